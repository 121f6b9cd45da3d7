//! Links by rtnetlink (`NETLINK_ROUTE`): what the ioctls cannot say — a veth's peer (its
//! index and namespace), which XDP program a link runs and in which mode — and attaching
//! or removing a program the netlink way (it stays with the link after this process
//! exits, as `ip link set dev X xdp obj ...` does). Used for the veth trap
//! (`netif::veth`).
//!
//! Replies come from the kernel, but are parsed as untrusted bytes all the same: every
//! length is checked before it is used.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const RTM_NEWLINK: u16 = 16;
const RTM_GETLINK: u16 = 18;
const RTM_SETLINK: u16 = 19;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 2;
const NLA_F_NESTED: u16 = 0x8000;
const NLA_TYPE_MASK: u16 = 0x3fff;

const IFLA_IFNAME: u16 = 3;
const IFLA_LINK: u16 = 5;
const IFLA_LINKINFO: u16 = 18;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_LINK_NETNSID: u16 = 37;
const IFLA_XDP: u16 = 43;
const IFLA_TARGET_NETNSID: u16 = 46;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;

/// `XDP_FLAGS_*` (linux/if_link.h).
pub const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1;
pub const XDP_FLAGS_SKB_MODE: u32 = 2;
pub const XDP_FLAGS_DRV_MODE: u32 = 4;

const HDR: usize = 16; // struct nlmsghdr
const IFINFO: usize = 16; // struct ifinfomsg

/// How an XDP program is attached to a link (`XDP_ATTACHED_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XdpAttached {
    None,
    /// Native (driver) mode.
    Driver,
    /// Generic (skb) mode.
    Generic,
    Offloaded,
    /// Programs in several modes at once.
    Multi,
}

impl XdpAttached {
    fn from_u8(v: u8) -> XdpAttached {
        match v {
            1 => XdpAttached::Driver,
            2 => XdpAttached::Generic,
            3 => XdpAttached::Offloaded,
            4 => XdpAttached::Multi,
            _ => XdpAttached::None,
        }
    }
}

/// What rtnetlink says of one link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Link {
    pub index: u32,
    pub name: String,
    /// `IFLA_INFO_KIND`: "veth", "bridge"... (None for a physical device).
    pub kind: Option<String>,
    /// `IFLA_LINK`: for a veth, its peer's index (in the peer's namespace).
    pub link: Option<u32>,
    /// `IFLA_LINK_NETNSID`: the namespace of that peer, as an id seen from the asking
    /// namespace (`ip netns list-id`); None: the same namespace.
    pub link_netnsid: Option<i32>,
    pub xdp: XdpAttached,
    /// The attached program's id (mode `Driver`, `Generic` or `Offloaded`).
    pub xdp_prog_id: Option<u32>,
}

/// A netlink route socket of the calling thread's network namespace.
fn socket() -> io::Result<OwnedFd> {
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A request under construction: header, `ifinfomsg`, attributes.
struct Request {
    buf: Vec<u8>,
    /// Where open nested attributes start.
    nests: Vec<usize>,
}

impl Request {
    /// A link request: `ifinfomsg` for link `index`.
    fn new(kind: u16, flags: u16, index: u32) -> Request {
        let mut body = [0u8; IFINFO];
        body[0] = libc::AF_UNSPEC as u8;
        body[4..8].copy_from_slice(&(index as i32).to_ne_bytes());
        Request::with_body(kind, flags, &body)
    }

    fn with_body(kind: u16, flags: u16, body: &[u8]) -> Request {
        let mut buf = vec![0u8; HDR];
        buf[4..6].copy_from_slice(&kind.to_ne_bytes());
        buf[6..8].copy_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        buf[8..12].copy_from_slice(&1u32.to_ne_bytes()); // sequence number
        buf.extend_from_slice(body);
        buf.resize(buf.len().next_multiple_of(4), 0);
        Request { buf, nests: Vec::new() }
    }

    fn attr(&mut self, kind: u16, data: &[u8]) -> &mut Request {
        let len = 4 + data.len();
        self.buf.extend_from_slice(&(len as u16).to_ne_bytes());
        self.buf.extend_from_slice(&kind.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.buf.resize(self.buf.len().next_multiple_of(4), 0);
        self
    }

    fn nest(&mut self, kind: u16) -> &mut Request {
        self.nests.push(self.buf.len());
        self.attr(kind | NLA_F_NESTED, &[])
    }

    fn end_nest(&mut self) -> &mut Request {
        let start = self.nests.pop().expect("an open nest");
        let len = (self.buf.len() - start) as u16;
        self.buf[start..start + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn finish(&mut self) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        &self.buf
    }
}

/// Sends `req` and returns the first reply message (type and payload), or the error the
/// kernel answered with.
fn exchange(sock: &OwnedFd, req: &mut Request) -> io::Result<(u16, Vec<u8>)> {
    let msg = req.finish();
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 64 * 1024];
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    first_message(&buf)
}

fn bad(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed netlink reply: {what}"))
}

/// The first message of a reply: `NLMSG_ERROR` becomes the error it carries (0: an
/// acknowledgement, returned as an empty `NLMSG_ERROR` message).
fn first_message(buf: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    if buf.len() < HDR {
        return Err(bad("shorter than its header"));
    }
    let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
    let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
    if len < HDR || len > buf.len() {
        return Err(bad("length out of bounds"));
    }
    let payload = &buf[HDR..len];
    if kind == NLMSG_ERROR {
        if payload.len() < 4 {
            return Err(bad("short error"));
        }
        let errno = i32::from_ne_bytes(payload[0..4].try_into().unwrap());
        if errno != 0 {
            return Err(io::Error::from_raw_os_error(errno.wrapping_neg()));
        }
        return Ok((NLMSG_ERROR, Vec::new()));
    }
    Ok((kind, payload.to_vec()))
}

/// The attributes in `buf`, as (type without flags, payload); stops at the first one that
/// does not fit.
fn attributes(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let data = &buf[4..len];
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        Some((kind, data))
    })
}

fn u32_of(data: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(data.get(..4)?.try_into().ok()?))
}

/// Parses an `RTM_NEWLINK` payload.
fn parse_link(payload: &[u8]) -> io::Result<Link> {
    if payload.len() < IFINFO {
        return Err(bad("short ifinfomsg"));
    }
    let index = i32::from_ne_bytes(payload[4..8].try_into().unwrap()) as u32;
    let mut link = Link {
        index,
        name: String::new(),
        kind: None,
        link: None,
        link_netnsid: None,
        xdp: XdpAttached::None,
        xdp_prog_id: None,
    };
    let text = |d: &[u8]| String::from_utf8_lossy(d.split(|&b| b == 0).next().unwrap_or(d)).into_owned();
    for (kind, data) in attributes(&payload[IFINFO..]) {
        match kind {
            IFLA_IFNAME => link.name = text(data),
            IFLA_LINK => link.link = u32_of(data),
            IFLA_LINK_NETNSID => link.link_netnsid = u32_of(data).map(|v| v as i32),
            IFLA_LINKINFO => {
                link.kind = attributes(data).find(|(k, _)| *k == IFLA_INFO_KIND).map(|(_, d)| text(d));
            }
            IFLA_XDP => {
                for (k, d) in attributes(data) {
                    match k {
                        IFLA_XDP_ATTACHED => {
                            link.xdp = d.first().map_or(XdpAttached::None, |&v| XdpAttached::from_u8(v))
                        }
                        IFLA_XDP_PROG_ID => link.xdp_prog_id = u32_of(d),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    Ok(link)
}

/// The link with index `index`, in this namespace (`netnsid` None) or in the namespace
/// with that id as seen from this one.
pub fn link(index: u32, netnsid: Option<i32>) -> io::Result<Link> {
    let sock = socket()?;
    let mut req = Request::new(RTM_GETLINK, 0, index);
    if let Some(id) = netnsid {
        req.attr(IFLA_TARGET_NETNSID, &id.to_ne_bytes());
    }
    match exchange(&sock, &mut req)? {
        (RTM_NEWLINK, payload) => parse_link(&payload),
        (kind, _) => Err(bad(&format!("message type {kind} for a link"))),
    }
}

/// The link named `name` in this namespace.
pub fn link_named(name: &str) -> io::Result<Link> {
    let index = nix::net::if_::if_nametoindex(name).map_err(io::Error::from)?;
    link(index, None)
}

const RTM_NEWNSID: u16 = 88;
const RTM_GETNSID: u16 = 90;
const NETNSA_NSID: u16 = 1;
const NETNSA_FD: u16 = 3;

/// The id this namespace gives the namespace `ns` refers to (an open `/run/netns/NAME`),
/// if it has given it one.
pub fn netnsid_of(ns: std::os::fd::BorrowedFd<'_>) -> io::Result<Option<i32>> {
    let sock = socket()?;
    let mut req = Request::with_body(RTM_GETNSID, 0, &[libc::AF_UNSPEC as u8]);
    req.attr(NETNSA_FD, &(ns.as_raw_fd() as u32).to_ne_bytes());
    match exchange(&sock, &mut req)? {
        (RTM_NEWNSID, payload) if payload.len() >= 4 => Ok(attributes(&payload[4..])
            .find(|(k, _)| *k == NETNSA_NSID)
            .and_then(|(_, d)| u32_of(d))
            .map(|v| v as i32)
            .filter(|&v| v >= 0)),
        (kind, _) => Err(bad(&format!("message type {kind} for a namespace id"))),
    }
}

/// Attaches the program `prog` to link `index` of this namespace with `flags`
/// (`XDP_FLAGS_*`), or removes the one attached in that mode (`prog` None).
pub fn set_xdp(index: u32, prog: Option<RawFd>, flags: u32) -> io::Result<()> {
    let sock = socket()?;
    let mut req = Request::new(RTM_SETLINK, NLM_F_ACK, index);
    req.nest(IFLA_XDP)
        .attr(IFLA_XDP_FD, &prog.unwrap_or(-1).to_ne_bytes())
        .attr(IFLA_XDP_FLAGS, &flags.to_ne_bytes())
        .end_nest();
    exchange(&sock, &mut req).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_framed_with_nested_attributes_padded() {
        let mut r = Request::new(RTM_SETLINK, NLM_F_ACK, 7);
        r.nest(IFLA_XDP).attr(IFLA_XDP_FD, &5i32.to_ne_bytes()).attr(IFLA_XDP_FLAGS, &4u32.to_ne_bytes()).end_nest();
        let b = r.finish().to_vec();
        assert_eq!(u32::from_ne_bytes(b[0..4].try_into().unwrap()) as usize, b.len());
        assert_eq!(i32::from_ne_bytes(b[HDR + 4..HDR + 8].try_into().unwrap()), 7);
        let attrs: Vec<_> = attributes(&b[HDR + IFINFO..]).collect();
        assert_eq!(attrs.len(), 1);
        assert_eq!(attrs[0].0, IFLA_XDP);
        let inner: Vec<_> = attributes(attrs[0].1).map(|(k, d)| (k, d.to_vec())).collect();
        assert_eq!(
            inner,
            vec![(IFLA_XDP_FD, 5i32.to_ne_bytes().to_vec()), (IFLA_XDP_FLAGS, 4u32.to_ne_bytes().to_vec())]
        );
    }

    #[test]
    fn hostile_replies_are_errors_not_panics() {
        assert!(first_message(&[0; 8]).is_err());
        let mut m = vec![0u8; HDR];
        m[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(first_message(&m).is_err(), "a length past the buffer");
        // An attribute claiming more than there is ends the walk.
        let attrs = [200u8, 0, 3, 0, b'x'];
        assert_eq!(attributes(&attrs).count(), 0);
        assert!(parse_link(&[0; 4]).is_err());
        // An error reply carries the errno.
        let mut e = vec![0u8; HDR + 4];
        e[0..4].copy_from_slice(&((HDR + 4) as u32).to_ne_bytes());
        e[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        e[HDR..HDR + 4].copy_from_slice(&(-libc::ENODEV).to_ne_bytes());
        assert_eq!(first_message(&e).unwrap_err().raw_os_error(), Some(libc::ENODEV));
    }

    /// Loopback is in every namespace: no peer, no XDP.
    #[test]
    fn loopback_is_read_back() {
        let lo = link_named("lo").expect("rtnetlink answers");
        assert_eq!((lo.index, lo.name.as_str(), lo.link_netnsid, lo.xdp), (1, "lo", None, XdpAttached::None));
    }
}
