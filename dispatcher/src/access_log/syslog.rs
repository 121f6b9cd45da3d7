//! The access log's syslog destination: one message per line, one datagram each, to a
//! Unix datagram socket (`/dev/log`) or a UDP address; RFC 5424
//! (`<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - MSG`) or, for receivers that read
//! only that (journald on /dev/log), the local RFC 3164 form glibc's `syslog()` sends
//! (`<PRI>Mmm dd hh:mm:ss TAG[PID]: MSG`).
//!
//! Failure model: the socket is non-blocking and never connected, so each send names its
//! receiver. A receiver that is missing (no socket file, nobody bound to it), full
//! (its queue: `EAGAIN`) or unreachable costs that one line: it is dropped and counted
//! (`dispatcher_access_log_dropped_total`), the failure is reported once until a line
//! goes through again, and the next line simply tries again. Nothing here waits, and the
//! request path only ever hands entries to the writer's queue.

use std::{
    net::{SocketAddr, UdpSocket},
    os::unix::net::UnixDatagram,
    path::PathBuf,
    sync::atomic::Ordering,
    time::SystemTime,
};

use anyhow::Context as _;

use super::{haproxy, json, legacy_header, rfc3339, Entry};
use crate::{
    config::{AccessLogFormat, AccessLogSettings, SyslogFormat, SyslogTarget},
    metrics::Counters,
};

/// Informational: every access log line.
const SEVERITY_INFO: u8 = 6;

pub struct Syslog {
    socket: Socket,
    /// `<PRI>`'s value: facility * 8 + severity.
    pri: u8,
    /// `HOSTNAME APP-NAME PROCID MSGID` (RFC 5424), or `TAG[PID]:` (RFC 3164).
    ident: String,
    form: SyslogFormat,
    max_message: usize,
    failing: bool,
}

enum Socket {
    Unix(UnixDatagram, PathBuf),
    Udp(UdpSocket, SocketAddr),
}

impl Syslog {
    /// A socket for `target` (the receiver need not exist yet).
    pub fn new(target: &SyslogTarget, settings: &AccessLogSettings, host: String) -> anyhow::Result<Syslog> {
        let socket = match target {
            SyslogTarget::Unix(path) => {
                let s = UnixDatagram::unbound().context("creating the access log's syslog socket")?;
                s.set_nonblocking(true).context("the access log's syslog socket")?;
                Socket::Unix(s, path.clone())
            }
            SyslogTarget::Udp(addr) => {
                let local: SocketAddr =
                    if addr.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
                let s = UdpSocket::bind(local).context("creating the access log's syslog socket")?;
                s.set_nonblocking(true).context("the access log's syslog socket")?;
                Socket::Udp(s, *addr)
            }
        };
        Ok(Syslog {
            socket,
            pri: settings.facility * 8 + SEVERITY_INFO,
            ident: match settings.syslog_format {
                SyslogFormat::Rfc5424 => format!("{host} {} {} access", settings.tag, std::process::id()),
                SyslogFormat::Rfc3164 => format!("{}[{}]:", settings.tag, std::process::id()),
            },
            form: settings.syslog_format,
            max_message: settings.max_message,
            failing: false,
        })
    }

    /// Formats `e` after the header into `msg`, cut to `max_message` bytes, and sends it.
    pub fn send(&mut self, msg: &mut String, e: &Entry, format: AccessLogFormat, counters: &Counters) {
        match self.form {
            SyslogFormat::Rfc5424 => header(msg, self.pri, SystemTime::now(), &self.ident),
            SyslogFormat::Rfc3164 => header3164(msg, self.pri, SystemTime::now(), &self.ident),
        }
        match format {
            AccessLogFormat::Json => json(msg, e),
            AccessLogFormat::Haproxy => haproxy(msg, e),
        }
        truncate(msg, self.max_message);
        let sent = match &self.socket {
            Socket::Unix(s, path) => s.send_to(msg.as_bytes(), path),
            Socket::Udp(s, addr) => s.send_to(msg.as_bytes(), addr),
        };
        match sent {
            Ok(_) => {
                counters.access_log_lines.fetch_add(1, Ordering::Relaxed);
                self.failing = false;
            }
            Err(err) => {
                counters.access_log_dropped.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    self.failing = true;
                    let to = match &self.socket {
                        Socket::Unix(_, p) => p.display().to_string(),
                        Socket::Udp(_, a) => a.to_string(),
                    };
                    tracing::warn!(error = %err, syslog = %to, "the access log's syslog receiver does not take its lines (dropped and counted until it does)");
                }
            }
        }
    }
}

/// `<PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID - ` (RFC 5424: version 1, no
/// structured data).
pub fn header(o: &mut String, pri: u8, at: SystemTime, ident: &str) {
    use std::fmt::Write as _;
    let _ = write!(o, "<{pri}>1 ");
    rfc3339(o, at);
    let _ = write!(o, " {ident} - ");
}

/// `<PRI>Mmm dd hh:mm:ss TAG[PID]: ` (UTC).
pub fn header3164(o: &mut String, pri: u8, at: SystemTime, ident: &str) {
    use std::fmt::Write as _;
    let _ = write!(o, "<{pri}>");
    legacy_header(o, at, ident);
}

/// Cuts `msg` to at most `max` bytes, at a character boundary.
fn truncate(msg: &mut String, max: usize) {
    if msg.len() > max {
        let mut at = max;
        while !msg.is_char_boundary(at) {
            at -= 1;
        }
        msg.truncate(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_has_the_rfc5424_header_and_is_cut_at_its_size() {
        let mut s = String::new();
        let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(1_796_103_007_250);
        header(&mut s, 16 * 8 + SEVERITY_INFO, at, "h dispatcher 42 access");
        assert_eq!(s, "<134>1 2026-12-01T05:30:07.250Z h dispatcher 42 access - ");
        let mut s = String::new();
        header3164(&mut s, 16 * 8 + SEVERITY_INFO, at, "dispatcher[42]:");
        assert_eq!(s, "<134>Dec  1 05:30:07 dispatcher[42]: ", "the local form glibc's syslog() sends");
        let mut m = "ab\u{e9}c".to_string();
        truncate(&mut m, 3);
        assert_eq!(m, "ab", "never inside a character");
    }
}
