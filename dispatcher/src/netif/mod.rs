//! The interfaces of this process's network namespace, by ioctl (sysfs may show another
//! namespace's): up and down, MAC address, TUN devices. Used by the announcements
//! (`announce`) and by steering (this dispatcher's MAC). `rtnl` asks rtnetlink what
//! ioctls cannot tell (a veth's peer, the XDP program of a link); `veth` finds the veth
//! trap with it.

pub mod rtnl;
pub mod veth;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

/// A `struct ifreq` naming `name` (at most IFNAMSIZ - 1 bytes).
fn ifreq(name: &str) -> anyhow::Result<libc::ifreq> {
    anyhow::ensure!(!name.is_empty() && name.len() < libc::IFNAMSIZ, "interface name {name:?}");
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    Ok(req)
}

/// A socket to ask interface ioctls on.
fn control_socket() -> nix::Result<OwnedFd> {
    nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )
}

/// Opens (creating) the TUN device `name`; it lives as long as the descriptor.
pub fn open_tun(name: &str) -> anyhow::Result<OwnedFd> {
    let mut req = ifreq(name)?;
    let fd = nix::fcntl::open(
        "/dev/net/tun",
        nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .context("opening /dev/net/tun")?;
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    req.ifr_ifru.ifru_flags = IFF_TUN | IFF_NO_PI;
    if unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
        bail!("creating TUN device {name}: {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sets `name` administratively up or down.
pub fn set_up(name: &str, up: bool) -> anyhow::Result<()> {
    let sock = control_socket()?;
    let mut req = ifreq(name)?;
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) } < 0 {
        bail!("reading the flags of {name}: {}", std::io::Error::last_os_error());
    }
    let flag = libc::IFF_UP as libc::c_short;
    unsafe {
        req.ifr_ifru.ifru_flags = if up { req.ifr_ifru.ifru_flags | flag } else { req.ifr_ifru.ifru_flags & !flag };
    }
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as _, &mut req) } < 0 {
        bail!("setting {name} {}: {}", if up { "up" } else { "down" }, std::io::Error::last_os_error());
    }
    Ok(())
}

/// The MAC address of `name` (SIOCGIFHWADDR).
pub fn hardware_address(name: &str) -> anyhow::Result<[u8; 6]> {
    let sock = control_socket()?;
    let mut req = ifreq(name)?;
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFHWADDR as _, &mut req) } < 0 {
        bail!("reading the MAC address of {name}: {}", std::io::Error::last_os_error());
    }
    let data = unsafe { req.ifr_ifru.ifru_hwaddr.sa_data };
    Ok([data[0] as u8, data[1] as u8, data[2] as u8, data[3] as u8, data[4] as u8, data[5] as u8])
}

/// The first IPv4 address of `name` (else its first IPv6 address that is not
/// link-local): where the peer channel listens on the segment steering uses.
pub fn host_address(name: &str) -> anyhow::Result<std::net::IpAddr> {
    let mut v6 = None;
    for a in nix::ifaddrs::getifaddrs()?.filter(|a| a.interface_name == name) {
        let Some(addr) = a.address else { continue };
        if let Some(v4) = addr.as_sockaddr_in() {
            return Ok(std::net::IpAddr::V4(v4.ip()));
        }
        if let Some(s6) = addr.as_sockaddr_in6() {
            let ip = s6.ip();
            if v6.is_none() && (ip.segments()[0] & 0xffc0) != 0xfe80 {
                v6 = Some(std::net::IpAddr::V6(ip));
            }
        }
    }
    v6.ok_or_else(|| anyhow::anyhow!("{name} has no IP address (the peer heartbeats go from and to it)"))
}

pub fn exists(name: &str) -> bool {
    nix::net::if_::if_nametoindex(name).is_ok()
}
