//! Types and constants shared by the XDP program and the agent.
//!
//! Every map key and value is `#[repr(C)]` without implicit padding (explicit `_pad`
//! fields) so that the kernel and user space agree byte for byte. Addresses and ports are
//! kept in network byte order exactly as they appear on the wire; counters, ids and times
//! are host order. An address is four `u32` words holding the wire bytes in memory order
//! (`addr_words`): word-aligned, so the XDP program copies and compares it with four
//! loads instead of a byte loop. IPv4 uses the first word, the others are zero.
#![no_std]

pub mod hash;
pub mod sip;

/// Capacities, used by both sides.
pub const MAX_VIPS: u32 = 64;
pub const MAX_BACKENDS: u32 = 4096;
/// Largest Maglev table per VIP (a prime; Katran's default). `RINGS` holds
/// `MAX_VIPS * MAX_RING_SIZE` slots; a VIP may use a smaller prime.
pub const MAX_RING_SIZE: u32 = 65537;
pub const DEFAULT_RING_SIZE: u32 = 65537;
pub const DEFAULT_MAX_FLOWS: u32 = 1 << 20;
pub const DEFAULT_MAX_AFFINITY: u32 = 1 << 18;
pub const MAX_CLONES: u32 = 1 << 16;

/// "no backend" in ids that point at a backend (replica, ring slot).
pub const NO_BACKEND: u32 = u32::MAX;

pub const AF_INET: u8 = 2;
pub const AF_INET6: u8 = 10;
/// `FlowKey::family` of a SIP dialog's pin: `src` holds the Call-ID hash, `dst`,
/// `dport` and `proto` the VIP, `sport` is 0 (`sip_call_key`). No packet has it.
pub const FAMILY_SIP_CALL: u8 = 0xfe;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_IPIP: u8 = 4;
pub const IPPROTO_IPV6: u8 = 41;

/// `VipInfo::mode`
pub const MODE_L4: u8 = 0;
pub const MODE_HTTP: u8 = 1;
/// Entry with port 0: marks an address that carries VIPs, so that truncated packets to
/// that address (whose ports cannot be read) are dropped rather than passed.
pub const MODE_ADDR_MARKER: u8 = 2;
/// SIP over UDP: XDP reads each datagram's affinity (`sip`) and forwards it.
pub const MODE_SIP: u8 = 3;

/// `VipInfo::forward`
pub const FWD_MAC: u8 = 0;
pub const FWD_IPIP: u8 = 1;

/// `VipInfo::flags`
pub const VIP_F_AFFINITY: u16 = 1;

/// `BackendInfo::state`
pub const STATE_UNUSED: u8 = 0;
pub const STATE_UP: u8 = 1;
pub const STATE_SUSPECT: u8 = 2;
pub const STATE_DOWN: u8 = 3;
pub const STATE_DRAIN: u8 = 4;
pub const STATE_DISABLED: u8 = 5;

/// An address's wire bytes as the maps hold them.
#[inline(always)]
pub fn addr_words(b: &[u8; 16]) -> [u32; 4] {
    [
        u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
        u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
        u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
    ]
}

/// The wire bytes of an address held as words.
pub fn addr_from_words(w: &[u32; 4]) -> [u8; 16] {
    let mut b = [0u8; 16];
    for (i, x) in w.iter().enumerate() {
        b[i * 4..i * 4 + 4].copy_from_slice(&x.to_ne_bytes());
    }
    b
}

/// What a backend's `BACKENDS` entry says routing obeys (`BackendInfo::state`). The map
/// holds the `u8`; the agent works with this type and converts at the map boundary.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendState {
    Unused = STATE_UNUSED,
    Up = STATE_UP,
    Suspect = STATE_SUSPECT,
    Down = STATE_DOWN,
    Drain = STATE_DRAIN,
    Disabled = STATE_DISABLED,
}

/// What the health checks and failed requests say of a backend.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Up = STATE_UP,
    Suspect = STATE_SUSPECT,
    Down = STATE_DOWN,
}

/// What the operator said of a backend (`BackendInfo::admin`): nothing, drain or disable.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    None = 0,
    Drain = STATE_DRAIN,
    Disabled = STATE_DISABLED,
}

impl BackendState {
    /// From the map's byte; an unknown value is `Unused`.
    pub const fn from_u8(v: u8) -> BackendState {
        match v {
            STATE_UP => BackendState::Up,
            STATE_SUSPECT => BackendState::Suspect,
            STATE_DOWN => BackendState::Down,
            STATE_DRAIN => BackendState::Drain,
            STATE_DISABLED => BackendState::Disabled,
            _ => BackendState::Unused,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            BackendState::Unused => "unused",
            BackendState::Up => "up",
            BackendState::Suspect => "suspect",
            BackendState::Down => "down",
            BackendState::Drain => "drain",
            BackendState::Disabled => "disabled",
        }
    }

    /// Takes new sessions, flows and unbound requests.
    pub const fn takes_new(self) -> bool {
        takes_new_flows(self as u8)
    }

    /// Keeps what it has (flows, sessions): up, suspect or draining.
    pub const fn keeps(self) -> bool {
        keeps_flows(self as u8)
    }

    /// Out of service: its flows and sessions go to its replica.
    pub const fn is_out(self) -> bool {
        matches!(self, BackendState::Down | BackendState::Disabled)
    }
}

impl Health {
    /// From the map's state byte: the health it implies (drain and disabled say nothing
    /// of it: up until checks tell otherwise).
    pub const fn from_u8(v: u8) -> Health {
        match v {
            STATE_SUSPECT => Health::Suspect,
            STATE_DOWN => Health::Down,
            _ => Health::Up,
        }
    }

    pub const fn name(self) -> &'static str {
        BackendState::from_u8(self as u8).name()
    }
}

impl Operator {
    /// From the map's `admin` byte; anything else is no operator's state.
    pub const fn from_u8(v: u8) -> Operator {
        match v {
            STATE_DRAIN => Operator::Drain,
            STATE_DISABLED => Operator::Disabled,
            _ => Operator::None,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            Operator::None => "none",
            Operator::Drain => "drain",
            Operator::Disabled => "disabled",
        }
    }
}

/// The state routing obeys, from the operator's state and the health. They are two
/// dimensions: a drained backend that goes down is down (its sessions and flows fail over
/// to its replica), and a drain given to a backend that is down leaves it down.
pub const fn effective_state(op: Operator, health: Health) -> BackendState {
    match (op, health) {
        (Operator::Disabled, _) => BackendState::Disabled,
        (_, Health::Down) => BackendState::Down,
        (_, Health::Suspect) => BackendState::Suspect,
        (Operator::Drain, Health::Up) => BackendState::Drain,
        (Operator::None, Health::Up) => BackendState::Up,
    }
}

/// May this backend take a new flow?
#[inline(always)]
pub const fn takes_new_flows(state: u8) -> bool {
    state == STATE_UP
}

/// May this backend keep a flow already pinned to it?
#[inline(always)]
pub const fn keeps_flows(state: u8) -> bool {
    state == STATE_UP || state == STATE_SUSPECT || state == STATE_DRAIN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_state_and_the_health_combine() {
        use {BackendState as S, Health as H, Operator as O};
        assert_eq!(effective_state(O::None, H::Up), S::Up);
        assert_eq!(effective_state(O::Drain, H::Up), S::Drain);
        assert_eq!(effective_state(O::Drain, H::Suspect), S::Suspect, "held, not sent elsewhere");
        assert_eq!(effective_state(O::Drain, H::Down), S::Down, "drained and dead fails over");
        assert_eq!(effective_state(O::Disabled, H::Up), S::Disabled);
        assert_eq!(effective_state(O::Disabled, H::Down), S::Disabled);
        assert_eq!(effective_state(O::None, H::Down), S::Down);
        for v in 0..=6u8 {
            let s = BackendState::from_u8(v);
            assert!(v > 5 || s as u8 == v, "the map's byte round-trips");
        }
    }
}

/// `VIPS` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct VipKey {
    pub addr: [u32; 4],
    /// Network order; 0 for an address marker.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

/// `VIPS` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct VipInfo {
    pub id: u32,
    pub mode: u8,
    pub forward: u8,
    pub flags: u16,
    /// Number of slots of this VIP's Maglev table in `RINGS` (prime, <= MAX_RING_SIZE).
    pub ring_size: u32,
    /// Source-IP affinity lifetime in seconds (when `VIP_F_AFFINITY`).
    pub sticky_secs: u32,
    /// Affinity scope: VIPs with the same group share client affinity (cross-port).
    pub port_group: u32,
    pub _pad: u32,
    /// Outer source address for IPIP (same family as the VIP).
    pub encap_src: [u32; 4],
}

/// `BACKENDS` value (index = backend id).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendInfo {
    /// Wire bytes in memory order.
    pub addr4: u32,
    /// All zero when the backend has no IPv6 address.
    pub addr6: [u32; 4],
    /// MAC the frames go to: the backend itself (MAC forwarding) or the next hop (IPIP).
    pub mac: [u8; 6],
    /// What XDP obeys: `effective_state(admin, health)`.
    pub state: u8,
    /// The operator's state (0, drain or disabled), kept here so that it survives an
    /// agent restart beside the health; the XDP program does not read it.
    pub admin: u8,
    /// Peer replica backend id, or NO_BACKEND.
    pub replica: u32,
    pub weight: u32,
}

/// `FLOWS` key: the source tuple of a connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FlowKey {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Network order.
    pub sport: u16,
    /// Network order.
    pub dport: u16,
    pub proto: u8,
    pub family: u8,
    pub _pad: u16,
}

/// `FLOWS` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FlowValue {
    pub backend: u32,
    pub vip: u32,
    /// Hash of the session cookie that pinned this flow: a SIP dialog's Call-ID hash (0 for
    /// L4 flows).
    pub cookie_hash: u64,
    /// On a VIP with `sticky_time`, when it was pinned (bpf_ktime_get_coarse_ns); 0
    /// elsewhere (no clock is read for it). Packets of an established flow write
    /// nothing: the LRU ages entries by use.
    pub pinned_ns: u64,
}

/// The `FLOWS` key that pins the messages of a SIP dialog (by its Call-ID hash) on a VIP.
#[inline(always)]
pub const fn sip_call_key(vip: &VipKey, call_id: u64) -> FlowKey {
    FlowKey {
        src: [call_id as u32, (call_id >> 32) as u32, 0, 0],
        dst: vip.addr,
        sport: 0,
        dport: vip.port,
        proto: vip.proto,
        family: FAMILY_SIP_CALL,
        _pad: 0,
    }
}

/// `AFFINITY` key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct AffinityKey {
    pub group: u32,
    /// AF_INET or AF_INET6 (a whole word: no padding bytes to clear).
    pub family: u32,
    pub client: [u32; 4],
}

/// `AFFINITY` value.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct AffinityValue {
    pub backend: u32,
    pub _pad: u32,
    /// bpf_ktime_get_ns() after which the entry no longer applies.
    pub expires_ns: u64,
}

/// `CLONES` value (key: `hash::cookie_hash` of the clone or partition ID).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CloneValue {
    pub owner: u32,
    pub replica: u32,
    /// `CLONE_F_FAILED_OVER`: `owner` stands in for the clone's own backend, which is
    /// out and recorded in `replica`.
    pub flags: u32,
    pub _pad: u32,
}

pub const CLONE_F_FAILED_OVER: u32 = 1;
/// Learned (from a check's answer, a response, a dialog, another dispatcher), not
/// configured: for SIP, a dialog pinned here (`FLOWS`, by its Call-ID) to another live
/// container goes where it began rather than where the learned name says (the pin was
/// seen first-hand; a learned name may come from a message anyone could send).
pub const CLONE_F_LEARNED: u32 = 2;

/// What the XDP program reports on `SIP_LEARN` (a ring buffer): a SIP message naming a
/// logical name nobody owns yet, forwarded by its dialog's pin to the container that took
/// the dialog's first request. The agent checks it (the name's hash against the message,
/// the ids against its configuration) and learns the name for that container.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SipLearnEvent {
    pub vip: u32,
    pub backend: u32,
    /// `hash::cookie_hash` of the logical name, and of the Call-ID (the scanner's).
    pub ln: u64,
    pub call_id: u64,
    /// Bytes of `msg` that hold the message (at most `sip::SIP_SCAN_MAX`).
    pub len: u32,
    /// Where the name was found (`sip::SRC_*`).
    pub src: u32,
    pub msg: [u8; sip::SIP_SCAN_MAX],
}

/// `SIP_LEARN`'s size in bytes (a power of two, a multiple of the page size): room for
/// about 120 reports waiting for the agent; more are dropped and counted.
pub const SIP_LEARN_RING_BYTES: u32 = 256 * 1024;
/// At most this many reports per CPU per second (the rest counted), and one per logical
/// name per second (`SIP_LEARN_SEEN`, an LRU of this many names).
pub const SIP_LEARN_PER_CPU_PER_SEC: u64 = 64;
pub const SIP_LEARN_SEEN_ENTRIES: u32 = 1024;

/// Slots of one dispatcher-ownership table (a prime): `STEER` holds `STEER_TABLES` of
/// them: four that take turns as the current one, the two previous ones and the one being
/// written, and at `STEER_FALLBACK` the current membership without this dispatcher (what
/// the others will use once this one's agent is gone).
pub const STEER_SIZE: u32 = 4093;
pub const STEER_TABLES: u32 = 5;
pub const STEER_FALLBACK: u32 = 4;
/// The agent's beacon (`SteerConf::heartbeat_ns`) older than this: the agent is gone, and
/// this host steers what it owned by the fallback table.
pub const STEER_AGENT_STALE_NS: u64 = 1_000_000_000;

/// `STEER` value: which dispatcher owns the connections whose flow hash lands here.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SteerSlot {
    /// The owner's MAC on the shared segment.
    pub mac: [u8; 6],
    /// 1 when the slot names a dispatcher.
    pub valid: u8,
    pub _pad: u8,
}

/// `STEER_CONF` value (one entry): the tables in use and this dispatcher's MAC.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SteerConf {
    /// One word, written at once: `steer_sel(current, previous, flags)`.
    pub sel: u32,
    /// Generation of the current table (for status; not read by XDP).
    pub generation: u32,
    pub self_mac: [u8; 6],
    pub _pad: [u8; 2],
    /// CLOCK_MONOTONIC ns of the agent's last beacon (written every 200 ms); 0: no beacon
    /// (the agent is taken to be there).
    pub heartbeat_ns: u64,
}

/// `SteerConf::sel` flags.
pub const STEER_ON: u32 = 1 << 8;
/// The previous table is valid: second chance applies.
pub const STEER_HAS_PREV: u32 = 1 << 9;
/// The one before it too (two changes within the second-chance time).
pub const STEER_HAS_PREV2: u32 = 1 << 10;
/// This dispatcher left (`dispatcher leave`, stop): a packet the owner sent here that has
/// no connection here is dropped (the sender's table is behind; TCP retransmits), never
/// answered with a reset.
pub const STEER_LEFT: u32 = 1 << 11;

/// `TAKEOVER` holds records: a non-SYN segment of an owned slot with no socket here is
/// looked up there (one flag, so that no lookup is made while nothing is armed).
pub const STEER_TAKEOVER: u32 = 1 << 16;

/// `TAKEOVER` value: a connection of a dead dispatcher that this one may continue (the
/// agent holds the handshake's options; XDP only needs to know the tuple is armed).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TakeoverRec {
    /// CLOCK_MONOTONIC ns of the last report of one of its segments (0: none yet).
    pub reported_ns: u64,
}

/// Records of dead dispatchers' connections armed at once (an LRU).
pub const TAKEOVER_ENTRIES: u32 = 262_144;
/// A connection's segments are reported at most this often (the client's retransmissions
/// come an RTO apart, at least 200 ms).
pub const TAKEOVER_REPORT_EVERY_NS: u64 = 50_000_000;
/// `TAKEOVER_EVENTS`' size in bytes: room for about 970 reports (with their data)
/// waiting for the agent; a report that finds it full is not made (the client's
/// retransmission is reported instead).
pub const TAKEOVER_RING_BYTES: u32 = 2 * 1024 * 1024;
/// The longest TCP header (with options).
pub const TAKEOVER_TCP_HEADER: usize = 60;
/// The most data of a reported segment that goes with the report (more than an Ethernet
/// MTU's TCP segment; a power of two, for the XDP program's bound): the rebuilt socket is
/// given it, and the client's request needs no retransmission. A longer segment goes
/// without (and is retransmitted).
pub const TAKEOVER_DATA: usize = 2048;
const _: () = assert!(TAKEOVER_DATA.is_power_of_two());

/// What the XDP program reports on `TAKEOVER_EVENTS`: a segment of an armed connection,
/// what the agent needs to rebuild its socket (`takeover::Resume`). The TCP header is
/// copied as it is (the agent reads it: the program's stack is near its bound).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TakeoverEvent {
    pub key: FlowKey,
    /// The TCP segment's length (header and data), from the IP length.
    pub segment_len: u16,
    /// Bytes of `tcp` that hold the TCP header (its data offset, at most 60).
    pub header_len: u16,
    /// (64 bytes: the XDP program's bound on the copy is a mask.)
    pub tcp: [u8; 64],
    /// Bytes of `data` copied from the segment: all of its data, or 0 (none, or more than
    /// `TAKEOVER_DATA`, or the copy failed).
    pub data_len: u16,
    pub _pad: u16,
    pub data: [u8; TAKEOVER_DATA],
}

/// `sel`: current table in bits 0-3, previous in 4-7, the one before in 12-15, flags.
#[inline(always)]
pub const fn steer_sel(current: u32, previous: u32, flags: u32) -> u32 {
    steer_sel3(current, previous, 0, flags)
}

#[inline(always)]
pub const fn steer_sel3(current: u32, previous: u32, previous2: u32, flags: u32) -> u32 {
    (current & 0xf) | ((previous & 0xf) << 4) | ((previous2 & 0xf) << 12) | flags
}

/// `FRAGS` key: one IP datagram in fragments (RFC 791's reassembly key; IPv6's 32-bit
/// identification, RFC 8200 4.5). The addresses are held as 64-bit words (`new`): the
/// BPF compiler merges stores of known-zero words (an IPv4 address's upper three) into
/// 8-byte stores, which the verifier takes on the stack only aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FragKey {
    pub src: [u64; 2],
    pub dst: [u64; 2],
    /// The IP ID as read from the header (memory order of the wire bytes).
    pub id: u32,
    pub proto: u8,
    pub family: u8,
    pub _pad: u16,
}

impl FragKey {
    /// From addresses as `FlowKey` holds them (wire bytes in memory order).
    #[inline(always)]
    pub const fn new(src: &[u32; 4], dst: &[u32; 4], id: u32, proto: u8, family: u8) -> FragKey {
        const fn pair(a: u32, b: u32) -> u64 {
            // Little and big endian alike: the two words' bytes in their order.
            if cfg!(target_endian = "little") {
                a as u64 | (b as u64) << 32
            } else {
                (a as u64) << 32 | b as u64
            }
        }
        FragKey {
            src: [pair(src[0], src[1]), pair(src[2], src[3])],
            dst: [pair(dst[0], dst[1]), pair(dst[2], dst[3])],
            id,
            proto,
            family,
            _pad: 0,
        }
    }
}

#[cfg(test)]
mod frag_key_tests {
    use super::*;

    /// The key holds the addresses' bytes in their order, whatever the words' grouping.
    #[test]
    fn a_frag_key_holds_the_address_bytes_in_order() {
        let src = [u32::from_ne_bytes([10, 0, 0, 2]), 0, 0, 0];
        let dst = [1, 2, 3, u32::from_ne_bytes([9, 8, 7, 6])];
        let k = FragKey::new(&src, &dst, 7, IPPROTO_UDP, AF_INET);
        let bytes: [u8; 40] = unsafe { core::mem::transmute(k) };
        let words: [u32; 8] = [src[0], src[1], src[2], src[3], dst[0], dst[1], dst[2], dst[3]];
        for (i, w) in words.iter().enumerate() {
            assert_eq!(bytes[i * 4..i * 4 + 4], w.to_ne_bytes(), "word {i}");
        }
        assert_eq!(bytes[32..38], [7, 0, 0, 0, IPPROTO_UDP, AF_INET]);
    }
}

/// `FRAGS` value: where the datagram's first fragment went.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragValue {
    /// The backend, or `NO_BACKEND`: the first fragment went to the host stack (a port of
    /// a VIP address that is no VIP), and so do the others.
    pub backend: u32,
    pub vip: u32,
    /// bpf_ktime_get_coarse_ns() when the first fragment was seen.
    pub created_ns: u64,
    /// The VIP's port (network order): with the address and protocol, its `VIPS` key.
    pub port: u16,
    pub _pad: [u16; 3],
}

/// `FRAG_BUDGET` value (per CPU): first fragments recorded in the current second.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct FragBudget {
    pub window_ns: u64,
    pub used: u64,
}

/// Entries of `FRAGS` (an LRU hash shared by all CPUs).
pub const FRAG_ENTRIES: u32 = 65536;
/// New `FRAGS` entries a CPU may make per second; first fragments beyond it are dropped
/// (`drop_frag_budget`). With C CPUs a live entry survives at least
/// `FRAG_ENTRIES / (C * FRAG_BUDGET_PER_SEC)` seconds of a flood (8 s / C).
pub const FRAG_BUDGET_PER_SEC: u64 = 8192;
/// How long the later fragments of a datagram follow its first one (the kernel's
/// `ipfrag_time` is 30 s; fragments of one datagram leave their sender back to back).
pub const FRAG_LIFETIME_NS: u64 = 2_000_000_000;

/// `STATS` value (per CPU).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counter {
    pub packets: u64,
    pub bytes: u64,
}

/// `STATS` slots. Global slots first, then `VIP_SLOTS` per VIP, then `BACKEND_SLOTS`
/// per backend.
pub mod stats {
    pub const PASS_NON_VIP: u32 = 0;
    pub const PASS_NON_IP: u32 = 1;
    pub const PASS_HTTP: u32 = 2;
    pub const PASS_IP_OPTIONS: u32 = 3;
    pub const PASS_FRAGMENT: u32 = 4;
    pub const PASS_IPV6_EXT: u32 = 5;
    pub const DROP_TRUNCATED: u32 = 6;
    pub const DROP_BAD_IHL: u32 = 7;
    pub const DROP_BAD_TCP_DOFF: u32 = 8;
    pub const DROP_NO_BACKEND: u32 = 9;
    pub const DROP_ENCAP_FAILED: u32 = 10;
    pub const DROP_BAD_VERSION: u32 = 11;
    /// The IP length disagrees with the frame or is shorter than the headers, or a UDP
    /// length is under 8 or past the IP payload.
    pub const DROP_BAD_LENGTH: u32 = 12;
    /// A broadcast or multicast destination MAC on VIP traffic.
    pub const DROP_GROUP_MAC: u32 = 13;
    /// A source address no client can have (loopback, "this network", multicast, ...).
    pub const DROP_MARTIAN: u32 = 14;
    /// HTTP VIP packets sent on to the dispatcher that owns the connection (`STEER`).
    pub const STEERED: u32 = 15;
    /// Sent to the owner under the previous table (second chance, daisy chaining).
    pub const STEER_SECOND_CHANCE: u32 = 16;
    /// Kept here although another dispatcher owns the tuple now: a local connection
    /// from before the change, or a packet the owner sent back (second chance).
    pub const STEER_KEPT_LOCAL: u32 = 17;
    /// Not sent on because its TTL or hop limit was spent (a steering loop).
    pub const STEER_TTL_EXPIRED: u32 = 18;
    /// Dropped on a dispatcher that left (or whose agent is gone): sent here by a
    /// dispatcher whose table was behind, with no connection here.
    pub const STEER_DROPPED_LEFT: u32 = 19;
    /// SIP VIP datagrams that are not a complete SIP message with a Call-ID (not SIP, no
    /// end of the header section, binary...).
    pub const DROP_SIP_INVALID: u32 = 20;
    /// SIP header sections longer than `sip::SIP_SCAN_MAX`.
    pub const DROP_SIP_TOO_LONG: u32 = 21;
    /// SIP messages whose owner is suspect: held back (SIP over UDP retransmits), never
    /// sent to another container.
    pub const DROP_SIP_HELD: u32 = 22;
    /// SIP messages naming a logical name nobody owns (and no dialog pinned here).
    pub const DROP_SIP_UNKNOWN_LN: u32 = 23;
    /// SIP messages naming a logical name nobody owns yet, forwarded by their dialog's pin
    /// and reported to the agent to learn the name (`SIP_LEARN`).
    pub const SIP_LEARN_REPORTED: u32 = 24;
    /// Such reports not made: the per-CPU budget was spent or the ring buffer was full.
    pub const SIP_LEARN_SKIPPED: u32 = 25;
    /// SIP messages whose learned logical name names another container than the one their
    /// dialog is pinned to here: sent where the dialog began (`CLONE_F_LEARNED`).
    pub const SIP_PIN_OVER_LEARNED: u32 = 26;
    /// First fragments of a UDP datagram to an L4 or SIP VIP, forwarded and recorded in
    /// `FRAGS`.
    pub const FRAG_FIRST: u32 = 27;
    /// Later fragments forwarded where their first fragment went (`FRAGS`).
    pub const FRAG_FOLLOWED: u32 = 28;
    /// Later fragments to a VIP address with no live record of their first fragment (it
    /// has not come yet, was dropped, or is older than `FRAG_LIFETIME_NS`).
    pub const DROP_FRAG_NO_FIRST: u32 = 29;
    /// First fragments beyond this CPU's `FRAG_BUDGET_PER_SEC`.
    pub const DROP_FRAG_BUDGET: u32 = 30;
    /// Segments of a dead dispatcher's connection (a `TAKEOVER` record, no socket here)
    /// reported to the agent on `TAKEOVER_EVENTS` and dropped: the client retransmits to
    /// the socket the agent rebuilds.
    pub const TAKEOVER_REPORTED: u32 = 31;
    /// Such segments dropped without a report (reported less than
    /// `TAKEOVER_REPORT_EVERY_NS` ago, or the ring full).
    pub const TAKEOVER_DROPPED: u32 = 32;
    pub const GLOBAL_SLOTS: u32 = 33;

    pub const GLOBAL_NAMES: [&str; 33] = [
        "pass_non_vip",
        "pass_non_ip",
        "pass_http",
        "pass_ip_options",
        "pass_fragment",
        "pass_ipv6_ext",
        "drop_truncated",
        "drop_bad_ihl",
        "drop_bad_tcp_doff",
        "drop_no_backend",
        "drop_encap_failed",
        "drop_bad_version",
        "drop_bad_length",
        "drop_group_mac",
        "drop_martian",
        "steered",
        "steer_second_chance",
        "steer_kept_local",
        "steer_ttl_expired",
        "steer_dropped_left",
        "drop_sip_invalid",
        "drop_sip_too_long",
        "drop_sip_held",
        "drop_sip_unknown_ln",
        "sip_learn_reported",
        "sip_learn_skipped",
        "sip_pin_over_learned",
        "frag_first",
        "frag_followed",
        "drop_frag_no_first",
        "drop_frag_budget",
        "takeover_reported",
        "takeover_dropped",
    ];

    /// Per VIP: forwarded packets/bytes other than on a pinned flow, new flows, packets and
    /// bytes forwarded on a pinned flow (flow-table hits), affinity hits, drops. Each
    /// forwarded packet is counted once, under `VIP_PACKETS` or `VIP_FLOW_HITS`: the VIP's
    /// total is their sum (`vip_forwarded` in the agent).
    pub const VIP_PACKETS: u32 = 0;
    pub const VIP_NEW_FLOWS: u32 = 1;
    pub const VIP_FLOW_HITS: u32 = 2;
    pub const VIP_AFFINITY_HITS: u32 = 3;
    pub const VIP_DROPS: u32 = 4;
    pub const VIP_REPINNED: u32 = 5;
    /// SIP VIPs: messages forwarded by where their affinity came from (`vip_sip_source`),
    /// held while their owner is suspect, dropped for an unknown logical name or as
    /// invalid.
    pub const VIP_SIP_ROUTE: u32 = 6;
    pub const VIP_SIP_VIA: u32 = 7;
    pub const VIP_SIP_TO_TAG: u32 = 8;
    pub const VIP_SIP_FROM_TAG: u32 = 9;
    pub const VIP_SIP_CALL_ID: u32 = 10;
    pub const VIP_SIP_HELD: u32 = 11;
    pub const VIP_SIP_UNKNOWN_LN: u32 = 12;
    pub const VIP_SIP_INVALID: u32 = 13;
    /// SIP VIPs: forwarded messages by how their container was chosen — by logical name
    /// (`CLONES`), by their dialog's pin (`FLOWS`, Call-ID), placed on the ring (a new
    /// dialog). Each forwarded message is counted under exactly one of them.
    pub const VIP_SIP_BY_LN: u32 = 14;
    pub const VIP_SIP_BY_PIN: u32 = 15;
    pub const VIP_SIP_BY_RING: u32 = 16;
    /// UDP VIPs (L4 and SIP): first fragments recorded, later fragments forwarded after
    /// them, later fragments dropped with no first, first fragments over the budget (each
    /// drop also in `VIP_DROPS`; on a later fragment's address, the id its marker names).
    pub const VIP_FRAG_FIRST: u32 = 17;
    pub const VIP_FRAG_FOLLOWED: u32 = 18;
    pub const VIP_FRAG_NO_FIRST: u32 = 19;
    pub const VIP_FRAG_BUDGET: u32 = 20;
    pub const VIP_SLOTS: u32 = 21;

    /// The per-VIP slot counting messages routed by affinity source `src` (`sip::SRC_*`).
    #[inline(always)]
    pub const fn vip_sip_source(src: u8) -> u32 {
        VIP_SIP_ROUTE + src as u32 - 1
    }

    /// Per backend: forwarded packets/bytes, new flows, and SIP `ACK`s forwarded to it (a
    /// caller acknowledges a final answer it received: the container answered — the
    /// passive evidence the SIP health check counts).
    pub const BACKEND_PACKETS: u32 = 0;
    pub const BACKEND_NEW_FLOWS: u32 = 1;
    pub const BACKEND_SIP_ACKS: u32 = 2;
    pub const BACKEND_SLOTS: u32 = 3;

    pub const VIP_BASE: u32 = GLOBAL_SLOTS;
    pub const BACKEND_BASE: u32 = VIP_BASE + super::MAX_VIPS * VIP_SLOTS;
    pub const TOTAL_SLOTS: u32 = BACKEND_BASE + super::MAX_BACKENDS * BACKEND_SLOTS;

    #[inline(always)]
    pub const fn vip_slot(vip: u32, what: u32) -> u32 {
        VIP_BASE + vip * VIP_SLOTS + what
    }

    #[inline(always)]
    pub const fn backend_slot(backend: u32, what: u32) -> u32 {
        BACKEND_BASE + backend * BACKEND_SLOTS + what
    }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for VipKey {}
    unsafe impl aya::Pod for VipInfo {}
    unsafe impl aya::Pod for BackendInfo {}
    unsafe impl aya::Pod for FlowKey {}
    unsafe impl aya::Pod for FlowValue {}
    unsafe impl aya::Pod for AffinityKey {}
    unsafe impl aya::Pod for AffinityValue {}
    unsafe impl aya::Pod for CloneValue {}
    unsafe impl aya::Pod for Counter {}
    unsafe impl aya::Pod for FragKey {}
    unsafe impl aya::Pod for FragValue {}
    unsafe impl aya::Pod for SteerSlot {}
    unsafe impl aya::Pod for SteerConf {}
    unsafe impl aya::Pod for SipLearnEvent {}
    unsafe impl aya::Pod for TakeoverRec {}
    unsafe impl aya::Pod for TakeoverEvent {}
}

// No implicit padding anywhere: the sizes are the sums of the fields.
const _: () = assert!(core::mem::size_of::<VipKey>() == 20);
const _: () = assert!(core::mem::size_of::<VipInfo>() == 40);
const _: () = assert!(core::mem::size_of::<BackendInfo>() == 36);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);
const _: () = assert!(core::mem::size_of::<TakeoverEvent>() == 2160);
const _: () = assert!(core::mem::size_of::<FlowValue>() == 24);
const _: () = assert!(core::mem::size_of::<AffinityKey>() == 24);
const _: () = assert!(core::mem::size_of::<AffinityValue>() == 16);
const _: () = assert!(core::mem::size_of::<SteerSlot>() == 8);
const _: () = assert!(core::mem::size_of::<FragKey>() == 40);
const _: () = assert!(core::mem::size_of::<FragValue>() == 24);
const _: () = assert!(core::mem::size_of::<SteerConf>() == 24);
const _: () = assert!(core::mem::size_of::<SipLearnEvent>() == 32 + sip::SIP_SCAN_MAX);
