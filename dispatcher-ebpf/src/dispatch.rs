//! From a raw frame to a verdict: classify, look up the VIP, select, forward.

use aya_ebpf::{bindings::xdp_action, programs::XdpContext};
use dispatcher_common::{
    addr_words,
    stats::{self, vip_slot},
    FlowKey, VipKey, AF_INET, AF_INET6, IPPROTO_TCP, IPPROTO_UDP, MODE_ADDR_MARKER, MODE_HTTP, MODE_SIP,
};

use crate::{
    forward, frag,
    maps::VIPS,
    parse::{
        be16, parse_l2, ptr_at, read_word, Ipv4Hdr, Ipv6Hdr, ETH_P_IP, ETH_P_IPV6, IPV4_HLEN, IPV6_HLEN, L2, L3,
        TCP_HLEN, UDP_HLEN,
    },
    select, sip,
    stats::count,
    steer,
};

const PASS: u32 = xdp_action::XDP_PASS;
const DROP: u32 = xdp_action::XDP_DROP;
const TCP_SYN: u8 = 0x02;
const TCP_ACK: u8 = 0x10;
/// IPv6 Fragment extension header (RFC 8200 4.5).
const IPV6_FRAGMENT: u8 = 44;
const IPV6_FRAG_HLEN: usize = 8;

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

/// The VIP id the address marker of this address and protocol names, if VIPs live there.
/// Used only for packets whose ports cannot be read, to decide between "malformed VIP
/// traffic" (drop, counted on that VIP) and "not ours" (pass).
#[inline(always)]
fn vip_of_addr(family: u8, addr: &[u32; 4], proto: u8) -> Option<u32> {
    let key = VipKey { addr: *addr, port: 0, proto, family };
    unsafe { VIPS.get(&key) }.map(|v| v.id)
}

#[inline(always)]
fn is_vip_addr(family: u8, addr: &[u32; 4], proto: u8) -> bool {
    vip_of_addr(family, addr, proto).is_some()
}

/// A malformed packet to a VIP: dropped, counted by reason and on the VIP.
#[inline(always)]
fn drop_vip(vip: u32, slot: u32, len: u64) -> Result<u32, ()> {
    count(vip_slot(vip, stats::VIP_DROPS), len);
    drop(slot, len)
}

/// A source address no client can have: IPv4 0/8, 127/8, 224/4 (multicast) and 240/4
/// (reserved, broadcast); IPv6 ::, ::1 and ff00::/8 (multicast).
#[inline(always)]
fn martian(family: u8, src: &[u32; 4]) -> bool {
    let first = src[0].to_ne_bytes()[0];
    if family == AF_INET {
        return first == 0 || first == 127 || first >= 224;
    }
    if first == 0xff {
        return true;
    }
    src[0] == 0 && src[1] == 0 && src[2] == 0 && (src[3] == 0 || src[3] == u32::from_ne_bytes([0, 0, 0, 1]))
}

/// IPv6 extension headers (RFC 8200 4, and those IANA lists since): a VIP's TCP or UDP
/// behind one cannot be read here. ICMPv6 and anything else is simply not VIP traffic.
#[inline(always)]
fn ipv6_extension(next: u8) -> bool {
    matches!(next, 0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254)
}

/// An IPv4 header with a bad version or IHL, options, or fragment bits: a defined,
/// counted verdict; nothing but VIP traffic is ever dropped.
#[inline(always)]
fn unusual_ipv4(ver_ihl: u8, proto: u8, dst: &[u32; 4], len: u64) -> u32 {
    let Some(vip) = vip_of_addr(AF_INET, dst, proto) else {
        count(stats::PASS_NON_VIP, len);
        return PASS;
    };
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
    if verdict == DROP {
        count(vip_slot(vip, stats::VIP_DROPS), len);
    }
    count(slot, len);
    verdict
}

/// A later fragment (offset > 0) of a UDP datagram: it carries no ports, so its VIP is
/// known by address and protocol only. To an address with UDP VIPs it follows its first
/// fragment (`frag`); elsewhere it is not ours.
#[inline(always)]
fn later_fragment(ctx: &XdpContext, l2: &L2, l3: &L3, id: u32, len: u64) -> Result<u32, ()> {
    let Some(marker) = vip_of_addr(l3.family, &l3.dst, IPPROTO_UDP) else {
        return pass(stats::PASS_NON_VIP, len);
    };
    let in_frame = (ctx.data_end() - ctx.data() - l2.l3_off) as u32;
    if l3.ip_len <= (l3.l4_off - l2.l3_off) as u32 || l3.ip_len > in_frame {
        return drop_vip(marker, stats::DROP_BAD_LENGTH, len);
    }
    if l2.group_dst {
        return drop_vip(marker, stats::DROP_GROUP_MAC, len);
    }
    Ok(frag::later(ctx, l2, l3, id, marker, len))
}

pub fn try_dispatch(ctx: &XdpContext) -> Result<u32, ()> {
    let len = (ctx.data_end() - ctx.data()) as u64;
    // The IP ID of a UDP datagram's first fragment (offset 0, more to come).
    let mut first: Option<u32> = None;
    // The IP ID of a later fragment (offset > 0) of a UDP datagram: no ports to read. Its
    // L3 is made by the same code as every packet's (the families' words unknown to the
    // compiler, which would otherwise write known-zero words in misaligned 8-byte stores
    // the verifier refuses).
    let mut later: Option<u32> = None;
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
            let l3 = L3 {
                family: AF_INET,
                proto: ip.proto,
                l4_off: l2.l3_off + IPV4_HLEN,
                ip_len: be16(ip.tot_len) as u32,
                src: [read_word(&ip.src), 0, 0, 0],
                dst,
                head: [ip.ver_ihl, ip.tos, ip.tot_len[0], ip.tot_len[1]],
            };
            // Common case first: version 4, no options, not a fragment. Only a packet that
            // is not asks whether its address carries VIPs (one more lookup).
            let frag_off = be16(ip.frag_off);
            if ip.ver_ihl != 0x45 || frag_off & 0x3fff != 0 {
                // A UDP fragment with a plain header goes where its datagram's first
                // fragment goes; the rest keep their defined verdict (TCP fragments too).
                if ip.ver_ihl != 0x45 || ip.proto != IPPROTO_UDP {
                    return Ok(unusual_ipv4(ip.ver_ihl, ip.proto, &dst, len));
                }
                let id = u16::from_ne_bytes(ip.id) as u32;
                if frag_off & 0x1fff != 0 {
                    later = Some(id);
                } else {
                    // Offset 0 with more fragments: the first, dispatched below.
                    first = Some(id);
                }
            }
            l3
        }
        ETH_P_IPV6 => {
            let Ok(ip) = ptr_at::<Ipv6Hdr>(ctx, l2.l3_off) else {
                return pass(stats::PASS_NON_VIP, len);
            };
            let ip = unsafe { &*ip };
            let dst = addr_words(&ip.dst);
            let mut proto = ip.next_hdr;
            let mut l4_off = l2.l3_off + IPV6_HLEN;
            // A Fragment header right after the fixed header, of a UDP datagram: the
            // datagram's first fragment is dispatched, the later ones follow it. Any other
            // chain of extension headers keeps its defined verdict below.
            if proto == IPV6_FRAGMENT && ip.ver_tc_flow[0] >> 4 == 6 {
                if let Ok(fh) = ptr_at::<[u8; IPV6_FRAG_HLEN]>(ctx, l4_off) {
                    let fh = unsafe { &*fh };
                    if fh[0] == IPPROTO_UDP {
                        proto = IPPROTO_UDP;
                        l4_off += IPV6_FRAG_HLEN;
                        let id = u32::from_ne_bytes([fh[4], fh[5], fh[6], fh[7]]);
                        let off_m = be16([fh[2], fh[3]]);
                        if off_m & 0xfff8 != 0 {
                            later = Some(id);
                        } else if off_m & 1 != 0 {
                            first = Some(id);
                        }
                        // Offset 0 and no more fragments: an atomic fragment (RFC 6946),
                        // a whole datagram.
                    }
                }
            }
            if proto != IPPROTO_TCP && proto != IPPROTO_UDP {
                let ours = ipv6_extension(ip.next_hdr)
                    && (is_vip_addr(AF_INET6, &dst, IPPROTO_TCP) || is_vip_addr(AF_INET6, &dst, IPPROTO_UDP));
                return pass(if ours { stats::PASS_IPV6_EXT } else { stats::PASS_NON_VIP }, len);
            }
            if ip.ver_tc_flow[0] >> 4 != 6 {
                return match vip_of_addr(AF_INET6, &dst, ip.next_hdr) {
                    Some(vip) => drop_vip(vip, stats::DROP_BAD_VERSION, len),
                    None => pass(stats::PASS_NON_VIP, len),
                };
            }
            let ip_len = be16(ip.payload_len) as u32 + IPV6_HLEN as u32;
            L3 { family: AF_INET6, proto, l4_off, ip_len, src: addr_words(&ip.src), dst, head: ip.ver_tc_flow }
        }
        _ => return pass(stats::PASS_NON_IP, len),
    };
    if let Some(id) = later {
        return later_fragment(ctx, &l2, &l3, id, len);
    }
    if l3.proto != IPPROTO_TCP && l3.proto != IPPROTO_UDP {
        return pass(stats::PASS_NON_VIP, len);
    }

    // Transport header: ports, and for TCP a sane data offset.
    let l4_len = if l3.proto == IPPROTO_TCP { TCP_HLEN } else { UDP_HLEN };
    if ctx.data() + l3.l4_off + l4_len > ctx.data_end() {
        return match vip_of_addr(l3.family, &l3.dst, l3.proto) {
            Some(vip) => drop_vip(vip, stats::DROP_TRUNCATED, len),
            None => pass(stats::PASS_NON_VIP, len),
        };
    }
    // The ports, and for TCP the data offset and flags (bytes 12 and 13), for UDP the
    // datagram's length (bytes 4 and 5), in one read.
    let (sport, dport, l4_bits) = if l3.proto == IPPROTO_TCP {
        let t = unsafe { &*ptr_at::<[u8; 14]>(ctx, l3.l4_off)? };
        ([t[0], t[1]], [t[2], t[3]], [t[12], t[13]])
    } else {
        let u = unsafe { &*ptr_at::<[u8; 6]>(ctx, l3.l4_off)? };
        ([u[0], u[1]], [u[2], u[3]], [u[4], u[5]])
    };
    let key = FlowKey {
        src: l3.src,
        dst: l3.dst,
        sport: u16::from_ne_bytes(sport),
        dport: u16::from_ne_bytes(dport),
        proto: l3.proto,
        family: l3.family,
        _pad: 0,
    };

    let vkey = VipKey { addr: key.dst, port: key.dport, proto: l3.proto, family: l3.family };
    // Read in place (no copy onto the stack).
    let vip = match unsafe { VIPS.get(&vkey) } {
        Some(v) if v.mode != MODE_ADDR_MARKER => v,
        _ => return Ok(first.map_or_else(|| count_pass(stats::PASS_NON_VIP, len), |id| host_first(&l3, id, len))),
    };
    // VIP traffic only from here: what no sane sender sends is dropped and counted.
    // The IP length must cover the headers and fit in the frame (a longer frame is link
    // padding); it is what an IPIP outer header is computed from.
    let in_frame = (ctx.data_end() - ctx.data() - l2.l3_off) as u32;
    let headers = (l3.l4_off - l2.l3_off + l4_len) as u32;
    if l3.ip_len < headers || l3.ip_len > in_frame {
        return drop_vip(vip.id, stats::DROP_BAD_LENGTH, len);
    }
    // A UDP length must cover its header and fit in the IP payload (RFC 768; the kernel
    // drops a longer one and ignores bytes past a shorter one, and so does SIP's scan).
    // A first fragment holds only the start of its datagram: its UDP length must name
    // more than it carries.
    let udp_len = u16::from_be_bytes(l4_bits) as u32;
    let ip_payload = l3.ip_len - (l3.l4_off - l2.l3_off) as u32;
    if l3.proto == IPPROTO_UDP && (udp_len < UDP_HLEN as u32 || (udp_len <= ip_payload) == first.is_some()) {
        return drop_vip(vip.id, stats::DROP_BAD_LENGTH, len);
    }
    if l2.group_dst {
        return drop_vip(vip.id, stats::DROP_GROUP_MAC, len);
    }
    if martian(l3.family, &l3.src) {
        return drop_vip(vip.id, stats::DROP_MARTIAN, len);
    }
    let mut syn = false;
    if l3.proto == IPPROTO_TCP {
        // Data offset is the high nibble of byte 12; the flags are byte 13.
        let [doff, flags] = l4_bits;
        if doff >> 4 < 5 {
            return drop_vip(vip.id, stats::DROP_BAD_TCP_DOFF, len);
        }
        syn = flags & (TCP_SYN | TCP_ACK) == TCP_SYN;
    }
    if vip.mode == MODE_HTTP {
        if l3.proto == IPPROTO_TCP {
            if let Some(verdict) = steer::steer(ctx, &l2, &l3, &key, syn, len)? {
                return Ok(verdict);
            }
        }
        return pass(stats::PASS_HTTP, len);
    }

    if first.is_some() && !frag::take_budget() {
        return Ok(frag::drop_over_budget(vip.id, len));
    }

    if vip.mode == MODE_SIP && l3.proto == IPPROTO_UDP {
        // A first fragment's message is what it carries (the UDP length names the whole).
        let msg_len = if first.is_some() { ip_payload } else { udp_len };
        return sip::dispatch(ctx, &l2, &l3, vip, &vkey, msg_len, first, len);
    }

    let Some((backend_id, backend, hit)) = select::select_backend(vip, &key, syn, 0) else {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        return drop(stats::DROP_NO_BACKEND, len);
    };
    let verdict = forward::forward(ctx, &l2, &l3, vip, backend);
    if verdict == DROP {
        count(vip_slot(vip.id, stats::VIP_DROPS), len);
        count(stats::DROP_ENCAP_FAILED, len);
    } else {
        count(vip_slot(vip.id, if hit { stats::VIP_FLOW_HITS } else { stats::VIP_PACKETS }), len);
        count(stats::backend_slot(backend_id, stats::BACKEND_PACKETS), len);
        if let Some(id) = first {
            frag::recorded(&l3, id, vip.id, vkey.port, backend_id, len);
        }
    }
    Ok(verdict)
}

#[inline(always)]
fn count_pass(slot: u32, len: u64) -> u32 {
    count(slot, len);
    PASS
}

/// The first fragment of a UDP datagram for no VIP: to the host stack, and if its address
/// carries UDP VIPs, its later fragments (which that address would take for VIP traffic)
/// are recorded to follow it there.
#[inline(always)]
fn host_first(l3: &L3, id: u32, len: u64) -> u32 {
    if let Some(marker) = vip_of_addr(l3.family, &l3.dst, IPPROTO_UDP) {
        if frag::take_budget() {
            frag::record(l3, id, marker, 0, dispatcher_common::NO_BACKEND);
        }
        return count_pass(stats::PASS_FRAGMENT, len);
    }
    count_pass(stats::PASS_NON_VIP, len)
}
