//! The TC datapath from userspace: on a fresh load, `ailb_tc_ingress` is attached to the
//! ingress of each `[daemon] interfaces` entry through a tcx link pinned at
//! `links/tc-<interface>` (so it keeps forwarding while no daemon runs, like the cgroup
//! links), or, where the kernel has no tcx or `[daemon.tc] attach = "clsact"`, through a
//! netlink filter on the interface's clsact qdisc (recorded by a pin of the program at
//! `links/clsact:<priority>:<handle>:<interface>`), and `ailb_tc_reclaim` is pinned at `progs/ailb_tc_reclaim` for the housekeeping
//! to run; the TC settings and each model's remote-client settings are written after every
//! apply; `ailb teardown` removes the pins, which detaches the programs.

use std::{
    fs,
    net::SocketAddrV6,
    os::unix::fs::DirBuilderExt,
    path::{Path, PathBuf},
};

use ailb_common::{
    hash::conversation_hash, maps, programs, TcConfig, TcConfig6, TcModel, TcStats, FLOW_COUNT, FLOW_FORWARD,
    FLOW_REPLY, TC_AFFINITY_CLIENT_ADDR, TC_AFFINITY_NONE, TC_MODE_MASQUERADE, TC_MODE_OFF, TC_MODE_ROUTED,
    TC_PROG_IPV6,
};
use aya::{
    maps::{Array, HashMap, Map, MapData, PerCpuArray, ProgramArray},
    programs::{
        links::FdLink,
        tc::{qdisc_add_clsact, NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
        Link, LinkOrder, SchedClassifier, TcAttachType, TestRun, TestRunOptions,
    },
    Ebpf,
};
use tracing::info;

use super::{io_err, map_err, DatapathError, Maps, RemoteModel, TcAttach, TcMode, TcOptions, PIN_DIR_MODE};

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
/// program to every interface (`how`: tcx, netlink clsact, or tcx with clsact where the
/// kernel has no tcx). Nothing when no interface is configured.
pub(crate) fn attach(ebpf: &mut Ebpf, dir: &Path, interfaces: &[String], how: TcAttach) -> Result<(), DatapathError> {
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

    load_ingress6(ebpf)?;
    let name = programs::TC_INGRESS;
    let ingress: &mut SchedClassifier =
        ebpf.program_mut(name).ok_or(DatapathError::MissingProgram { name })?.try_into().map_err(prog_err(name))?;
    ingress.load().map_err(prog_err(name))?;
    for interface in interfaces {
        let tcx = match how {
            TcAttach::Clsact => Err(None),
            TcAttach::Tcx | TcAttach::Auto => attach_tcx(ingress, dir, interface).map_err(Some),
        };
        match tcx {
            Ok(()) => info!(program = name, interface = %interface, "attached (tcx ingress)"),
            Err(Some(e)) if !(how == TcAttach::Auto && tcx_unsupported(&e)) => return Err(e),
            Err(e) => {
                if let Some(e) = e {
                    info!(interface = %interface, error = %e, "tcx is not supported here; attaching through clsact");
                }
                attach_clsact(ingress, dir, interface)?;
                info!(program = name, interface = %interface, "attached (clsact ingress, netlink)");
            }
        }
    }
    Ok(())
}

/// Loads `ailb_tc_ingress6` and puts it in its `AILB_TC_PROGS` slot, where the ingress
/// program tail-calls it for IPv6 frames. The map is pinned, so the slot stays filled after
/// this process exits (and with it the program, which nothing else holds).
pub fn load_ingress6(ebpf: &mut Ebpf) -> Result<(), DatapathError> {
    let name = programs::TC_INGRESS6;
    let prog: &mut SchedClassifier =
        ebpf.program_mut(name).ok_or(DatapathError::MissingProgram { name })?.try_into().map_err(prog_err(name))?;
    prog.load().map_err(prog_err(name))?;
    let fd = prog
        .fd()
        .map_err(prog_err(name))?
        .try_clone()
        .map_err(|e| DatapathError::Program { name, source: Box::new(aya::programs::ProgramError::IOError(e)) })?;
    let map = ebpf.map_mut(maps::TC_PROGS).ok_or(DatapathError::MissingMap { name: maps::TC_PROGS })?;
    let mut slots: ProgramArray<&mut MapData> = ProgramArray::try_from(map).map_err(map_err(maps::TC_PROGS))?;
    slots.set(TC_PROG_IPV6, &fd, 0).map_err(map_err(maps::TC_PROGS))
}

/// A tcx link on `interface`'s ingress, pinned at [`link_pin`].
fn attach_tcx(ingress: &mut SchedClassifier, dir: &Path, interface: &str) -> Result<(), DatapathError> {
    let iface_err = |e| DatapathError::Interface { name: interface.to_string(), source: Box::new(e) };
    let id = ingress
        .attach_with_options(interface, TcAttachType::Ingress, TcAttachOptions::TcxOrder(LinkOrder::default()))
        .map_err(iface_err)?;
    let link = ingress.take_link(id).map_err(iface_err)?;
    let fd: FdLink = link
        .try_into()
        .map_err(|e| DatapathError::InterfaceLink { name: interface.to_string(), source: Box::new(e) })?;
    let pin = link_pin(dir, interface);
    fd.pin(&pin).map_err(|e| DatapathError::Io { what: "pin link", path: pin.clone(), source: pin_io(e) })?;
    Ok(())
}

/// Whether a tcx attach failed because the kernel has no tcx (before 6.6: the link create
/// refuses the attach type), not for a reason a clsact attach would share.
fn tcx_unsupported(e: &DatapathError) -> bool {
    let DatapathError::Interface { source, .. } = e else {
        return false;
    };
    let aya::programs::ProgramError::SyscallError(s) = source.as_ref() else {
        return false;
    };
    // ENOTSUPP (524) is the kernel-internal code some paths return for an unknown attach type.
    matches!(s.io_error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | 524))
}

/// A netlink filter on `interface`'s clsact ingress (the qdisc added when absent). The
/// filter holds the program, so it stays attached after the daemon exits, as a tcx link held
/// by its pin does; its priority and handle are kept in the name of a pin of the program
/// ([`clsact_pin`]) for `ailb teardown` to remove exactly this filter.
fn attach_clsact(ingress: &mut SchedClassifier, dir: &Path, interface: &str) -> Result<(), DatapathError> {
    let iface_err = |e| DatapathError::Interface { name: interface.to_string(), source: Box::new(e) };
    if let Err(e) = qdisc_add_clsact(interface) {
        // EEXIST: the interface has its clsact qdisc already.
        let exists = matches!(&e, TcError::NetlinkError(n) if n.raw_os_error() == Some(libc::EEXIST));
        if !exists {
            return Err(iface_err(aya::programs::ProgramError::from(e)));
        }
    }
    let id = ingress
        .attach_with_options(interface, TcAttachType::Ingress, TcAttachOptions::Netlink(NlOptions::default()))
        .map_err(iface_err)?;
    let link = ingress.take_link(id).map_err(iface_err)?;
    let (priority, handle) = (link.priority().map_err(iface_err)?, u32::from(link.handle().map_err(iface_err)?));
    // Dropping the link would detach the filter; the filter is to outlive this process.
    std::mem::forget(link);
    let pin = clsact_pin(dir, interface, priority, handle);
    ingress.pin(&pin).map_err(|e| DatapathError::Io { what: "pin program", path: pin.clone(), source: pin_io(e) })?;
    Ok(())
}

/// Pin of the ingress program for a clsact filter on `interface` at `priority` and `handle`:
/// `links/clsact:<priority>:<handle>:<interface>` (':' is in no interface name).
pub fn clsact_pin(dir: &Path, interface: &str, priority: u16, handle: u32) -> PathBuf {
    dir.join("links").join(format!("clsact:{priority}:{handle}:{interface}"))
}

/// How the TC program is attached to one interface, as its pin records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attachment {
    Tcx { interface: String },
    Clsact { interface: String, priority: u16, handle: u32 },
}

impl Attachment {
    pub fn interface(&self) -> &str {
        match self {
            Self::Tcx { interface } | Self::Clsact { interface, .. } => interface,
        }
    }

    /// The pin that records it.
    pub fn pin(&self, dir: &Path) -> PathBuf {
        match self {
            Self::Tcx { interface } => link_pin(dir, interface),
            Self::Clsact { interface, priority, handle } => clsact_pin(dir, interface, *priority, *handle),
        }
    }

    /// Parses a file name under `links/`; `None` for the cgroup links.
    fn parse(name: &str) -> Option<Self> {
        if let Some(interface) = name.strip_prefix("tc-") {
            return Some(Self::Tcx { interface: interface.to_string() });
        }
        let mut parts = name.strip_prefix("clsact:")?.splitn(3, ':');
        let (priority, handle) = (parts.next()?.parse().ok()?, parts.next()?.parse().ok()?);
        Some(Self::Clsact { interface: parts.next()?.to_string(), priority, handle })
    }

    /// Detaches a clsact filter (a tcx link goes with its pin). A filter or interface already
    /// gone is nothing to do; the interface must be of this network namespace.
    pub fn detach(&self) -> Result<(), DatapathError> {
        let Self::Clsact { interface, priority, handle } = self else {
            return Ok(());
        };
        let iface_err = |e| DatapathError::Interface { name: interface.clone(), source: Box::new(e) };
        let link = match SchedClassifierLink::attached(
            interface,
            TcAttachType::Ingress,
            *priority,
            TcHandle::from(*handle),
            None,
        ) {
            Ok(l) => l,
            // No such interface here: it was removed (its filters with it), or it is in another
            // network namespace, where its filter stays until removed there (`tc filter del`).
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) || e.kind() == std::io::ErrorKind::NotFound => {
                tracing::warn!(
                    interface = %interface,
                    priority = *priority,
                    handle = *handle,
                    "no such interface in this network namespace: nothing to detach here; if it exists in \
                     another namespace, its clsact filter stays attached there"
                );
                return Ok(());
            }
            Err(e) => return Err(iface_err(aya::programs::ProgramError::from(TcError::IoError(e)))),
        };
        match link.detach() {
            Ok(()) => Ok(()),
            // The filter is gone already (removed by hand, or the qdisc with it).
            Err(aya::programs::ProgramError::NetlinkError(n)) if n.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            Err(e) => Err(iface_err(e)),
        }
    }
}

/// Every TC attachment recorded under `links/`, sorted by interface.
pub fn attachments(dir: &Path) -> Vec<Attachment> {
    let Ok(entries) = fs::read_dir(dir.join("links")) else {
        return Vec::new();
    };
    let mut all: Vec<Attachment> =
        entries.filter_map(Result::ok).filter_map(|e| e.file_name().to_str().and_then(Attachment::parse)).collect();
    all.sort_by(|a, b| a.interface().cmp(b.interface()));
    all
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

/// Writes `AILB_TC_CONFIG` and the `AILB_TC_MODELS` entry of each of `remote` (the model's
/// index read back from `AILB_MODEL_NAMES`, which the writer keeps): mode off when no
/// interface is configured.
pub fn write<'m>(
    maps: &Maps,
    tc: &TcOptions,
    remote: impl IntoIterator<Item = (&'m str, RemoteModel)>,
) -> Result<(), DatapathError> {
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
    let nat_addr6 = tc.nat_address6.map_or([0; 4], |a| super::values::addr6_be(&SocketAddrV6::new(a, 0, 0, 0)).0);
    let mut config6: Array<MapData, TcConfig6> =
        open_map(&maps.dir, maps::TC_CONFIG6)?.try_into().map_err(map_err(maps::TC_CONFIG6))?;
    config6.set(0, TcConfig6 { nat_addr6 }, 0).map_err(map_err(maps::TC_CONFIG6))?;
    let mut models: Array<MapData, TcModel> =
        open_map(&maps.dir, maps::TC_MODELS)?.try_into().map_err(map_err(maps::TC_MODELS))?;
    for (name, m) in remote {
        let Ok(index) = maps.model_names.get(&conversation_hash(name.as_bytes()), 0) else {
            continue;
        };
        let affinity = if m.client_affinity { TC_AFFINITY_CLIENT_ADDR } else { TC_AFFINITY_NONE };
        let entry = TcModel { required_mem_mb: m.required_memory_mb.unwrap_or(0), affinity };
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

/// What `ailb status` shows of the TC datapath. Both families' flows are in the same
/// numbers and counters; `flows_ipv6` says how many of the flows are IPv6.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TcStatus {
    /// Flows with a forward entry (IPv4 and IPv6).
    pub flows: u64,
    /// Of `flows`, the IPv6 ones (`AILB_FLOWS6`).
    pub flows_ipv6: u64,
    /// Flows still counted in flight.
    pub counted: u64,
    /// Reply entries: in masquerade mode, the NAT ports in use.
    pub nat_ports: u64,
    pub interfaces: Vec<String>,
    pub stats: TcStats,
}

impl TcStatus {
    /// Counts one flow table entry of `kind`.
    fn count_entry(&mut self, kind: u32) {
        match kind {
            FLOW_FORWARD => self.flows += 1,
            FLOW_REPLY => self.nat_ports += 1,
            FLOW_COUNT => self.counted += 1,
            _ => {}
        }
    }
}

/// Reads the flow tables and the TC counters from the pins in `dir`.
pub fn read_status(dir: &Path) -> Result<TcStatus, DatapathError> {
    let mut st = TcStatus::default();
    let flows: HashMap<MapData, ailb_common::FlowKey, ailb_common::Flow> =
        open_map(dir, maps::FLOWS)?.try_into().map_err(map_err(maps::FLOWS))?;
    for key in flows.keys().filter_map(Result::ok) {
        st.count_entry(key.kind);
    }
    let flows6: HashMap<MapData, ailb_common::FlowKey6, ailb_common::Flow6> =
        open_map(dir, maps::FLOWS6)?.try_into().map_err(map_err(maps::FLOWS6))?;
    for key in flows6.keys().filter_map(Result::ok) {
        st.count_entry(key.kind);
        st.flows_ipv6 += u64::from(key.kind == FLOW_FORWARD);
    }
    let stats: PerCpuArray<MapData, TcStats> =
        open_map(dir, maps::TC_STATS)?.try_into().map_err(map_err(maps::TC_STATS))?;
    for s in stats.get(&0, 0).map_err(map_err(maps::TC_STATS))?.iter() {
        st.stats.merge(s);
    }
    st.interfaces = interfaces(dir);
    Ok(st)
}

/// The interfaces with the TC program attached (tcx or clsact), from the pins under `links/`.
pub fn interfaces(dir: &Path) -> Vec<String> {
    attachments(dir).iter().map(|a| a.interface().to_string()).collect()
}

#[cfg(test)]
mod tests;
