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

use core::ffi::c_void;

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_loop, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use dispatcher_common::{
    keeps_flows,
    sip::{Scan, SIP_SCAN_MAX, SRC_CALL_ID},
    sip_call_key, stats,
    stats::vip_slot,
    CloneValue, VipInfo, VipKey, CLONE_F_FAILED_OVER, NO_BACKEND, STATE_SUSPECT,
};

use crate::{
    forward,
    maps::{BACKENDS, CLONES, FLOWS, SIP_SCRATCH},
    parse::{L2, L3, UDP_HLEN},
    select,
    stats::count,
};

const DROP: u32 = xdp_action::XDP_DROP;

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

    let chosen = if src != SRC_CALL_ID {
        match unsafe { CLONES.get(&hash) } {
            Some(v) => match owner_of(v) {
                Ok(Some(found)) => found,
                Ok(None) => return drop_counted(vip.id, stats::VIP_SIP_HELD, stats::DROP_SIP_HELD, len),
                Err(()) => {
                    count(vip_slot(vip.id, stats::VIP_DROPS), len);
                    return Ok(count_drop(stats::DROP_NO_BACKEND, len));
                }
            },
            None => {
                // Nobody owns the name (not configured, not learned yet): where the dialog
                // began, if it began here, else nowhere.
                let key = sip_call_key(vkey, walk.scan.call_id);
                if !walk.scan.has(SRC_CALL_ID) || unsafe { FLOWS.get(&key) }.is_none() {
                    return drop_counted(vip.id, stats::VIP_SIP_UNKNOWN_LN, stats::DROP_SIP_UNKNOWN_LN, len);
                }
                match select::select_backend(vip, &key, false, walk.scan.call_id) {
                    Some(found) => found,
                    None => {
                        count(vip_slot(vip.id, stats::VIP_DROPS), len);
                        return Ok(count_drop(stats::DROP_NO_BACKEND, len));
                    }
                }
            }
        }
    } else {
        let key = sip_call_key(vkey, hash);
        match select::select_backend(vip, &key, false, hash) {
            Some(found) => found,
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
    let verdict = forward::forward(ctx, l2, l3, vip, backend);
    if verdict == DROP {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_ENCAP_FAILED, len);
    } else {
        count(vip_slot(vip.id, if hit { stats::VIP_FLOW_HITS } else { stats::VIP_PACKETS }), len);
        count(vip_slot(vip.id, stats::vip_sip_source(src)), len);
        count(stats::backend_slot(backend_id, stats::BACKEND_PACKETS), len);
        if let Some(id) = first {
            crate::frag::recorded(l3, id, vip.id, vkey.port, backend_id, len);
        }
    }
    Ok(verdict)
}

#[inline(always)]
fn count_drop(slot: u32, len: u64) -> u32 {
    count(slot, len);
    DROP
}
