//! Fresh load or reopen. A fresh start loads the object, pins every map, lets the caller
//! write the first tables, then attaches the programs through pinned links. A restart finds
//! the pins, checks the ABI version and reuses them: programs never stopped routing, and
//! affinity and in-flight counts are kept.

use std::{
    fs,
    os::{
        fd::AsFd,
        unix::fs::{DirBuilderExt, PermissionsExt},
    },
    path::{Path, PathBuf},
};

use ailb_common::{filter_entries, filter_lines, maps, programs, ABI_VERSION, MEMBER_CHUNK, TABLE_CHUNK};
use aya::{
    programs::{CgroupSockAddr, CgroupSockopt, SockOps},
    Btf, Ebpf, EbpfLoader,
};
use tracing::{info, warn};

use super::{
    io_err, link_pin, store::WriterMaps, sys, ArenaLimits, DatapathError, Maps, TcAttach, PIN_DIR_MODE, PIN_MODE,
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/ailb.bpf.o"));

/// The embedded eBPF object (empty when the binary was built without it), for tests that
/// load its programs on their own maps (`BPF_PROG_TEST_RUN` fixtures).
pub fn object() -> &'static [u8] {
    OBJECT
}

pub struct Opened {
    pub maps: Maps,
    pub attach: Attach,
}

/// The programs of a fresh load, loaded but not attached yet (none after a reopen).
pub struct Attach {
    dir: PathBuf,
    pending: Option<Ebpf>,
}

impl Attach {
    pub fn is_fresh(&self) -> bool {
        self.pending.is_some()
    }

    /// Attaches the programs to `cgroup` and the TC program to `interfaces` through links
    /// pinned under `<dir>/links/`. A no-op when the pins were reopened (the links are still
    /// attached; a changed interface list takes a teardown and a fresh start).
    pub fn attach(mut self, cgroup: &Path, interfaces: &[String], tc_attach: TcAttach) -> Result<(), DatapathError> {
        let Some(mut ebpf) = self.pending.take() else {
            return Ok(());
        };
        let dir = self.dir.clone();
        super::tc::attach(&mut ebpf, &dir, interfaces, tc_attach)?;
        let cg = fs::File::open(cgroup).map_err(io_err("open cgroup", cgroup))?;
        let prog_err = |name| move |e| DatapathError::Program { name, source: Box::new(e) };
        for name in programs::ALL {
            let program = ebpf.program_mut(name).ok_or(DatapathError::MissingProgram { name })?;
            let (fd, attach_type) = match name {
                programs::CONNECT4 | programs::CONNECT6 => {
                    let p: &mut CgroupSockAddr = program.try_into().map_err(prog_err(name))?;
                    p.load().map_err(prog_err(name))?;
                    let attach_type = if name == programs::CONNECT4 {
                        sys::BPF_CGROUP_INET4_CONNECT
                    } else {
                        sys::BPF_CGROUP_INET6_CONNECT
                    };
                    (p.fd().map_err(prog_err(name))?.as_fd().try_clone_to_owned(), attach_type)
                }
                programs::SETSOCKOPT => {
                    let p: &mut CgroupSockopt = program.try_into().map_err(prog_err(name))?;
                    p.load().map_err(prog_err(name))?;
                    (p.fd().map_err(prog_err(name))?.as_fd().try_clone_to_owned(), sys::BPF_CGROUP_SETSOCKOPT)
                }
                _ => {
                    let p: &mut SockOps = program.try_into().map_err(prog_err(name))?;
                    p.load().map_err(prog_err(name))?;
                    (p.fd().map_err(prog_err(name))?.as_fd().try_clone_to_owned(), sys::BPF_CGROUP_SOCK_OPS)
                }
            };
            let fd = fd.map_err(io_err("dup program fd", &dir))?;
            let link =
                sys::link_create(fd.as_fd(), cg.as_fd(), attach_type).map_err(io_err("attach to cgroup", cgroup))?;
            let pin = link_pin(&dir, name);
            sys::obj_pin(link.as_fd(), &pin).map_err(io_err("pin link", &pin))?;
            restrict(&pin, PIN_MODE)?;
            info!(program = name, cgroup = %cgroup.display(), "attached");
        }
        Ok(())
    }
}

fn ensure_bpffs(dir: &Path) -> Result<(), DatapathError> {
    let mounts = sys::mounts_of("bpf").map_err(io_err("read /proc/mounts", Path::new("/proc/mounts")))?;
    if mounts.iter().any(|m| dir.starts_with(m)) {
        return Ok(());
    }
    let default = Path::new("/sys/fs/bpf");
    if dir.starts_with(default) && default.is_dir() {
        info!("mounting bpffs at /sys/fs/bpf");
        return sys::mount_bpffs(default).map_err(io_err("mount bpffs", default));
    }
    Err(DatapathError::State { path: dir.to_path_buf(), reason: "not on a bpf filesystem".into() })
}

/// Sets `path`'s mode. The kernel creates pins with 0600 minus the umask already; this makes
/// the mode independent of the umask and of what created the file.
fn restrict(path: &Path, mode: u32) -> Result<(), DatapathError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("set the mode of", path))
}

/// Creates `dir` (and missing parents) and `dir/links`, both [`PIN_DIR_MODE`]. An existing
/// `dir` (created empty by the operator, with the owner and mode of their choice) is kept as is.
fn create_pin_dirs(dir: &Path) -> Result<(), DatapathError> {
    let mut builder = fs::DirBuilder::new();
    builder.recursive(true).mode(PIN_DIR_MODE);
    builder.create(dir).map_err(io_err("create pin directory", dir))?;
    let links = dir.join("links");
    builder.create(&links).map_err(io_err("create pin directory", &links))?;
    restrict(&links, PIN_DIR_MODE)
}

/// Whether `dir` exists and holds nothing: an operator may create the pin directory
/// beforehand (owned by the daemon's user) for a daemon that may not create it.
fn empty_dir(dir: &Path) -> Result<bool, DatapathError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_err("read pin directory", dir)(e)),
    }
}

/// Whether every pin of a complete ailb state is present in `dir`.
fn complete(dir: &Path) -> bool {
    maps::ALL.iter().all(|m| dir.join(m).exists()) && programs::ALL.iter().all(|p| link_pin(dir, p).exists())
}

/// Opens the pinned state in `dir`, or loads the object with arenas of `limits` and pins it.
/// Pinned arenas keep the size they were created with (a warning says when `limits` differ).
pub fn open_or_load(dir: &Path, limits: &ArenaLimits) -> Result<Opened, DatapathError> {
    ensure_bpffs(dir)?;
    if dir.exists() && !empty_dir(dir)? {
        return reopen(dir, limits);
    }
    load(dir, limits)
}

/// A restart: the pins of a complete state of this ABI version, reused as they are.
fn reopen(dir: &Path, limits: &ArenaLimits) -> Result<Opened, DatapathError> {
    if !complete(dir) {
        return Err(DatapathError::State {
            path: dir.to_path_buf(),
            reason: format!(
                "incomplete ailb state (an interrupted start?); remove it with `ailb teardown --bpffs {}`",
                dir.display()
            ),
        });
    }
    let maps = Maps::open(dir)?;
    let abi = maps.global_config()?.abi_version;
    if abi != ABI_VERSION {
        return Err(DatapathError::State {
            path: dir.to_path_buf(),
            reason: format!("pinned state has ABI version {abi}, this ailb uses {ABI_VERSION}; run `ailb teardown --bpffs {}` first", dir.display()),
        });
    }
    warn_if_resized(dir, &maps, limits);
    info!(dir = %dir.display(), "reopened pinned maps and links: programs kept routing while the daemon was down");
    Ok(Opened { maps, attach: Attach { dir: dir.to_path_buf(), pending: None } })
}

/// Warns when the pinned arenas' sizes differ from `limits`: they keep theirs until a teardown.
fn warn_if_resized(dir: &Path, maps: &Maps, limits: &ArenaLimits) {
    let (tables, members) = maps.arena_chunks();
    let prefix_entries = aya::maps::MapData::from_pin(dir.join(maps::PREFIX))
        .and_then(|m| m.info())
        .map(|i| i.max_entries())
        .unwrap_or(limits.prefix_entries);
    let pinned =
        ArenaLimits { table_slots: tables * TABLE_CHUNK, member_slots: members * MEMBER_CHUNK, prefix_entries };
    if pinned != *limits {
        warn!(
            pinned_table_slots = pinned.table_slots,
            pinned_member_slots = pinned.member_slots,
            table_slots = limits.table_slots,
            member_slots = limits.member_slots,
            pinned_prefix_entries = pinned.prefix_entries,
            prefix_entries = limits.prefix_entries,
            "the pinned arenas keep their size; [limits] takes effect after `ailb teardown`"
        );
    }
}

/// A fresh start: loads the object with arenas of `limits` and pins every map; on a failure
/// after the load, removes what it pinned.
fn load(dir: &Path, limits: &ArenaLimits) -> Result<Opened, DatapathError> {
    if OBJECT.is_empty() {
        return Err(DatapathError::NoObject);
    }
    let btf = Btf::from_sys_fs().ok();
    let ebpf = EbpfLoader::new()
        .btf(btf.as_ref())
        .map_max_entries(maps::TABLES, limits.table_slots / TABLE_CHUNK)
        .map_max_entries(maps::MEMBERS, limits.member_slots / MEMBER_CHUNK)
        .map_max_entries(maps::PREFIX, limits.prefix_entries)
        .map_max_entries(maps::PREFIX_FILTER, filter_entries(filter_lines(limits.prefix_entries)))
        .load(OBJECT)
        .map_err(|e| DatapathError::Load(Box::new(e)))?;
    let pinned = pin_maps(&ebpf, dir).and_then(|maps| {
        super::prefix_filter::PrefixFilter::open(dir)?.init(filter_lines(limits.prefix_entries))?;
        Ok(maps)
    });
    match pinned {
        Ok(maps) => {
            info!(dir = %dir.display(), "loaded eBPF object and pinned maps");
            Ok(Opened { maps, attach: Attach { dir: dir.to_path_buf(), pending: Some(ebpf) } })
        }
        Err(e) => {
            let _cleanup = super::teardown(dir);
            Err(e)
        }
    }
}

/// Creates the pin directories, pins every map of `ebpf` there ([`PIN_MODE`]) and opens them.
fn pin_maps(ebpf: &Ebpf, dir: &Path) -> Result<Maps, DatapathError> {
    create_pin_dirs(dir)?;
    for name in maps::ALL {
        let map = ebpf.map(name).ok_or_else(|| DatapathError::State {
            path: dir.to_path_buf(),
            reason: format!("map {name} missing from the eBPF object"),
        })?;
        let pin = dir.join(name);
        map.pin(&pin).map_err(|e| DatapathError::Io {
            what: "pin map",
            path: pin.clone(),
            source: match e {
                aya::pin::PinError::SyscallError(s) => s.io_error,
                other => std::io::Error::other(other.to_string()),
            },
        })?;
        restrict(&pin, PIN_MODE)?;
    }
    Maps::open(dir)
}
