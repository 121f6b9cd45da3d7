//! Sending the packet to the chosen backend: MAC forwarding (L2 direct server return) or
//! IPIP encapsulation (L3 direct server return), both out of the ingress interface.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use dispatcher_common::{BackendInfo, VipInfo, AF_INET, FWD_IPIP, IPPROTO_IPIP, IPPROTO_IPV6};

use crate::parse::{
    load_mac, ptr_at, store_mac, EthHdr, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPV4_HLEN, IPV6_HLEN, L2, L3, VLAN_HLEN,
};

const TX: u32 = xdp_action::XDP_TX;
const DROP: u32 = xdp_action::XDP_DROP;
const OUTER_TTL: u8 = 64;

#[inline(always)]
pub fn forward(ctx: &XdpContext, l2: &L2, l3: &L3, vip: &VipInfo, b: &BackendInfo) -> u32 {
    let done = if vip.forward == FWD_IPIP {
        if l3.family == AF_INET {
            encap_ipv4(ctx, l2, l3, vip, b)
        } else {
            encap_ipv6(ctx, l2, l3, vip, b)
        }
    } else {
        rewrite_macs(ctx, 0, b)
    };
    if done.is_ok() {
        TX
    } else {
        DROP
    }
}

/// New destination: the backend (or next hop); new source: the address the frame was
/// sent to, which is this interface.
#[inline(always)]
fn rewrite_macs(ctx: &XdpContext, eth_off: usize, b: &BackendInfo) -> Result<(), ()> {
    let eth = ptr_at::<EthHdr>(ctx, eth_off)? as *mut u8;
    unsafe {
        let to = load_mac(eth);
        store_mac(eth.add(6), to);
        store_mac(eth, load_mac(b.mac.as_ptr()));
    }
    Ok(())
}

/// Grow the head by `outer` bytes and move the link header (Ethernet and the VLAN tag if
/// any) to the new front, with its ethertype set to the outer protocol. Returns the new
/// front, checked once for `FRONT` bytes (the link header, tag and outer header: every
/// frame that gets here is longer, its inner headers having been checked).
#[inline(always)]
fn push_outer<const FRONT: usize>(
    ctx: &XdpContext,
    l2: &L2,
    outer: usize,
    ethertype: u16,
    b: &BackendInfo,
) -> Result<*mut u8, ()> {
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(outer as i32)) } != 0 {
        return Err(());
    }
    let base = ptr_at::<[u8; FRONT]>(ctx, 0)? as *mut u8;
    unsafe {
        // The old link header starts `outer` bytes in (at least 20: no overlap).
        let old = base.add(outer);
        store_mac(base.add(6), load_mac(old));
        store_mac(base, load_mac(b.mac.as_ptr()));
        if l2.l3_off == ETH_HLEN {
            (base.add(12) as *mut u16).write_unaligned(ethertype.to_be());
        } else {
            // Keep the 802.1Q tag: the next hop is on the same VLAN we received on.
            (base.add(12) as *mut u32).write_unaligned((old.add(12) as *const u32).read_unaligned());
            (base.add(16) as *mut u16).write_unaligned(ethertype.to_be());
        }
    }
    Ok(base)
}

/// Front bytes `push_outer` checks: link header, VLAN tag, outer header.
const FRONT4: usize = ETH_HLEN + VLAN_HLEN + IPV4_HLEN;
const FRONT6: usize = ETH_HLEN + VLAN_HLEN + IPV6_HLEN;

#[inline(always)]
fn encap_ipv4(ctx: &XdpContext, l2: &L2, l3: &L3, vip: &VipInfo, b: &BackendInfo) -> Result<(), ()> {
    if l3.ip_len + IPV4_HLEN as u32 > u16::MAX as u32 {
        return Err(());
    }
    let tos = l3.head[1];
    let base = push_outer::<FRONT4>(ctx, l2, IPV4_HLEN, ETH_P_IP, b)?;
    let off = if l2.l3_off == ETH_HLEN { ETH_HLEN } else { ETH_HLEN + VLAN_HLEN };
    // The inner length fits its frame (checked before), so this does not wrap.
    let tot_len = (l3.ip_len + IPV4_HLEN as u32) as u16;
    let (src, dst) = (vip.encap_src[0], b.addr4);
    // The header is made in registers and its checksum (RFC 1071) summed from them, then
    // stored as five words: x86 takes unaligned stores to packet memory, and this is a
    // fraction of the instructions of field-by-field bytes read back for the sum.
    let [l0, l1] = tot_len.to_be_bytes();
    let w0 = u32::from_ne_bytes([0x45, tos, l0, l1]);
    let (s, d) = (u32::from_be(src), u32::from_be(dst));
    let mut sum = (0x4500 | tos as u32)
        + tot_len as u32
        + (((OUTER_TTL as u32) << 8) | IPPROTO_IPIP as u32)
        + (s >> 16)
        + (s & 0xffff)
        + (d >> 16)
        + (d & 0xffff);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    let [c0, c1] = (!(sum as u16)).to_be_bytes();
    let w2 = u32::from_ne_bytes([OUTER_TTL, IPPROTO_IPIP, c0, c1]);
    unsafe {
        let outer = base.add(off) as *mut u32;
        outer.write_unaligned(w0);
        // Identification 0, no fragment flags or offset.
        outer.add(1).write_unaligned(0);
        outer.add(2).write_unaligned(w2);
        outer.add(3).write_unaligned(src);
        outer.add(4).write_unaligned(dst);
    }
    Ok(())
}

#[inline(always)]
fn encap_ipv6(ctx: &XdpContext, l2: &L2, l3: &L3, vip: &VipInfo, b: &BackendInfo) -> Result<(), ()> {
    if b.addr6 == [0u32; 4] || l3.ip_len > u16::MAX as u32 {
        return Err(());
    }
    let first = u32::from_ne_bytes(l3.head);
    let base = push_outer::<FRONT6>(ctx, l2, IPV6_HLEN, ETH_P_IPV6, b)?;
    let off = if l2.l3_off == ETH_HLEN { ETH_HLEN } else { ETH_HLEN + VLAN_HLEN };
    let [p0, p1] = (l3.ip_len as u16).to_be_bytes();
    // Ten word stores (x86 takes unaligned stores to packet memory).
    unsafe {
        let outer = base.add(off) as *mut u32;
        outer.write_unaligned(first);
        outer.add(1).write_unaligned(u32::from_ne_bytes([p0, p1, IPPROTO_IPV6, OUTER_TTL]));
        for i in 0..4 {
            outer.add(2 + i).write_unaligned(vip.encap_src[i]);
            outer.add(6 + i).write_unaligned(b.addr6[i]);
        }
    }
    Ok(())
}
