//! A fixture for the TC programs: the embedded object loaded on its own maps (not pinned,
//! so nothing is shared with a daemon or another test), one model behind one VIP, and the
//! programs run on frames with `BPF_PROG_TEST_RUN`.

use std::net::{Ipv4Addr, Ipv6Addr};

use ailb_common::{
    maps, pick::VecMaps, programs, Backend, BackendAddr6, Flow, Flow6, FlowKey, FlowKey6, GlobalConfig, MemberChunk,
    ModelState, Service, ServiceKey, ServiceKey6, TableChunk, TcConfig, TcConfig6, TcModel, TcStats, BACKEND_IPV6,
    BACKEND_LIVE, INFLIGHT_MEM_BASE, INFLIGHT_MODEL_BASE, MEMBER_CHUNK, MEM_UNKNOWN, NO_BACKEND, NO_CAP, TABLE_CHUNK,
};
use aya::{
    maps::{Array, HashMap, PerCpuArray},
    programs::{SchedClassifier, TestRun, TestRunOptions},
    Btf, Ebpf, EbpfLoader,
};

pub(crate) const TC_ACT_OK: u32 = 0;
pub(crate) const TC_ACT_SHOT: u32 = 2;

pub(crate) const VIP: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 77, 0, 1), 8000);
pub(crate) const NAT: Ipv4Addr = Ipv4Addr::new(10, 88, 0, 1);
#[allow(dead_code, reason = "each test binary uses one family's constants")]
pub(crate) const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(10, 66, 0, 2), 40000);

pub(crate) const VIP6: (Ipv6Addr, u16) = (Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, 0, 1), 8000);
pub(crate) const NAT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x88, 0, 0, 0, 0, 0, 1);
#[allow(dead_code, reason = "each test binary uses one family's constants")]
pub(crate) const CLIENT6: (Ipv6Addr, u16) = (Ipv6Addr::new(0xfd00, 0x66, 0, 0, 0, 0, 0, 2), 40000);
pub(crate) const NAT6_WORDS: [u32; 4] = words6(NAT6);

pub(crate) fn be_addr(a: Ipv4Addr) -> u32 {
    u32::from_ne_bytes(a.octets())
}

/// An IPv6 address as the maps hold it: the 16 bytes in network order as four words.
pub(crate) const fn words6(a: Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    [
        u32::from_ne_bytes([o[0], o[1], o[2], o[3]]),
        u32::from_ne_bytes([o[4], o[5], o[6], o[7]]),
        u32::from_ne_bytes([o[8], o[9], o[10], o[11]]),
        u32::from_ne_bytes([o[12], o[13], o[14], o[15]]),
    ]
}

/// How a fixture's model and TC settings are set up.
pub(crate) struct Setup {
    pub(crate) mode: u32,
    pub(crate) ports: (u16, u16),
    pub(crate) backends: Vec<(Ipv4Addr, u16, u32)>,
    /// IPv6 backends, with the ids after `backends`.
    pub(crate) backends6: Vec<(Ipv6Addr, u16, u32)>,
    pub(crate) tc_model: TcModel,
    pub(crate) idle_timeout_ns: u64,
}

impl Setup {
    pub(crate) fn new(mode: u32, backends: &[(Ipv4Addr, u16, u32)]) -> Self {
        Self {
            mode,
            ports: (20000, 29999),
            backends: backends.to_vec(),
            backends6: Vec::new(),
            tc_model: TcModel::default(),
            idle_timeout_ns: 0,
        }
    }
}

pub(crate) struct Fixture {
    pub(crate) ebpf: Ebpf,
}

impl Fixture {
    pub(crate) fn new(setup: &Setup) -> Self {
        ailb_tests::require_root();
        let object = ailb_userspace::datapath::load::object();
        assert!(!object.is_empty(), "the eBPF object is not embedded: build it with `cargo xtask build`");
        let btf = Btf::from_sys_fs().ok();
        let mut ebpf = EbpfLoader::new().btf(btf.as_ref()).load(object).expect("load the eBPF object");
        for name in [programs::TC_INGRESS, programs::TC_RECLAIM] {
            let p: &mut SchedClassifier = ebpf.program_mut(name).expect(name).try_into().expect(name);
            p.load().unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        }
        // The daemon's own step: the IPv6 program into the slot the ingress program tail-calls.
        ailb_userspace::datapath::tc::load_ingress6(&mut ebpf)
            .unwrap_or_else(|e| panic!("{}: {e:?}", programs::TC_INGRESS6));
        let mut f = Self { ebpf };
        f.write_model(setup);
        f
    }

    fn write_model(&mut self, setup: &Setup) {
        let entry = |addr, port: u16, weight, state| Backend {
            addr,
            port: port.to_be(),
            _pad: 0,
            model: 0,
            weight,
            cap: NO_CAP,
            free_mem_mb: MEM_UNKNOWN,
            state,
            mem_capacity_mb: MEM_UNKNOWN,
        };
        let mut backends: Vec<Backend> = setup
            .backends
            .iter()
            .map(|&(addr, port, weight)| entry(be_addr(addr), port, weight, BACKEND_LIVE))
            .collect();
        backends.extend(
            setup.backends6.iter().map(|&(_, port, weight)| entry(0, port, weight, BACKEND_LIVE | BACKEND_IPV6)),
        );
        let mut addrs6 = self.array::<BackendAddr6>(maps::BACKEND_ADDRS6);
        for (i, b) in setup.backends6.iter().enumerate() {
            addrs6.set((setup.backends.len() + i) as u32, BackendAddr6 { addr: words6(b.0) }, 0).unwrap();
        }
        let (vm, state) = VecMaps::one_model(0, 0, backends.clone());
        let gc = GlobalConfig::defaults();
        self.array::<GlobalConfig>(maps::CONFIG).set(0, gc, 0).unwrap();
        let mut b = self.array::<Backend>(maps::BACKENDS);
        for (i, be) in backends.iter().enumerate() {
            b.set(i as u32, be, 0).unwrap();
        }
        // The one model's table and members at the arena positions `VecMaps::one_model` gave.
        let mut tables = self.array::<TableChunk>(maps::TABLES);
        for (i, part) in vm.table.chunks(TABLE_CHUNK as usize).enumerate() {
            let mut chunk = TableChunk { slots: [NO_BACKEND; TABLE_CHUNK as usize] };
            chunk.slots[..part.len()].copy_from_slice(part);
            tables.set(vm.table_offset / TABLE_CHUNK + i as u32, chunk, 0).unwrap();
        }
        let mut members = self.array::<MemberChunk>(maps::MEMBERS);
        for (i, part) in vm.members.chunks(MEMBER_CHUNK as usize).enumerate() {
            let mut chunk = MemberChunk { ids: [NO_BACKEND; MEMBER_CHUNK as usize] };
            chunk.ids[..part.len()].copy_from_slice(part);
            members.set(vm.member_offset / MEMBER_CHUNK + i as u32, chunk, 0).unwrap();
        }
        self.array::<ModelState>(maps::MODELS).set(0, state, 0).unwrap();
        self.array::<TcModel>(maps::TC_MODELS).set(0, setup.tc_model, 0).unwrap();
        let mut services: HashMap<_, ServiceKey, Service> =
            HashMap::try_from(self.ebpf.map_mut(maps::SERVICES).unwrap()).unwrap();
        let key = ServiceKey { addr: be_addr(VIP.0), port: VIP.1.to_be(), _pad: 0 };
        services.insert(key, Service { model: 0, flags: 0 }, 0).unwrap();
        let mut services6: HashMap<_, ServiceKey6, Service> =
            HashMap::try_from(self.ebpf.map_mut(maps::SERVICES6).unwrap()).unwrap();
        let key = ServiceKey6 { addr: words6(VIP6.0), port: VIP6.1.to_be(), _pad: 0 };
        services6.insert(key, Service { model: 0, flags: 0 }, 0).unwrap();
        self.set_tc_config(setup.mode, setup.ports, setup.idle_timeout_ns);
    }

    pub(crate) fn set_tc_config(&mut self, mode: u32, ports: (u16, u16), idle_timeout_ns: u64) {
        self.set_tc_config_nat6(mode, ports, idle_timeout_ns, NAT6_WORDS);
    }

    /// [`Self::set_tc_config`] with the IPv6 NAT address `nat_addr6` (all zero: none).
    pub(crate) fn set_tc_config_nat6(
        &mut self,
        mode: u32,
        ports: (u16, u16),
        idle_timeout_ns: u64,
        nat_addr6: [u32; 4],
    ) {
        let cfg =
            TcConfig { mode, nat_addr: be_addr(NAT), port_min: ports.0, port_max: ports.1, _pad: 0, idle_timeout_ns };
        self.array::<TcConfig>(maps::TC_CONFIG).set(0, cfg, 0).unwrap();
        self.array::<TcConfig6>(maps::TC_CONFIG6).set(0, TcConfig6 { nat_addr6 }, 0).unwrap();
    }

    fn array<V: aya::Pod>(&mut self, name: &str) -> Array<&mut aya::maps::MapData, V> {
        Array::try_from(self.ebpf.map_mut(name).unwrap_or_else(|| panic!("map {name}"))).unwrap()
    }

    fn program(&self, name: &str) -> &SchedClassifier {
        self.ebpf.program(name).expect(name).try_into().expect(name)
    }

    /// Runs `ailb_tc_ingress` on `frame`: the verdict and the frame as the program left it.
    pub(crate) fn run(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; frame.len() + 256];
        let opts = TestRunOptions { data_in: Some(frame), data_out: Some(&mut out), ..TestRunOptions::new() };
        let res = self
            .program(programs::TC_INGRESS)
            .test_run(opts)
            .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN of ailb_tc_ingress on {} bytes: {e:?}", frame.len()));
        out.truncate(res.data_size_out as usize);
        (res.return_value, out)
    }

    /// Runs `ailb_tc_reclaim`: the number of flows it removed.
    pub(crate) fn reclaim(&self) -> u32 {
        let frame = [0u8; 64];
        let opts = TestRunOptions { data_in: Some(&frame), ..TestRunOptions::new() };
        self.program(programs::TC_RECLAIM).test_run(opts).expect("BPF_PROG_TEST_RUN of ailb_tc_reclaim").return_value
    }

    pub(crate) fn flows(&self) -> Vec<(FlowKey, Flow)> {
        let m: HashMap<_, FlowKey, Flow> = HashMap::try_from(self.ebpf.map(maps::FLOWS).unwrap()).unwrap();
        m.iter().map(|r| r.unwrap()).collect()
    }

    #[allow(dead_code, reason = "the IPv6 fixtures' reader")]
    pub(crate) fn flows6(&self) -> Vec<(FlowKey6, Flow6)> {
        let m: HashMap<_, FlowKey6, Flow6> = HashMap::try_from(self.ebpf.map(maps::FLOWS6).unwrap()).unwrap();
        m.iter().map(|r| r.unwrap()).collect()
    }

    pub(crate) fn inflight(&self, index: u32) -> u64 {
        let a: Array<_, u64> = Array::try_from(self.ebpf.map(maps::INFLIGHT).unwrap()).unwrap();
        a.get(&index, 0).unwrap()
    }

    /// (connections of backend `id`, of the model, memory hints of backend `id`).
    pub(crate) fn counts(&self, id: u32) -> (u64, u64, u64) {
        (self.inflight(id), self.inflight(INFLIGHT_MODEL_BASE), self.inflight(INFLIGHT_MEM_BASE + id))
    }

    pub(crate) fn tc_stats(&self) -> TcStats {
        let a: PerCpuArray<_, TcStats> = PerCpuArray::try_from(self.ebpf.map(maps::TC_STATS).unwrap()).unwrap();
        let mut total = TcStats::default();
        for s in a.get(&0, 0).unwrap().iter() {
            total.merge(s);
        }
        total
    }
}
