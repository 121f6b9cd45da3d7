//! HTTP/2 from clients (RFC 9113), by ALPN `h2` on HTTPS VIPs or by prior knowledge on
//! `h2c` VIPs, with the `h2` crate as the codec. Each stream is one request: its head
//! written once as the HTTP/1.1 head that goes upstream and checked as every request
//! head is (`translate`), then served by the proxy's own phases with the stream as its
//! client side (`stream`, `http::client`), so that a stream is routed, held, retried,
//! queued, learned from and logged exactly as an HTTP/1.1 request is, and goes upstream
//! over the same HTTP/1.1 pools. Streams of one connection are independent: each carries its
//! own session and may reach its own clone.
//!
//! The bounds (`[http] h2_*`, `max_header_bytes`): streams open at once
//! (SETTINGS_MAX_CONCURRENT_STREAMS, the `h2` crate refuses the excess), the decoded
//! header list (SETTINGS_MAX_HEADER_LIST_SIZE: HPACK bombs and CONTINUATION floods end
//! there, in the crate), streams reset by the client per second (rapid reset,
//! CVE-2023-44487) and control frames per second (SETTINGS, PING, PRIORITY, empty
//! frames, needless WINDOW_UPDATEs: `frames`), each broken bound answered with GOAWAY
//! and counted; a response is sent as the client's window allows, and a window that
//! stays shut for `client_timeout` resets the stream; a connection without streams for
//! `client_idle_timeout` gets a graceful GOAWAY, as do all on stop, reload and leave.

mod frames;
pub mod stream;
mod translate;

pub use stream::{body_at_hand, copied, respond};
pub use translate::response_fields;

use std::{
    future::Future,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use h2::Reason;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    sync::watch,
};
use tracing::Instrument as _;

use super::{proxy::VipCtx, Counted};
use frames::{Alarm, Metered, PREFACE};

/// Where a client connection is: its address and its slot in the dispatchers'
/// ownership table.
#[derive(Clone, Copy, Debug)]
pub struct At {
    pub peer: SocketAddr,
    pub steer_slot: usize,
}

/// Why the dispatcher ended an HTTP/2 connection with GOAWAY (the `reason` label:
/// `metrics::H2_GOAWAY_REASONS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoAway {
    /// The listener stopped (stop, reload): graceful.
    Stop = 0,
    /// Its slot belongs to another dispatcher now, or this one leaves: graceful.
    Leave = 1,
    /// No stream for `client_idle_timeout`: graceful.
    Idle = 2,
    RapidReset = 3,
    ControlFlood = 4,
    /// The client broke the protocol (the `h2` crate's connection error).
    ProtocolError = 5,
    /// One of the `h2` crate's own bounds (resets it had to send, streams reset before
    /// they were accepted).
    EnhanceYourCalm = 6,
}

impl GoAway {
    const ALL: [GoAway; 7] = [
        GoAway::Stop,
        GoAway::Leave,
        GoAway::Idle,
        GoAway::RapidReset,
        GoAway::ControlFlood,
        GoAway::ProtocolError,
        GoAway::EnhanceYourCalm,
    ];

    fn from_index(i: u8) -> Option<GoAway> {
        Self::ALL.get(i as usize).copied()
    }

    /// The GOAWAY the `h2` crate sent itself, from the error it ended the connection with.
    fn of(e: &h2::Error) -> Option<GoAway> {
        if !e.is_go_away() || e.is_remote() {
            return None;
        }
        Some(match e.reason() {
            Some(Reason::ENHANCE_YOUR_CALM) => GoAway::EnhanceYourCalm,
            Some(Reason::NO_ERROR) | None => return None,
            Some(_) => GoAway::ProtocolError,
        })
    }
}

/// Whether a plain connection opens with the HTTP/2 preface (prior knowledge), peeked
/// without taking it, for at most `within`. Anything else is HTTP/1.x.
pub async fn prior_knowledge(stream: &TcpStream, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; PREFACE.len()];
    loop {
        let n = match tokio::time::timeout_at(deadline, stream.peek(&mut buf)).await {
            Ok(Ok(n)) => n,
            _ => return false,
        };
        if n == 0 || buf[..n] != PREFACE[..n] {
            return false;
        }
        if n == PREFACE.len() {
            return true;
        }
        // A part of the preface: the rest is on its way (peek does not wait for more).
        if tokio::time::timeout_at(deadline, tokio::time::sleep(Duration::from_millis(5))).await.is_err() {
            return false;
        }
    }
}

/// The streams of one connection: how many are open, and when the last one ended.
#[derive(Default)]
struct Live {
    streams: AtomicUsize,
    last_end_ns: AtomicU64,
}

/// Counts a stream open for as long as it lives.
struct Open(Arc<Live>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.last_end_ns.store(crate::metrics::mono_ns(), Ordering::Relaxed);
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

fn builder(ctx: &VipCtx) -> h2::server::Builder {
    let (s, h2) = (&ctx.settings, &ctx.settings.h2);
    let mut b = h2::server::Builder::new();
    b.max_concurrent_streams(h2.max_concurrent_streams)
        .initial_window_size(h2.initial_window_size)
        // What the codec may hold of all the connection's request bodies at once: four
        // streams' windows.
        .initial_connection_window_size(h2.initial_window_size.saturating_mul(4).min((1 << 31) - 1))
        .max_header_list_size(s.max_header_bytes as u32)
        // What a stream's response may hold in the crate's buffer beyond the client's
        // window: the proxy keeps what it has read of the backend's body (one read), and
        // the backend the remainder.
        .max_send_buffer_size(64 * 1024);
    b
}

/// How a connection is ending: why the dispatcher sent GOAWAY, and when it closes
/// whatever its streams still do.
#[derive(Default)]
struct Ending {
    why: Option<GoAway>,
    until: Option<Instant>,
}

impl Ending {
    /// A graceful GOAWAY (the streams open finish within `grace`), unless one was sent.
    fn graceful<T: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        conn: &mut h2::server::Connection<T, Bytes>,
        why: GoAway,
        grace: Duration,
    ) {
        if self.why.is_none() {
            self.why = Some(why);
            conn.graceful_shutdown();
            self.until = Some(Instant::now() + grace);
        }
    }
}

/// One HTTP/2 client connection, from its preface to its end.
///
/// Not an `async fn`: an async fn's arguments stay in its future for as long as it
/// lives, so the socket (with its TLS state, about 1.2 KiB) would be held twice by every
/// idle connection, once as the argument and once inside the codec. The handshake's
/// future (the codec with the socket) is boxed here and freed once it is done; the
/// connection's own future holds the codec alone.
pub fn serve<T>(ctx: Arc<VipCtx>, io: T, at: At, stop: watch::Receiver<bool>) -> impl Future<Output = ()> + Send
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let alarm = Alarm::new();
    let io = Metered::new(io, &ctx.settings.h2, alarm.clone(), ctx.servers.counters.clone());
    let handshake =
        Box::pin(tokio::time::timeout(ctx.settings.header_timeout, builder(&ctx).handshake::<_, Bytes>(io)));
    run(ctx, handshake, alarm, at, stop)
}

type Handshake<T> = Pin<Box<tokio::time::Timeout<h2::server::Handshake<Metered<T>, Bytes>>>>;

async fn run<T>(ctx: Arc<VipCtx>, handshake: Handshake<T>, alarm: Arc<Alarm>, at: At, mut stop: watch::Receiver<bool>)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let s = &ctx.settings;
    let counters = ctx.servers.counters.clone();
    counters.h2_connections_open.fetch_add(1, Ordering::Relaxed);
    let _open = Counted(&counters.h2_connections_open);
    let mut conn = match handshake.await {
        Ok(Ok(conn)) => conn,
        _ => return,
    };
    let live = Arc::new(Live::default());
    // The streams' tasks: none outlives its connection (dropped with it, so aborted), and
    // no more run at once than SETTINGS_MAX_CONCURRENT_STREAMS, though the client may
    // reset a stream (the codec then forgets it) while its task still queues or waits
    // for its backend.
    let mut tasks = tokio::task::JoinSet::new();
    let mut end = Ending::default();
    // One timer for the connection's life, moved when it fires with streams open (not
    // re-armed for every stream: a timer is a lock and a wheel slot).
    let idle = tokio::time::sleep(s.client_idle_timeout);
    tokio::pin!(idle);
    let mut streams = 0u64;
    if *stop.borrow() {
        end.graceful(&mut conn, GoAway::Stop, s.drain_timeout);
    }
    loop {
        tokio::select! {
            biased;
            _ = alarm.notify.notified() => {
                // A bound broken: GOAWAY at once, the streams' work dropped.
                if let Some(w) = alarm.raised() {
                    end.why = Some(w);
                    conn.abrupt_shutdown(Reason::ENHANCE_YOUR_CALM);
                    end.until = Some(Instant::now() + Duration::from_secs(1));
                }
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            accepted = conn.accept() => match accepted {
                Some(Ok((_, mut respond))) if live.streams.load(Ordering::Relaxed) >= s.h2.max_concurrent_streams as usize => {
                    // Streams the client reset still at work: no more until they end.
                    respond.send_reset(Reason::REFUSED_STREAM);
                }
                Some(Ok((req, respond))) => {
                    live.streams.fetch_add(1, Ordering::Relaxed);
                    streams += 1;
                    let open = Open(live.clone());
                    let (stream_ctx, stop) = (ctx.clone(), stop.clone());
                    let span = tracing::debug_span!("stream", n = streams);
                    tasks.spawn(async move {
                        let _open = open;
                        stream::serve(stream_ctx, at, stop, req, respond).await;
                    }.instrument(span));
                    if !ctx.ownership.keeps(at.steer_slot) {
                        end.graceful(&mut conn, GoAway::Leave, s.drain_timeout);
                    }
                }
                Some(Err(e)) => {
                    if end.why.is_none() {
                        end.why = GoAway::of(&e);
                    }
                    tracing::debug!(error = %e, "HTTP/2 connection ended");
                    break;
                }
                None => break,
            },
            _ = stop.changed(), if end.why.is_none() => end.graceful(&mut conn, GoAway::Stop, s.drain_timeout),
            _ = &mut idle, if end.why.is_none() => {
                let last = live.last_end_ns.load(Ordering::Relaxed);
                let since = Duration::from_nanos(crate::metrics::mono_ns().saturating_sub(last.max(1)));
                let now = tokio::time::Instant::now();
                if live.streams.load(Ordering::Relaxed) > 0 {
                    idle.as_mut().reset(now + s.client_idle_timeout);
                } else if last != 0 && since < s.client_idle_timeout {
                    idle.as_mut().reset(now + (s.client_idle_timeout - since));
                } else {
                    end.graceful(&mut conn, GoAway::Idle, s.client_timeout);
                }
            }
            _ = tokio::time::sleep_until(end.until.unwrap_or_else(Instant::now).into()), if end.until.is_some() => break,
        }
    }
    if let Some(w) = end.why {
        counters.h2_goaways[w as usize].fetch_add(1, Ordering::Relaxed);
    }
}
