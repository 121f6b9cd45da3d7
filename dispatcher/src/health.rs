//! Active health checks and the health state machine.
//!
//! up --(one failure: a check or a failed request)--> suspect --(`fall` failed checks)--> down
//! suspect --(a passing check)--> up;  down --(`rise` passing checks)--> up
//!
//! Suspect means "ownership unknown": its sessions are held, not sent elsewhere, until a
//! check confirms it down (then its replica serves them) or clears it.

use std::net::SocketAddr;

use dispatcher_common::{STATE_DOWN, STATE_SUSPECT, STATE_UP};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

use crate::config::{CheckKind, Config, HealthSettings, Protocol, VipMode};

/// What to check for one backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Probe {
    pub addr: SocketAddr,
    /// `Some(path)`: HTTP GET; `None`: TCP connect.
    pub http_path: Option<String>,
}

/// The probe for each backend: by default (`kind = "auto"`) HTTP on the backend port of
/// its first HTTP VIP, else a TCP connect to its first TCP VIP's port; `kind` and `port`
/// override. A backend that serves only UDP VIPs is not checked.
pub fn probes(cfg: &Config) -> Vec<Option<Probe>> {
    let h = &cfg.health;
    (0..cfg.backends.len())
        .map(|b| {
            if !h.enabled || cfg.backends[b].retired {
                return None;
            }
            let vips: Vec<_> = cfg.vips.iter().filter(|v| !v.retired && v.backends.contains(&b)).collect();
            let http_vip = vips.iter().find(|v| v.mode == VipMode::Http);
            let tcp_vip = vips.iter().find(|v| v.protocol == Protocol::Tcp);
            let (port, speaks_http) = match (http_vip, tcp_vip) {
                (Some(v), _) => (v.backend_port, true),
                (None, Some(v)) => (v.port, false),
                (None, None) => return None,
            };
            let http = match h.kind {
                CheckKind::Auto => speaks_http,
                CheckKind::Http => true,
                CheckKind::Tcp => false,
            };
            let port = h.port.unwrap_or(port);
            Some(Probe {
                addr: SocketAddr::new(cfg.backends[b].address.into(), port),
                http_path: http.then(|| h.path.clone()),
            })
        })
        .collect()
}

/// What one check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Fail,
    /// The check could not be made for a reason of this host's (out of descriptors,
    /// ports, buffers): it says nothing about the backend and changes nothing.
    Local,
}

/// Runs one check.
pub async fn check(p: &Probe, s: &HealthSettings) -> Verdict {
    let attempt = async {
        let mut stream = match TcpStream::connect(p.addr).await {
            Ok(st) => st,
            Err(e) if e.raw_os_error().is_some_and(crate::http::pool::is_local_errno) => {
                crate::ratelimit::warn("health check connect", &e);
                return Verdict::Local;
            }
            Err(_) => return Verdict::Fail,
        };
        let Some(path) = &p.http_path else { return Verdict::Pass };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: dispatcher-health\r\nConnection: close\r\n\r\n",
            p.addr
        );
        if stream.write_all(req.as_bytes()).await.is_err() {
            return Verdict::Fail;
        }
        // The status line is in the first bytes; the rest is read and discarded until the
        // server closes (bounded by the check's timeout).
        let mut head = [0u8; 64];
        let mut got = 0;
        let mut sink = [0u8; 4096];
        loop {
            let read =
                if got < head.len() { stream.read(&mut head[got..]).await } else { stream.read(&mut sink).await };
            match read {
                Ok(0) => break,
                Ok(n) if got < head.len() => got += n,
                Ok(_) => {}
                Err(_) if got > 0 => break,
                Err(_) => return Verdict::Fail,
            }
        }
        match status_of(&head[..got]) {
            Some(status) if status == s.expect_status => Verdict::Pass,
            _ => Verdict::Fail,
        }
    };
    tokio::time::timeout(s.timeout, attempt).await.unwrap_or(Verdict::Fail)
}

/// The status code of an `HTTP/1.x NNN ...` status line.
fn status_of(response: &[u8]) -> Option<u16> {
    let rest = response.strip_prefix(b"HTTP/1.")?;
    let code = rest.get(2..5)?;
    if rest.get(1) != Some(&b' ') || !code.iter().all(u8::is_ascii_digit) || rest.get(5).is_some_and(|&b| b != b' ') {
        return None;
    }
    std::str::from_utf8(code).ok()?.parse().ok()
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
pub fn next(health: u8, passed: bool, streak: &mut Streak, rise: u32, fall: u32) -> u8 {
    if passed {
        streak.ok += 1;
        streak.fail = 0;
        match health {
            STATE_DOWN if streak.ok < rise => STATE_DOWN,
            _ => STATE_UP,
        }
    } else {
        streak.fail += 1;
        streak.ok = 0;
        if streak.fail >= fall || health == STATE_DOWN {
            STATE_DOWN
        } else {
            STATE_SUSPECT
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines() {
        assert_eq!(status_of(b"HTTP/1.1 200 OK\r\n\r\n"), Some(200));
        assert_eq!(status_of(b"HTTP/1.0 503 x"), Some(503));
        assert_eq!(status_of(b"HTTP/1.1 2000"), None);
        assert_eq!(status_of(b"HTTP/1.1  200"), None);
        assert_eq!(status_of(b"HTTP/2 200"), None);
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
        let probe = Probe { addr, http_path: Some("/".into()) };
        let s = HealthSettings::default();
        assert_eq!(check(&probe, &s).await, Verdict::Pass);
        assert!(server.await.unwrap(), "the server's response was read whole and the connection closed in order");
    }

    #[test]
    fn transitions_follow_rise_and_fall() {
        let mut s = Streak::default();
        let mut h = STATE_UP;
        h = next(h, false, &mut s, 2, 3);
        assert_eq!(h, STATE_SUSPECT, "the first failure makes it suspect");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, STATE_UP, "a passing check clears suspicion");
        for _ in 0..2 {
            h = next(h, false, &mut s, 2, 3);
            assert_eq!(h, STATE_SUSPECT);
        }
        h = next(h, false, &mut s, 2, 3);
        assert_eq!(h, STATE_DOWN, "fall consecutive failures");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, STATE_DOWN, "one success is not enough to rise");
        h = next(h, false, &mut s, 2, 3);
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, STATE_DOWN, "a flapping backend stays down");
        h = next(h, true, &mut s, 2, 3);
        assert_eq!(h, STATE_UP, "rise consecutive successes");
    }
}
