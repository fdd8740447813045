//! Resolving the configured cgroup. Only `"/"` means the cgroup2 root: a relative path is
//! created under the cgroup2 mount, so a mistake cannot attach to every process of the host.

use std::path::{Path, PathBuf};

use super::{sys, DatapathError};

/// The cgroup2 mount point (e.g. `/sys/fs/cgroup` or, on hybrid hosts, `/sys/fs/cgroup/unified`).
pub fn cgroup2_mount() -> Result<PathBuf, DatapathError> {
    let mounts = sys::mounts_of("cgroup2")
        .map_err(|e| DatapathError::Cgroup { cgroup: String::new(), reason: e.to_string() })?;
    mounts.into_iter().next().ok_or_else(|| DatapathError::Cgroup {
        cgroup: String::new(),
        reason: "no cgroup2 filesystem is mounted".into(),
    })
}

/// Returns the cgroup directory, creating a relative one if missing.
pub fn resolve_cgroup(configured: &str) -> Result<PathBuf, DatapathError> {
    let mount = cgroup2_mount()?;
    let err = |reason: String| DatapathError::Cgroup { cgroup: configured.to_string(), reason };
    let path = if configured == "/" {
        return Ok(mount);
    } else if configured.starts_with('/') {
        let p = PathBuf::from(configured);
        if !p.starts_with(&mount) {
            return Err(err(format!("an absolute cgroup path must be under the cgroup2 mount {}", mount.display())));
        }
        p
    } else {
        mount.join(configured)
    };
    if same_dir(&path, &mount) {
        return Err(err("this is the cgroup2 root; write cgroup = \"/\" to attach there on purpose".into()));
    }
    if !path.is_dir() {
        std::fs::create_dir_all(&path).map_err(|e| err(format!("cannot create {}: {e}", path.display())))?;
    }
    Ok(path)
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}
