//! Internet checksum of a fresh IPv4 header (RFC 1071).

use crate::parse::Ipv4Hdr;

#[inline(always)]
pub fn ipv4_header_csum(h: &Ipv4Hdr) -> [u8; 2] {
    let words = [
        u16::from_be_bytes([h.ver_ihl, h.tos]),
        u16::from_be_bytes(h.tot_len),
        u16::from_be_bytes(h.id),
        u16::from_be_bytes(h.frag_off),
        u16::from_be_bytes([h.ttl, h.proto]),
        u16::from_be_bytes([h.src[0], h.src[1]]),
        u16::from_be_bytes([h.src[2], h.src[3]]),
        u16::from_be_bytes([h.dst[0], h.dst[1]]),
        u16::from_be_bytes([h.dst[2], h.dst[3]]),
    ];
    let mut sum: u32 = 0;
    for w in words {
        sum += w as u32;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    (!(sum as u16)).to_be_bytes()
}
