//! The floor under `ailb_tc_ingress`'s per-packet time on this machine: the reference programs
//! of `ailb-ebpf/src/tc_floor.rs` (nothing; the parse and flow lookups; and a FIB lookup; and
//! the rewrite's helper calls) attached in front of it on the gateway's tcx ingresses, so that
//! the kernel's BPF statistics time each on the same packets; and what the statistics
//! themselves add to a run (`BPF_PROG_TEST_RUN` of the empty program with them off and on).

use std::path::Path;

use ailb_common::{maps, Flow, FlowKey};
use anyhow::{anyhow, bail, Context, Result};
use aya::{
    maps::{HashMap, Map, MapData},
    programs::{links::LinkOrder, tc::TcAttachOptions, SchedClassifier, TcAttachType, TestRun, TestRunOptions},
    Btf, Ebpf, EbpfLoader,
};

use ailb_tests::remote::Gateway;

/// The reference programs, each the one before plus one stage.
pub(crate) const FLOORS: [(&str, &str); 4] = [
    ("ailb_tc_floor_pass", "empty program (returns at once)"),
    ("ailb_tc_floor_lookup", "parse (with the IPv4 header checksum) + the flow lookups"),
    ("ailb_tc_floor_fib", "+ the FIB lookup of the flow's destination"),
    ("ailb_tc_floor_rewrite", "+ the rewrite's checksum and store helpers (values written back unchanged)"),
];

/// The reference programs, loaded from the embedded object on maps of their own (the flow
/// map filled from the daemon's by [`Floors::copy_flows`]); attached while this lives.
pub(crate) struct Floors {
    ebpf: Ebpf,
}

impl Floors {
    pub(crate) fn load() -> Result<Self> {
        let object = ailb_userspace::datapath::load::object();
        if object.is_empty() {
            bail!("the eBPF object is not embedded: build it with `cargo xtask build`");
        }
        let btf = Btf::from_sys_fs().ok();
        // The arenas are not read by these programs: the smallest the loader accepts.
        let mut ebpf = EbpfLoader::new()
            .btf(btf.as_ref())
            .map_max_entries(maps::TABLES, 1)
            .map_max_entries(maps::MEMBERS, 1)
            .load(object)
            .context("loading the eBPF object for the reference programs")?;
        for (name, _) in FLOORS {
            classifier(&mut ebpf, name)?.load().with_context(|| format!("the verifier refused {name}"))?;
        }
        Ok(Self { ebpf })
    }

    /// Copies every entry of the daemon's pinned flow map (`AILB_FLOWS` under `bpffs`) into
    /// the reference programs' own, so that their lookups find the same flows.
    pub(crate) fn copy_flows(&mut self, bpffs: &Path) -> Result<usize> {
        let pin = bpffs.join(maps::FLOWS);
        let data = MapData::from_pin(&pin).with_context(|| format!("opening {}", pin.display()))?;
        let pinned: HashMap<_, FlowKey, Flow> = HashMap::try_from(Map::HashMap(data))?;
        let entries: Vec<(FlowKey, Flow)> = pinned.iter().collect::<Result<_, _>>()?;
        let map = self.ebpf.map_mut(maps::FLOWS).context("the object has no flow map")?;
        let mut own: HashMap<_, FlowKey, Flow> = HashMap::try_from(map)?;
        for (k, v) in &entries {
            own.insert(k, v, 0)?;
        }
        Ok(entries.len())
    }

    /// Attaches every reference program in front of the tcx chain of each of `gw`'s gateway
    /// interfaces (in the gateway namespace), the empty one first.
    pub(crate) fn attach(&mut self, gw: &Gateway) -> Result<()> {
        let path = gw.topo.gateway.path();
        let ifaces = gw.topo.gateway_ifaces.clone();
        let ebpf = &mut self.ebpf;
        std::thread::scope(|s| {
            s.spawn(move || -> Result<()> {
                super::enter(&path);
                for iface in &ifaces {
                    for (name, _) in FLOORS.iter().rev() {
                        classifier(ebpf, name)?
                            .attach_with_options(
                                iface,
                                TcAttachType::Ingress,
                                TcAttachOptions::TcxOrder(LinkOrder::first()),
                            )
                            .with_context(|| format!("attaching {name} to {iface}"))?;
                    }
                }
                Ok(())
            })
            .join()
            .map_err(|_| anyhow!("the attaching thread panicked"))?
        })
    }

    /// (run_cnt, run_time_ns) of each reference program, in [`FLOORS`] order.
    pub(crate) fn stats(&mut self) -> Result<Vec<(u64, u64)>> {
        FLOORS
            .iter()
            .map(|(name, _)| {
                let info = classifier(&mut self.ebpf, name)?.info()?;
                Ok((info.run_count(), info.run_time().as_nanos() as u64))
            })
            .collect()
    }

    /// ns per run of the empty program under `BPF_PROG_TEST_RUN` (`repeat` runs on a 64-byte
    /// frame, the kernel's average), with the BPF statistics as they are now.
    pub(crate) fn test_run_empty(&mut self, repeat: u32) -> Result<f64> {
        let frame = [0u8; 64];
        let opts = TestRunOptions { data_in: Some(&frame), repeat, ..TestRunOptions::new() };
        let res = classifier(&mut self.ebpf, FLOORS[0].0)?.test_run(opts).context("BPF_PROG_TEST_RUN")?;
        Ok(res.duration.as_nanos() as f64)
    }
}

fn classifier<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut SchedClassifier> {
    ebpf.program_mut(name)
        .with_context(|| format!("the eBPF object has no program {name} (rebuild it: `cargo xtask build`)"))?
        .try_into()
        .with_context(|| format!("{name} is not a sched_cls program"))
}
