//! Where the fleet's slots went during a phase: a sampler that every [`EVERY`] reads each
//! server's running and queued sequences (`GET /sim/state`), the kernel's in-flight count and
//! hinted memory per backend (the pinned `AILB_INFLIGHT`, for ailb's rows) and the bench's own
//! count of requests sent and not yet answered whole, and what those samples add up to.
//!
//! The router holds what was sent and is at no server: `outstanding - sum(running + queued)`
//! (requests waiting in its admission, or on their way to a server, or their answers on their
//! way back). A slot idle while the router holds a request is capacity the router left unused;
//! a server queueing while the other has a free slot is capacity its placement left unused.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ailb_common::{maps, INFLIGHT_MEM_BASE};
use aya::maps::{Array, Map, MapData};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Time between samples: short against a request's 0.8 s, and two small reads of each server.
pub(super) const EVERY: Duration = Duration::from_millis(10);

/// One sample, per server in the order of the bench's backends.
#[derive(Debug, Clone, Default)]
pub(super) struct Sample {
    pub running: Vec<u64>,
    pub queued: Vec<u64>,
    /// The kernel's connections in flight and their hinted MB (`None`: not read, the peer's
    /// rows).
    pub kernel: Option<Vec<(u64, u64)>>,
    /// Requests sent and not yet answered whole.
    pub outstanding: u64,
}

/// The kernel's counters of the backends, by id in the order of the bench's backends.
pub(super) struct KernelView {
    map: Array<MapData, u64>,
    ids: Vec<u32>,
}

impl KernelView {
    /// The pinned counters under `bpffs` for backends `ids`; `None` when not readable.
    pub(super) fn open(bpffs: &Path, ids: Vec<u32>) -> Option<Self> {
        let md = MapData::from_pin(bpffs.join(maps::INFLIGHT)).ok()?;
        let map = Map::from_map_data(md).ok()?.try_into().ok()?;
        Some(Self { map, ids })
    }

    fn read(&self) -> Option<Vec<(u64, u64)>> {
        self.ids
            .iter()
            .map(|&id| Some((self.map.get(&id, 0).ok()?, self.map.get(&(INFLIGHT_MEM_BASE + id), 0).ok()?)))
            .collect()
    }
}

/// `(running, waiting)` of the simulated server at `addr`.
async fn sim_state(addr: &str) -> Option<(u64, u64)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(b"GET /sim/state HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n").await.ok()?;
    let mut raw = Vec::with_capacity(1024);
    s.read_to_end(&mut raw).await.ok()?;
    let at = raw.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let v: serde_json::Value = serde_json::from_slice(&raw[at..]).ok()?;
    Some((v["running"].as_u64()?, v["waiting"].as_u64()?))
}

/// Samples `servers` (and `kernel`) every [`EVERY`] until `stop`.
pub(super) async fn run(
    servers: &'static [&'static str],
    kernel: Option<Arc<KernelView>>,
    outstanding: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let mut tick = tokio::time::interval(EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let kernel_before = kernel.as_ref().and_then(|k| k.read());
        let reads: Vec<_> = servers.iter().map(|a| tokio::spawn(sim_state(a))).collect();
        let mut states = Vec::with_capacity(reads.len());
        for r in reads {
            states.push(r.await.ok().flatten());
        }
        let Some(states) = states.into_iter().collect::<Option<Vec<_>>>() else { continue };
        out.push(Sample {
            running: states.iter().map(|s| s.0).collect(),
            queued: states.iter().map(|s| s.1).collect(),
            kernel: kernel_before,
            outstanding: outstanding.load(Ordering::Relaxed),
        });
    }
    out
}

/// What the samples add up to; each a share of the phase's sampled time unless named otherwise.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Summary {
    pub samples: usize,
    /// Mean sequences running, over the fleet's slots.
    pub busy: f64,
    /// Time with a free slot in the fleet while the router held a request.
    pub idle_while_held: f64,
    /// Mean slots idle that a held request could have taken (`min(free, held)`), slots.
    pub idle_slots_while_held: f64,
    /// Time with a server queueing while another had a free slot.
    pub queued_beside_room: f64,
    /// Mean requests queued at a server that another's free slots could have run, slots.
    pub queued_slots_beside_room: f64,
    /// Mean requests held by the router.
    pub held: f64,
    /// Mean requests queued at the servers.
    pub queued: f64,
    /// Mean of the kernel's in-flight count less the servers' running and queued, per backend
    /// summed (`None`: not read): what the kernel counts that no server holds.
    pub kernel_excess: Option<f64>,
    /// Time with the kernel's hinted memory at the fleet's limit while a slot was free.
    pub kernel_full_slot_free: Option<f64>,
}

/// Sums up `samples` of a fleet of servers with `per_server` slots each, `mem_limit_mb` of
/// hinted memory in all.
pub(super) fn summarize(samples: &[Sample], per_server: u64, mem_limit_mb: u64, need_mb: u64) -> Summary {
    let n = samples.len();
    if n == 0 {
        return Summary::default();
    }
    let mut s = Summary { samples: n, ..Summary::default() };
    let (mut excess, mut kernel_n, mut kernel_full) = (0.0, 0usize, 0usize);
    for x in samples {
        let servers = x.running.len() as u64;
        let running: u64 = x.running.iter().sum();
        let at_servers = running + x.queued.iter().sum::<u64>();
        let held = x.outstanding.saturating_sub(at_servers);
        let free = (per_server * servers).saturating_sub(running);
        s.busy += running as f64 / (per_server * servers) as f64;
        s.held += held as f64;
        s.queued += (at_servers - running) as f64;
        if free > 0 && held > 0 {
            s.idle_while_held += 1.0;
            s.idle_slots_while_held += free.min(held) as f64;
        }
        let room: u64 = x.running.iter().map(|&r| per_server.saturating_sub(r)).sum();
        let beside =
            x.queued.iter().zip(&x.running).map(|(&q, &r)| q.min(room - per_server.saturating_sub(r))).sum::<u64>();
        if beside > 0 {
            s.queued_beside_room += 1.0;
            s.queued_slots_beside_room += beside as f64;
        }
        if let Some(k) = &x.kernel {
            kernel_n += 1;
            let counted: u64 = k.iter().map(|c| c.0).sum();
            excess += counted as f64 - at_servers as f64;
            let mem: u64 = k.iter().map(|c| c.1).sum();
            if free > 0 && mem + need_mb > mem_limit_mb {
                kernel_full += 1;
            }
        }
    }
    let n = n as f64;
    for v in [
        &mut s.busy,
        &mut s.held,
        &mut s.queued,
        &mut s.idle_while_held,
        &mut s.idle_slots_while_held,
        &mut s.queued_beside_room,
        &mut s.queued_slots_beside_room,
    ] {
        *v /= n;
    }
    if kernel_n > 0 {
        s.kernel_excess = Some(excess / kernel_n as f64);
        s.kernel_full_slot_free = Some(kernel_full as f64 / kernel_n as f64);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(running: [u64; 2], queued: [u64; 2], outstanding: u64, kernel: Option<[(u64, u64); 2]>) -> Sample {
        Sample { running: running.to_vec(), queued: queued.to_vec(), kernel: kernel.map(|k| k.to_vec()), outstanding }
    }

    #[test]
    fn idle_slots_while_the_router_holds_requests() {
        // 7 running, 2 held: one slot idle that a held request could take; then all busy.
        let s = summarize(&[at([4, 3], [0, 0], 9, None), at([4, 4], [0, 0], 8, None)], 4, 2000, 250);
        assert_eq!(s.samples, 2);
        assert!((s.busy - 15.0 / 16.0).abs() < 1e-9);
        assert!((s.idle_while_held - 0.5).abs() < 1e-9);
        assert!((s.idle_slots_while_held - 0.5).abs() < 1e-9);
        assert!((s.held - 1.0).abs() < 1e-9);
        assert_eq!(s.queued_beside_room, 0.0);
        assert_eq!(s.kernel_excess, None);
    }

    #[test]
    fn a_server_queueing_beside_a_free_slot() {
        // Server 0 runs 4 and queues 2 while server 1 runs 2: both queued could run there.
        let s = summarize(&[at([4, 2], [2, 0], 8, Some([(6, 1500), (2, 500)]))], 4, 2000, 250);
        assert_eq!(s.queued_beside_room, 1.0);
        assert_eq!(s.queued_slots_beside_room, 2.0);
        assert_eq!(s.idle_while_held, 0.0);
        assert_eq!(s.kernel_excess, Some(0.0));
        // The two queued hold their memory: the fleet's limit is reached with two slots free.
        assert_eq!(s.kernel_full_slot_free, Some(1.0));
        // Queued at the server that has its own room counts nothing (it is starting).
        let s = summarize(&[at([3, 4], [1, 0], 8, None)], 4, 2000, 250);
        assert_eq!(s.queued_beside_room, 0.0);
    }

    #[test]
    fn the_kernel_counting_a_finished_request() {
        // The servers run 7; the kernel still counts 8 (2000 MB): the admission sees no room.
        let s = summarize(&[at([4, 3], [0, 0], 8, Some([(4, 1000), (4, 1000)]))], 4, 2000, 250);
        assert_eq!(s.kernel_excess, Some(1.0));
        assert_eq!(s.kernel_full_slot_free, Some(1.0));
        assert_eq!(s.idle_while_held, 1.0);
    }
}
