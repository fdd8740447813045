//! A child cgroup under the cgroup2 mount that the programs attach to and the clients run in.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The cgroup2 mount point, from `/proc/mounts` (`/sys/fs/cgroup/unified` on a hybrid layout,
/// `/sys/fs/cgroup` on most hosts).
pub fn cgroup2_mount() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_else(|e| panic!("reading /proc/mounts: {e}"));
    parse_cgroup2_mount(&mounts).unwrap_or_else(|| panic!("no cgroup2 filesystem in /proc/mounts"))
}

/// The first `cgroup2` entry of a `/proc/mounts` text (octal escapes such as `\040` decoded).
pub fn parse_cgroup2_mount(mounts: &str) -> Option<PathBuf> {
    mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(unescape_mount(f[1])))
    })
}

fn unescape_mount(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A child cgroup `<cgroup2 mount>/ailb-test-<name>-<pid>`, removed on drop.
///
/// Processes are put in it by [`CgroupGuard::open_procs`] + `pre_exec` (see `client.rs`); they
/// are killed by their own guards, so on drop this waits (bounded) for it to become empty and
/// removes it. It never touches the cgroup2 root or any cgroup it did not create.
pub struct CgroupGuard {
    path: PathBuf,
}

impl CgroupGuard {
    pub fn new(name: &str) -> Self {
        let path = cgroup2_mount().join(crate::unique_name(name));
        if path.exists() {
            // A stale cgroup of an earlier run of this very process id; it is ours by name.
            let _ = std::fs::remove_dir(&path);
        }
        std::fs::create_dir(&path).unwrap_or_else(|e| panic!("creating child cgroup {}: {e}", path.display()));
        Self { path }
    }

    /// Absolute path, as written into the daemon's `[daemon] cgroup`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `cgroup.procs`, opened for writing (close-on-exec) so that a forked child can move
    /// itself in before exec.
    pub fn open_procs(&self) -> File {
        let p = self.path.join("cgroup.procs");
        OpenOptions::new().write(true).open(&p).unwrap_or_else(|e| panic!("opening {}: {e}", p.display()))
    }

    /// Pids currently in the cgroup.
    pub fn procs(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        // Exited processes leave the cgroup asynchronously; rmdir fails with EBUSY until then.
        let deadline = Instant::now() + Duration::from_secs(5);
        let last_err = loop {
            let err = match std::fs::remove_dir(&self.path) {
                Ok(()) => return,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                break err;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let msg = format!(
            "could not remove child cgroup {} within 5 s: {}; pids still in it: {:?}",
            self.path.display(),
            last_err,
            self.procs()
        );
        if std::thread::panicking() {
            eprintln!("{msg}");
        } else {
            panic!("{msg}");
        }
    }
}

#[cfg(test)]
mod tests;
