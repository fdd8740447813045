//! The only module that talks to the kernel through aya: loads the eBPF object, pins maps and
//! links under one bpffs directory, attaches to the configured cgroup, writes tables
//! atomically, reopens the pins after a restart (fail-static), reads them for `status`, and
//! tears everything down.
//!
//! The writer ([`writer`]) keeps its logic apart from aya: it reaches the maps through
//! [`WriterMaps`] only (`store.rs` implements it for [`Maps`]; the tests use the in-memory
//! `fake.rs`), takes ids from `ids.rs` and the map values from [`values`].

mod arena;
pub mod cgroup;
pub mod explain;
#[cfg(test)]
mod fake;
mod ids;
pub mod load;
pub mod memory;
pub mod model_load;
pub mod prefix;
pub mod prefix_filter;
mod settings;
pub mod status;
mod store;
mod sys;
pub mod tables;
pub mod tc;
pub mod teardown;
pub mod values;
pub mod writer;

use std::path::{Path, PathBuf};

use ailb_common::{
    maps, AffinityKey, AffinityValue, Backend, BackendAddr6, BackendStats, GlobalConfig, MemberChunk, ModelState,
    Service, ServiceKey, ServiceKey6, Stats, TableChunk,
};
use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};

pub use cgroup::resolve_cgroup;
pub use load::open_or_load;
pub use settings::{ArenaLimits, RemoteModel, TcAttach, TcMode, TcOptions, WriterSettings};
pub use status::read_status;
pub use store::WriterMaps;
pub use sys::monotonic_ns;
pub use teardown::teardown;
pub use writer::Writer;

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("eBPF object not embedded in this binary: build it with `cargo xtask build`")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("program {name}: {source}")]
    Program {
        name: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("interface {name:?}: attaching the TC program: {source}")]
    Interface {
        name: String,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("interface {name:?}: pinning the TC link: {source}")]
    InterfaceLink {
        name: String,
        #[source]
        source: Box<aya::programs::links::LinkError>,
    },
    #[error("program {name}: not found in the eBPF object")]
    MissingProgram { name: &'static str },
    #[error("map {name}: not found in the eBPF object")]
    MissingMap { name: &'static str },
    #[error("map {name}: {source}")]
    Map {
        name: String,
        #[source]
        source: Box<MapError>,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("cgroup {cgroup:?}: {reason}")]
    Cgroup { cgroup: String, reason: String },
    #[error("table for model {model}: {source}")]
    Table {
        model: String,
        #[source]
        source: ailb_common::maglev::MaglevError,
    },
    #[error("{what}: no free slot (at most {max})")]
    Full { what: &'static str, max: u32 },
    #[error(
        "{field} = {capacity} is full: {need} more needed, {free} free (raise it; a new size takes effect after \
         `ailb teardown`)"
    )]
    ArenaFull { field: &'static str, capacity: u64, need: u64, free: u64 },
}

impl DatapathError {
    /// The operating system's error number this error comes from, if any (found through the
    /// source chain: an `io::Error` of ours, or the one inside aya's `SyscallError`). The CLI
    /// tells "no pins" (ENOENT) from "not allowed to read them" (EACCES, EPERM) by it.
    pub fn errno(&self) -> Option<i32> {
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cur {
            if let Some(n) = e.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) {
                return Some(n);
            }
            cur = e.source();
        }
        None
    }
}

/// Mode of the pin directory and of `links/` when the daemon creates them: its own user only.
pub const PIN_DIR_MODE: u32 = 0o700;
/// Mode of every map and link pin: read and write by the daemon's user only (a reader of the
/// pins can change the routing tables).
pub const PIN_MODE: u32 = 0o600;

pub(crate) fn map_err(name: &str) -> impl FnOnce(MapError) -> DatapathError + '_ {
    move |source| DatapathError::Map { name: name.to_string(), source: Box::new(source) }
}

pub(crate) fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DatapathError {
    let path = path.to_path_buf();
    move |source| DatapathError::Io { what, path, source }
}

/// Typed handles on every pinned map.
pub struct Maps {
    pub dir: PathBuf,
    pub services: HashMap<MapData, ServiceKey, Service>,
    pub services6: HashMap<MapData, ServiceKey6, Service>,
    pub backends: Array<MapData, Backend>,
    pub backend_addrs6: Array<MapData, BackendAddr6>,
    pub models: Array<MapData, ModelState>,
    pub tables: Array<MapData, TableChunk>,
    pub members: Array<MapData, MemberChunk>,
    pub model_names: HashMap<MapData, u64, u32>,
    pub affinity: HashMap<MapData, AffinityKey, AffinityValue>,
    pub inflight: Array<MapData, u64>,
    pub stats: PerCpuArray<MapData, Stats>,
    pub backend_stats: PerCpuArray<MapData, BackendStats>,
    pub config: Array<MapData, GlobalConfig>,
}

fn open_map(dir: &Path, name: &str) -> Result<Map, DatapathError> {
    let md = MapData::from_pin(dir.join(name)).map_err(map_err(name))?;
    Map::from_map_data(md).map_err(map_err(name))
}

macro_rules! typed {
    ($dir:expr, $name:expr) => {
        open_map($dir, $name)?.try_into().map_err(map_err($name))?
    };
}

impl Maps {
    /// Opens every map pinned in `dir`.
    pub fn open(dir: &Path) -> Result<Self, DatapathError> {
        Ok(Self {
            dir: dir.to_path_buf(),
            services: typed!(dir, maps::SERVICES),
            services6: typed!(dir, maps::SERVICES6),
            backends: typed!(dir, maps::BACKENDS),
            backend_addrs6: typed!(dir, maps::BACKEND_ADDRS6),
            models: typed!(dir, maps::MODELS),
            tables: typed!(dir, maps::TABLES),
            members: typed!(dir, maps::MEMBERS),
            model_names: typed!(dir, maps::MODEL_NAMES),
            affinity: typed!(dir, maps::AFFINITY),
            inflight: typed!(dir, maps::INFLIGHT),
            stats: typed!(dir, maps::STATS),
            backend_stats: typed!(dir, maps::BACKEND_STATS),
            config: typed!(dir, maps::CONFIG),
        })
    }

    pub fn global_config(&self) -> Result<GlobalConfig, DatapathError> {
        self.config.get(&0, 0).map_err(map_err(maps::CONFIG))
    }
}

/// Path of a link pin.
pub(crate) fn link_pin(dir: &Path, program: &str) -> PathBuf {
    dir.join("links").join(program)
}
