//! Sending the packet to the chosen backend: MAC forwarding (L2 direct server return) or
//! IPIP encapsulation (L3 direct server return), both out of the ingress interface.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, programs::XdpContext};
use dispatcher_common::{BackendInfo, VipInfo, AF_INET, FWD_IPIP, IPPROTO_IPIP, IPPROTO_IPV6};

use crate::{
    csum::ipv4_header_csum,
    dispatch::L3,
    parse::{
        ptr_at, read_mac, read_word, write_addr6, write_mac, write_word, EthHdr, Ipv4Hdr, Ipv6Hdr, ETH_HLEN, ETH_P_IP,
        ETH_P_IPV6, IPV4_HLEN, IPV6_HLEN, L2, VLAN_HLEN,
    },
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
    let eth = unsafe { &mut *ptr_at::<EthHdr>(ctx, eth_off)? };
    let to = read_mac(&eth.dst);
    write_mac(&mut eth.src, to);
    write_mac(&mut eth.dst, b.mac);
    Ok(())
}

/// Grow the head by `outer` bytes and move the link header (Ethernet and the VLAN tag if
/// any) to the new front, with its ethertype set to the outer protocol.
#[inline(always)]
fn push_outer(ctx: &XdpContext, l2: &L2, outer: usize, ethertype: u16, b: &BackendInfo) -> Result<(), ()> {
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(outer as i32)) } != 0 {
        return Err(());
    }
    let old = unsafe { &*ptr_at::<EthHdr>(ctx, outer)? };
    let to = read_mac(&old.dst);
    let old_proto = old.proto;
    let new = unsafe { &mut *ptr_at::<EthHdr>(ctx, 0)? };
    write_mac(&mut new.src, to);
    write_mac(&mut new.dst, b.mac);
    if l2.l3_off == ETH_HLEN {
        new.proto = ethertype.to_be_bytes();
    } else {
        // Keep the 802.1Q tag: the next hop is on the same VLAN we received on.
        new.proto = old_proto;
        let tag_old: *const [u8; 2] = ptr_at(ctx, outer + ETH_HLEN)?;
        let tag_new: *mut [u8; 4] = ptr_at(ctx, ETH_HLEN)?;
        unsafe {
            let t = *tag_old;
            *tag_new = [t[0], t[1], (ethertype >> 8) as u8, ethertype as u8];
        }
    }
    Ok(())
}

#[inline(always)]
fn encap_ipv4(ctx: &XdpContext, l2: &L2, l3: &L3, vip: &VipInfo, b: &BackendInfo) -> Result<(), ()> {
    if l3.ip_len + IPV4_HLEN as u32 > u16::MAX as u32 {
        return Err(());
    }
    let tos = unsafe { (*ptr_at::<Ipv4Hdr>(ctx, l2.l3_off)?).tos };
    push_outer(ctx, l2, IPV4_HLEN, ETH_P_IP, b)?;
    let off = if l2.l3_off == ETH_HLEN { ETH_HLEN } else { ETH_HLEN + VLAN_HLEN };
    let outer = unsafe { &mut *ptr_at::<Ipv4Hdr>(ctx, off)? };
    outer.ver_ihl = 0x45;
    outer.tos = tos;
    // The inner length fits its frame (checked before), so this does not wrap.
    outer.tot_len = ((l3.ip_len + IPV4_HLEN as u32) as u16).to_be_bytes();
    outer.id = [0, 0];
    outer.frag_off = [0, 0];
    outer.ttl = OUTER_TTL;
    outer.proto = IPPROTO_IPIP;
    outer.check = [0, 0];
    write_word(&mut outer.src, vip.encap_src[0]);
    write_word(&mut outer.dst, b.addr4);
    outer.check = ipv4_header_csum(outer);
    Ok(())
}

#[inline(always)]
fn encap_ipv6(ctx: &XdpContext, l2: &L2, l3: &L3, vip: &VipInfo, b: &BackendInfo) -> Result<(), ()> {
    if b.addr6 == [0u32; 4] || l3.ip_len > u16::MAX as u32 {
        return Err(());
    }
    let first = read_word(unsafe { &(*ptr_at::<Ipv6Hdr>(ctx, l2.l3_off)?).ver_tc_flow });
    push_outer(ctx, l2, IPV6_HLEN, ETH_P_IPV6, b)?;
    let off = if l2.l3_off == ETH_HLEN { ETH_HLEN } else { ETH_HLEN + VLAN_HLEN };
    let outer = unsafe { &mut *ptr_at::<Ipv6Hdr>(ctx, off)? };
    write_word(&mut outer.ver_tc_flow, first);
    outer.payload_len = (l3.ip_len as u16).to_be_bytes();
    outer.next_hdr = IPPROTO_IPV6;
    outer.hop_limit = OUTER_TTL;
    write_addr6(&mut outer.src, &vip.encap_src);
    write_addr6(&mut outer.dst, &b.addr6);
    Ok(())
}
