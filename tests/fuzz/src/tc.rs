//! The TC datapath under `BPF_PROG_TEST_RUN`, for the `tc_packet` target: the embedded eBPF
//! object loaded once per process on its own maps (not pinned: nothing is shared with a daemon
//! or a test), one model behind one VIP with three backends, and the checks every packet's
//! result must pass.
//!
//! An input is a config byte and then packets, each a control byte, a 2-byte big-endian length
//! and that many bytes of Ethernet frame (fewer when the input ends first):
//! - config: bits 0-1 the mode (0 off, 1 and 3 masquerade, 2 routed), bit 2 client-address
//!   affinity, bit 3 a memory hint of 4,000 MB per remote connection, bit 4 a NAT port range of
//!   one port (so that a second flow to a backend finds none);
//! - control: bit 0 recompute both checksums before sending, bit 1 address the packet as the
//!   backend's answer to the last rewritten packet (its source and destination swapped), bit 2
//!   address it as the first rewritten packet was sent (the client's side of that flow again),
//!   bit 3 set the IPv4 total length to the frame's.
//!
//! The maps are emptied between inputs, so that one input alone reproduces what it found.

use std::net::Ipv4Addr;

use ailb_common::{
    maps, pick::VecMaps, programs, AffinityKey, AffinityValue, Backend, Flow, FlowKey, GlobalConfig, MemberChunk,
    ModelState, Service, ServiceKey, TableChunk, TcConfig, TcModel, TcStats, BACKEND_LIVE, FLOW_COUNT, FLOW_FORWARD,
    FLOW_REPLY, INFLIGHT_MEM_BASE, INFLIGHT_MODEL_BASE, MEMBER_CHUNK, MEM_UNKNOWN, NO_BACKEND, NO_CAP, TABLE_CHUNK,
    TC_AFFINITY_CLIENT_ADDR, TC_AFFINITY_NONE, TC_MODE_MASQUERADE, TC_MODE_OFF, TC_MODE_ROUTED,
};
use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, PerCpuValues},
    programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions},
    util::nr_cpus,
    Btf, Ebpf, EbpfLoader,
};

pub const ETH_HLEN: usize = 14;
pub const TC_ACT_SHOT: u32 = 2;
/// The shortest and the largest frame sent: `BPF_PROG_TEST_RUN` refuses (EINVAL) a TC program
/// a frame of no more than an Ethernet header, or of more than about a page; the largest is an
/// Ethernet MTU's.
pub const MIN_FRAME: usize = ETH_HLEN + 1;
pub const MAX_FRAME: usize = ETH_HLEN + 1500;
/// Frames shorter than an Ethernet and an IPv6 header, which the kernel may refuse as input.
const SHORT_FRAME: usize = ETH_HLEN + 40;
const EINVAL: i32 = 22;

pub const VIP: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 77, 0, 1), 8000);
pub const NAT: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
pub const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 66, 0, 2), 40000);
/// The model's backends: address, port, weight.
pub const BACKENDS: [(Ipv4Addr, u16, u32); 3] = [
    (Ipv4Addr::new(10, 99, 0, 11), 9001, 100),
    (Ipv4Addr::new(10, 99, 0, 12), 9002, 200),
    (Ipv4Addr::new(10, 99, 0, 13), 9003, 500),
];
/// The memory hint of config bit 3, MB.
pub const HINT_MB: u32 = 4000;

/// Why the programs cannot run here (no root, no BPF, no object embedded).
#[derive(Debug)]
pub struct Unavailable(pub String);

fn be_addr(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// The loaded programs and their maps.
pub struct Fixture {
    ebpf: Ebpf,
}

impl Fixture {
    /// Loads the embedded object and writes the model, or says why it cannot.
    pub fn load() -> Result<Self, Unavailable> {
        let object = ailb_userspace::datapath::load::object();
        if object.is_empty() {
            return Err(Unavailable("the eBPF object is not embedded: build it with `cargo xtask build`".into()));
        }
        let btf = Btf::from_sys_fs().ok();
        let mut ebpf = EbpfLoader::new()
            .btf(btf.as_ref())
            .load(object)
            .map_err(|e| Unavailable(format!("loading the eBPF object (root and BPF needed): {e}")))?;
        let p: &mut SchedClassifier = ebpf
            .program_mut(programs::TC_INGRESS)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| Unavailable(format!("no program {} in the object", programs::TC_INGRESS)))?;
        p.load().map_err(|e| Unavailable(format!("loading {}: {e}", programs::TC_INGRESS)))?;
        let mut f = Self { ebpf };
        f.write_model();
        Ok(f)
    }

    fn write_model(&mut self) {
        let backends: Vec<Backend> = BACKENDS
            .iter()
            .map(|&(addr, port, weight)| Backend {
                addr: be_addr(addr),
                port: port.to_be(),
                _pad: 0,
                model: 0,
                weight,
                cap: NO_CAP,
                free_mem_mb: MEM_UNKNOWN,
                state: BACKEND_LIVE,
                mem_capacity_mb: MEM_UNKNOWN,
            })
            .collect();
        let (vm, state) = VecMaps::one_model(0, 0, backends.clone());
        self.array::<GlobalConfig>(maps::CONFIG).set(0, GlobalConfig::defaults(), 0).expect("config");
        let mut b = self.array::<Backend>(maps::BACKENDS);
        for (i, be) in backends.iter().enumerate() {
            b.set(i as u32, be, 0).expect("backend");
        }
        let mut tables = self.array::<TableChunk>(maps::TABLES);
        for (i, part) in vm.table.chunks(TABLE_CHUNK as usize).enumerate() {
            let mut chunk = TableChunk { slots: [NO_BACKEND; TABLE_CHUNK as usize] };
            chunk.slots[..part.len()].copy_from_slice(part);
            tables.set(vm.table_offset / TABLE_CHUNK + i as u32, chunk, 0).expect("table");
        }
        let mut members = self.array::<MemberChunk>(maps::MEMBERS);
        for (i, part) in vm.members.chunks(MEMBER_CHUNK as usize).enumerate() {
            let mut chunk = MemberChunk { ids: [NO_BACKEND; MEMBER_CHUNK as usize] };
            chunk.ids[..part.len()].copy_from_slice(part);
            members.set(vm.member_offset / MEMBER_CHUNK + i as u32, chunk, 0).expect("members");
        }
        self.array::<ModelState>(maps::MODELS).set(0, state, 0).expect("model");
        let mut services: HashMap<_, ServiceKey, Service> =
            HashMap::try_from(self.ebpf.map_mut(maps::SERVICES).expect("services")).expect("services");
        let key = ServiceKey { addr: be_addr(VIP.0), port: VIP.1.to_be(), _pad: 0 };
        services.insert(key, Service { model: 0, flags: 0 }, 0).expect("service");
    }

    /// Sets the TC mode and model from an input's config byte.
    pub fn configure(&mut self, config: u8) {
        let mode = match config & 3 {
            0 => TC_MODE_OFF,
            2 => TC_MODE_ROUTED,
            _ => TC_MODE_MASQUERADE,
        };
        let affinity = if config & 4 != 0 { TC_AFFINITY_CLIENT_ADDR } else { TC_AFFINITY_NONE };
        let required_mem_mb = if config & 8 != 0 { HINT_MB } else { 0 };
        let port_max = if config & 16 != 0 { 20000 } else { 29999 };
        let cfg = TcConfig { mode, nat_addr: be_addr(NAT), port_min: 20000, port_max, _pad: 0, idle_timeout_ns: 0 };
        self.array::<TcConfig>(maps::TC_CONFIG).set(0, cfg, 0).expect("tc config");
        self.array::<TcModel>(maps::TC_MODELS).set(0, TcModel { required_mem_mb, affinity }, 0).expect("tc model");
    }

    /// Empties what packets write: flows, affinity, in-flight counters and the TC counters.
    pub fn reset(&mut self) {
        let mut flows: HashMap<_, FlowKey, Flow> =
            HashMap::try_from(self.ebpf.map_mut(maps::FLOWS).expect("flows")).expect("flows");
        let keys: Vec<FlowKey> = flows.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = flows.remove(&k);
        }
        let mut aff: HashMap<_, AffinityKey, AffinityValue> =
            HashMap::try_from(self.ebpf.map_mut(maps::AFFINITY).expect("affinity")).expect("affinity");
        let keys: Vec<AffinityKey> = aff.keys().filter_map(Result::ok).collect();
        for k in keys {
            let _ = aff.remove(&k);
        }
        let mut inflight = self.array::<u64>(maps::INFLIGHT);
        for i in counter_indices() {
            inflight.set(i, 0, 0).expect("inflight");
        }
        let cpus = nr_cpus().expect("number of CPUs");
        let zero = PerCpuValues::try_from(vec![TcStats::default(); cpus]).expect("per-CPU zeros");
        let mut stats: PerCpuArray<_, TcStats> =
            PerCpuArray::try_from(self.ebpf.map_mut(maps::TC_STATS).expect("tc stats")).expect("tc stats");
        stats.set(0, zero, 0).expect("tc stats");
    }

    fn array<V: aya::Pod>(&mut self, name: &str) -> Array<&mut MapData, V> {
        Array::try_from(self.ebpf.map_mut(name).unwrap_or_else(|| panic!("map {name}"))).expect(name)
    }

    /// Runs `ailb_tc_ingress` on `frame`: the verdict and the frame as the program left it.
    /// `None`: the kernel refused the frame as test input (EINVAL), which it does for a frame
    /// too short for the network header its ethertype names (6.18: IPv4 frames under 34 bytes,
    /// IPv6 under 54); a refusal of a longer frame, or any other error, is a failure.
    pub fn run(&self, frame: &[u8]) -> Option<(u32, Vec<u8>)> {
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions { data_in: Some(frame), data_out: Some(&mut out), ..TestRunOptions::new() };
        let p: &SchedClassifier =
            self.ebpf.program(programs::TC_INGRESS).and_then(|p| p.try_into().ok()).expect("the TC program");
        match p.test_run(opts) {
            Ok(res) => {
                out.truncate(res.data_size_out as usize);
                Some((res.return_value, out))
            }
            Err(ProgramError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(EINVAL) && frame.len() < SHORT_FRAME =>
            {
                None
            }
            Err(e) => panic!("BPF_PROG_TEST_RUN of ailb_tc_ingress on {} bytes: {e:?}", frame.len()),
        }
    }

    pub fn flows(&self) -> Vec<(FlowKey, Flow)> {
        let m: HashMap<_, FlowKey, Flow> =
            HashMap::try_from(self.ebpf.map(maps::FLOWS).expect("flows")).expect("flows");
        m.iter().map(|r| r.expect("reading a flow")).collect()
    }

    pub fn inflight(&self, index: u32) -> u64 {
        let a: Array<_, u64> = Array::try_from(self.ebpf.map(maps::INFLIGHT).expect("inflight")).expect("inflight");
        a.get(&index, 0).expect("inflight")
    }

    pub fn tc_stats(&self) -> TcStats {
        let a: PerCpuArray<_, TcStats> =
            PerCpuArray::try_from(self.ebpf.map(maps::TC_STATS).expect("tc stats")).expect("tc stats");
        let mut total = TcStats::default();
        for s in a.get(&0, 0).expect("tc stats").iter() {
            total.merge(s);
        }
        total
    }

    /// The flow table and the counters agree: every forward entry has its reply entry and the
    /// reverse, every count entry its forward entry, and the in-flight counters (per backend,
    /// of the model, memory) and the TC counters count exactly the flows with a count entry.
    /// Returns the TC counters and the number of flow entries.
    pub fn check_flows(&self) -> (TcStats, usize) {
        let flows = self.flows();
        let get = |k: &FlowKey| flows.iter().find(|(key, _)| key == k).map(|(_, f)| *f);
        let mut per_backend = [0u64; BACKENDS.len()];
        let mut mem = [0u64; BACKENDS.len()];
        let mut counted = 0u64;
        for (k, f) in &flows {
            assert!((f.backend as usize) < BACKENDS.len(), "flow {k:?} names backend {}: {flows:?}", f.backend);
            match k.kind {
                FLOW_FORWARD => {
                    let r = get(&f.peer).unwrap_or_else(|| panic!("forward {k:?} without its reply: {flows:?}"));
                    assert_eq!((f.peer.kind, r.peer, r.backend), (FLOW_REPLY, *k, f.backend), "{flows:?}");
                }
                FLOW_REPLY => {
                    let fw = get(&f.peer).unwrap_or_else(|| panic!("reply {k:?} without its forward: {flows:?}"));
                    assert_eq!((f.peer.kind, fw.peer), (FLOW_FORWARD, *k), "{flows:?}");
                }
                FLOW_COUNT => {
                    let fw = get(&FlowKey { kind: FLOW_FORWARD, ..*k })
                        .unwrap_or_else(|| panic!("count {k:?} without its forward entry: {flows:?}"));
                    counted += 1;
                    per_backend[fw.backend as usize] += 1;
                    mem[fw.backend as usize] += u64::from(fw.counted_mem_mb);
                }
                other => panic!("flow entry of kind {other}: {k:?}"),
            }
        }
        for id in 0..BACKENDS.len() as u32 {
            let i = id as usize;
            assert_eq!(self.inflight(id), per_backend[i], "backend {id} in flight vs its counted flows: {flows:?}");
            assert_eq!(self.inflight(INFLIGHT_MEM_BASE + id), mem[i], "backend {id} memory in flight: {flows:?}");
        }
        assert_eq!(self.inflight(INFLIGHT_MODEL_BASE), counted, "the model's in flight vs counted flows: {flows:?}");
        let s = self.tc_stats();
        let open = s.flows_opened.checked_sub(s.flows_closed + s.flows_reclaimed);
        assert_eq!(open, Some(counted), "opened - closed - reclaimed vs counted flows: {s:?} {flows:?}");
        (s, flows.len())
    }
}

/// The in-flight counter indices the model's packets can touch.
fn counter_indices() -> impl Iterator<Item = u32> {
    let n = BACKENDS.len() as u32;
    (0..n).chain([INFLIGHT_MODEL_BASE]).chain(INFLIGHT_MEM_BASE..INFLIGHT_MEM_BASE + n)
}

/// One's-complement of the one's-complement sum of `bytes` as big-endian 16-bit words (RFC
/// 1071); 0 over a header whose checksum field is right.
pub fn ones_complement(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An IPv4 / TCP frame's layout, when its headers are whole within it.
#[derive(Clone, Copy, Debug)]
pub struct Layout {
    /// IPv4 header length, bytes.
    pub ihl: usize,
    /// IPv4 total length.
    pub tot_len: usize,
    /// The protocol is TCP and its header lies within the total length and the frame.
    pub tcp: bool,
}

pub fn layout(f: &[u8]) -> Option<Layout> {
    if f.len() < ETH_HLEN + 20 || f[12..14] != [0x08, 0x00] || f[ETH_HLEN] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(f[ETH_HLEN] & 0xf) * 4;
    if ihl < 20 || ETH_HLEN + ihl > f.len() {
        return None;
    }
    let tot_len = usize::from(u16::from_be_bytes([f[ETH_HLEN + 2], f[ETH_HLEN + 3]]));
    let tcp = f[ETH_HLEN + 9] == 6 && tot_len >= ihl + 20 && ETH_HLEN + tot_len <= f.len();
    Some(Layout { ihl, tot_len, tcp })
}

/// The TCP checksum over the pseudo-header and segment, with the checksum field as it is.
fn tcp_sum(f: &[u8], l: Layout) -> u16 {
    let ip = &f[ETH_HLEN..];
    let segment = &ip[l.ihl..l.tot_len];
    let mut pseudo = Vec::with_capacity(12 + segment.len());
    pseudo.extend_from_slice(&ip[12..20]);
    pseudo.extend_from_slice(&[0, ip[9]]);
    pseudo.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    pseudo.extend_from_slice(segment);
    ones_complement(&pseudo)
}

/// Whether the IPv4 header checksum and the TCP checksum verify (`None`: no such header).
pub fn checksums(f: &[u8]) -> (Option<bool>, Option<bool>) {
    let Some(l) = layout(f) else { return (None, None) };
    let ip = ones_complement(&f[ETH_HLEN..ETH_HLEN + l.ihl]) == 0;
    (Some(ip), l.tcp.then(|| tcp_sum(f, l) == 0))
}

/// Recomputes both checksums where the headers allow.
pub fn fix_checksums(f: &mut [u8]) {
    let Some(l) = layout(f) else { return };
    if l.tcp {
        let at = ETH_HLEN + l.ihl + 16;
        f[at..at + 2].fill(0);
        let c = tcp_sum(f, l);
        f[at..at + 2].copy_from_slice(&c.to_be_bytes());
    }
    f[ETH_HLEN + 10..ETH_HLEN + 12].fill(0);
    let c = ones_complement(&f[ETH_HLEN..ETH_HLEN + l.ihl]);
    f[ETH_HLEN + 10..ETH_HLEN + 12].copy_from_slice(&c.to_be_bytes());
}

/// Sets the IPv4 total length to what the frame holds.
pub fn fit_total_length(f: &mut [u8]) {
    if layout(f).is_some() {
        let len = (f.len() - ETH_HLEN).min(usize::from(u16::MAX)) as u16;
        f[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&len.to_be_bytes());
    }
}

/// ((source, port), (destination, port)) of an IPv4 frame whose transport ports are in it.
pub fn endpoints(f: &[u8]) -> Option<((Ipv4Addr, u16), (Ipv4Addr, u16))> {
    let l = layout(f)?;
    let t = ETH_HLEN + l.ihl;
    if t + 4 > f.len() {
        return None;
    }
    let addr = |o: usize| Ipv4Addr::new(f[o], f[o + 1], f[o + 2], f[o + 3]);
    let port = |o: usize| u16::from_be_bytes([f[o], f[o + 1]]);
    Some(((addr(ETH_HLEN + 12), port(t)), (addr(ETH_HLEN + 16), port(t + 2))))
}

/// Writes `src` and `dst` into an IPv4 frame whose ports are in it.
pub fn set_endpoints(f: &mut [u8], src: (Ipv4Addr, u16), dst: (Ipv4Addr, u16)) {
    let Some(l) = layout(f) else { return };
    let t = ETH_HLEN + l.ihl;
    if t + 4 > f.len() {
        return;
    }
    f[ETH_HLEN + 12..ETH_HLEN + 16].copy_from_slice(&src.0.octets());
    f[ETH_HLEN + 16..ETH_HLEN + 20].copy_from_slice(&dst.0.octets());
    f[t..t + 2].copy_from_slice(&src.1.to_be_bytes());
    f[t + 2..t + 4].copy_from_slice(&dst.1.to_be_bytes());
}

/// The bytes a rewrite may change: the MAC addresses (a FIB answer), the TTL (forwarding), the
/// IPv4 checksum and addresses, the TCP ports and checksum.
pub fn rewritable(l: Layout) -> impl Fn(usize) -> bool {
    let t = ETH_HLEN + l.ihl;
    move |i| {
        i < 12
            || i == ETH_HLEN + 8
            || (ETH_HLEN + 10..ETH_HLEN + 20).contains(&i)
            || (t..t + 4).contains(&i)
            || (t + 16..t + 18).contains(&i)
    }
}

/// Which outcomes a packet had, each as a branch of its own: libFuzzer's coverage sees this
/// process's code only, not the program's in the kernel, so without this an input that reaches
/// a new verdict or counter (a full NAT range, a refused pick, a close) would look like nothing new.
pub fn outcome_branches(before: &TcStats, after: &TcStats, verdict: u32, rewritten: bool, entries: usize) {
    use std::hint::black_box;
    let moved = [
        after.flows_opened > before.flows_opened,
        after.flows_closed > before.flows_closed,
        after.flows_reclaimed > before.flows_reclaimed,
        after.flows_full > before.flows_full,
        after.nat_exhausted > before.nat_exhausted,
        after.refused > before.refused,
        after.malformed > before.malformed,
        after.redirected > before.redirected,
        after.to_stack > before.to_stack,
    ];
    for (i, m) in moved.into_iter().enumerate() {
        if m {
            black_box(i);
        }
    }
    match verdict {
        0 => black_box(100),
        TC_ACT_SHOT => black_box(102),
        _ => black_box(199),
    };
    if rewritten {
        black_box(200);
    }
    match entries {
        0 => black_box(300),
        1..=3 => black_box(301),
        4..=6 => black_box(302),
        _ => black_box(303),
    };
}
