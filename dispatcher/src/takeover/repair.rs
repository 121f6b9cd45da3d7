//! Connection takeover (issue 31 part 1): what a dispatcher must know to continue, on
//! another host, a client's TCP connection whose dispatcher died between two requests,
//! and the socket rebuilt from it with `TCP_REPAIR` (CONFIG_CHECKPOINT_RESTORE).
//!
//! An idle keep-alive connection is fully described by its tuple, the options agreed in
//! the handshake (MSS, window scales, SACK and timestamps permitted: `Handshake`, read
//! from `TCP_INFO` once at accept) and three numbers the client's next segment carries
//! (`Resume`): its sequence number is the next byte the dead dispatcher expected, its
//! acknowledgement the next byte the dead dispatcher would have sent, its timestamp echo
//! the dead host's last TSval. `rebuild` makes an established socket from them without a
//! handshake, so the client's retransmission of that segment lands on it.
//!
//! The records that carry `Handshake` to the dispatcher that takes over a slot, and the
//! XDP program's report of the client's segment: the rest of `takeover`. See
//! docs/cluster.md ("Connection takeover").

use std::{
    io,
    net::{SocketAddr, TcpStream},
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

// linux/tcp.h (not all in the libc crate).
const TCP_REPAIR: libc::c_int = 19;
const TCP_REPAIR_QUEUE: libc::c_int = 20;
const TCP_QUEUE_SEQ: libc::c_int = 21;
const TCP_REPAIR_OPTIONS: libc::c_int = 22;
const TCP_TIMESTAMP: libc::c_int = 24;
const TCP_REPAIR_WINDOW: libc::c_int = 29;
const TCP_RECV_QUEUE: libc::c_int = 1;
const TCP_SEND_QUEUE: libc::c_int = 2;
const TCP_REPAIR_ON: libc::c_int = 1;
const TCP_REPAIR_OFF: libc::c_int = 0;
/// Repair off without the window probe the kernel sends otherwise.
const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;
const TCPOPT_MAXSEG: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
/// Timestamps in microseconds (Linux 6.7+): a clock this module does not continue.
const TCPI_OPT_USEC_TS: u8 = 64;
/// The bytes the timestamp option takes in every segment.
const TS_OPTION_BYTES: u32 = 12;
/// RFC 7323 2.3: a window scale above 14 is taken as 14; the kernel refuses more.
const MAX_WSCALE: u8 = 14;

/// The options a connection's handshake agreed, as the accepting dispatcher saw them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    /// The segment size this side sends (the peer's MSS, less the options' room).
    pub mss: u16,
    /// The client's window scale (applied to the windows it advertises) and ours.
    pub snd_wscale: u8,
    pub rcv_wscale: u8,
    pub sack: bool,
    pub timestamps: bool,
    /// Window scaling was agreed at all (both scales are meaningless without it).
    pub wscale: bool,
}

impl Handshake {
    /// `of`, and the connection's timestamp clock now (its next TSval; `None` without
    /// timestamps, or with microsecond ones): a second call, at accept.
    pub fn with_clock(fd: RawFd) -> io::Result<(Handshake, Option<u32>)> {
        let (h, usec) = Handshake::read(fd)?;
        if !h.timestamps || usec {
            return Ok((h, None));
        }
        Ok((h, Some(getsockopt_u32(fd, TCP_TIMESTAMP, "TCP_TIMESTAMP")?)))
    }

    /// Read from an established socket's `TCP_INFO` (one call, at accept).
    pub fn of(fd: RawFd) -> io::Result<Handshake> {
        Ok(Handshake::read(fd)?.0)
    }

    fn read(fd: RawFd) -> io::Result<(Handshake, bool)> {
        let mut info = [0u8; 104];
        let mut len = info.len() as libc::socklen_t;
        // SAFETY: `info` is writable for `len` bytes; the kernel writes at most that.
        let r = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, libc::TCP_INFO, info.as_mut_ptr().cast(), &mut len) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let usec = len > 5 && info[5] & TCPI_OPT_USEC_TS != 0;
        Ok((Handshake::from_tcp_info(&info[..len as usize])?, usec))
    }

    /// `struct tcp_info`: options at byte 5, the two scales at byte 6 (send in the low
    /// nibble), the send MSS at byte 16.
    pub fn from_tcp_info(info: &[u8]) -> io::Result<Handshake> {
        if info.len() < 20 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "TCP_INFO too short"));
        }
        let options = info[5];
        // The send MSS less the timestamp option's room: the peer's MSS (the clamp the
        // rebuilt socket is given) is that much more.
        let timestamps = options & TCPI_OPT_TIMESTAMPS != 0;
        let mss = u32::from_ne_bytes(info[16..20].try_into().unwrap()) + if timestamps { TS_OPTION_BYTES } else { 0 };
        let wscale = options & TCPI_OPT_WSCALE != 0;
        Ok(Handshake {
            mss: mss.clamp(1, u16::MAX as u32) as u16,
            snd_wscale: if wscale { (info[6] & 0xf).min(MAX_WSCALE) } else { 0 },
            rcv_wscale: if wscale { (info[6] >> 4).min(MAX_WSCALE) } else { 0 },
            sack: options & TCPI_OPT_SACK != 0,
            timestamps,
            wscale,
        })
    }
}

/// What the client's next segment says of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// The segment's sequence number: the next byte expected from the client.
    pub rcv_nxt: u32,
    /// Its acknowledgement number: the next byte to send to the client.
    pub snd_nxt: u32,
    /// Its timestamp echo (the dead host's last TSval), when timestamps are on.
    pub ts_echo: Option<u32>,
    /// The window it advertises, unscaled.
    pub window: u16,
}

fn setsockopt<T>(fd: RawFd, name: libc::c_int, value: &T, what: &str) -> io::Result<()> {
    // SAFETY: `value` is a live `T` of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

pub(super) fn sockaddr(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than sockaddr_in and suitably aligned.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: v6.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: v6.ip().octets() },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// An established socket for `local` <- `peer`, continuing where the client's segment
/// says, with the handshake's options; made without a handshake (`TCP_REPAIR`, which
/// needs CAP_NET_ADMIN). `received`: the segment's data (all of it, or nothing), queued
/// as if it had arrived; it is acknowledged when first read (below), so the client need
/// not retransmit it. Without it, the client's retransmission lands on the socket.
pub fn rebuild(
    local: SocketAddr,
    peer: SocketAddr,
    h: &Handshake,
    r: &Resume,
    received: &[u8],
) -> io::Result<TcpStream> {
    rebuild_with(local, peer, h, r, received, true)
}

/// `rebuild`; `window_probe`: the kernel's window probe goes out as repair ends (off for a
/// socket that is reset at once).
pub fn rebuild_with(
    local: SocketAddr,
    peer: SocketAddr,
    h: &Handshake,
    r: &Resume,
    received: &[u8],
    window_probe: bool,
) -> io::Result<TcpStream> {
    let family = if local.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: a plain socket call; the descriptor is owned at once.
    let raw = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    let fd = sock.as_raw_fd();
    setsockopt(fd, TCP_REPAIR, &TCP_REPAIR_ON, "TCP_REPAIR on")?;
    // SO_REUSEPORT as the VIP's listeners have it: a listener bound later (a reload's new
    // worker) is not refused for this socket's address.
    sock_opt(fd, libc::SO_REUSEPORT, 1, "SO_REUSEPORT")?;
    // Repair mode binds beside the VIP's listener (the kernel forces the reuse).
    let (addr, len) = sockaddr(local);
    // SAFETY: `addr` holds `len` valid bytes.
    if unsafe { libc::bind(fd, (&addr as *const libc::sockaddr_storage).cast(), len) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("bind {local}: {e}")));
    }
    setsockopt(fd, TCP_REPAIR_QUEUE, &TCP_SEND_QUEUE, "TCP_REPAIR_QUEUE send")?;
    setsockopt(fd, TCP_QUEUE_SEQ, &r.snd_nxt, "TCP_QUEUE_SEQ send")?;
    setsockopt(fd, TCP_REPAIR_QUEUE, &TCP_RECV_QUEUE, "TCP_REPAIR_QUEUE recv")?;
    setsockopt(fd, TCP_QUEUE_SEQ, &r.rcv_nxt, "TCP_QUEUE_SEQ recv")?;
    // In repair mode connect sends nothing: the socket is established at once.
    let (addr, len) = sockaddr(peer);
    // SAFETY: as above.
    if unsafe { libc::connect(fd, (&addr as *const libc::sockaddr_storage).cast(), len) } != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("connect {peer} (repair): {e}")));
    }
    let mut opts: Vec<[u32; 2]> = vec![[TCPOPT_MAXSEG, h.mss as u32]];
    if h.wscale {
        opts.push([TCPOPT_WINDOW, h.snd_wscale as u32 | (h.rcv_wscale as u32) << 16]);
    }
    if h.sack {
        opts.push([TCPOPT_SACK_PERM, 0]);
    }
    if h.timestamps {
        opts.push([TCPOPT_TIMESTAMP, 0]);
    }
    // SAFETY: `opts` is an array of `struct tcp_repair_opt` (two u32 each).
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            TCP_REPAIR_OPTIONS,
            opts.as_ptr().cast(),
            (opts.len() * 8) as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("TCP_REPAIR_OPTIONS: {e}")));
    }
    if let (true, Some(echo)) = (h.timestamps, r.ts_echo) {
        // Our TSvals go on from the dead host's last one (the client's PAWS check). The
        // value's low bit chooses microsecond timestamps (Linux 6.7+): left clear, the
        // clock is the millisecond one the connection had.
        setsockopt(fd, TCP_TIMESTAMP, &(echo.wrapping_add(2) & !1), "TCP_TIMESTAMP")?;
    }
    if !received.is_empty() {
        // Into the receive queue (repair mode's send), as if it had arrived: the next
        // byte expected moves past it.
        setsockopt(fd, TCP_REPAIR_QUEUE, &TCP_RECV_QUEUE, "TCP_REPAIR_QUEUE recv")?;
        let mut at = 0;
        while at < received.len() {
            // SAFETY: the pointer and length are those of the rest of `received`.
            let n = unsafe { libc::send(fd, received[at..].as_ptr().cast(), received.len() - at, 0) };
            if n <= 0 {
                let e = if n < 0 { io::Error::last_os_error() } else { io::ErrorKind::WriteZero.into() };
                return Err(io::Error::new(e.kind(), format!("queueing the segment's data (repair): {e}")));
            }
            at += n as usize;
        }
    }
    // The client's window as it advertised it, scaled; ours opens as the kernel's own.
    // With data queued, our window is taken as just that data (the last update at the
    // segment's start): nothing acknowledges the data by itself (a window probe sent as
    // repair ends carries an old sequence number, which the client drops unread), but the
    // first read then frees "a lot" of window, and the kernel sends a window update: the
    // acknowledgement. A segment that comes before it is out of that window and answered
    // with an acknowledgement and the real window (the client sends it again).
    let snd_wnd = (r.window as u32) << h.snd_wscale;
    let (rcv_wnd, rcv_wup) = match received.len() as u32 {
        0 => (65535 << h.rcv_wscale.min(2), r.rcv_nxt),
        n => (n, r.rcv_nxt),
    };
    let window: [u32; 5] = [r.rcv_nxt, snd_wnd, snd_wnd, rcv_wnd, rcv_wup];
    setsockopt(fd, TCP_REPAIR_WINDOW, &window, "TCP_REPAIR_WINDOW")?;
    // (Not with data queued: the probe would carry a fresh window, and the read would
    // then have none to free and send no acknowledgement.)
    let off = if window_probe && received.is_empty() { TCP_REPAIR_OFF } else { TCP_REPAIR_OFF_NO_WP };
    setsockopt(fd, TCP_REPAIR, &off, "TCP_REPAIR off")?;
    // Repair off leaves the socket with no address reuse at all.
    sock_opt(fd, libc::SO_REUSEADDR, 1, "SO_REUSEADDR")?;
    Ok(TcpStream::from(sock))
}

fn sock_opt(fd: RawFd, name: libc::c_int, value: libc::c_int, what: &str) -> io::Result<()> {
    // SAFETY: `value` is a live c_int of the size passed.
    let r = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(())
}

/// Makes the client of `local` <- `peer` answer at once with an acknowledgement that says
/// where it is: a socket rebuilt at a sequence number far outside its window sends, as
/// repair ends, a window probe, which the client answers (RFC 9293 3.10.7.4); the socket
/// is then closed in repair mode, without a word. Needs what `rebuild` needs
/// (CAP_NET_ADMIN), no raw socket.
pub fn probe(local: SocketAddr, peer: SocketAddr, h: &Handshake, seq: u32) -> io::Result<()> {
    let r = Resume { rcv_nxt: seq, snd_nxt: seq ^ 0x8000_0000, ts_echo: None, window: 1024 };
    let sock = rebuild_with(local, peer, h, &r, &[], true)?;
    setsockopt(sock.as_raw_fd(), TCP_REPAIR, &TCP_REPAIR_ON, "TCP_REPAIR on")?;
    drop(sock);
    Ok(())
}

fn getsockopt_u32(fd: RawFd, name: libc::c_int, what: &str) -> io::Result<u32> {
    let mut v: u32 = 0;
    let mut len = std::mem::size_of::<u32>() as libc::socklen_t;
    // SAFETY: `v` is writable for `len` bytes.
    let r = unsafe { libc::getsockopt(fd, libc::IPPROTO_TCP, name, (&mut v as *mut u32).cast(), &mut len) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("{what}: {e}")));
    }
    Ok(v)
}

/// Closes an idle connection's socket without a word to its peer (no FIN, no RST), as a
/// dead host's connection ends, and returns what the client's next segment will say
/// (read in repair mode: the next byte expected and the next to send, the last TSval, the
/// client's last window unscaled).
pub fn vanish(fd: OwnedFd) -> io::Result<Resume> {
    let raw = fd.as_raw_fd();
    let h = Handshake::of(raw)?;
    setsockopt(raw, TCP_REPAIR, &TCP_REPAIR_ON, "TCP_REPAIR on")?;
    setsockopt(raw, TCP_REPAIR_QUEUE, &TCP_RECV_QUEUE, "TCP_REPAIR_QUEUE recv")?;
    let rcv_nxt = getsockopt_u32(raw, TCP_QUEUE_SEQ, "TCP_QUEUE_SEQ recv")?;
    setsockopt(raw, TCP_REPAIR_QUEUE, &TCP_SEND_QUEUE, "TCP_REPAIR_QUEUE send")?;
    let snd_nxt = getsockopt_u32(raw, TCP_QUEUE_SEQ, "TCP_QUEUE_SEQ send")?;
    let ts = getsockopt_u32(raw, TCP_TIMESTAMP, "TCP_TIMESTAMP")?;
    let mut window = [0u32; 5];
    let mut len = std::mem::size_of_val(&window) as libc::socklen_t;
    // SAFETY: `window` is writable for `len` bytes.
    let r =
        unsafe { libc::getsockopt(raw, libc::IPPROTO_TCP, TCP_REPAIR_WINDOW, window.as_mut_ptr().cast(), &mut len) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    drop(fd);
    Ok(Resume {
        rcv_nxt,
        snd_nxt,
        ts_echo: h.timestamps.then_some(ts),
        window: (window[1] >> h.snd_wscale).min(u16::MAX as u32) as u16,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_info_says_the_handshakes_options() {
        let mut info = [0u8; 104];
        info[5] = TCPI_OPT_TIMESTAMPS | TCPI_OPT_SACK | TCPI_OPT_WSCALE;
        info[6] = 7 | (9 << 4);
        info[16..20].copy_from_slice(&1448u32.to_ne_bytes());
        let h = Handshake::from_tcp_info(&info).unwrap();
        assert_eq!(
            h,
            Handshake { mss: 1460, snd_wscale: 7, rcv_wscale: 9, sack: true, timestamps: true, wscale: true },
            "the peer's MSS: the send MSS and the timestamps' 12 bytes"
        );
        // No window scaling agreed: the nibbles mean nothing; a scale past 14 is 14.
        info[5] = TCPI_OPT_SACK;
        assert_eq!(Handshake::from_tcp_info(&info).unwrap().snd_wscale, 0);
        info[5] = TCPI_OPT_WSCALE;
        info[6] = 15;
        assert_eq!(Handshake::from_tcp_info(&info).unwrap().snd_wscale, 14);
        assert!(Handshake::from_tcp_info(&info[..12]).is_err(), "cut short");
    }
}
