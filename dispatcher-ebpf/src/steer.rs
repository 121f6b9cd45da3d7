//! Connection steering for HTTP VIPs when several dispatchers share them behind ECMP.
//!
//! Every dispatcher holds the same ownership table (`STEER`, built by the agents from the
//! shared membership): the flow hash of a connection's tuple names the dispatcher that
//! terminates it. A packet that lands on another dispatcher is sent on to the owner by MAC
//! (same segment, `XDP_TX`). After a membership change the previous table is kept for a
//! while: the current owner sends a non-SYN packet it has no socket for to the owner under
//! the previous table (second chance, as in Beamer or GLB), so the connections that were
//! open before the change go on where they live.
//!
//! Two changes within the second-chance time: the table before the previous one is kept
//! too, and the newest earlier owner that is neither here nor the sender gets the packet.
//!
//! Agent gone: the agent writes a beacon into `STEER_CONF` every 200 ms. When it is older
//! than `STEER_AGENT_STALE_NS` (the agent died; nothing listens here any more), a SYN this
//! host owns goes by the fallback table, the membership without it: the table the others
//! install once its lease expires, so a connection opened meanwhile stays where it is.
//!
//! Takeover (issue 31): when a dispatcher dies, the one its fallback table named for a
//! connection's slot holds the connection's handshake (sent over the peer channel) and
//! arms it in `TAKEOVER`. A non-SYN segment of an owned slot with no socket here and an
//! armed record is reported to the agent (`TAKEOVER_EVENTS`: its sequence, acknowledgement,
//! window and options, and its data when it fits) and dropped; the agent rebuilds the
//! socket with `TCP_REPAIR`, gives it the segment's data, and deletes the record; the
//! client's later segments land on the new socket. This comes before the second chance:
//! the earlier table names the dead dispatcher.
//!
//! Loops: a dispatcher never sends a packet back to the one it came from, and every hop
//! spends one unit of the IP TTL (hop limit); a packet that would leave with none stays.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::{bpf_sock_tuple, xdp_action, BPF_F_CURRENT_NETNS},
    helpers::{bpf_ktime_get_coarse_ns, bpf_sk_release, bpf_skc_lookup_tcp, bpf_xdp_load_bytes},
    programs::XdpContext,
};
use dispatcher_common::{
    hash::flow_hash, stats, FlowKey, SteerConf, SteerSlot, TakeoverEvent, AF_INET, STEER_AGENT_STALE_NS,
    STEER_FALLBACK, STEER_HAS_PREV, STEER_HAS_PREV2, STEER_LEFT, STEER_ON, STEER_SIZE, STEER_TAKEOVER, TAKEOVER_DATA,
    TAKEOVER_REPORT_EVERY_NS, TAKEOVER_TCP_HEADER,
};

use crate::{
    maps::{STEER, STEER_CONF, TAKEOVER, TAKEOVER_EVENTS},
    parse::{ptr_at, write_mac, EthHdr, Ipv4Hdr, Ipv6Hdr, L2, L3},
    stats::count,
};

const TCP_LISTEN: u32 = 10;

#[inline(always)]
fn slot(table: u32, h: u32) -> Option<SteerSlot> {
    STEER.get((table & 0xf) * STEER_SIZE + h % STEER_SIZE).copied().filter(|s| s.valid == 1)
}

#[inline(always)]
fn same_mac(a: &[u8; 6], b: &[u8; 6]) -> bool {
    a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] && a[5] == b[5]
}

/// A connection of this host's for the tuple: an established (or half-open, or
/// time-wait) socket, not merely the listener.
#[inline(always)]
fn local_connection(ctx: &XdpContext, key: &FlowKey) -> bool {
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let size = if key.family == AF_INET {
        let t = unsafe { &mut tuple.__bindgen_anon_1.ipv4 };
        t.saddr = key.src[0];
        t.daddr = key.dst[0];
        t.sport = key.sport;
        t.dport = key.dport;
        core::mem::size_of_val(t)
    } else {
        let t = unsafe { &mut tuple.__bindgen_anon_1.ipv6 };
        t.saddr = key.src;
        t.daddr = key.dst;
        t.sport = key.sport;
        t.dport = key.dport;
        core::mem::size_of_val(t)
    };
    let sk = unsafe { bpf_skc_lookup_tcp(ctx.ctx as *mut _, &mut tuple, size as u32, BPF_F_CURRENT_NETNS as u64, 0) };
    if sk.is_null() {
        return false;
    }
    let state = unsafe { (*sk).state };
    unsafe { bpf_sk_release(sk as *mut _) };
    state != TCP_LISTEN
}

/// Sends the frame to `to` on the segment it came from, spending one hop.
#[inline(always)]
fn send_to(
    ctx: &XdpContext,
    l2: &L2,
    l3: &L3,
    conf: &SteerConf,
    to: &[u8; 6],
    slot_: u32,
    len: u64,
) -> Result<u32, ()> {
    if l3.family == AF_INET {
        let ip = unsafe { &mut *ptr_at::<Ipv4Hdr>(ctx, l2.l3_off)? };
        if ip.ttl <= 1 {
            count(stats::STEER_TTL_EXPIRED, len);
            return Ok(xdp_action::XDP_PASS);
        }
        ip.ttl -= 1;
        // RFC 1624 (eqn. 3), as the kernel's ip_decrease_ttl: the TTL is the high byte of
        // its 16-bit word, so the checksum grows by 0x0100, with the carry folded in
        // (never yielding 0xffff, "minus zero").
        let sum = u16::from_be_bytes(ip.check) as u32 + 0x0100;
        ip.check = ((sum + (sum >= 0xffff) as u32) as u16).to_be_bytes();
    } else {
        let ip = unsafe { &mut *ptr_at::<Ipv6Hdr>(ctx, l2.l3_off)? };
        if ip.hop_limit <= 1 {
            count(stats::STEER_TTL_EXPIRED, len);
            return Ok(xdp_action::XDP_PASS);
        }
        ip.hop_limit -= 1;
    }
    let eth = unsafe { &mut *ptr_at::<EthHdr>(ctx, 0)? };
    write_mac(&mut eth.dst, *to);
    write_mac(&mut eth.src, conf.self_mac);
    count(slot_, len);
    Ok(xdp_action::XDP_TX)
}

/// What `takeover` did: nothing (not armed), or dropped the segment, reported or not.
const TAKEOVER_NOT_ARMED: u32 = 0;
const TAKEOVER_REPORTED: u32 = 1;
const TAKEOVER_NOT_REPORTED: u32 = 2;

/// A segment of an armed connection of a dead dispatcher: reported (at most once per
/// `TAKEOVER_REPORT_EVERY_NS`) and to be dropped; a SYN with an armed tuple deletes the
/// record (a new connection: the record is stale). (No socket lookup: the agent deletes
/// the record as soon as it made the socket; a segment caught between the two is
/// retransmitted.)
///
/// A function of its own (`inline(never)`), its arguments in registers, counting nothing
/// itself: the main program's frame is near the verifier's 512-byte bound (with this
/// one's added), so this one's must stay tiny. `at`: the TCP header's offset (low 16
/// bits), the IP headers' length (next 16), the IP length (high 32).
#[inline(never)]
fn takeover(ctx: &XdpContext, key: &FlowKey, at: u64, syn: u64) -> u32 {
    if syn != 0 {
        // (A delete of what is not there costs a bucket lock, only while armed.)
        let _ = TAKEOVER.remove(key);
        return TAKEOVER_NOT_ARMED;
    }
    let Some(rec) = TAKEOVER.get_ptr_mut(key) else { return TAKEOVER_NOT_ARMED };
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    if now.saturating_sub(unsafe { (*rec).reported_ns }) < TAKEOVER_REPORT_EVERY_NS {
        return TAKEOVER_NOT_REPORTED;
    }
    // Before the report, which may fail (the ring full; the client's retransmission is
    // reported then): nothing of this stays live across its helper calls.
    unsafe { (*rec).reported_ns = now };
    if !report(ctx, key, at) {
        return TAKEOVER_NOT_REPORTED;
    }
    TAKEOVER_REPORTED
}

/// The report itself: the tuple, the segment's length, its TCP header as it is, and its
/// data when it fits (the rebuilt socket is given it: no retransmission).
#[inline(always)]
fn report(ctx: &XdpContext, key: &FlowKey, at: u64) -> bool {
    let l4_off = (at & 0xffff) as u32;
    let Some(mut entry) = TAKEOVER_EVENTS.reserve::<TakeoverEvent>(0) else { return false };
    let Ok(doff) = ptr_at::<u8>(ctx, l4_off as usize + 12) else {
        entry.discard(0);
        return false;
    };
    // 20..=60, and seen by the verifier as 1..=64 (a mask, as the data's length below).
    let header = (((unsafe { *doff } >> 4) as u64 * 4).clamp(20, TAKEOVER_TCP_HEADER as u64) - 1) & 63;
    let header = header + 1;
    // The data's length, masked into 1..=TAKEOVER_DATA (a power of two), not checked: the
    // compiler turns checks of it into checks of the lengths it comes from, and the
    // verifier needs the bound (above zero) on the helper's length itself. Kept only when
    // it is all of the data. Worked out before the first copy, and the outcome written
    // at once, so that few values live across the helper calls (this frame must stay
    // tiny).
    let data = (at >> 32).saturating_sub((at >> 16) & 0xffff).saturating_sub(header);
    let len = (data.wrapping_sub(1) & (TAKEOVER_DATA as u64 - 1)) + 1;
    let data_at = l4_off + header as u32;
    let e = entry.as_mut_ptr();
    unsafe {
        // Word by word: a struct copy becomes a call to memcpy, whose frame adds to ours.
        for i in 0..4 {
            core::ptr::write_volatile(&mut (*e).key.src[i], core::ptr::read_volatile(&key.src[i]));
            core::ptr::write_volatile(&mut (*e).key.dst[i], core::ptr::read_volatile(&key.dst[i]));
        }
        (*e).key.sport = key.sport;
        (*e).key.dport = key.dport;
        (*e).key.proto = key.proto;
        (*e).key.family = key.family;
        (*e).key._pad = 0;
        (*e).segment_len = ((at >> 32) as u32).saturating_sub(((at >> 16) & 0xffff) as u32) as u16;
        (*e).header_len = header as u16;
        (*e).data_len = if len == data { len as u16 } else { 0 };
        (*e)._pad = 0;
    }
    let copied =
        unsafe { bpf_xdp_load_bytes(ctx.ctx, l4_off, core::ptr::addr_of_mut!((*e).tcp) as *mut c_void, header as u32) };
    if copied != 0 {
        entry.discard(0);
        return false;
    }
    let to = unsafe { core::ptr::addr_of_mut!((*e).data) as *mut c_void };
    if unsafe { bpf_xdp_load_bytes(ctx.ctx, data_at, to, len as u32) } != 0 {
        unsafe { (*e).data_len = 0 };
    }
    entry.submit(0);
    true
}

/// The verdict for a TCP packet to an HTTP VIP: `None` when this dispatcher terminates
/// it (the caller passes it to the stack), else the verdict of sending it on.
#[inline(always)]
pub fn steer(ctx: &XdpContext, l2: &L2, l3: &L3, key: &FlowKey, syn: bool, len: u64) -> Result<Option<u32>, ()> {
    let Some(conf) = STEER_CONF.get(0) else { return Ok(None) };
    // Read in place (a copy would take the main program's stack, which is near the
    // verifier's bound).
    if conf.sel & STEER_ON == 0 {
        return Ok(None);
    }
    let h = flow_hash(key);
    let Some(mut owner) = slot(conf.sel, h) else { return Ok(None) };
    let from = unsafe { (*ptr_at::<EthHdr>(ctx, 0)?).src };
    // The owners under the two previous tables (a SYN opens a new connection: none).
    let prev = if conf.sel & STEER_HAS_PREV != 0 && !syn { slot(conf.sel >> 4, h) } else { None };
    let prev2 = if conf.sel & STEER_HAS_PREV2 != 0 && !syn { slot(conf.sel >> 12, h) } else { None };
    // Read only where it decides (a clock read per packet otherwise).
    let agent_gone = || {
        conf.heartbeat_ns != 0
            && unsafe { bpf_ktime_get_coarse_ns() }.saturating_sub(conf.heartbeat_ns) > STEER_AGENT_STALE_NS
    };

    if syn && same_mac(&owner.mac, &conf.self_mac) && agent_gone() {
        // A new connection, and no agent here any more to take it: to the owner this
        // host's slots will have once the others notice. (Packets of connections it had
        // went with its sockets; they are not looked at, to keep the clock read off the
        // path of every established packet.)
        match slot(STEER_FALLBACK, h) {
            Some(f) if !same_mac(&f.mac, &conf.self_mac) => owner = f,
            _ => return Ok(None),
        }
    }
    if same_mac(&owner.mac, &conf.self_mac) {
        // A dead dispatcher's connection this one continues (before the second chance:
        // the earlier table names the dead one).
        // (With the agent gone, nothing reads the reports: the flag is not followed.)
        if conf.sel & STEER_TAKEOVER != 0 && !agent_gone() {
            let at = l3.l4_off as u64 | ((l3.l4_off - l2.l3_off) as u64) << 16 | (l3.ip_len as u64) << 32;
            match takeover(ctx, key, at, syn as u64) {
                TAKEOVER_NOT_ARMED => {}
                done => {
                    count(
                        if done == TAKEOVER_REPORTED { stats::TAKEOVER_REPORTED } else { stats::TAKEOVER_DROPPED },
                        len,
                    );
                    return Ok(Some(xdp_action::XDP_DROP));
                }
            }
        }
        // Ours under the current table. A new connection, or one of ours, stays; else the
        // newest earlier owner that is neither here nor the sender gets it.
        let usable =
            |p: &Option<SteerSlot>| p.filter(|p| !same_mac(&p.mac, &conf.self_mac) && !same_mac(&p.mac, &from));
        let Some(to) = usable(&prev).or(usable(&prev2)) else { return Ok(None) };
        if local_connection(ctx, key) {
            return Ok(None);
        }
        return send_to(ctx, l2, l3, conf, &to.mac, stats::STEER_SECOND_CHANCE, len).map(Some);
    }
    // Another dispatcher's. The owner itself sent it here: its second chance (or its table
    // is behind). It stays; but where nothing can take it (this dispatcher left, or its
    // agent is gone) and no connection is here, it is dropped: the sender catches up and
    // TCP retransmits, where a reset would break the connection.
    if same_mac(&owner.mac, &from) {
        if (conf.sel & STEER_LEFT != 0 || agent_gone()) && !local_connection(ctx, key) {
            count(stats::STEER_DROPPED_LEFT, len);
            return Ok(Some(xdp_action::XDP_DROP));
        }
        count(stats::STEER_KEPT_LOCAL, len);
        return Ok(None);
    }
    // A connection this host held under an earlier table, still open here.
    let was_ours = |p: &Option<SteerSlot>| p.is_some_and(|p| same_mac(&p.mac, &conf.self_mac));
    if (was_ours(&prev) || was_ours(&prev2)) && local_connection(ctx, key) {
        count(stats::STEER_KEPT_LOCAL, len);
        return Ok(None);
    }
    send_to(ctx, l2, l3, conf, &owner.mac, stats::STEERED, len).map(Some)
}
