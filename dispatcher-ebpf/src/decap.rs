//! `decap`: the backends' half of IPIP forwarding. Strips the outer IPv4 (protocol 4) or
//! IPv6 (next header 41) header and passes the inner packet to the stack, so that a
//! kernel without the ipip module (or without a tunnel device configured) still accepts
//! the dispatcher's traffic. Everything else passes untouched.
#![no_std]
#![no_main]

mod rt;

mod parse;

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, macros::xdp, programs::XdpContext};
use dispatcher_common::{IPPROTO_IPIP, IPPROTO_IPV6};
use parse::{
    parse_l2, ptr_at, read_mac, write_mac, EthHdr, Ipv4Hdr, Ipv6Hdr, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPV4_HLEN,
    IPV6_HLEN,
};

#[xdp]
pub fn decap(ctx: XdpContext) -> u32 {
    try_decap(&ctx).unwrap_or(xdp_action::XDP_DROP)
}

fn try_decap(ctx: &XdpContext) -> Result<u32, ()> {
    let Some(l2) = parse_l2(ctx) else {
        return Ok(xdp_action::XDP_PASS);
    };
    // Only untagged frames: a tagged frame's VLAN device does its own decapsulation path.
    if l2.l3_off != ETH_HLEN {
        return Ok(xdp_action::XDP_PASS);
    }
    let (outer, inner_type) = match l2.ethertype {
        ETH_P_IP => {
            let Ok(ip) = ptr_at::<Ipv4Hdr>(ctx, ETH_HLEN) else {
                return Ok(xdp_action::XDP_PASS);
            };
            let ip = unsafe { &*ip };
            if ip.proto != IPPROTO_IPIP || ip.ver_ihl != 0x45 {
                return Ok(xdp_action::XDP_PASS);
            }
            (IPV4_HLEN, ETH_P_IP)
        }
        ETH_P_IPV6 => {
            let Ok(ip) = ptr_at::<Ipv6Hdr>(ctx, ETH_HLEN) else {
                return Ok(xdp_action::XDP_PASS);
            };
            if unsafe { (*ip).next_hdr } != IPPROTO_IPV6 {
                return Ok(xdp_action::XDP_PASS);
            }
            (IPV6_HLEN, ETH_P_IPV6)
        }
        _ => return Ok(xdp_action::XDP_PASS),
    };
    // The inner header must at least be there, or the stack gets garbage.
    ptr_at::<[u8; IPV4_HLEN]>(ctx, ETH_HLEN + outer)?;
    {
        // The old and new link headers overlap: read both MACs before writing.
        let old = unsafe { &*ptr_at::<EthHdr>(ctx, 0)? };
        let (dst, src) = (read_mac(&old.dst), read_mac(&old.src));
        let new = unsafe { &mut *ptr_at::<EthHdr>(ctx, outer)? };
        write_mac(&mut new.dst, dst);
        write_mac(&mut new.src, src);
        new.proto = inner_type.to_be_bytes();
    }
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, outer as i32) } != 0 {
        return Err(());
    }
    Ok(xdp_action::XDP_PASS)
}
