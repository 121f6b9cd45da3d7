//! From a raw frame to a verdict: classify, look up the VIP, select, forward.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use dispatcher_common::{
    addr_words,
    stats::{self, vip_slot},
    FlowKey, VipInfo, VipKey, AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, MODE_ADDR_MARKER, MODE_HTTP,
};

use crate::{
    forward,
    maps::VIPS,
    parse::{
        be16, parse_l2, ptr_at, read_word, Ipv4Hdr, Ipv6Hdr, Ports, ETH_P_IP, ETH_P_IPV6, IPV4_HLEN, IPV6_HLEN,
        TCP_HLEN, UDP_HLEN,
    },
    select,
    stats::count,
};

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;

/// What the network and transport headers said.
pub struct L3 {
    pub family: u8,
    pub proto: u8,
    pub l4_off: usize,
    /// Length of the IP packet as its header states (header included).
    pub ip_len: u16,
    pub src: [u32; 4],
    pub dst: [u32; 4],
}

#[inline(always)]
fn pass(slot: u32, len: u64) -> Result<u32, ()> {
    count(slot, len);
    Ok(PASS)
}

#[inline(always)]
fn drop(slot: u32, len: u64) -> Result<u32, ()> {
    count(slot, len);
    Ok(DROP)
}

/// Does any VIP live on this address for this protocol? Used only for packets whose ports
/// cannot be read, to decide between "malformed VIP traffic" (drop) and "not ours" (pass).
#[inline(always)]
fn is_vip_addr(family: u8, addr: &[u32; 4], proto: u8) -> bool {
    let key = VipKey { addr: *addr, port: 0, proto, family };
    unsafe { VIPS.get(&key) }.is_some()
}

/// An IPv4 header with a bad version or IHL, options, or fragment bits: a defined,
/// counted verdict; nothing but VIP traffic is ever dropped.
#[inline(always)]
fn unusual_ipv4(ver_ihl: u8, proto: u8, dst: &[u32; 4], len: u64) -> u32 {
    if !is_vip_addr(AF_INET, dst, proto) {
        count(stats::PASS_NON_VIP, len);
        return PASS;
    }
    let ihl = ver_ihl & 0x0f;
    let (slot, verdict) = if ver_ihl >> 4 != 4 {
        (stats::DROP_BAD_VERSION, DROP)
    } else if ihl < 5 {
        (stats::DROP_BAD_IHL, DROP)
    } else if ihl > 5 {
        (stats::PASS_IP_OPTIONS, PASS)
    } else {
        // More-fragments flag or a fragment offset: later fragments carry no ports.
        (stats::PASS_FRAGMENT, PASS)
    };
    count(slot, len);
    verdict
}

pub fn try_dispatch(ctx: &XdpContext) -> Result<u32, ()> {
    let len = (ctx.data_end() - ctx.data()) as u64;
    let Some(l2) = parse_l2(ctx) else {
        return pass(stats::PASS_NON_IP, len);
    };
    let l3 = match l2.ethertype {
        ETH_P_IP => {
            let Ok(ip) = ptr_at::<Ipv4Hdr>(ctx, l2.l3_off) else {
                return pass(stats::PASS_NON_VIP, len);
            };
            let ip = unsafe { &*ip };
            let dst = [read_word(&ip.dst), 0, 0, 0];
            // Common case first: version 4, no options, not a fragment. Only a packet that
            // is not asks whether its address carries VIPs (one more lookup).
            if ip.ver_ihl != 0x45 || be16(ip.frag_off) & 0x3fff != 0 {
                return Ok(unusual_ipv4(ip.ver_ihl, ip.proto, &dst, len));
            }
            L3 {
                family: AF_INET,
                proto: ip.proto,
                l4_off: l2.l3_off + IPV4_HLEN,
                ip_len: be16(ip.tot_len),
                src: [read_word(&ip.src), 0, 0, 0],
                dst,
            }
        }
        ETH_P_IPV6 => {
            let Ok(ip) = ptr_at::<Ipv6Hdr>(ctx, l2.l3_off) else {
                return pass(stats::PASS_NON_VIP, len);
            };
            let ip = unsafe { &*ip };
            let dst = addr_words(&ip.dst);
            if ip.next_hdr != IPPROTO_TCP && ip.next_hdr != IPPROTO_UDP {
                let ours = is_vip_addr(AF_INET6, &dst, IPPROTO_TCP) || is_vip_addr(AF_INET6, &dst, IPPROTO_UDP);
                return pass(if ours { stats::PASS_IPV6_EXT } else { stats::PASS_NON_VIP }, len);
            }
            if ip.ver_tc_flow[0] >> 4 != 6 {
                let ours = is_vip_addr(AF_INET6, &dst, ip.next_hdr);
                return if ours { drop(stats::DROP_BAD_VERSION, len) } else { pass(stats::PASS_NON_VIP, len) };
            }
            let ip_len = be16(ip.payload_len).wrapping_add(IPV6_HLEN as u16);
            L3 {
                family: AF_INET6,
                proto: ip.next_hdr,
                l4_off: l2.l3_off + IPV6_HLEN,
                ip_len,
                src: addr_words(&ip.src),
                dst,
            }
        }
        _ => return pass(stats::PASS_NON_IP, len),
    };
    if l3.proto != IPPROTO_TCP && l3.proto != IPPROTO_UDP {
        return pass(stats::PASS_NON_VIP, len);
    }

    // Transport header: ports, and for TCP a sane data offset.
    let l4_len = if l3.proto == IPPROTO_TCP { TCP_HLEN } else { UDP_HLEN };
    if ctx.data() + l3.l4_off + l4_len > ctx.data_end() {
        return if is_vip_addr(l3.family, &l3.dst, l3.proto) {
            drop(stats::DROP_TRUNCATED, len)
        } else {
            pass(stats::PASS_NON_VIP, len)
        };
    }
    let ports = unsafe { &*ptr_at::<Ports>(ctx, l3.l4_off)? };
    let key = FlowKey {
        src: l3.src,
        dst: l3.dst,
        sport: u16::from_ne_bytes(ports.src),
        dport: u16::from_ne_bytes(ports.dst),
        proto: l3.proto,
        family: l3.family,
        _pad: 0,
    };

    let vkey = VipKey { addr: key.dst, port: key.dport, proto: l3.proto, family: l3.family };
    let Some(vip) = (unsafe { VIPS.get(&vkey) }) else {
        return pass(stats::PASS_NON_VIP, len);
    };
    let vip: VipInfo = *vip;
    if vip.mode == MODE_ADDR_MARKER {
        return pass(stats::PASS_NON_VIP, len);
    }
    let mut syn = false;
    if l3.proto == IPPROTO_TCP {
        // Data offset is the high nibble of byte 12; the flags are byte 13.
        let [doff, flags] = unsafe { *ptr_at::<[u8; 2]>(ctx, l3.l4_off + 12)? };
        if doff >> 4 < 5 {
            count(vip_slot(vip.id, stats::VIP_DROPS), len);
            return drop(stats::DROP_BAD_TCP_DOFF, len);
        }
        syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    }
    if vip.mode == MODE_HTTP {
        return pass(stats::PASS_HTTP, len);
    }

    let Some((backend_id, backend)) = select::select_backend(&vip, &key, syn) else {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        return drop(stats::DROP_NO_BACKEND, len);
    };
    let verdict = forward::forward(ctx, &l2, &l3, &vip, &backend);
    if verdict == DROP {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_ENCAP_FAILED, len);
    } else {
        count(vip_slot(vip.id, stats::VIP_PACKETS), len);
        count(stats::backend_slot(backend_id, stats::BACKEND_PACKETS), len);
    }
    Ok(verdict)
}
