//! The maps, named as docs/design.md lists them ("Who owns what"). Sizes are defaults; the agent may resize FLOWS and
//! AFFINITY at load time and pins them all under bpffs.

use aya_ebpf::{
    bindings::{BPF_F_NO_COMMON_LRU, BPF_F_NO_PREALLOC},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use dispatcher_common::{
    stats, AffinityKey, AffinityValue, BackendInfo, CloneValue, Counter, FlowKey, FlowValue, FragBudget, FragKey,
    FragValue, SteerConf, SteerSlot, TakeoverRec, VipInfo, VipKey, DEFAULT_MAX_AFFINITY, DEFAULT_MAX_FLOWS,
    FRAG_ENTRIES, MAX_BACKENDS, MAX_CLONES, MAX_RING_SIZE, MAX_VIPS, SIP_LEARN_RING_BYTES, SIP_LEARN_SEEN_ENTRIES,
    STEER_SIZE, STEER_TABLES, TAKEOVER_ENTRIES, TAKEOVER_RING_BYTES,
};

#[map]
pub static VIPS: HashMap<VipKey, VipInfo> = HashMap::with_max_entries(MAX_VIPS * 4, 0);

#[map]
pub static BACKENDS: Array<BackendInfo> = Array::with_max_entries(MAX_BACKENDS, 0);

#[map]
pub static RINGS: Array<u32> = Array::with_max_entries(MAX_VIPS * MAX_RING_SIZE, 0);

/// One LRU over all CPUs (a common LRU hash map): a new flow takes a node from
/// its CPU's local free list, refilled from the common list in batches, where per-CPU
/// LRU lists rotate on every insert; and the whole capacity serves whichever CPU needs
/// it (per-CPU lists split it evenly, whatever RSS does).
#[map]
pub static FLOWS: LruHashMap<FlowKey, FlowValue> = LruHashMap::with_max_entries(DEFAULT_MAX_FLOWS, 0);

#[map]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue> =
    LruHashMap::with_max_entries(DEFAULT_MAX_AFFINITY, BPF_F_NO_COMMON_LRU);

/// Written by the agent (clone IDs, partition IDs, SIP logical names); read here for SIP.
#[map]
pub static CLONES: HashMap<u64, CloneValue> = HashMap::with_max_entries(MAX_CLONES, 0);

#[map]
pub static STATS: PerCpuArray<Counter> = PerCpuArray::with_max_entries(stats::TOTAL_SLOTS, 0);

/// Dispatcher-ownership tables for HTTP VIPs behind ECMP (`steer`): `STEER_TABLES`
/// tables of `STEER_SIZE` slots, chosen by `STEER_CONF`.
#[map]
pub static STEER: Array<SteerSlot> = Array::with_max_entries(STEER_TABLES * STEER_SIZE, 0);

#[map]
pub static STEER_CONF: Array<SteerConf> = Array::with_max_entries(1, 0);

/// Connections of dead dispatchers this one may continue (`steer`, issue 31): written by
/// the agent when their dispatcher is gone (`takeover::inbox`, which bounds how many),
/// deleted once it rebuilt the socket. Not pinned: the records live in the agent that
/// received them. Not preallocated: empty, it takes no memory (nothing is armed but
/// after a death).
#[map]
pub static TAKEOVER: HashMap<FlowKey, TakeoverRec> = HashMap::with_max_entries(TAKEOVER_ENTRIES, BPF_F_NO_PREALLOC);

/// A segment of an armed connection, for the agent to rebuild its socket from.
#[map]
pub static TAKEOVER_EVENTS: RingBuf = RingBuf::with_byte_size(TAKEOVER_RING_BYTES, 0);

/// A SIP datagram's header section, copied for the scanner, and the scanner's state
/// (`sip`; too big for the stack): one per CPU.
#[repr(C)]
pub struct SipScratch {
    pub scan: dispatcher_common::sip::Scan,
    /// Bytes of `buf` that hold the message.
    pub n: u64,
    pub buf: [u8; dispatcher_common::sip::SIP_SCAN_MAX],
}

#[map]
pub static SIP_SCRATCH: PerCpuArray<SipScratch> = PerCpuArray::with_max_entries(1, 0);

/// Where each fragmented UDP datagram's first fragment went (`frag`), so that its later
/// fragments, which carry no ports, follow it. One LRU over all CPUs; entries older than
/// `FRAG_LIFETIME_NS` are not followed, and new ones are rationed (`FRAG_BUDGET`).
#[map]
pub static FRAGS: LruHashMap<FragKey, FragValue> = LruHashMap::with_max_entries(FRAG_ENTRIES, 0);

/// Each CPU's count of new `FRAGS` entries in the current second (not pinned: a restart
/// starts a fresh second).
#[map]
pub static FRAG_BUDGET: PerCpuArray<FragBudget> = PerCpuArray::with_max_entries(1, 0);

/// Logical names seen in dialogs pinned here and not owned by anybody yet, reported to the
/// agent (`SipLearnEvent`), which learns them.
#[map]
pub static SIP_LEARN: RingBuf = RingBuf::with_byte_size(SIP_LEARN_RING_BYTES, 0);

/// When each logical name was last reported (`bpf_ktime_get_coarse_ns`): once a second at
/// most per name.
#[map]
pub static SIP_LEARN_SEEN: LruHashMap<u64, u64> = LruHashMap::with_max_entries(SIP_LEARN_SEEN_ENTRIES, 0);

/// This CPU's report budget: the second it counts (coarse ns / 10^9) and the reports made
/// in it.
#[map]
pub static SIP_LEARN_BUDGET: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);
