//! Which backend a VIP packet goes to: pinned flow, then client affinity, then the
//! VIP's Maglev ring — each filtered by the backend's state.

use aya_ebpf::{bindings::BPF_NOEXIST, helpers::bpf_ktime_get_coarse_ns};
use dispatcher_common::{
    hash::flow_hash, keeps_flows, stats, takes_new_flows, AffinityKey, AffinityValue, BackendInfo, FlowKey, FlowValue,
    VipInfo, MAX_RING_SIZE, NO_BACKEND, STATE_UP, VIP_F_AFFINITY,
};

use crate::{
    maps::{AFFINITY, BACKENDS, FLOWS, RINGS},
    stats::count,
};

/// Extra ring slots probed when the chosen one names a backend that takes no new flows
/// (the agent rebuilds the ring on every state change; this covers the gap).
const RING_PROBES: u32 = 4;
const NS_PER_SEC: u64 = 1_000_000_000;

/// A backend's entry, read in place (no copy onto the stack).
#[inline(always)]
fn backend(id: u32) -> Option<&'static BackendInfo> {
    BACKENDS.get(id)
}

/// The backend itself if it takes new flows, else its replica if that one does.
#[inline(always)]
fn usable_for_new(id: u32) -> Option<(u32, &'static BackendInfo)> {
    let b = backend(id)?;
    if takes_new_flows(b.state) {
        return Some((id, b));
    }
    replica_if_up(b)
}

#[inline(always)]
fn replica_if_up(b: &BackendInfo) -> Option<(u32, &'static BackendInfo)> {
    if b.replica == NO_BACKEND {
        return None;
    }
    let r = backend(b.replica)?;
    if r.state == STATE_UP {
        Some((b.replica, r))
    } else {
        None
    }
}

/// Where a flow's walk of the VIP's ring starts: the first slot, the probe step and the
/// ring's size, with the first slot's backend id already read.
struct RingWalk {
    slot: u32,
    step: u32,
    size: u32,
    first: u32,
}

#[inline(always)]
fn ring_walk(vip: &VipInfo, key: &FlowKey) -> Option<RingWalk> {
    let size = vip.ring_size;
    if size == 0 || size > MAX_RING_SIZE {
        return None;
    }
    let h = flow_hash(key);
    let slot = h % size;
    let step = (h >> 16) % (size - 1).max(1) + 1;
    let p = RINGS.get_ptr(vip.id * MAX_RING_SIZE + slot)?;
    // Read here, used later (volatile: the load stays where it is written): the miss
    // overlaps whatever the caller does before it looks at `first`.
    let first = unsafe { core::ptr::read_volatile(p) };
    Some(RingWalk { slot, step, size, first })
}

#[inline(always)]
fn from_ring(w: RingWalk, vip: &VipInfo) -> Option<(u32, &'static BackendInfo)> {
    let RingWalk { mut slot, step, size, first } = w;
    if size == 0 {
        // Never (`ring_walk` checked): tells the compiler, which would otherwise keep a
        // division-by-zero panic the verifier refuses.
        return None;
    }
    let mut id = first;
    for i in 0..=RING_PROBES {
        if i > 0 {
            slot = (slot + step) % size;
            id = *RINGS.get(vip.id * MAX_RING_SIZE + slot)?;
        }
        if id != NO_BACKEND {
            if let Some(found) = usable_for_new(id) {
                return Some(found);
            }
        }
    }
    None
}

#[inline(always)]
fn from_affinity(akey: &AffinityKey, now: u64) -> Option<(u32, &'static BackendInfo)> {
    let a = unsafe { AFFINITY.get(akey) }?;
    if a.expires_ns < now {
        return None;
    }
    usable_for_new(a.backend)
}

/// The chosen backend: its id, its entry, and whether the packet followed its flow's pin
/// (counted by the caller under `VIP_FLOW_HITS`, every other forwarded packet under
/// `VIP_PACKETS`: one counter per packet).
pub type Chosen = (u32, &'static BackendInfo, bool);

/// `syn`: a TCP connection attempt (SYN without ACK). A SYN is placed like a new flow: its
/// ring slot is read first and its `FLOWS` lookup made while that read is in flight (a
/// default ring is 256 KiB, mostly out of the caches, and the lookup's own miss, the hash
/// bucket, then overlaps it; the insert finds the bucket cached). A retransmitted SYN
/// stays where its first went while that backend takes new flows; one on a tuple pinned
/// to a backend taking none (drained, suspect, down) is a new connection, chosen afresh.
/// `cookie`: what a new pin records as its `cookie_hash` (a SIP dialog's Call-ID hash,
/// else 0).
#[inline(always)]
pub fn select_backend(vip: &VipInfo, key: &FlowKey, syn: bool, cookie: u64) -> Option<Chosen> {
    if !syn {
        if let Some(flow) = FLOWS.get_ptr_mut(key) {
            let pinned = unsafe { (*flow).backend };
            if let Some(b) = backend(pinned) {
                if keeps_flows(b.state) {
                    return Some((pinned, b, true));
                }
                // Pinned backend is down or disabled: its peer replica holds its state.
                if let Some((rid, r)) = replica_if_up(b) {
                    unsafe { (*flow).backend = rid };
                    count(stats::vip_slot(vip.id, stats::VIP_REPINNED), 0);
                    return Some((rid, r, false));
                }
            }
            // No replica to take it: chosen as a new flow (the entry is overwritten).
        }
    }

    // Coarse clock (jiffy resolution), read only where a sticky time needs it: enough
    // for that, and far cheaper than the precise one.
    let sticky = vip.flags & VIP_F_AFFINITY != 0;
    let now = if sticky { unsafe { bpf_ktime_get_coarse_ns() } } else { 0 };
    let akey = AffinityKey { group: vip.port_group, family: key.family as u32, client: key.src };
    let mut chosen = None;
    if sticky {
        chosen = from_affinity(&akey, now);
        if chosen.is_some() {
            count(stats::vip_slot(vip.id, stats::VIP_AFFINITY_HITS), 0);
        }
    }
    // The ring's first slot is read before a SYN's FLOWS lookup: the two cache misses
    // (ring slot, hash bucket) overlap instead of following each other.
    let walk = if chosen.is_none() { ring_walk(vip, key) } else { None };
    let mut repin = false;
    if syn {
        // A retransmitted SYN (or a client reusing its port) stays where its first went
        // while that backend takes new flows; one pinned to a backend taking none (drained,
        // suspect, down) is a new connection, chosen afresh.
        if let Some(p) = unsafe { FLOWS.get(key) } {
            let pinned = p.backend;
            if let Some(pb) = backend(pinned).filter(|pb| takes_new_flows(pb.state)) {
                return Some((pinned, pb, true));
            }
            repin = true;
        }
    }
    if chosen.is_none() {
        chosen = from_ring(walk?, vip);
    }
    let (id, b) = chosen?;

    let flow = FlowValue { backend: id, vip: vip.id, cookie_hash: cookie, pinned_ns: now };
    if syn && !repin {
        if FLOWS.insert(key, &flow, BPF_NOEXIST as u64).is_err() {
            // Pinned meanwhile (another CPU): as above.
            if let Some(p) = unsafe { FLOWS.get(key) } {
                let pinned = p.backend;
                if let Some(pb) = backend(pinned).filter(|pb| takes_new_flows(pb.state)) {
                    return Some((pinned, pb, true));
                }
            }
            let _ = FLOWS.insert(key, &flow, 0);
        }
    } else {
        let _ = FLOWS.insert(key, &flow, 0);
    }
    if sticky {
        let expires_ns = now + vip.sticky_secs as u64 * NS_PER_SEC;
        let _ = AFFINITY.insert(&akey, &AffinityValue { backend: id, _pad: 0, expires_ns }, 0);
    }
    count(stats::vip_slot(vip.id, stats::VIP_NEW_FLOWS), 0);
    count(stats::backend_slot(id, stats::BACKEND_NEW_FLOWS), 0);
    Some((id, b, false))
}
