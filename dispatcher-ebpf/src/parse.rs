//! Header layouts and the one bounds-checked accessor every packet read goes through.
#![allow(dead_code)]

use aya_ebpf::programs::XdpContext;

pub const ETH_HLEN: usize = 14;
pub const VLAN_HLEN: usize = 4;
pub const IPV4_HLEN: usize = 20;
pub const IPV6_HLEN: usize = 40;
pub const TCP_HLEN: usize = 20;
pub const UDP_HLEN: usize = 8;

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86DD;
pub const ETH_P_8021Q: u16 = 0x8100;

/// All multi-byte fields are byte arrays: packet data has no alignment guarantee.
#[repr(C)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub proto: [u8; 2],
}

#[repr(C)]
pub struct VlanHdr {
    pub tci: [u8; 2],
    pub proto: [u8; 2],
}

#[repr(C)]
pub struct Ipv4Hdr {
    pub ver_ihl: u8,
    pub tos: u8,
    pub tot_len: [u8; 2],
    pub id: [u8; 2],
    pub frag_off: [u8; 2],
    pub ttl: u8,
    pub proto: u8,
    pub check: [u8; 2],
    pub src: [u8; 4],
    pub dst: [u8; 4],
}

#[repr(C)]
pub struct Ipv6Hdr {
    pub ver_tc_flow: [u8; 4],
    pub payload_len: [u8; 2],
    pub next_hdr: u8,
    pub hop_limit: u8,
    pub src: [u8; 16],
    pub dst: [u8; 16],
}

#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Result<*mut T, ()> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return Err(());
    }
    Ok((start + offset) as *mut T)
}

// Copies into and out of packet memory are written out byte by byte: an array copy
// would become a call to a byte-loop memcpy/memmove in BPF, several times slower.

#[inline(always)]
pub fn read_mac(m: &[u8; 6]) -> [u8; 6] {
    [m[0], m[1], m[2], m[3], m[4], m[5]]
}

#[inline(always)]
pub fn write_mac(dst: &mut [u8; 6], v: [u8; 6]) {
    dst[0] = v[0];
    dst[1] = v[1];
    dst[2] = v[2];
    dst[3] = v[3];
    dst[4] = v[4];
    dst[5] = v[5];
}

/// A MAC address held as a 4-byte and a 2-byte word: two loads or stores instead of six
/// (x86 takes unaligned accesses to packet memory).
#[derive(Clone, Copy)]
pub struct Mac(u32, u16);

/// # Safety
/// `p` points at 6 readable bytes (checked packet memory, or a map value).
#[inline(always)]
pub unsafe fn load_mac(p: *const u8) -> Mac {
    unsafe { Mac((p as *const u32).read_unaligned(), (p.add(4) as *const u16).read_unaligned()) }
}

/// # Safety
/// `p` points at 6 writable bytes of checked packet memory.
#[inline(always)]
pub unsafe fn store_mac(p: *mut u8, m: Mac) {
    unsafe {
        (p as *mut u32).write_unaligned(m.0);
        (p.add(4) as *mut u16).write_unaligned(m.1);
    }
}

#[inline(always)]
pub fn read_word(b: &[u8; 4]) -> u32 {
    u32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

#[inline(always)]
pub fn write_word(dst: &mut [u8; 4], w: u32) {
    let b = w.to_ne_bytes();
    dst[0] = b[0];
    dst[1] = b[1];
    dst[2] = b[2];
    dst[3] = b[3];
}

#[inline(always)]
pub fn write_addr6(dst: &mut [u8; 16], w: &[u32; 4]) {
    for (i, word) in w.iter().enumerate() {
        let b = word.to_ne_bytes();
        dst[i * 4] = b[0];
        dst[i * 4 + 1] = b[1];
        dst[i * 4 + 2] = b[2];
        dst[i * 4 + 3] = b[3];
    }
}

#[inline(always)]
pub fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// What the network and transport headers said.
pub struct L3 {
    pub family: u8,
    pub proto: u8,
    pub l4_off: usize,
    /// Length of the IP packet as its header states (header included; u32: an IPv6
    /// payload length plus its header may pass 65535).
    pub ip_len: u32,
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// The header's first four bytes as they are (IPv4: version/IHL, TOS, length; IPv6:
    /// version, traffic class, flow label), kept for an outer header.
    pub head: [u8; 4],
}

/// The link layer: where the IP header starts and which protocol it is.
pub struct L2 {
    pub l3_off: usize,
    pub ethertype: u16,
    /// The destination MAC is a group address (broadcast or multicast).
    pub group_dst: bool,
}

/// Ethernet plus at most one 802.1Q tag. `None`: frame shorter than its link header.
#[inline(always)]
pub fn parse_l2(ctx: &XdpContext) -> Option<L2> {
    let eth: *const EthHdr = ptr_at(ctx, 0).ok()?;
    let ethertype = be16(unsafe { (*eth).proto });
    // The I/G bit: the lowest bit of the first byte.
    let group_dst = unsafe { (*eth).dst[0] } & 1 != 0;
    if ethertype != ETH_P_8021Q {
        return Some(L2 { l3_off: ETH_HLEN, ethertype, group_dst });
    }
    let vlan: *const VlanHdr = ptr_at(ctx, ETH_HLEN).ok()?;
    Some(L2 { l3_off: ETH_HLEN + VLAN_HLEN, ethertype: be16(unsafe { (*vlan).proto }), group_dst })
}
