//! The L7 path: where a request goes. `listener` accepts on each HTTP VIP, `proxy` runs
//! one client connection (head -> route -> upstream -> response) in phases: `attempt`
//! (one attempt on a backend and how it failed), `respond` (the response), `answer` (the
//! proxy's own answers); `head` and `body` are
//! the HTTP/1.1 message handling, `rewrite` builds the forwarded heads, `session` reads JSESSIONID, `route` picks the
//! backend,
//! `persist` keeps clients without a session on one backend by a cookie of its own,
//! `pool` keeps upstream connections, `sources` limits the client connections per source address, `queue` bounds the requests in flight per backend
//! (`maxconn`) and queues the rest, `hold` makes a request wait while its session's
//! owner is suspect, `retry` says what may be replayed, `tunnel` carries upgraded
//! connections, `io` is a connection's two halves (plain TCP or TLS, see `crate::tls`).

pub mod answer;
pub mod attempt;
pub mod body;
pub mod head;
pub mod hold;
pub mod listener;
pub mod persist;
pub mod pool;
pub mod proxy;
pub mod respond;
pub mod retry;
pub mod rewrite;
pub mod route;
pub mod session;
pub mod tunnel;

/// A deterministic xorshift generator for the randomized (split-invariance) tests.
#[cfg(test)]
pub(crate) fn xorshift(mut seed: u64) -> impl FnMut() -> u64 {
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    }
}

/// Decrements a gauge when dropped.
pub(crate) struct Counted<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
