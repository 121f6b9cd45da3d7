//! The frames of one HTTP/2 connection as they pass through its socket, read by their
//! 9-byte headers only (the `h2` crate decodes them): what clients send that costs work
//! and carries no request — SETTINGS, PING, PRIORITY, RST_STREAM, empty DATA and
//! CONTINUATION frames, WINDOW_UPDATEs beyond what the data sent explains (two per DATA
//! frame: the stream's and the connection's, however small the client's windows) — is charged
//! to per-connection budgets, and every RST_STREAM either way is counted by its error
//! code. A budget spent raises the connection's alarm: the connection loop answers with
//! GOAWAY (ENHANCE_YOUR_CALM) and reads nothing more of it.

use std::{
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU8, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::Instant,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    sync::Notify,
};

use super::GoAway;
use crate::{config::H2Settings, metrics::Counters};

/// The client connection preface (RFC 9113 3.4), before its first frame.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PRIORITY: u8 = 0x2;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// WINDOW_UPDATEs a client may send for free per DATA frame it was sent: one for the
/// stream, one for the connection (a client with small windows reopens them after every
/// frame; more than that is no reader's need).
const FREE_UPDATES_PER_FRAME: u64 = 2;
/// The most free WINDOW_UPDATEs saved up.
const MAX_FREE_UPDATES: u64 = 4096;

/// One frame's header, and the error code of a RST_STREAM or GOAWAY.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: u8,
    pub flags: u8,
    pub len: u32,
    pub code: Option<u32>,
}

/// Frame headers out of a byte stream, however it is cut into reads or writes.
#[derive(Debug, Default)]
pub struct Scan {
    /// Bytes to pass over: a preface, or the rest of a frame's payload.
    skip: usize,
    head: [u8; 9],
    have: usize,
    /// The payload bytes kept (RST_STREAM: its code; GOAWAY: last stream and code).
    kept: [u8; 8],
    want: usize,
    got: usize,
    frame: Option<Frame>,
}

impl Scan {
    /// A scanner of the client's side: the connection preface first.
    pub fn after_preface() -> Scan {
        Scan { skip: PREFACE.len(), ..Default::default() }
    }

    /// Each complete frame header in `buf` (with its code, for RST_STREAM and GOAWAY).
    pub fn feed(&mut self, mut buf: &[u8], mut on: impl FnMut(Frame)) {
        while !buf.is_empty() {
            if let Some(mut f) = self.frame {
                let take = (self.want - self.got).min(buf.len());
                self.kept[self.got..self.got + take].copy_from_slice(&buf[..take]);
                self.got += take;
                buf = &buf[take..];
                if self.got < self.want {
                    return;
                }
                let at = if f.kind == GOAWAY { 4 } else { 0 };
                if self.got >= at + 4 {
                    f.code = Some(u32::from_be_bytes(self.kept[at..at + 4].try_into().unwrap()));
                }
                on(f);
                self.frame = None;
                continue;
            }
            if self.skip > 0 {
                let take = self.skip.min(buf.len());
                self.skip -= take;
                buf = &buf[take..];
                continue;
            }
            let take = (9 - self.have).min(buf.len());
            self.head[self.have..self.have + take].copy_from_slice(&buf[..take]);
            self.have += take;
            buf = &buf[take..];
            if self.have < 9 {
                return;
            }
            self.have = 0;
            let h = &self.head;
            let len = u32::from_be_bytes([0, h[0], h[1], h[2]]);
            let f = Frame { kind: h[3], flags: h[4], len, code: None };
            let want = match f.kind {
                RST_STREAM => 4,
                GOAWAY => 8,
                _ => 0,
            }
            .min(len as usize);
            (self.want, self.got) = (want, 0);
            self.skip = len as usize - want;
            if want == 0 {
                on(f);
            } else {
                self.frame = Some(f);
            }
        }
    }
}

/// A token bucket: `rate` per second, up to twice that saved.
#[derive(Debug)]
pub struct Bucket {
    tokens: f64,
    rate: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(rate: u32) -> Bucket {
        Bucket { tokens: 2.0 * rate as f64, rate: rate as f64, last: Instant::now() }
    }

    /// Takes a token; `false` when none is left.
    pub fn take(&mut self) -> bool {
        let now = Instant::now();
        let refill = now.saturating_duration_since(self.last).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + refill).min(2.0 * self.rate);
        self.last = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// A connection's alarm: the first bound a client broke, and the connection loop woken.
pub struct Alarm {
    why: AtomicU8,
    pub notify: Notify,
}

impl Alarm {
    const NONE: u8 = u8::MAX;

    pub fn new() -> Arc<Alarm> {
        Arc::new(Alarm { why: AtomicU8::new(Self::NONE), notify: Notify::new() })
    }

    pub fn raise(&self, why: GoAway) {
        if self.why.compare_exchange(Self::NONE, why as u8, Ordering::AcqRel, Ordering::Acquire).is_ok() {
            self.notify.notify_one();
        }
    }

    pub fn raised(&self) -> Option<GoAway> {
        GoAway::from_index(self.why.load(Ordering::Acquire))
    }
}

/// What a client's frames have cost so far.
struct Budgets {
    control: Bucket,
    resets: Bucket,
    /// WINDOW_UPDATEs the data sent explains, not yet used.
    free_updates: u64,
}

impl Budgets {
    /// Charges an incoming frame; the bound it broke, if any.
    fn charge(&mut self, f: Frame) -> Option<GoAway> {
        let control = match f.kind {
            RST_STREAM => {
                if !self.resets.take() {
                    return Some(GoAway::RapidReset);
                }
                true
            }
            // A PING ACK costs as a PING: the dispatcher sends no PING of its own, and the
            // codec logs every unexpected ACK.
            PING => true,
            SETTINGS => f.flags & ACK == 0,
            PRIORITY => true,
            WINDOW_UPDATE if self.free_updates > 0 => {
                self.free_updates -= 1;
                false
            }
            WINDOW_UPDATE => true,
            DATA => f.len == 0 && f.flags & END_STREAM == 0,
            HEADERS | CONTINUATION => f.len == 0 && f.flags & (END_HEADERS | END_STREAM) == 0,
            _ => false,
        };
        (control && !self.control.take()).then_some(GoAway::ControlFlood)
    }

    fn sent_data(&mut self, len: u32) {
        if len > 0 {
            self.free_updates = (self.free_updates + FREE_UPDATES_PER_FRAME).min(MAX_FREE_UPDATES);
        }
    }
}

/// The connection's socket with its frames metered both ways.
pub struct Metered<T> {
    io: T,
    inbound: Scan,
    outbound: Scan,
    budgets: Budgets,
    alarm: Arc<Alarm>,
    counters: Arc<Counters>,
}

impl<T> Metered<T> {
    pub fn new(io: T, s: &H2Settings, alarm: Arc<Alarm>, counters: Arc<Counters>) -> Self {
        let budgets = Budgets {
            control: Bucket::new(s.max_control_frames_per_second),
            resets: Bucket::new(s.max_resets_per_second),
            // The updates a client sends right after its SETTINGS (curl, browsers).
            free_updates: 4,
        };
        Metered { io, inbound: Scan::after_preface(), outbound: Scan::default(), budgets, alarm, counters }
    }
}

/// The index of an error code in `metrics::H2_ERRORS`.
pub fn error_index(code: u32) -> usize {
    (code as usize).min(crate::metrics::H2_ERRORS.len() - 1)
}

impl<T: AsyncRead + Unpin> AsyncRead for Metered<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let me = self.get_mut();
        if me.alarm.raised().is_some() {
            // Nothing more of a client that broke a bound: the GOAWAY goes out, its
            // frames are not read (the connection loop closes it).
            return Poll::Pending;
        }
        let before = buf.filled().len();
        let r = Pin::new(&mut me.io).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = r {
            let (budgets, alarm, counters) = (&mut me.budgets, &me.alarm, &me.counters);
            me.inbound.feed(&buf.filled()[before..], |f| {
                if f.kind == RST_STREAM {
                    let code = error_index(f.code.unwrap_or(u32::MAX));
                    counters.h2_resets_received[code].fetch_add(1, Ordering::Relaxed);
                }
                if let Some(why) = budgets.charge(f) {
                    alarm.raise(why);
                }
            });
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Metered<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let me = self.get_mut();
        let r = Pin::new(&mut me.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            me.wrote(&buf[..n]);
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl<T> Metered<T> {
    fn wrote(&mut self, bytes: &[u8]) {
        let (budgets, counters) = (&mut self.budgets, &self.counters);
        self.outbound.feed(bytes, |f| match f.kind {
            DATA => budgets.sent_data(f.len),
            RST_STREAM => {
                let code = error_index(f.code.unwrap_or(u32::MAX));
                counters.h2_resets_sent[code].fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = len.to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags, 0, 0, 0, 1]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_are_found_however_the_stream_is_cut() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(SETTINGS, 0, &[0; 6]));
        bytes.extend(frame(DATA, END_STREAM, &[7; 100]));
        bytes.extend(frame(RST_STREAM, 0, &8u32.to_be_bytes()));
        bytes.extend(frame(GOAWAY, 0, &[0, 0, 0, 3, 0, 0, 0, 11, 1, 2]));
        bytes.extend(frame(PING, ACK, &[0; 8]));
        let want = vec![
            Frame { kind: SETTINGS, flags: 0, len: 6, code: None },
            Frame { kind: DATA, flags: END_STREAM, len: 100, code: None },
            Frame { kind: RST_STREAM, flags: 0, len: 4, code: Some(8) },
            Frame { kind: GOAWAY, flags: 0, len: 10, code: Some(11) },
            Frame { kind: PING, flags: ACK, len: 8, code: None },
        ];
        for cut in [1, 2, 3, 5, 9, 10, 64, bytes.len()] {
            let mut scan = Scan::after_preface();
            let mut got = Vec::new();
            for piece in bytes.chunks(cut) {
                scan.feed(piece, |f| got.push(f));
            }
            assert_eq!(got, want, "cut into pieces of {cut}");
        }
    }

    #[test]
    fn a_short_reset_frame_is_seen_without_a_code() {
        let mut scan = Scan::default();
        let mut got = Vec::new();
        scan.feed(&frame(RST_STREAM, 0, &[0, 1]), |f| got.push(f));
        scan.feed(&frame(PING, 0, &[0; 8]), |f| got.push(f));
        assert_eq!(got[0], Frame { kind: RST_STREAM, flags: 0, len: 2, code: None });
        assert_eq!(got[1].kind, PING);
    }

    fn budgets(control: u32, resets: u32) -> Budgets {
        Budgets { control: Bucket::new(control), resets: Bucket::new(resets), free_updates: 0 }
    }

    #[test]
    fn control_frames_past_the_burst_break_the_bound_and_only_settings_acks_cost_nothing() {
        let mut b = budgets(10, 10);
        let ping = Frame { kind: PING, flags: 0, len: 8, code: None };
        let settings_ack = Frame { kind: SETTINGS, flags: ACK, len: 0, code: None };
        for _ in 0..1000 {
            assert_eq!(b.charge(settings_ack), None);
        }
        // A burst of twice the rate, then the bound.
        let broke = (0..100).position(|_| b.charge(ping).is_some());
        assert_eq!(broke, Some(20));
        // Unsolicited PING ACKs (the dispatcher sends no PING) cost as PINGs.
        let mut b = budgets(10, 10);
        let ping_ack = Frame { kind: PING, flags: ACK, len: 8, code: None };
        assert_eq!((0..100).position(|_| b.charge(ping_ack).is_some()), Some(20));
    }

    #[test]
    fn resets_have_their_own_budget_and_data_earns_window_updates() {
        let mut b = budgets(1_000_000, 5);
        let rst = Frame { kind: RST_STREAM, flags: 0, len: 4, code: Some(8) };
        assert_eq!((0..20).position(|_| b.charge(rst).is_some()), Some(10));
        assert_eq!(b.charge(rst), Some(GoAway::RapidReset));

        // A client with 4 KiB windows reopens both after every DATA frame: free.
        let mut b = budgets(1, 1);
        let update = Frame { kind: WINDOW_UPDATE, flags: 0, len: 4, code: None };
        for _ in 0..10_000 {
            b.sent_data(4096);
            assert_eq!(b.charge(update), None);
            assert_eq!(b.charge(update), None);
        }
        b.sent_data(0);
        // Past what the data explains: charged (a burst of 2 at a rate of 1).
        assert_eq!((0..5).position(|_| b.charge(update).is_some()), Some(2));
    }

    #[test]
    fn empty_frames_without_an_end_are_control_frames() {
        let mut b = budgets(1, 1_000);
        let empty = Frame { kind: DATA, flags: 0, len: 0, code: None };
        let last = Frame { kind: DATA, flags: END_STREAM, len: 0, code: None };
        let cont = Frame { kind: CONTINUATION, flags: 0, len: 0, code: None };
        assert_eq!(b.charge(last), None);
        assert_eq!(b.charge(empty), None);
        assert_eq!(b.charge(cont), None);
        assert_eq!(b.charge(empty), Some(GoAway::ControlFlood));
    }
}
