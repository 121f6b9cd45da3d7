//! A dead dispatcher's connection that had a request in progress cannot be continued, and
//! its client may have nothing more to send (it waits for an answer): the successor makes
//! it speak. A bare acknowledgement from the VIP with a sequence number outside the
//! client's window is answered by an acknowledgement saying where the client is (RFC 9293
//! 3.10.7.4: an unacceptable segment is answered with an ACK), which reaches the
//! successor like any segment of the connection; the XDP program reports it, and the
//! agent resets the connection with the sequence number the client expects.
//!
//! One segment per busy connection, once, when its dispatcher is found dead (bounded by
//! the records armed). A raw TCP socket: the TCP checksum is ours to compute.

use std::{
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

/// RFC 1071 over the pseudo-header and the segment.
fn checksum(src: IpAddr, dst: IpAddr, segment: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32;
        }
    };
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            add(&s.octets());
            add(&d.octets());
            add(&[0, libc::IPPROTO_TCP as u8]);
            add(&(segment.len() as u16).to_be_bytes());
        }
        (s, d) => {
            let v6 = |a: IpAddr| match a {
                IpAddr::V6(a) => a.octets(),
                IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            };
            add(&v6(s));
            add(&v6(d));
            add(&(segment.len() as u32).to_be_bytes());
            add(&[0, 0, 0, libc::IPPROTO_TCP as u8]);
        }
    }
    add(segment);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The probe: an ACK from `local` to `client`, its sequence number `seq` (chosen outside
/// the client's window) and its acknowledgement `ack` (far behind what the client sent).
pub fn segment(local: SocketAddr, client: SocketAddr, seq: u32, ack: u32) -> [u8; 20] {
    let mut t = [0u8; 20];
    t[0..2].copy_from_slice(&local.port().to_be_bytes());
    t[2..4].copy_from_slice(&client.port().to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x10; // ACK
    t[14..16].copy_from_slice(&1024u16.to_be_bytes());
    let sum = checksum(local.ip(), client.ip(), &t);
    t[16..18].copy_from_slice(&sum.to_be_bytes());
    t
}

/// Sends the probe for the connection `client` -> `local` (a VIP address of this host).
pub fn probe(local: SocketAddr, client: SocketAddr, seq: u32, ack: u32) -> io::Result<()> {
    let family = if local.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let raw = unsafe { libc::socket(family, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::IPPROTO_TCP) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let from = std::net::SocketAddr::new(local.ip(), 0);
    let std_sock = socket2_free_bind(&sock, from)?;
    let to = SocketAddr::new(client.ip(), 0);
    let seg = segment(local, client, seq, ack);
    let (addr, len) = super::repair::sockaddr(to);
    // SAFETY: `seg` and `addr` are valid for the lengths given.
    let sent = unsafe {
        libc::sendto(
            std_sock,
            seg.as_ptr().cast(),
            seg.len(),
            libc::MSG_DONTWAIT,
            (&addr as *const libc::sockaddr_storage).cast(),
            len,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Binds the raw socket to the VIP address (its segments leave from it).
fn socket2_free_bind(sock: &OwnedFd, from: SocketAddr) -> io::Result<libc::c_int> {
    let (addr, len) = super::repair::sockaddr(from);
    // SAFETY: `addr` holds `len` valid bytes.
    if unsafe { libc::bind(sock.as_raw_fd(), (&addr as *const libc::sockaddr_storage).cast(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sock.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_is_a_bare_ack_with_a_valid_checksum() {
        let local: SocketAddr = "10.99.100.40:80".parse().unwrap();
        let client: SocketAddr = "10.98.0.7:40000".parse().unwrap();
        let t = segment(local, client, 0x1234_5678, 9);
        assert_eq!(u16::from_be_bytes([t[0], t[1]]), 80);
        assert_eq!(u16::from_be_bytes([t[2], t[3]]), 40000);
        assert_eq!((t[12], t[13]), (0x50, 0x10));
        // The checksum over the pseudo-header and the segment with it folds to zero.
        assert_eq!(checksum(local.ip(), client.ip(), &t), 0);
        let v6 = segment("[fd00::40]:80".parse().unwrap(), "[fd00::7]:1".parse().unwrap(), 1, 2);
        assert_eq!(checksum("fd00::40".parse().unwrap(), "fd00::7".parse().unwrap(), &v6), 0);
    }
}
