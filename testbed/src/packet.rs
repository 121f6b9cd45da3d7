//! A small packet builder for XDP fixtures: readable descriptions instead of hex blobs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const CLIENT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];

#[derive(Clone, Debug)]
pub struct Packet {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    pub vlan: Option<u16>,
    /// Overrides the ethertype (after the VLAN tag, if any).
    pub ethertype: Option<u16>,
    pub src: IpAddr,
    pub dst: IpAddr,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
    pub tos: u8,
    /// IPv4 header length in 32-bit words (5 = no options); options are zero bytes.
    pub ihl: u8,
    pub ip_version: Option<u8>,
    pub frag_off: u16,
    /// TCP data offset in 32-bit words.
    pub tcp_doff: u8,
    pub tcp_flags: u8,
    pub payload: Vec<u8>,
    /// Cut the frame to this many bytes after building.
    pub truncate: Option<usize>,
    /// Overrides the IPv4 total length (checksum fixed) or the IPv6 payload length.
    pub ip_len: Option<u16>,
    /// Overrides the UDP length field.
    pub udp_len: Option<u16>,
}

pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;

impl Packet {
    fn new(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, proto: u8) -> Packet {
        Packet {
            eth_dst: LB_MAC,
            eth_src: CLIENT_MAC,
            vlan: None,
            ethertype: None,
            src,
            dst,
            proto,
            sport,
            dport,
            tos: 0,
            ihl: 5,
            ip_version: None,
            frag_off: 0,
            tcp_doff: 5,
            tcp_flags: TCP_SYN,
            payload: Vec::new(),
            truncate: None,
            ip_len: None,
            udp_len: None,
        }
    }

    pub fn tcp(src: &str, sport: u16, dst: &str, dport: u16) -> Packet {
        Packet::new(src.parse().unwrap(), sport, dst.parse().unwrap(), dport, 6)
    }

    pub fn udp(src: &str, sport: u16, dst: &str, dport: u16) -> Packet {
        Packet::new(src.parse().unwrap(), sport, dst.parse().unwrap(), dport, 17)
    }

    pub fn with(mut self, f: impl FnOnce(&mut Packet)) -> Packet {
        f(&mut self);
        self
    }

    fn l4(&self) -> Vec<u8> {
        let mut l4 = Vec::new();
        l4.extend_from_slice(&self.sport.to_be_bytes());
        l4.extend_from_slice(&self.dport.to_be_bytes());
        match self.proto {
            6 => {
                l4.extend_from_slice(&1000u32.to_be_bytes()); // seq
                l4.extend_from_slice(&0u32.to_be_bytes()); // ack
                l4.push(self.tcp_doff << 4);
                l4.push(self.tcp_flags);
                l4.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]); // window, csum, urg
                let opts = (self.tcp_doff as usize).saturating_sub(5) * 4;
                l4.extend(std::iter::repeat_n(1u8, opts)); // NOPs
            }
            17 => {
                l4.extend_from_slice(&self.udp_len.unwrap_or((8 + self.payload.len()) as u16).to_be_bytes());
                l4.extend_from_slice(&[0, 0]);
            }
            _ => {}
        }
        l4.extend_from_slice(&self.payload);
        l4
    }

    /// The IP packet (header and payload), without the link header.
    pub fn ip_packet(&self) -> Vec<u8> {
        let l4 = self.l4();
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                let hlen = self.ihl as usize * 4;
                let mut h = ipv4_header(s, d, self.proto, self.tos, (hlen.max(20) + l4.len()) as u16, self.frag_off);
                h[0] = (self.ip_version.unwrap_or(4) << 4) | self.ihl;
                if let Some(n) = self.ip_len {
                    h[2..4].copy_from_slice(&n.to_be_bytes());
                }
                h.extend(std::iter::repeat_n(0u8, hlen.saturating_sub(20)));
                h[10..12].copy_from_slice(&[0, 0]);
                let c = csum(&h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                h.extend_from_slice(&l4);
                h
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                let mut h = ipv6_header(s, d, self.proto, l4.len() as u16);
                if let Some(v) = self.ip_version {
                    h[0] = (v << 4) | (h[0] & 0x0f);
                }
                if let Some(n) = self.ip_len {
                    h[4..6].copy_from_slice(&n.to_be_bytes());
                }
                h.extend_from_slice(&l4);
                h
            }
            _ => panic!("mixed address families"),
        }
    }

    /// The datagram cut into IP fragments (RFC 791; IPv6: a Fragment header right after
    /// the fixed header, RFC 8200 4.5), in order: frames whose IP payloads hold at most
    /// `chunk` bytes of the datagram (a multiple of 8), all with IP ID `id` (IPv4: its low
    /// 16 bits).
    pub fn fragments(&self, chunk: usize, id: u32) -> Vec<Vec<u8>> {
        assert!(chunk > 0 && chunk.is_multiple_of(8), "fragment data is counted in 8-byte units");
        let whole = self.ip_packet();
        let (v4, hlen) = if self.src.is_ipv4() { (true, 20) } else { (false, 40) };
        let data = &whole[hlen..];
        let mut frames = Vec::new();
        for (i, part) in data.chunks(chunk).enumerate() {
            let off = i * chunk;
            let more = off + part.len() < data.len();
            let mut f = self.link_header(if v4 { 0x0800 } else { 0x86dd });
            match (self.src, self.dst) {
                (IpAddr::V4(s), IpAddr::V4(d)) => {
                    let bits = (off / 8) as u16 | if more { 0x2000 } else { 0 };
                    let mut h = ipv4_header(s, d, self.proto, self.tos, (20 + part.len()) as u16, bits);
                    h[4..6].copy_from_slice(&(id as u16).to_be_bytes());
                    h[10..12].copy_from_slice(&[0, 0]);
                    let c = csum(&h);
                    h[10..12].copy_from_slice(&c.to_be_bytes());
                    f.extend_from_slice(&h);
                }
                (IpAddr::V6(s), IpAddr::V6(d)) => {
                    f.extend_from_slice(&ipv6_header(s, d, 44, (8 + part.len()) as u16));
                    f.extend_from_slice(&[self.proto, 0]);
                    f.extend_from_slice(&((off as u16) | more as u16).to_be_bytes());
                    f.extend_from_slice(&id.to_be_bytes());
                }
                _ => panic!("mixed address families"),
            }
            f.extend_from_slice(part);
            frames.push(f);
        }
        frames
    }

    pub fn link_header(&self, ethertype: u16) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&self.eth_dst);
        f.extend_from_slice(&self.eth_src);
        if let Some(id) = self.vlan {
            f.extend_from_slice(&0x8100u16.to_be_bytes());
            f.extend_from_slice(&id.to_be_bytes());
        }
        f.extend_from_slice(&self.ethertype.unwrap_or(ethertype).to_be_bytes());
        f
    }

    pub fn build(&self) -> Vec<u8> {
        let et = if self.src.is_ipv4() { 0x0800 } else { 0x86dd };
        let mut f = self.link_header(et);
        f.extend_from_slice(&self.ip_packet());
        if let Some(n) = self.truncate {
            f.truncate(n);
        }
        f
    }
}

/// RFC 1071 checksum.
pub fn csum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        sum += w as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, tos: u8, tot_len: u16, frag_off: u16) -> Vec<u8> {
    let mut h = vec![0x45, tos];
    h.extend_from_slice(&tot_len.to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&frag_off.to_be_bytes());
    h.push(64);
    h.push(proto);
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = csum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

pub fn ipv6_header(src: Ipv6Addr, dst: Ipv6Addr, next: u8, payload_len: u16) -> Vec<u8> {
    let mut h = vec![0x60, 0, 0, 0];
    h.extend_from_slice(&payload_len.to_be_bytes());
    h.push(next);
    h.push(64);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    h
}

/// Ethernet header with the given MACs and ethertype.
pub fn eth(dst: [u8; 6], src: [u8; 6], ethertype: u16) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_checksum_verifies() {
        let p = Packet::tcp("10.0.0.2", 1000, "10.0.100.1", 80).build();
        assert_eq!(csum(&p[14..34]), 0, "a header with its checksum sums to zero");
        assert_eq!(p.len(), 14 + 20 + 20);
        assert_eq!(&p[12..14], &[0x08, 0x00]);
    }

    #[test]
    fn vlan_and_ipv6_layout() {
        let p = Packet::udp("fd00::2", 5, "fd00::100", 53).with(|p| p.vlan = Some(7)).build();
        assert_eq!(&p[12..18], &[0x81, 0x00, 0, 7, 0x86, 0xdd]);
        assert_eq!(p.len(), 18 + 40 + 8);
    }
}
