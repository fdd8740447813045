//! The TC datapath's map layouts: remote clients (on another host) reach a VIP through an
//! interface of the gateway, where `ailb_tc_ingress` runs the same pick as `connect4` on
//! each TCP SYN, keeps the flow in `AILB_FLOWS` and rewrites its packets both ways.
//!
//! A flow is three entries of `AILB_FLOWS` ([`FlowKey::kind`]):
//! * [`FLOW_FORWARD`], keyed by the packet as the client sends it (client -> VIP): the
//!   rewrite to the backend (and, masquerading, from the gateway's NAT address and port);
//! * [`FLOW_REPLY`], keyed by the reply as the backend sends it (backend -> NAT address and
//!   port, or -> client when routed): the rewrite back to VIP -> client;
//! * [`FLOW_COUNT`], keyed like the forward entry: it exists while the flow is counted in
//!   `AILB_INFLIGHT`. Whoever deletes it (the first FIN or RST, or the idle reclaim) uncounts
//!   the flow; a hash map delete succeeds for one caller only, so the counters come back
//!   exactly, without an atomic compare-and-swap (which the generic BPF CPU lacks).
//!
//! `AILB_FLOWS` is a plain hash map, not an LRU: an LRU would evict a flow's entries
//! silently, leaving its in-flight count behind forever. When it is full, a new SYN is
//! dropped (counted in [`TcStats::flows_full`]) and established flows go on.

/// Flows `AILB_FLOWS` can hold (three entries each).
pub const MAX_FLOWS: u32 = 32_768;
/// `AILB_FLOWS` entries.
pub const FLOW_ENTRIES: u32 = 3 * MAX_FLOWS;
/// IPv6 flows `AILB_FLOWS6` can hold (three entries each, as in `AILB_FLOWS`).
pub const MAX_FLOWS6: u32 = 32_768;
/// `AILB_FLOWS6` entries.
pub const FLOW6_ENTRIES: u32 = 3 * MAX_FLOWS6;
/// NAT ports tried for one new flow (masquerade) before its SYN is dropped: with a port range
/// a fraction `u` in use towards one backend, a SYN fails with probability `u^NAT_PROBES`.
pub const NAT_PROBES: u32 = 16;

/// Slots of `AILB_TC_PROGS`, the programs `ailb_tc_ingress` tail-calls.
pub const TC_PROGS: u32 = 1;
/// `AILB_TC_PROGS` slot of `ailb_tc_ingress6` (IPv6 frames).
pub const TC_PROG_IPV6: u32 = 0;

/// [`FlowKey::kind`]: the client's side of a flow.
pub const FLOW_FORWARD: u32 = 1;
/// [`FlowKey::kind`]: the backend's side of a flow.
pub const FLOW_REPLY: u32 = 2;
/// [`FlowKey::kind`]: the flow is counted in flight (same addresses as the forward key).
pub const FLOW_COUNT: u32 = 3;

/// `AILB_FLOWS` key: a packet's addresses and ports as it arrives (network byte order).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub src_addr: u32,
    pub dst_addr: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub kind: u32,
}

/// `AILB_FLOWS6` key: an IPv6 packet's addresses (the 16 bytes as four words, as
/// [`super::ServiceKey6::addr`]) and ports as it arrives, network byte order. IPv6 flows have
/// their own map so that an IPv4 flow's key stays 16 bytes (hashed on every IPv4 packet) and
/// its entry 56.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey6 {
    pub src_addr: [u32; 4],
    pub dst_addr: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub kind: u32,
}

/// `AILB_FLOWS6` value: [`Flow`] with IPv6 addresses.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow6 {
    pub src_addr: [u32; 4],
    pub dst_addr: [u32; 4],
    pub src_port: u16,
    pub dst_port: u16,
    pub backend: u32,
    pub model: u32,
    pub counted_mem_mb: u32,
    pub flags: u32,
    pub _pad: u32,
    pub last_seen_ns: u64,
    pub peer: FlowKey6,
}

/// The client sent a FIN on this flow. Each side's flag is the low bit of a byte of its own
/// (byte [`flow_fin_byte`] of `flags`, little-endian), so that each side sets it with a one-byte
/// store: FINs of both sides handled on two CPUs at once both stay, where a read-modify-write
/// of the whole word could keep one (the flow would then wait for the idle reclaim).
pub const FLOW_FIN_CLIENT: u32 = 1;
/// The backend sent a FIN on this flow (its own byte, as [`FLOW_FIN_CLIENT`]).
pub const FLOW_FIN_BACKEND: u32 = 1 << 8;

/// The byte of a flow's `flags` (little-endian: byte 0 is bits 0-7) that holds `fin`, one of
/// the `FLOW_FIN_*` flags; setting that byte to 1 sets the flag.
pub const fn flow_fin_byte(fin: u32) -> usize {
    (fin.trailing_zeros() / 8) as usize
}

/// `AILB_FLOWS` value: what a packet matching the key is rewritten to (network byte order),
/// the pick it belongs to, and the other entry of the flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    pub src_addr: u32,
    pub dst_addr: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub backend: u32,
    pub model: u32,
    /// The memory hint counted in `AILB_INFLIGHT` for this flow (the model's
    /// `required_memory_mb` when it was opened).
    pub counted_mem_mb: u32,
    /// `FLOW_FIN_*` seen (kept in the forward entry).
    pub flags: u32,
    pub _pad: u32,
    /// The last packet matching this entry (the reclaim takes the later of both entries).
    pub last_seen_ns: u64,
    /// The flow's other entry: the reply key in a forward entry and the reverse.
    pub peer: FlowKey,
}

/// [`TcConfig::mode`]: the TC program passes every packet untouched.
pub const TC_MODE_OFF: u32 = 0;
/// Destination rewritten to the backend, source to the NAT address and a port of the range.
pub const TC_MODE_MASQUERADE: u32 = 1;
/// Destination only: the gateway is the backends' route back to the clients.
pub const TC_MODE_ROUTED: u32 = 2;

/// `AILB_TC_CONFIG` value (one entry).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcConfig {
    pub mode: u32,
    /// The gateway's address the masqueraded flows come from (network byte order).
    pub nat_addr: u32,
    /// The NAT port range, inclusive, host byte order.
    pub port_min: u16,
    pub port_max: u16,
    pub _pad: u32,
    /// A flow with no packet for this long is reclaimed (entries and counts); 0: never.
    pub idle_timeout_ns: u64,
}

/// `AILB_TC_CONFIG6` value (one entry): what IPv6 flows need beyond [`TcConfig`], which they
/// share (mode, port range, idle timeout). A map of its own so that the IPv4 program's copy
/// of [`TcConfig`] stays 24 bytes of its stack, which is full.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcConfig6 {
    /// The gateway's IPv6 address the masqueraded IPv6 flows come from (as
    /// [`super::ServiceKey6::addr`]); all zero: IPv6 packets are not balanced in masquerade
    /// mode (they pass untouched). The port range and its use are the IPv4 flows'.
    pub nat_addr6: [u32; 4],
}

/// [`TcModel::affinity`]: every remote connection is placed afresh.
pub const TC_AFFINITY_NONE: u32 = 0;
/// [`TcModel::affinity`]: a client address keeps its backend (as IPVS persistence), in the
/// model's affinity entries under [`AFFINITY_SPACE_CLIENT`].
pub const TC_AFFINITY_CLIENT_ADDR: u32 = 1;

/// [`super::AffinityKey::space`] of conversations (the socket ABI).
pub const AFFINITY_SPACE_CONVERSATION: u32 = 0;
/// [`super::AffinityKey::space`] of remote client addresses (`conversation` = the IPv4
/// address, network byte order).
pub const AFFINITY_SPACE_CLIENT: u32 = 1;
/// [`super::AffinityKey::space`] of remote IPv6 client addresses (`conversation` = a 64-bit
/// hash of the 16 address bytes: its own space, so that no hash equals an IPv4 client's key).
pub const AFFINITY_SPACE_CLIENT6: u32 = 2;

/// `AILB_TC_MODELS` value, indexed by model: what a remote connection to the model's VIP is
/// picked with (it carries no socket hints).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcModel {
    /// The memory hint of a remote connection, MB (0: none).
    pub required_mem_mb: u32,
    pub affinity: u32,
}

/// `AILB_TC_STATS` value (per-CPU, one entry). The picks themselves count in `Stats`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize))]
pub struct TcStats {
    pub flows_opened: u64,
    /// Flows uncounted: at a FIN, an RST or by the idle reclaim (each flow once).
    pub flows_closed: u64,
    /// Flows removed by the idle reclaim.
    pub flows_reclaimed: u64,
    /// SYNs dropped: `AILB_FLOWS` full.
    pub flows_full: u64,
    /// SYNs dropped: no free NAT port towards the backend in [`NAT_PROBES`] tries.
    pub nat_exhausted: u64,
    /// SYNs to a VIP dropped because the pick refused them (no backend, no fit, shared VIP).
    pub refused: u64,
    /// Packets to a VIP or of a flow dropped: bad IPv4 or TCP header, bad IPv4 checksum, a
    /// fragment, TTL exhausted.
    pub malformed: u64,
    /// Packets rewritten and redirected to the FIB's next hop.
    pub redirected: u64,
    /// Packets rewritten and handed to the gateway's own stack (no FIB answer to redirect by).
    pub to_stack: u64,
    /// Of `flows_closed`, the flows an RST ended (no FIN before it).
    pub ended_rst: u64,
    /// Of `flows_closed`, the flows the idle reclaim ended (no FIN or RST before it). The rest
    /// (`flows_closed - ended_rst - ended_idle`) ended with a FIN.
    pub ended_idle: u64,
}

impl TcStats {
    /// Adds another CPU's counters.
    pub fn merge(&mut self, o: &Self) {
        self.flows_opened += o.flows_opened;
        self.flows_closed += o.flows_closed;
        self.flows_reclaimed += o.flows_reclaimed;
        self.flows_full += o.flows_full;
        self.nat_exhausted += o.nat_exhausted;
        self.refused += o.refused;
        self.malformed += o.malformed;
        self.redirected += o.redirected;
        self.to_stack += o.to_stack;
        self.ended_rst += o.ended_rst;
        self.ended_idle += o.ended_idle;
    }

    /// Flows ended with a FIN (the uncounted ones neither an RST nor the reclaim ended).
    pub fn ended_fin(&self) -> u64 {
        self.flows_closed.saturating_sub(self.ended_rst).saturating_sub(self.ended_idle)
    }
}

#[cfg(test)]
mod tests;
