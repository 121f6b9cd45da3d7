//! UDP datagrams in IP fragments, on L4 and SIP VIPs. The first fragment (offset 0, more
//! fragments) carries the UDP header and the start of the payload: it is dispatched as a
//! whole datagram would be (`dispatch`, `sip`), and where it went is recorded in `FRAGS`
//! under {family, source, destination, protocol, IP ID}. A later fragment carries no
//! ports: it goes where its record says, by the same forward path, while the record is
//! younger than `FRAG_LIFETIME_NS`; with no record (it came first, or its first fragment
//! was dropped) it is dropped and counted — never passed to the host, which would answer
//! with ICMP for a port it does not serve. SIP over UDP retransmits the whole message.
//!
//! Bounded: `FRAGS` has `FRAG_ENTRIES` entries, and each CPU makes at most
//! `FRAG_BUDGET_PER_SEC` new ones a second (first fragments beyond are dropped and
//! counted), so a flood of first fragments that never complete evicts a live entry no
//! sooner than `FRAG_ENTRIES / (CPUs * FRAG_BUDGET_PER_SEC)` seconds after it was made.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_coarse_ns, programs::XdpContext};
use dispatcher_common::{
    keeps_flows, stats, stats::vip_slot, FragKey, FragValue, VipKey, FRAG_BUDGET_PER_SEC, FRAG_LIFETIME_NS, NO_BACKEND,
};

use crate::{
    forward,
    maps::{BACKENDS, FRAGS, FRAG_BUDGET, VIPS},
    parse::{L2, L3},
    stats::count,
};

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;
const NS_PER_SEC: u64 = 1_000_000_000;

#[inline(always)]
pub fn key(l3: &L3, id: u32) -> FragKey {
    FragKey::new(&l3.src, &l3.dst, id, l3.proto, l3.family)
}

/// Takes one new entry from this CPU's budget of the current second; false: spent.
#[inline(always)]
pub fn take_budget() -> bool {
    let Some(b) = FRAG_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let b = unsafe { &mut *b };
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if now.wrapping_sub(b.window_ns) >= NS_PER_SEC {
        b.window_ns = now;
        b.used = 0;
    }
    if b.used >= FRAG_BUDGET_PER_SEC {
        return false;
    }
    b.used += 1;
    true
}

/// Records where the first fragment `id` of `l3`'s datagram went: `backend` (or
/// `NO_BACKEND`, the host) of the VIP `vip` on `port`.
#[inline(always)]
pub fn record(l3: &L3, id: u32, vip: u32, port: u16, backend: u32) {
    let v = FragValue { backend, vip, created_ns: unsafe { bpf_ktime_get_coarse_ns() }, port, _pad: [0; 3] };
    let _ = FRAGS.insert(&key(l3, id), &v, 0);
}

/// A first fragment forwarded to `backend`: recorded for its later fragments, counted.
#[inline(always)]
pub fn recorded(l3: &L3, id: u32, vip: u32, port: u16, backend: u32, len: u64) {
    record(l3, id, vip, port, backend);
    count(vip_slot(vip, stats::VIP_FRAG_FIRST), len);
    count(stats::FRAG_FIRST, len);
}

/// A first fragment over this CPU's budget: dropped, counted.
#[inline(always)]
pub fn drop_over_budget(vip: u32, len: u64) -> u32 {
    count(vip_slot(vip, stats::VIP_FRAG_BUDGET), len);
    count(vip_slot(vip, stats::VIP_DROPS), len);
    count(stats::DROP_FRAG_BUDGET, len);
    DROP
}

/// A later fragment (offset > 0) of a UDP datagram to an address that carries VIPs
/// (`marker`: the id its address marker names, for the counters).
#[inline(always)]
pub fn later(ctx: &XdpContext, l2: &L2, l3: &L3, id: u32, marker: u32, len: u64) -> u32 {
    let orphan = || {
        count(vip_slot(marker, stats::VIP_FRAG_NO_FIRST), len);
        count(vip_slot(marker, stats::VIP_DROPS), len);
        count(stats::DROP_FRAG_NO_FIRST, len);
        DROP
    };
    let Some(rec) = (unsafe { FRAGS.get(&key(l3, id)) }) else {
        return orphan();
    };
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if now.wrapping_sub(rec.created_ns) > FRAG_LIFETIME_NS {
        return orphan();
    }
    if rec.backend == NO_BACKEND {
        // The first fragment was for the host (no VIP on its port): so is the rest.
        count(stats::PASS_FRAGMENT, len);
        return PASS;
    }
    let (backend_id, vip_id) = (rec.backend, rec.vip);
    let vkey = VipKey { addr: l3.dst, port: rec.port, proto: l3.proto, family: l3.family };
    // The VIP as it is now (removed or renumbered since: the record is stale).
    let Some(vip) = (unsafe { VIPS.get(&vkey) }).filter(|v| v.id == vip_id) else {
        return orphan();
    };
    // The container that has the first fragment, while it keeps what it has (a suspect
    // one too: the rest of a datagram it holds is no use to anyone else).
    let Some(b) = BACKENDS.get(backend_id).filter(|b| keeps_flows(b.state)) else {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_NO_BACKEND, len);
        return DROP;
    };
    let verdict = forward::forward(ctx, l2, l3, vip, b);
    if verdict == DROP {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_ENCAP_FAILED, len);
    } else {
        // One count per forwarded packet, as a flow-table hit (it followed a record).
        count(vip_slot(vip.id, stats::VIP_FLOW_HITS), len);
        count(vip_slot(vip.id, stats::VIP_FRAG_FOLLOWED), len);
        count(stats::FRAG_FOLLOWED, len);
        count(stats::backend_slot(backend_id, stats::BACKEND_PACKETS), len);
    }
    verdict
}
