//! Program names (ELF section functions); links are pinned under `links/<name>`.

pub const CONNECT4: &str = "ailb_connect4";
/// `cgroup/connect6`: IPv6 sockets, to IPv6 VIPs and (v4-mapped) to IPv4 VIPs.
pub const CONNECT6: &str = "ailb_connect6";
pub const SETSOCKOPT: &str = "ailb_setsockopt";
pub const SOCKOPS: &str = "ailb_sockops";
/// The cgroup programs, attached by links pinned under `links/<name>`.
pub const ALL: [&str; 4] = [CONNECT4, CONNECT6, SETSOCKOPT, SOCKOPS];
/// `sched_cls` on the ingress of each `[daemon] interfaces` entry: remote clients' flows.
/// Its links are pinned under `links/tc-<interface>`.
pub const TC_INGRESS: &str = "ailb_tc_ingress";
/// `sched_cls`, never attached: the daemon's housekeeping runs it (`BPF_PROG_TEST_RUN`)
/// to reclaim idle flows in the kernel, where the counters' atomic adds are. Pinned under
/// `progs/<name>`.
pub const TC_RECLAIM: &str = "ailb_tc_reclaim";
/// `sched_cls`, never attached: `ailb_tc_ingress` tail-calls it for IPv6 frames (slot
/// `TC_PROG_IPV6` of `AILB_TC_PROGS`).
pub const TC_INGRESS6: &str = "ailb_tc_ingress6";
pub const TC: [&str; 3] = [TC_INGRESS, TC_INGRESS6, TC_RECLAIM];
