//! SIP VIPs (UDP): one datagram is one message. Its affinity is read here
//! (`dispatcher_common::sip`, one `bpf_loop` step per 16 bytes of the header section):
//! a logical name goes to its owner through `CLONES`, exactly like a clone ID; a message
//! without one (an initial INVITE, REGISTER, OPTIONS) is placed by its Call-ID on the
//! VIP's Maglev ring and pinned in `FLOWS` under that Call-ID, so that retransmissions
//! and the rest of the dialog reach the same container whatever the source port.
//!
//! Never to a non-owner: a suspect owner's messages are dropped and counted (SIP over UDP
//! retransmits), a down owner's go to its replica, an unknown logical name goes where
//! the dialog's Call-ID is pinned, else it is dropped and counted.
//!
//! Learning: an unknown name in a dialog pinned here to a container that is up is that
//! container's (it put the name in its answer, which the caller echoes): reported to the
//! agent on `SIP_LEARN`, which checks and learns it. A learned name (`CLONE_F_LEARNED`)
//! yields to a dialog pinned here to another live container. ACKs forwarded to a container
//! are counted (`BACKEND_SIP_ACKS`): the health check's passive evidence.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_ktime_get_coarse_ns, bpf_loop, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use dispatcher_common::{
    keeps_flows,
    sip::{Scan, SIP_SCAN_MAX, SRC_CALL_ID},
    sip_call_key, stats,
    stats::vip_slot,
    CloneValue, FlowKey, SipLearnEvent, VipInfo, VipKey, CLONE_F_FAILED_OVER, CLONE_F_LEARNED, NO_BACKEND,
    SIP_LEARN_PER_CPU_PER_SEC, STATE_SUSPECT, STATE_UP,
};

use crate::{
    forward,
    maps::{BACKENDS, CLONES, FLOWS, SIP_LEARN, SIP_LEARN_BUDGET, SIP_LEARN_SEEN, SIP_SCRATCH},
    parse::{L2, L3, UDP_HLEN},
    select,
    stats::count,
};

const DROP: u32 = xdp_action::XDP_DROP;
const NS_PER_SEC: u64 = 1_000_000_000;

/// Bytes the scanner reads per `bpf_loop` step: the callback and the scratch lookup are
/// paid once per chunk, not per byte.
const CHUNK: usize = 16;
const _: () = assert!(SIP_SCAN_MAX.is_multiple_of(CHUNK));

/// Chunk `index` of the message (in this CPU's `SIP_SCRATCH`); 1 stops the loop (end of
/// the message or of its header section).
#[inline(never)]
unsafe extern "C" fn step(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(w) = SIP_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    let w = unsafe { &mut *w };
    // Bounded on a value the compiler cannot reason about, so that the verifier sees
    // the chunk inside `buf` before any address is computed from it.
    let index = unsafe { core::ptr::read_volatile(&index) } as usize;
    if index >= SIP_SCAN_MAX / CHUNK {
        return 1;
    }
    let base = index * CHUNK;
    let end = w.n as usize;
    for k in 0..CHUNK {
        let i = base + k;
        if i >= end {
            return 1;
        }
        if !w.scan.step(w.buf[i]) {
            return 1;
        }
    }
    0
}

#[inline(always)]
fn drop_counted(vip: u32, vip_what: u32, global: u32, len: u64) -> Result<u32, ()> {
    count(vip_slot(vip, vip_what), len);
    count(vip_slot(vip, stats::VIP_DROPS), len);
    count(global, len);
    Ok(DROP)
}

/// Where a logical name's messages go: `Ok(Some)` a backend, `Ok(None)` held (owner
/// suspect), `Err` nobody.
#[inline(always)]
fn owner_of(v: &CloneValue) -> Result<Option<select::Chosen>, ()> {
    let b = BACKENDS.get(v.owner).ok_or(())?;
    if b.state == STATE_SUSPECT {
        return Ok(None);
    }
    if keeps_flows(b.state) {
        return Ok(Some((v.owner, b, false)));
    }
    // Out, and the agent has not rewritten the entry yet: its replica holds its sessions.
    if v.flags & CLONE_F_FAILED_OVER == 0 && v.replica != NO_BACKEND {
        let r = BACKENDS.get(v.replica).ok_or(())?;
        if r.state == STATE_SUSPECT {
            return Ok(None);
        }
        if keeps_flows(r.state) {
            return Ok(Some((v.replica, r, false)));
        }
    }
    Err(())
}

/// `udp_len`: the message's length with its UDP header, checked by the caller against the
/// IP length (which was checked against the frame): the datagram's UDP length, or for a
/// first fragment (`first`: its IP ID) what the fragment carries. A first fragment's
/// header section may go on in the next fragment: its affinity is what it holds
/// (`Scan::affinity_so_far`).
#[allow(clippy::too_many_arguments)]
pub fn dispatch(
    ctx: &XdpContext,
    l2: &L2,
    l3: &L3,
    vip: &VipInfo,
    vkey: &VipKey,
    udp_len: u32,
    first: Option<u32>,
    len: u64,
) -> Result<u32, ()> {
    let off = l3.l4_off + UDP_HLEN;
    let mut n = udp_len.saturating_sub(UDP_HLEN as u32) as usize;
    let too_long = n > SIP_SCAN_MAX;
    if too_long {
        n = SIP_SCAN_MAX;
    }
    if n == 0 {
        return drop_counted(vip.id, stats::VIP_SIP_INVALID, stats::DROP_SIP_INVALID, len);
    }
    // Checked again on a value the compiler cannot reason about, so that the verifier
    // sees 1..=SIP_SCAN_MAX right where the helper takes it.
    let n = unsafe { core::ptr::read_volatile(&n) };
    if n == 0 || n > SIP_SCAN_MAX {
        return Err(());
    }
    let w = unsafe { &mut *SIP_SCRATCH.get_ptr_mut(0).ok_or(())? };
    let copied = unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, w.buf.as_mut_ptr() as *mut c_void, n as u32) };
    if copied != 0 {
        return drop_counted(vip.id, stats::VIP_SIP_INVALID, stats::DROP_SIP_INVALID, len);
    }
    w.scan = Scan::default();
    w.n = n as u64;
    let cb = step as *const () as *mut c_void;
    unsafe { bpf_loop(n.div_ceil(CHUNK) as u32, cb, core::ptr::null_mut(), 0) };
    let walk = w;
    let affinity = if first.is_some() { walk.scan.affinity_so_far() } else { walk.scan.affinity() };
    let Some((src, hash)) = affinity else {
        let (what, global) = if too_long && walk.scan.done == 0 {
            (stats::VIP_SIP_INVALID, stats::DROP_SIP_TOO_LONG)
        } else {
            (stats::VIP_SIP_INVALID, stats::DROP_SIP_INVALID)
        };
        return drop_counted(vip.id, what, global, len);
    };

    let call_key = sip_call_key(vkey, walk.scan.call_id);
    // How the container is chosen (`VIP_SIP_BY_*`), and a name to report for learning.
    let mut how = stats::VIP_SIP_BY_LN;
    let mut learn = false;
    let chosen = if src != SRC_CALL_ID {
        match unsafe { CLONES.get(&hash) } {
            Some(v) => match pinned_elsewhere(v, vip, &call_key, walk.scan.call_id) {
                Some(found) => {
                    how = stats::VIP_SIP_BY_PIN;
                    count(stats::SIP_PIN_OVER_LEARNED, len);
                    found
                }
                None => match owner_of(v) {
                    Ok(Some(found)) => found,
                    Ok(None) => return drop_counted(vip.id, stats::VIP_SIP_HELD, stats::DROP_SIP_HELD, len),
                    Err(()) => {
                        count(vip_slot(vip.id, stats::VIP_DROPS), len);
                        return Ok(count_drop(stats::DROP_NO_BACKEND, len));
                    }
                },
            },
            None => {
                // Nobody owns the name (not configured, not learned yet): where the dialog
                // began, if it began here, else nowhere.
                if unsafe { FLOWS.get(&call_key) }.is_none() {
                    return drop_counted(vip.id, stats::VIP_SIP_UNKNOWN_LN, stats::DROP_SIP_UNKNOWN_LN, len);
                }
                how = stats::VIP_SIP_BY_PIN;
                match select::select_backend(vip, &call_key, false, walk.scan.call_id) {
                    Some(found) => {
                        // The container that took the dialog's first request, still there:
                        // the name is its own (it put it in its answer, which the caller
                        // echoes).
                        learn = found.2 && found.1.state == STATE_UP;
                        found
                    }
                    None => {
                        count(vip_slot(vip.id, stats::VIP_DROPS), len);
                        return Ok(count_drop(stats::DROP_NO_BACKEND, len));
                    }
                }
            }
        }
    } else {
        match select::select_backend(vip, &call_key, false, hash) {
            Some(found) => {
                how = if found.2 { stats::VIP_SIP_BY_PIN } else { stats::VIP_SIP_BY_RING };
                found
            }
            None => {
                count(vip_slot(vip.id, stats::VIP_DROPS), len);
                return Ok(count_drop(stats::DROP_NO_BACKEND, len));
            }
        }
    };
    let (backend_id, backend, hit) = chosen;
    if backend.state == STATE_SUSPECT {
        // A dialog pinned to a container that may be frozen: held, as a name would be.
        return drop_counted(vip.id, stats::VIP_SIP_HELD, stats::DROP_SIP_HELD, len);
    }
    // Read before the forward rewrites nothing of the message, but the scratch copy is
    // what the scanner read: its first bytes are the start line.
    let ack = walk.scan.response == 0
        && walk.buf[0] == b'A'
        && walk.buf[1] == b'C'
        && walk.buf[2] == b'K'
        && walk.buf[3] == b' ';
    if learn {
        report(ctx, off, n, vip.id, backend_id, hash, walk.scan.call_id, src, len);
    }
    let verdict = forward::forward(ctx, l2, l3, vip, backend);
    if verdict == DROP {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_ENCAP_FAILED, len);
    } else {
        count(vip_slot(vip.id, if hit { stats::VIP_FLOW_HITS } else { stats::VIP_PACKETS }), len);
        count(vip_slot(vip.id, stats::vip_sip_source(src)), len);
        count(vip_slot(vip.id, how), len);
        count(stats::backend_slot(backend_id, stats::BACKEND_PACKETS), len);
        if ack {
            count(stats::backend_slot(backend_id, stats::BACKEND_SIP_ACKS), len);
        }
        if let Some(id) = first {
            crate::frag::recorded(l3, id, vip.id, vkey.port, backend_id, len);
        }
    }
    Ok(verdict)
}

/// A learned name (`CLONE_F_LEARNED`) whose message belongs to a dialog pinned here to
/// another container that keeps its flows: the dialog goes where it began (seen here
/// first-hand), not where a learned name says.
#[inline(always)]
fn pinned_elsewhere(v: &CloneValue, vip: &VipInfo, call_key: &FlowKey, call_id: u64) -> Option<select::Chosen> {
    if v.flags & CLONE_F_LEARNED == 0 {
        return None;
    }
    let pinned = unsafe { FLOWS.get(call_key) }?.backend;
    if pinned == v.owner || pinned == v.replica {
        return None;
    }
    let b = BACKENDS.get(pinned)?;
    if !keeps_flows(b.state) {
        return None;
    }
    select::select_backend(vip, call_key, false, call_id)
}

/// Reports the message to the agent (`SIP_LEARN`) — at most once a second per name and
/// `SIP_LEARN_PER_CPU_PER_SEC` per CPU; what is not reported is counted.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn report(ctx: &XdpContext, off: usize, n: usize, vip: u32, backend: u32, ln: u64, call_id: u64, src: u8, len: u64) {
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if let Some(last) = unsafe { SIP_LEARN_SEEN.get(&ln) } {
        if now.wrapping_sub(*last) < NS_PER_SEC {
            return;
        }
    }
    let Some(budget) = SIP_LEARN_BUDGET.get_ptr_mut(0) else {
        return;
    };
    let budget = unsafe { &mut *budget };
    let second = now / NS_PER_SEC;
    if budget[0] != second {
        budget[0] = second;
        budget[1] = 0;
    }
    if budget[1] >= SIP_LEARN_PER_CPU_PER_SEC {
        count(stats::SIP_LEARN_SKIPPED, len);
        return;
    }
    let Some(mut entry) = SIP_LEARN.reserve::<SipLearnEvent>(0) else {
        count(stats::SIP_LEARN_SKIPPED, len);
        return;
    };
    // Bounded again where the helper takes it (the verifier's view of `n`).
    let n = unsafe { core::ptr::read_volatile(&n) };
    if n == 0 || n > SIP_SCAN_MAX {
        entry.discard(0);
        return;
    }
    let e = entry.as_mut_ptr();
    unsafe {
        (*e).vip = vip;
        (*e).backend = backend;
        (*e).ln = ln;
        (*e).call_id = call_id;
        (*e).len = n as u32;
        (*e).src = src as u32;
    }
    let copied =
        unsafe { bpf_xdp_load_bytes(ctx.ctx, off as u32, core::ptr::addr_of_mut!((*e).msg) as *mut c_void, n as u32) };
    if copied != 0 {
        entry.discard(0);
        count(stats::SIP_LEARN_SKIPPED, len);
        return;
    }
    entry.submit(0);
    budget[1] += 1;
    let _ = SIP_LEARN_SEEN.insert(&ln, &now, 0);
    count(stats::SIP_LEARN_REPORTED, len);
}

#[inline(always)]
fn count_drop(slot: u32, len: u64) -> u32 {
    count(slot, len);
    DROP
}
