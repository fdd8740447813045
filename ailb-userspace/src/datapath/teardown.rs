//! Removes every link pin (cgroup and TC; removing one detaches its program: the pin holds the
//! last reference), the clsact filters (detached through netlink, in this network namespace),
//! the reclaim program's pin,
//! every map pin and the directory. Idempotent.

use std::{fs, path::Path};

use ailb_common::{maps, programs};

use super::{io_err, link_pin, DatapathError};

/// Returns the number of pins removed.
pub fn teardown(dir: &Path) -> Result<usize, DatapathError> {
    // Only a directory that is not there is nothing to do: one that cannot be looked up
    // (EACCES) is an error, not "nothing to tear down".
    match fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("look up pin directory", dir)(e)),
    }
    let mut removed = 0;
    let mut remove = |p: &Path| -> Result<(), DatapathError> {
        match fs::remove_file(p) {
            Ok(()) => {
                removed += 1;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove pin", p)(e)),
        }
    };
    for p in programs::ALL {
        remove(&link_pin(dir, p))?;
    }
    // The TC attachments (one per interface: a tcx link, or a clsact filter, detached first,
    // and its record) and the reclaim program.
    for a in super::tc::attachments(dir) {
        a.detach()?;
        remove(&a.pin(dir))?;
    }
    remove(&super::tc::reclaim_pin(dir))?;
    let progs = dir.join("progs");
    if progs.exists() {
        fs::remove_dir(&progs).map_err(io_err("remove directory (unknown files left in it?)", &progs))?;
    }
    for m in maps::ALL {
        remove(&dir.join(m))?;
    }
    let links = dir.join("links");
    if links.exists() {
        fs::remove_dir(&links).map_err(io_err("remove directory (unknown files left in it?)", &links))?;
    }
    fs::remove_dir(dir).map_err(io_err("remove directory (unknown files left in it?)", dir))?;
    Ok(removed)
}
