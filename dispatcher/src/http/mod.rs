//! The L7 path: where a request goes. `listener` accepts on each HTTP VIP, `proxy` runs
//! one client connection (head -> route -> upstream -> response), `head` and `body` are
//! the HTTP/1.1 message handling, `rewrite` builds the forwarded heads, `session` reads JSESSIONID, `route` picks the
//! backend,
//! `pool` keeps upstream connections.

pub mod body;
pub mod head;
pub mod listener;
pub mod pool;
pub mod proxy;
pub mod rewrite;
pub mod route;
pub mod session;

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
