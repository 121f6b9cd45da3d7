//! The HTTP/1.1 codec: messages as bytes on a connection, with no knowledge of where a
//! request goes. It depends on nothing else in the crate; the proxy (`http`), the health
//! checks (`health`), TLS termination (`tls`) and the admin endpoint (`admin`) all speak
//! HTTP through it.
//!
//! `head` parses request and response heads (httparse plus the RFC 9112 checks, with
//! `HeadLimits`), `body` reads and relays bodies (Content-Length, chunked, until close)
//! under read and write deadlines, `rewrite` builds the heads as a proxy forwards them
//! (hop-by-hop fields, `X-Forwarded-*`, this process's `Via` marker), `answer` is the
//! answers of our own (reason phrases, the closing error answer, bounded client writes),
//! `io` is a connection's two halves (plain TCP or TLS) and the socket-level rules.

pub mod answer;
pub mod body;
pub mod head;
pub mod io;
pub mod rewrite;

pub use answer::{closing_answer, send_error, write_client, ERROR_WRITE_DEADLINE};

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
