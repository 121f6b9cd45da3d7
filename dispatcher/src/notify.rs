//! The service manager's notification protocol (systemd's `sd_notify`, `Type=notify`): a
//! datagram of `KEY=VALUE` lines to the socket named by `NOTIFY_SOCKET`.
//!
//! - `READY=1` once the agent serves: program attached, maps filled, HTTP listeners and
//!   the admin socket bound;
//! - `RELOADING=1` then `READY=1` around a reload (with `STATUS=` saying how it went);
//! - `STOPPING=1` when it begins to stop;
//! - `WATCHDOG=1` from the agent's control loop, at half the interval the manager asks
//!   for (`WATCHDOG_USEC`, for this process if `WATCHDOG_PID` says so): a loop that
//!   hangs stops the pings and the manager restarts the service.
//!
//! Without `NOTIFY_SOCKET` every call does nothing.

use std::{os::unix::net::UnixDatagram, time::Duration};

pub struct Notifier {
    target: Option<std::os::unix::net::SocketAddr>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From the environment the service manager set (`NOTIFY_SOCKET`, `WATCHDOG_USEC`,
    /// `WATCHDOG_PID`). A path starting with `@` is an abstract socket.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|s| {
            let s = s.to_string_lossy().into_owned();
            match s.strip_prefix('@') {
                Some(name) => {
                    use std::os::linux::net::SocketAddrExt;
                    std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).ok()
                }
                None => std::os::unix::net::SocketAddr::from_pathname(&s).ok(),
            }
        });
        let for_us = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
            .is_none_or(|p| p == std::process::id());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|&u| u > 0 && for_us && target.is_some())
            .map(Duration::from_micros);
        Notifier { target, watchdog }
    }

    /// Sends `state` (newline-separated `KEY=VALUE` lines); a failure is logged, never
    /// fatal (the manager may be gone).
    pub fn send(&self, state: &str) {
        let Some(target) = &self.target else { return };
        let sent = UnixDatagram::unbound().and_then(|s| s.send_to_addr(state.as_bytes(), target));
        if let Err(e) = sent {
            crate::ratelimit::warn("notifying the service manager", &e);
        }
    }

    /// How often the control loop pings: half the manager's watchdog interval.
    pub fn watchdog_every(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }
}
