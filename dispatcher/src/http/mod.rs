//! The L7 path: where a request goes. `listener` accepts on each HTTP VIP, `proxy` runs
//! one client connection (head -> route -> upstream -> response) in phases: `attempt`
//! (one attempt on a backend, and how it failed), `respond` (the response), `answer`
//! (the proxy's own answers as a type); `session` reads JSESSIONID, `route` picks the
//! backend, `persist` keeps clients without a session on one backend by a cookie of its
//! own, `pool` keeps upstream connections, `hold` makes a request wait while its
//! session's owner is suspect, `retry` says what may be replayed, `tunnel` carries
//! upgraded connections. The HTTP/1.1 messages themselves (heads, bodies, the forwarded
//! heads, the bytes of an answer of our own, a connection's plain or TLS halves) are the
//! codec's (`http1`). `client` is the client side of one request as the phases see it:
//! an HTTP/1.x connection or an HTTP/2 stream; `h2` serves HTTP/2 clients, each stream
//! one request that `proxy` serves like any other.

pub mod answer;
pub mod attempt;
pub mod client;
pub mod h2;
pub mod hold;
pub mod listener;
pub mod persist;
pub mod pool;
pub mod proxy;
pub mod respond;
pub mod retry;
pub mod route;
pub mod session;
pub mod tunnel;

/// The HTTP a client connection speaks (the access log's protocol, the `protocol`
/// label: `metrics::PROTOCOLS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    H1 = 0,
    H2 = 1,
}

/// Decrements a gauge when dropped.
pub(crate) struct Counted<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
