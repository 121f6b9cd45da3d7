//! Which backend a VIP packet goes to: pinned flow, then client affinity, then the
//! VIP's Maglev ring — each filtered by the backend's state.

use aya_ebpf::helpers::bpf_ktime_get_coarse_ns;
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

#[inline(always)]
fn backend(id: u32) -> Option<BackendInfo> {
    BACKENDS.get(id).copied()
}

/// The backend itself if it takes new flows, else its replica if that one does.
#[inline(always)]
fn usable_for_new(id: u32) -> Option<(u32, BackendInfo)> {
    let b = backend(id)?;
    if takes_new_flows(b.state) {
        return Some((id, b));
    }
    replica_if_up(&b)
}

#[inline(always)]
fn replica_if_up(b: &BackendInfo) -> Option<(u32, BackendInfo)> {
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

#[inline(always)]
fn from_ring(vip: &VipInfo, key: &FlowKey) -> Option<(u32, BackendInfo)> {
    let size = vip.ring_size;
    if size == 0 || size > MAX_RING_SIZE {
        return None;
    }
    let h = flow_hash(key);
    let mut slot = h % size;
    let step = (h >> 16) % (size - 1).max(1) + 1;
    for _ in 0..=RING_PROBES {
        let id = *RINGS.get(vip.id * MAX_RING_SIZE + slot)?;
        if id != NO_BACKEND {
            if let Some(found) = usable_for_new(id) {
                return Some(found);
            }
        }
        slot = (slot + step) % size;
    }
    None
}

#[inline(always)]
fn from_affinity(akey: &AffinityKey, now: u64) -> Option<(u32, BackendInfo)> {
    let a = unsafe { AFFINITY.get(akey) }?;
    if a.expires_ns < now {
        return None;
    }
    usable_for_new(a.backend)
}

/// `syn`: a TCP connection attempt (SYN without ACK). One that finds its tuple pinned to
/// a backend taking no new flows (drained, suspect, down) is a new connection reusing
/// the client's port, not part of the old flow: it is chosen afresh. `cookie`: what a
/// new pin records as its `cookie_hash` (a SIP dialog's Call-ID hash, else 0).
#[inline(always)]
pub fn select_backend(vip: &VipInfo, key: &FlowKey, syn: bool, cookie: u64) -> Option<(u32, BackendInfo)> {
    // Coarse clock (jiffy resolution): enough for "last seen" and sticky times, and far
    // cheaper than the precise one on every packet.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if let Some(flow) = FLOWS.get_ptr_mut(key) {
        let pinned = unsafe { (*flow).backend };
        if let Some(b) = backend(pinned).filter(|b| !syn || takes_new_flows(b.state)) {
            if keeps_flows(b.state) {
                unsafe { (*flow).last_seen_ns = now };
                count(stats::vip_slot(vip.id, stats::VIP_FLOW_HITS), 0);
                return Some((pinned, b));
            }
            // Pinned backend is down or disabled: its peer replica holds its state.
            if let Some((rid, r)) = replica_if_up(&b) {
                unsafe {
                    (*flow).backend = rid;
                    (*flow).last_seen_ns = now;
                }
                count(stats::vip_slot(vip.id, stats::VIP_REPINNED), 0);
                return Some((rid, r));
            }
        }
        // No replica to take it, or a new connection: fall through and choose as for a
        // new flow (the entry is overwritten).
    }

    let sticky = vip.flags & VIP_F_AFFINITY != 0;
    let akey = AffinityKey { group: vip.port_group, family: key.family as u32, client: key.src };
    let mut chosen = None;
    if sticky {
        chosen = from_affinity(&akey, now);
        if chosen.is_some() {
            count(stats::vip_slot(vip.id, stats::VIP_AFFINITY_HITS), 0);
        }
    }
    if chosen.is_none() {
        chosen = from_ring(vip, key);
    }
    let (id, b) = chosen?;

    let flow = FlowValue { backend: id, vip: vip.id, cookie_hash: cookie, last_seen_ns: now };
    let _ = FLOWS.insert(key, &flow, 0);
    if sticky {
        let expires_ns = now + vip.sticky_secs as u64 * NS_PER_SEC;
        let _ = AFFINITY.insert(&akey, &AffinityValue { backend: id, _pad: 0, expires_ns }, 0);
    }
    count(stats::vip_slot(vip.id, stats::VIP_NEW_FLOWS), 0);
    count(stats::backend_slot(id, stats::BACKEND_NEW_FLOWS), 0);
    Some((id, b))
}
