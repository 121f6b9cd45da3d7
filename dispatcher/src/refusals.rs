//! The last requests the dispatcher refused as malformed or hostile (HAProxy's `show
//! errors`): a bounded ring, filled where a refusal is decided (the HTTP/1.1 head parser
//! and its deadlines, a request body's framing, the HTTP/2 translator) and read by
//! `GET /errors` and `dispatcher errors`. Only the refusal path pays for it (one lock, one
//! copy of at most `CAPTURE` bytes); a good request never touches it. Its memory is
//! bounded: `KEPT` entries of at most `CAPTURE` bytes each. It holds client data:
//! operators only.

use std::{
    collections::VecDeque,
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex,
    },
    time::SystemTime,
};

use crate::api::{ErrorsReply, RefusedRequest};

/// How many refused requests are kept (the oldest goes first).
pub const KEPT: usize = 32;
/// How much of each is kept: the start of what arrived.
pub const CAPTURE: usize = 1024;

struct Entry {
    at: SystemTime,
    vip: std::sync::Arc<str>,
    client: SocketAddr,
    protocol: &'static str,
    status: u16,
    reason: &'static str,
    /// The first `CAPTURE` bytes of what arrived.
    bytes: Box<[u8]>,
    /// How many bytes had arrived.
    received: usize,
}

/// The ring (shared by a reload's generations, like the other request-path totals).
#[derive(Default)]
pub struct Refusals {
    ring: Mutex<VecDeque<Entry>>,
    /// Refusals since the agent started (kept or not).
    total: AtomicU64,
}

/// One refusal: where, from whom, how it was answered, why, and what arrived.
pub struct Refused<'a> {
    pub vip: &'a std::sync::Arc<str>,
    pub client: SocketAddr,
    /// `h1`, `h2`.
    pub protocol: &'static str,
    pub status: u16,
    pub reason: &'static str,
    pub bytes: &'a [u8],
}

impl Refusals {
    pub fn record(&self, r: Refused<'_>) {
        self.total.fetch_add(1, Ordering::Relaxed);
        let e = Entry {
            at: SystemTime::now(),
            vip: r.vip.clone(),
            client: r.client,
            protocol: r.protocol,
            status: r.status,
            reason: r.reason,
            bytes: r.bytes[..r.bytes.len().min(CAPTURE)].into(),
            received: r.bytes.len(),
        };
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        if ring.len() >= KEPT {
            ring.pop_front();
        }
        ring.push_back(e);
    }

    /// What `GET /errors` answers: oldest first.
    pub fn reply(&self) -> ErrorsReply {
        let ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let errors = ring
            .iter()
            .map(|e| {
                let mut at = String::new();
                crate::access_log::rfc3339(&mut at, e.at);
                RefusedRequest {
                    at,
                    vip: e.vip.to_string(),
                    client: e.client.to_string(),
                    protocol: e.protocol.into(),
                    status: e.status,
                    reason: e.reason.into(),
                    position: position(&e.bytes),
                    received: e.received,
                    captured: e.bytes.len(),
                    bytes: escape(&e.bytes),
                }
            })
            .collect();
        ErrorsReply { total: self.total.load(Ordering::Relaxed), kept: KEPT, errors }
    }
}

/// Printable ASCII as it is; every other byte, and the backslash, as `\xNN`.
pub fn escape(bytes: &[u8]) -> String {
    let mut o = String::with_capacity(bytes.len());
    for &b in bytes {
        if b.is_ascii_graphic() && b != b'\\' || b == b' ' {
            o.push(b as char);
        } else {
            o.push_str(&format!("\\x{b:02x}"));
        }
    }
    o
}

/// Where a head holds a byte no head may hold, when one does: a control other than a
/// tab or a CR before its LF (NUL, a bare CR, a bare LF...), or a byte above 0x7e.
pub fn position(bytes: &[u8]) -> Option<usize> {
    bytes.iter().enumerate().position(|(i, &b)| match b {
        b'\t' => false,
        b'\r' => bytes.get(i + 1).is_some_and(|&n| n != b'\n'),
        b'\n' => i == 0 || bytes[i - 1] != b'\r',
        0..=0x1f | 0x7f.. => true,
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(r: &Refusals, n: u16, bytes: &[u8]) {
        let vip: std::sync::Arc<str> = "app".into();
        let client = "10.0.0.2:40000".parse().unwrap();
        r.record(Refused { vip: &vip, client, protocol: "h1", status: n, reason: "bad", bytes });
    }

    #[test]
    fn the_ring_keeps_the_last_ones_and_a_bounded_capture() {
        let r = Refusals::default();
        for i in 0..100u16 {
            refused(&r, 400 + i, b"GET / HTTP/1.1\n");
        }
        let big = vec![b'a'; 5000];
        refused(&r, 431, &big);
        let got = r.reply();
        assert_eq!(got.total, 101);
        assert_eq!(got.errors.len(), KEPT, "bounded");
        assert_eq!(got.errors[0].status, 400 + 100 - KEPT as u16 + 1, "the oldest went first");
        let last = got.errors.last().unwrap();
        assert_eq!((last.status, last.received, last.captured, last.bytes.len()), (431, 5000, CAPTURE, CAPTURE));
        assert_eq!((last.vip.as_str(), last.client.as_str(), last.reason.as_str()), ("app", "10.0.0.2:40000", "bad"));
    }

    #[test]
    fn bytes_are_escaped_and_the_bad_one_is_found() {
        assert_eq!(
            escape(b"GET / HTTP/1.1\r\nX: a\0b\\\xff\r\n"),
            "GET / HTTP/1.1\\x0d\\x0aX: a\\x00b\\x5c\\xff\\x0d\\x0a"
        );
        assert_eq!(position(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), None);
        assert_eq!(position(b"GET / HTTP/1.1\nHost: x\n\n"), Some(14), "bare LF");
        assert_eq!(position(b"GET / HTTP/1.1\r\nX: a\0b\r\n"), Some(20), "NUL");
        assert_eq!(position(b"GET / HTTP/1.1\r\nX: a\rb\r\n"), Some(20), "bare CR");
        assert_eq!(position(b"GET / HTTP/1.1\r\nX\x80Y: v\r\n"), Some(17), "non-ASCII");
        assert_eq!(position(b"\nGET"), Some(0));
        assert_eq!(position(b"GET / HTTP/1.1\r\nX:\ta\r\n"), None, "a tab is allowed");
    }
}
