//! Active health checks and the health state machine.
//!
//! up --(one failure: a check or a failed request)--> suspect --(`fall` failed checks)--> down
//! suspect --(a passing check)--> up;  down --(`rise` passing checks)--> up
//!
//! Suspect means "ownership unknown": its sessions are held, not sent elsewhere, until a
//! check confirms it down (then its replica serves them) or clears it.

mod reason;
pub mod sip;

pub use reason::{Cause, Reason};

use std::{net::SocketAddr, time::Duration};

use bytes::Buf;
use dispatcher_common::Health;
use tokio::{
    io::{AsyncRead, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

use crate::config::{CheckKind, Config, HealthSettings, Protocol, VipMode};
use crate::http1::{
    body::{relay_body, HeadError, Inbound, RelayError, Timeouts},
    head::{parse_request, parse_response, HeadLimits},
    io::is_local_errno,
};

/// What to check for one backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub addr: SocketAddr,
    pub kind: ProbeKind,
    /// HTTP checks over TLS: the backend's HTTP VIP speaks TLS to it (`backend_tls`).
    pub tls: Option<ProbeTls>,
}

/// TLS for a backend's HTTP checks, as the VIP's requests use it (same CA, name and
/// client certificate).
#[derive(Clone)]
pub struct ProbeTls {
    files: crate::config::BackendTlsFiles,
    conn: std::sync::Arc<crate::tls::upstream::BackendTls>,
}

impl PartialEq for ProbeTls {
    fn eq(&self, other: &ProbeTls) -> bool {
        self.files == other.files
    }
}

impl std::fmt::Debug for ProbeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProbeTls({:?})", self.files)
    }
}

impl ProbeTls {
    fn new(files: &crate::config::BackendTlsFiles, address: std::net::IpAddr) -> Option<ProbeTls> {
        match crate::tls::upstream::client_config(files) {
            Ok(config) => Some(ProbeTls {
                files: files.clone(),
                conn: std::sync::Arc::new(crate::tls::upstream::BackendTls::new(config, files, address)),
            }),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "backend_tls for health checks");
                None
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum ProbeKind {
    /// A TCP connect.
    Tcp,
    /// `GET path` over HTTP/1.1.
    Http(String),
    /// A SIP `OPTIONS` over UDP.
    Sip,
}

/// The port a SIP VIP's containers are checked on: their own (`backend_port`) for a
/// SIP VIP over TCP or TLS, else the VIP's.
fn sip_port(v: &crate::config::Vip) -> u16 {
    v.sip_stream().map_or(v.port, |s| s.backend_port)
}

/// The probe for each backend: by default (`kind = "auto"`) HTTP on the port its requests
/// go to (its own `port`, else its farm's, else the `backend_port` of the first HTTP VIP
/// routing to its farm, else of its first HTTP VIP), else SIP `OPTIONS` to its first SIP VIP's port, else a TCP connect
/// to its first TCP VIP's port; `kind` and `port` override. A backend that serves only
/// UDP L4 VIPs is not checked.
pub fn probes(cfg: &Config) -> Vec<Option<Probe>> {
    let h = &cfg.health;
    (0..cfg.backends.len())
        .map(|b| {
            if !h.enabled || cfg.backends[b].retired {
                return None;
            }
            let vips: Vec<_> = cfg.vips.iter().filter(|v| !v.retired && v.backends.contains(&b)).collect();
            let http = farm_port(cfg, b).or_else(|| vips.iter().find_map(|v| v.http()).map(|h| (h.backend_port, h)));
            let http_vip = http.map(|(_, v)| v);
            let sip_vip = vips.iter().find(|v| v.mode() == VipMode::Sip);
            let tcp_vip = vips.iter().find(|v| v.protocol == Protocol::Tcp);
            let (port, auto) = match (http, sip_vip, tcp_vip) {
                (Some((port, _)), _, _) => (port, ProbeKind::Http(h.path.clone())),
                (None, Some(v), _) => (sip_port(v), ProbeKind::Sip),
                (None, None, Some(v)) => (v.port, ProbeKind::Tcp),
                (None, None, None) => return None,
            };
            let kind = match h.kind {
                CheckKind::Auto => auto,
                CheckKind::Http => ProbeKind::Http(h.path.clone()),
                CheckKind::Tcp => ProbeKind::Tcp,
                CheckKind::Sip => ProbeKind::Sip,
            };
            // A SIP check of a backend without a SIP VIP goes to SIP's port.
            let port = h.port.unwrap_or(if kind == ProbeKind::Sip {
                sip_vip.map(|v| sip_port(v)).unwrap_or(5060)
            } else {
                port
            });
            let address = cfg.backends[b].address.into();
            // HTTP checks on the backend port go over TLS when the VIP's requests do.
            let tls = match (&kind, http_vip.and_then(|v| v.backend_tls.as_ref())) {
                (ProbeKind::Http(_), Some(files)) if h.port.is_none() => ProbeTls::new(files, address),
                _ => None,
            };
            Some(Probe { addr: SocketAddr::new(address, port), kind, tls })
        })
        .collect()
}

/// The port HTTP requests reach backend `b` on through its farm, and the first HTTP VIP
/// routing to that farm; `None` when no served HTTP VIP routes to a farm of it.
fn farm_port(cfg: &Config, b: usize) -> Option<(u16, &crate::config::HttpVip)> {
    cfg.farms.iter().enumerate().filter(|(_, f)| f.members().any(|m| m == b)).find_map(|(i, f)| {
        let vip = (cfg.routes.iter().filter(|r| r.farm == i))
            .flat_map(|r| &r.vips)
            .find_map(|&v| cfg.vips.get(v).and_then(|v| v.served_http()))?;
        Some((f.port_of(&cfg.backends[b], vip.backend_port), vip))
    })
}

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Failed, and why.
    Fail(Cause),
    /// The check could not be made for a reason of this host's (out of descriptors,
    /// ports, buffers): it says nothing about the backend and changes nothing.
    Local,
}

/// Runs one check. A SIP check's answer may name a logical name (returned, to be
/// learned).
pub async fn check(p: &Probe, s: &HealthSettings) -> (Verdict, Option<String>) {
    if p.kind == ProbeKind::Sip {
        let timeout = (Verdict::Fail(Cause::timeout(s.timeout)), None);
        return tokio::time::timeout(s.timeout, sip::options(p.addr)).await.unwrap_or(timeout);
    }
    let attempt = async {
        let stream = match TcpStream::connect(p.addr).await {
            Ok(st) => st,
            Err(e) if e.raw_os_error().is_some_and(is_local_errno) => {
                crate::ratelimit::warn("health check connect", &e);
                return Verdict::Local;
            }
            Err(e) => return Verdict::Fail(Cause::of_io(&e)),
        };
        let ProbeKind::Http(path) = &p.kind else { return Verdict::Pass };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: dispatcher-health\r\nConnection: close\r\n\r\n",
            p.addr
        );
        let status = match &p.tls {
            None => http_check(stream, req.as_bytes(), s.timeout).await,
            Some(tls) => match tls.conn.connect(stream).await {
                Ok(conn) => http_check(conn, req.as_bytes(), s.timeout).await,
                // A certificate we do not trust fails the check, as it fails requests.
                Err(_) => Err(Cause::Tls),
            },
        };
        match status {
            Ok(status) if status == s.expect_status => Verdict::Pass,
            Ok(status) => Verdict::Fail(Cause::Status(status)),
            Err(cause) => Verdict::Fail(cause),
        }
    };
    (tokio::time::timeout(s.timeout, attempt).await.unwrap_or(Verdict::Fail(Cause::timeout(s.timeout))), None)
}

/// Sends `request` and reads the whole response; its status, or why there is none.
async fn http_check<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
    timeout: Duration,
) -> Result<u16, Cause> {
    stream.write_all(request).await.map_err(|e| Cause::of_io(&e))?;
    read_response(stream, request, timeout).await
}

/// Reads the whole response to `request` (head by the codec's parser, then the body as
/// it is framed: a length, chunks, or until the server closes) and returns its status.
/// The server thus never sees its response cut off (a reset), and a server that keeps the
/// connection open despite `Connection: close` does not make the check wait for its
/// timeout. A body that ends early or is badly chunked ends the reading, not the check.
async fn read_response<S: AsyncRead + Unpin>(stream: S, request: &[u8], timeout: Duration) -> Result<u16, Cause> {
    let limits = HeadLimits::default();
    let req = parse_request(request, &limits, &mut Vec::new()).ok().flatten().ok_or(Cause::BadResponse)?;
    let mut from = Inbound::with_chunk(stream, 4096);
    let res = match from.read_head(timeout, |buf| parse_response(buf, &req, &limits, &mut Vec::new())).await {
        Ok(res) => res,
        Err(HeadError::Closed) => return Err(Cause::Closed),
        Err(HeadError::Reject(_)) => return Err(Cause::BadResponse),
        Err(HeadError::Read(RelayError::Read(e))) => return Err(Cause::of_io(&e)),
        Err(HeadError::Read(RelayError::Timeout)) => return Err(Cause::timeout(timeout)),
        Err(HeadError::Read(_)) => return Err(Cause::Closed),
    };
    from.buf.advance(res.len);
    let t = Timeouts { read: timeout, write: timeout };
    let _ = relay_body(res.framing, &mut from, &mut tokio::io::sink(), t, false).await;
    Ok(res.status)
}

/// Consecutive results of one backend's checks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Streak {
    ok: u32,
    fail: u32,
}

impl Streak {
    /// After a failed request: it counts as the first failure towards `fall`.
    pub fn after_failure() -> Streak {
        Streak { ok: 0, fail: 1 }
    }
}

/// The health after one check result.
pub fn next(health: Health, passed: bool, streak: &mut Streak, rise: u32, fall: u32) -> Health {
    if passed {
        streak.ok += 1;
        streak.fail = 0;
        match health {
            Health::Down if streak.ok < rise => Health::Down,
            _ => Health::Up,
        }
    } else {
        streak.fail += 1;
        streak.ok = 0;
        if streak.fail >= fall || health == Health::Down {
            Health::Down
        } else {
            Health::Suspect
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    /// A server that answers with a framed response and keeps the connection open (it
    /// ignores `Connection: close`): the check passes at the end of the response, not at
    /// its timeout.
    #[tokio::test]
    async fn a_check_ends_with_a_framed_response() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let mut held = Vec::new();
            for reply in [
                &b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"[..],
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
                b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n",
            ] {
                let (mut c, _) = listener.accept().await.unwrap();
                let mut req = [0u8; 1024];
                let _ = c.read(&mut req).await.unwrap();
                c.write_all(reply).await.unwrap();
                held.push(c);
            }
            held
        });
        let probe = Probe { addr, kind: ProbeKind::Http("/".into()), tls: None };
        let s = HealthSettings { timeout: std::time::Duration::from_secs(2), ..HealthSettings::default() };
        assert_eq!(check(&probe, &s).await.0, Verdict::Pass, "Content-Length");
        assert_eq!(check(&probe, &s).await.0, Verdict::Pass, "chunked");
        assert_eq!(check(&probe, &s).await.0, Verdict::Fail(Cause::Status(503)), "503");
        drop(server.await.unwrap());
    }

    /// The whole response is read before the check closes: the server's own close comes
    /// first, so it never sees a reset (it did on most checks when only the status line
    /// was read).
    #[tokio::test]
    async fn a_check_reads_the_whole_response() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut c, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 1024];
            let _ = c.read(&mut req).await.unwrap();
            let body = vec![b'x'; 200_000];
            let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
            c.write_all(head.as_bytes()).await.unwrap();
            let wrote = c.write_all(&body).await.is_ok();
            c.shutdown().await.ok();
            // The checker's close after our FIN: an orderly end (0), not a reset (error).
            let mut rest = [0u8; 16];
            wrote && matches!(c.read(&mut rest).await, Ok(0))
        });
        let probe = Probe { addr, kind: ProbeKind::Http("/".into()), tls: None };
        let s = HealthSettings::default();
        assert_eq!(check(&probe, &s).await.0, Verdict::Pass);
        assert!(server.await.unwrap(), "the server's response was read whole and the connection closed in order");
    }

    /// A backend is checked on the port its requests go to: its own, else its farm's,
    /// else the VIP's `backend_port`; a farm's server no VIP lists is checked too.
    #[test]
    fn http_checks_go_to_the_port_requests_go_to() {
        let text = "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\n\
                    [[backend]]\nname = \"b\"\naddress = \"10.0.0.2\"\n[[backend]]\nname = \"c\"\naddress = \"10.0.0.3\"\n\
                    [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\nbackends = [\"a\"]\nbackend_port = 8080\n";
        let mut cfg = crate::config::Config::parse(text, "t").unwrap();
        let port = |cfg: &crate::config::Config, b: usize| probes(cfg)[b].as_ref().map(|p| p.addr.port());
        assert_eq!(port(&cfg, 0), Some(8080), "the implicit farm: the VIP's backend_port");
        assert_eq!(port(&cfg, 1), None, "in no VIP and no farm");
        cfg.farms.push(crate::config::Farm {
            name: "shop".into(),
            servers: vec![1],
            backup_servers: vec![2],
            port: Some(9080),
            implicit: false,
            ..cfg.farms[0].clone()
        });
        cfg.routes.push(crate::config::Route { farm: 1, ..cfg.routes[0].clone() });
        cfg.backends[2].port = Some(9081);
        assert_eq!((port(&cfg, 1), port(&cfg, 2)), (Some(9080), Some(9081)));
        assert!(matches!(probes(&cfg)[1].as_ref().unwrap().kind, ProbeKind::Http(_)));
    }

    #[test]
    fn transitions_follow_rise_and_fall() {
        let mut s = Streak::default();
        let mut h = Health::Up;
        h = next(h, false, &mut s, 2, 3);
        assert_eq!(h, Health::Suspect, "the first failure makes it suspect");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, Health::Up, "a passing check clears suspicion");
        for _ in 0..2 {
            h = next(h, false, &mut s, 2, 3);
            assert_eq!(h, Health::Suspect);
        }
        h = next(h, false, &mut s, 2, 3);
        assert_eq!(h, Health::Down, "fall consecutive failures");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, Health::Down, "one success is not enough to rise");
        h = next(h, false, &mut s, 2, 3);
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, Health::Down, "a flapping backend stays down");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, Health::Up, "rise consecutive successes");
    }

    /// A farm member is checked at the port its requests go to: its own, else its farm's,
    /// else the VIP's backend port.
    #[test]
    fn farm_members_are_checked_at_their_farms_port() {
        let text = "[dispatcher]\ninterface = \"eth0\"\n\n[[backend]]\nname = \"s1\"\naddress = \"10.0.1.1\"\n\n[[backend]]\nname = \"s2\"\naddress = \"10.0.1.2\"\nport = 9081\n\n[[backend]]\nname = \"s3\"\naddress = \"10.0.1.3\"\n\n[[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\nbackend_port = 8080\n\n[[farm]]\nname = \"f\"\nservers = [\"s1\", \"s2\"]\nport = 9080\n\n[[farm]]\nname = \"g\"\nservers = [\"s3\"]\n\n[[route]]\nhosts = [\"*\"]\nuris = [\"/a/*\"]\nfarm = \"f\"\n\n[[route]]\nhosts = [\"*\"]\nuris = [\"/*\"]\nfarm = \"g\"\n";
        let cfg = crate::config::Config::parse(text, "t").unwrap();
        let ports: Vec<Option<u16>> = probes(&cfg).iter().map(|p| p.as_ref().map(|p| p.addr.port())).collect();
        assert_eq!(ports, [Some(9080), Some(9081), Some(8080)]);
    }
}
