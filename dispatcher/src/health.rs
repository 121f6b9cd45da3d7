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

/// Runs one check; `true` when it passed.
pub async fn check(p: &Probe, s: &HealthSettings) -> bool {
    let attempt = async {
        let mut stream = TcpStream::connect(p.addr).await.ok()?;
        let Some(path) = &p.http_path else { return Some(true) };
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: dispatcher-health\r\nConnection: close\r\n\r\n",
            p.addr
        );
        stream.write_all(req.as_bytes()).await.ok()?;
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < 12 {
            let n = stream.read(&mut buf[got..]).await.ok()?;
            if n == 0 {
                break;
            }
            got += n;
        }
        let line = std::str::from_utf8(&buf[..got]).ok()?;
        let status: u16 = line.strip_prefix("HTTP/1.")?.get(2..5)?.parse().ok()?;
        Some(status == s.expect_status)
    };
    matches!(tokio::time::timeout(s.timeout, attempt).await, Ok(Some(true)))
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
