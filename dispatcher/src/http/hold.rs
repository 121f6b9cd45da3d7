//! Holding: a request for a session whose owner is suspect waits — no backend connection
//! held, bounded in time (`hold_time`) and in number (`max_held`), reading at most
//! `HOLD_READ_LIMIT` more of what the client sends — until the owner's state changes.

use std::{sync::atomic::Ordering, time::Instant};

use tokio::io::AsyncRead;

use super::{proxy::VipCtx, Counted};
use crate::http1::body::{Inbound, RelayError};

/// Bytes buffered from a client whose request is held.
const HOLD_READ_LIMIT: usize = 64 * 1024;

/// Records how long a hold lasted, however it ended (including the client leaving).
struct HoldTimer<'a>(&'a crate::metrics::Histogram, Instant);

impl Drop for HoldTimer<'_> {
    fn drop(&mut self) {
        self.0.record(self.1.elapsed());
    }
}

pub enum HoldEnd {
    /// The backend's state changed: route again.
    Changed,
    /// The hold time is over.
    Expired,
    /// Too many requests are held already.
    Full,
    ClientGone,
}

/// Waits (no polling, no backend connection held) until backend `b` changes state, the
/// deadline passes, or the client goes away.
pub async fn hold<R: AsyncRead + Unpin>(ctx: &VipCtx, b: usize, client: &mut Inbound<R>, deadline: Instant) -> HoldEnd {
    let be = &ctx.servers.backends[b];
    wait_for(ctx, &be.changed, || be.state() != dispatcher_common::BackendState::Suspect, client, deadline).await
}

/// `[cluster]`: waits until the clone table gains an entry (the session's clone ID may be
/// on its way from the dispatcher that learned it), the deadline passes, or the client
/// goes away. Counted and bounded as a hold.
pub async fn await_shared<R: AsyncRead + Unpin>(ctx: &VipCtx, client: &mut Inbound<R>, deadline: Instant) -> HoldEnd {
    let mut first = true;
    // Ready on the first wake-up: the caller routes again and comes back if still unknown.
    wait_for(ctx, &ctx.servers.clones_changed, || !std::mem::replace(&mut first, false), client, deadline).await
}

/// The wait both share: `ready` is asked before every sleep (the notification is armed
/// first, so no wake-up between the two is lost).
async fn wait_for<R: AsyncRead + Unpin>(
    ctx: &VipCtx,
    notify: &tokio::sync::Notify,
    mut ready: impl FnMut() -> bool,
    client: &mut Inbound<R>,
    deadline: Instant,
) -> HoldEnd {
    let c = &ctx.servers;
    if c.counters.held_now.fetch_add(1, Ordering::SeqCst) >= ctx.settings.max_held as u64 {
        c.counters.held_now.fetch_sub(1, Ordering::SeqCst);
        c.counters.hold_refused.fetch_add(1, Ordering::Relaxed);
        return HoldEnd::Full;
    }
    let _held = Counted(&c.counters.held_now);
    let _timer = HoldTimer(&c.hold_time, Instant::now());
    loop {
        let notified = notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if ready() {
            return HoldEnd::Changed;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return HoldEnd::Expired;
        }
        // While held, at most this much of what the client sends next (its body, a
        // pipelined request) is buffered; beyond it, nothing more is read.
        let room = client.buf.len() < HOLD_READ_LIMIT;
        tokio::select! {
            _ = &mut notified => return HoldEnd::Changed,
            _ = tokio::time::sleep(left) => return HoldEnd::Expired,
            r = client.fill(left), if room => match r {
                // More bytes (a body, a pipelined request) stay buffered; keep waiting.
                Ok(n) if n > 0 => {}
                Err(RelayError::Timeout) => return HoldEnd::Expired,
                _ => return HoldEnd::ClientGone,
            },
        }
    }
}
