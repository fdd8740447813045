//! The TC datapath from userspace: on a fresh load, `ailb_tc_ingress` is attached to the
//! ingress of each `[daemon] interfaces` entry through a tcx link pinned at
//! `links/tc-<interface>` (so it keeps forwarding while no daemon runs, like the cgroup
//! links), and `ailb_tc_reclaim` is pinned at `progs/ailb_tc_reclaim` for the housekeeping
//! to run; the TC settings and each model's remote-client settings are written after every
//! apply; `ailb teardown` removes the pins, which detaches the programs.

use std::{
    fs,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use ailb_common::{
    hash::conversation_hash, maps, programs, TcConfig, TcModel, TcStats, FLOW_COUNT, FLOW_FORWARD, FLOW_REPLY,
    TC_AFFINITY_CLIENT_ADDR, TC_AFFINITY_NONE, TC_MODE_MASQUERADE, TC_MODE_OFF, TC_MODE_ROUTED,
};
use aya::{
    maps::{Array, HashMap, Map, MapData, PerCpuArray},
    programs::{links::FdLink, tc::TcAttachOptions, LinkOrder, SchedClassifier, TcAttachType, TestRun, TestRunOptions},
    Ebpf,
};
use tracing::info;

use super::{io_err, map_err, DatapathError, Maps, PIN_DIR_MODE};
use crate::config::{TcMode, ValidConfig};

/// Pin of the tcx link of `interface`.
pub fn link_pin(dir: &Path, interface: &str) -> PathBuf {
    dir.join("links").join(format!("tc-{interface}"))
}

/// Pin of the reclaim program.
pub fn reclaim_pin(dir: &Path) -> PathBuf {
    dir.join("progs").join(programs::TC_RECLAIM)
}

fn prog_err(name: &'static str) -> impl Fn(aya::programs::ProgramError) -> DatapathError {
    move |e| DatapathError::Program { name, source: Box::new(e) }
}

/// Loads the TC programs of a fresh load, pins the reclaim program and attaches the ingress
/// program to every interface. Nothing when no interface is configured.
pub(crate) fn attach(ebpf: &mut Ebpf, dir: &Path, interfaces: &[String]) -> Result<(), DatapathError> {
    if interfaces.is_empty() {
        return Ok(());
    }
    let name = programs::TC_RECLAIM;
    let reclaim: &mut SchedClassifier =
        ebpf.program_mut(name).ok_or(DatapathError::MissingProgram { name })?.try_into().map_err(prog_err(name))?;
    reclaim.load().map_err(prog_err(name))?;
    let progs = dir.join("progs");
    fs::DirBuilder::new().mode(PIN_DIR_MODE).create(&progs).map_err(io_err("create pin directory", &progs))?;
    let pin = reclaim_pin(dir);
    reclaim.pin(&pin).map_err(|e| DatapathError::Io { what: "pin program", path: pin.clone(), source: pin_io(e) })?;

    let name = programs::TC_INGRESS;
    let ingress: &mut SchedClassifier =
        ebpf.program_mut(name).ok_or(DatapathError::MissingProgram { name })?.try_into().map_err(prog_err(name))?;
    ingress.load().map_err(prog_err(name))?;
    for interface in interfaces {
        let iface_err = |e| DatapathError::Interface { name: interface.clone(), source: Box::new(e) };
        let id = ingress
            .attach_with_options(interface, TcAttachType::Ingress, TcAttachOptions::TcxOrder(LinkOrder::default()))
            .map_err(iface_err)?;
        let link = ingress.take_link(id).map_err(iface_err)?;
        let fd: FdLink = link
            .try_into()
            .map_err(|e| DatapathError::InterfaceLink { name: interface.clone(), source: Box::new(e) })?;
        let pin = link_pin(dir, interface);
        fd.pin(&pin).map_err(|e| DatapathError::Io { what: "pin link", path: pin.clone(), source: pin_io(e) })?;
        info!(program = name, interface = %interface, "attached (tcx ingress)");
    }
    Ok(())
}

fn pin_io(e: aya::pin::PinError) -> std::io::Error {
    match e {
        aya::pin::PinError::SyscallError(s) => s.io_error,
        other => std::io::Error::other(other.to_string()),
    }
}

fn open_map(dir: &Path, name: &str) -> Result<Map, DatapathError> {
    let md = MapData::from_pin(dir.join(name)).map_err(map_err(name))?;
    Map::from_map_data(md).map_err(map_err(name))
}

/// Writes `AILB_TC_CONFIG` and every model's `AILB_TC_MODELS` entry (its index read back from
/// `AILB_MODEL_NAMES`, which the writer keeps): mode off when no interface is configured.
pub fn write(maps: &Maps, cfg: &ValidConfig) -> Result<(), DatapathError> {
    let tc = &cfg.tc;
    let mode = match (tc.interfaces.is_empty(), tc.mode) {
        (true, _) => TC_MODE_OFF,
        (false, TcMode::Masquerade) => TC_MODE_MASQUERADE,
        (false, TcMode::Routed) => TC_MODE_ROUTED,
    };
    let value = TcConfig {
        mode,
        nat_addr: tc.nat_address.map_or(0, |a| u32::from_ne_bytes(a.octets())),
        port_min: tc.nat_ports.0,
        port_max: tc.nat_ports.1,
        _pad: 0,
        idle_timeout_ns: tc.idle_timeout.as_nanos().min(u64::MAX as u128) as u64,
    };
    let mut config: Array<MapData, TcConfig> =
        open_map(&maps.dir, maps::TC_CONFIG)?.try_into().map_err(map_err(maps::TC_CONFIG))?;
    config.set(0, value, 0).map_err(map_err(maps::TC_CONFIG))?;
    let mut models: Array<MapData, TcModel> =
        open_map(&maps.dir, maps::TC_MODELS)?.try_into().map_err(map_err(maps::TC_MODELS))?;
    for (name, m) in &cfg.models {
        let Ok(index) = maps.model_names.get(&conversation_hash(name.as_bytes()), 0) else {
            continue;
        };
        let affinity = if m.remote_affinity { TC_AFFINITY_CLIENT_ADDR } else { TC_AFFINITY_NONE };
        let entry = TcModel { required_mem_mb: m.spec.required_memory_mb.unwrap_or(0), affinity };
        models.set(index, entry, 0).map_err(map_err(maps::TC_MODELS))?;
    }
    Ok(())
}

/// The pinned reclaim program, run by the daemon's housekeeping.
pub struct Reclaimer {
    prog: SchedClassifier,
}

impl Reclaimer {
    /// `None` when no reclaim program is pinned (no interface was configured at the fresh start).
    pub fn open(dir: &Path) -> Result<Option<Self>, DatapathError> {
        let pin = reclaim_pin(dir);
        if !pin.exists() {
            return Ok(None);
        }
        let prog = SchedClassifier::from_pin(&pin).map_err(prog_err(programs::TC_RECLAIM))?;
        Ok(Some(Self { prog }))
    }

    /// Removes the flows idle for the configured timeout: the number removed.
    pub fn run(&self) -> Result<u32, DatapathError> {
        // BPF_PROG_TEST_RUN of a sched_cls program needs a frame of at least an Ethernet
        // header; the program reads nothing of it.
        let frame = [0u8; 64];
        let opts = TestRunOptions { data_in: Some(&frame), ..TestRunOptions::new() };
        let res = self.prog.test_run(opts).map_err(prog_err(programs::TC_RECLAIM))?;
        Ok(res.return_value)
    }
}

/// What `ailb status` shows of the TC datapath.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TcStatus {
    /// Flows with a forward entry.
    pub flows: u64,
    /// Flows still counted in flight.
    pub counted: u64,
    /// Reply entries: in masquerade mode, the NAT ports in use.
    pub nat_ports: u64,
    pub interfaces: Vec<String>,
    pub stats: TcStats,
}

/// Reads the flow table and the TC counters from the pins in `dir`.
pub fn read_status(dir: &Path) -> Result<TcStatus, DatapathError> {
    let mut st = TcStatus::default();
    let flows: HashMap<MapData, ailb_common::FlowKey, ailb_common::Flow> =
        open_map(dir, maps::FLOWS)?.try_into().map_err(map_err(maps::FLOWS))?;
    for key in flows.keys().filter_map(Result::ok) {
        match key.kind {
            FLOW_FORWARD => st.flows += 1,
            FLOW_REPLY => st.nat_ports += 1,
            FLOW_COUNT => st.counted += 1,
            _ => {}
        }
    }
    let stats: PerCpuArray<MapData, TcStats> =
        open_map(dir, maps::TC_STATS)?.try_into().map_err(map_err(maps::TC_STATS))?;
    for s in stats.get(&0, 0).map_err(map_err(maps::TC_STATS))?.iter() {
        st.stats.merge(s);
    }
    st.interfaces = interfaces(dir);
    Ok(st)
}

/// The interfaces with a pinned link, from `links/tc-*`.
pub fn interfaces(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir.join("links")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.strip_prefix("tc-")).map(str::to_string))
        .collect();
    names.sort();
    names
}
