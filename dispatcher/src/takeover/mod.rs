//! Connection takeover (issue 31 part 1): a client's keep-alive connection whose
//! dispatcher died between two requests goes on, on the dispatcher that takes over its
//! slot, without the client noticing.
//!
//! - `repair`: what a connection is made of (the handshake's options, what the client's
//!   next segment says) and the socket rebuilt from it with `TCP_REPAIR`.
//! - `outbox`: at accept, each plain HTTP/1.x connection's handshake goes, batched every
//!   10 ms over the peer channel (`peers`), to the dispatcher the fallback table names
//!   for its slot, with which connections are quiet (no request in progress); at a
//!   graceful stop, the peers are told to forget them.
//! - `wire`: those batches on the wire.
//! - `inbox`: the records received, armed in `TAKEOVER` when their sender dies; the XDP
//!   program (`dispatcher-ebpf/src/steer.rs`) reports a client's segment of an armed
//!   connection and drops it; the socket is rebuilt and handed to an HTTP worker
//!   (`Adoption`), or reset when the connection was not quiet.
//!   A busy connection's client is made to send that segment at once (`repair::probe`).
//!
//! What cannot survive (docs/cluster.md, "When a dispatcher dies"): TLS and HTTP/2
//! connections (their keys and stream state died with the dispatcher; they are not
//! registered), a connection mid-request or mid-response (reset), one the dead
//! dispatcher accepted less than one heartbeat interval before it died (its record had
//! not gone yet).

pub mod inbox;
pub mod outbox;
pub mod repair;
pub mod wire;

use std::{
    collections::{BTreeSet, HashMap},
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use tokio::{io::unix::AsyncFd, sync::mpsc};

pub use repair::{rebuild, vanish, Handshake, Resume};

/// Where rebuilt sockets go: the HTTP workers' accept loops, by VIP address (each loop
/// registers when it starts; one that ended is skipped).
#[derive(Default)]
pub struct Adoption {
    by_addr: Mutex<HashMap<SocketAddr, Vec<mpsc::UnboundedSender<std::net::TcpStream>>>>,
    next: AtomicUsize,
}

impl Adoption {
    /// An accept loop for `addr` takes adopted sockets from the receiver.
    pub fn listen(&self, addr: SocketAddr) -> mpsc::UnboundedReceiver<std::net::TcpStream> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut m = self.by_addr.lock().unwrap();
        let list = m.entry(addr).or_default();
        list.retain(|t| !t.is_closed());
        list.push(tx);
        rx
    }

    /// Hands `sock` to one of the loops serving `addr`, in turn.
    pub fn hand(&self, addr: SocketAddr, mut sock: std::net::TcpStream) -> Result<(), std::net::TcpStream> {
        let mut m = self.by_addr.lock().unwrap();
        let Some(list) = m.get_mut(&addr) else { return Err(sock) };
        list.retain(|t| !t.is_closed());
        for _ in 0..list.len() {
            let i = self.next.fetch_add(1, Ordering::Relaxed) % list.len();
            match list[i].send(sock) {
                Ok(()) => return Ok(()),
                Err(e) => sock = e.0,
            }
        }
        Err(sock)
    }
}

/// Both sides of takeover, as one dispatcher runs them.
pub struct Takeover {
    pub outbox: Arc<outbox::Outbox>,
    pub inbox: inbox::Inbox,
    pub adoption: Arc<Adoption>,
}

impl Takeover {
    /// Both sides' counts; `xdp`: segments reported and dropped without a report.
    pub fn status(&self, xdp: [u64; 2]) -> crate::api::TakeoverStatus {
        let (o, i) = (&self.outbox.counters, &self.inbox.counters);
        let l = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        crate::api::TakeoverStatus {
            tracked: self.outbox.tracked() as u64,
            registered: l(&o.registered),
            untracked: l(&o.untracked),
            records_sent: l(&o.records_sent),
            bytes_sent: l(&o.bytes_sent),
            busy_ns: l(&o.busy_ns),
            held: self.inbox.held() as u64,
            armed_now: self.inbox.armed() as u64,
            batches: l(&i.batches),
            batches_refused: l(&i.batches_refused),
            records_refused: l(&i.records_refused),
            armed: l(&i.armed),
            rebuilt: l(&i.rebuilt),
            reset: l(&i.reset),
            failed: l(&i.failed),
            reports_refused: l(&i.reports_refused),
            waited: l(&i.waited),
            probed: l(&i.probed),
            implausible: l(&i.implausible),
            given: l(&i.given),
            segments_reported: xdp[0],
            segments_dropped: xdp[1],
        }
    }

    /// The HTTP path's handle: registering connections, adopting rebuilt ones.
    pub fn http(&self) -> Http {
        Http { outbox: self.outbox.clone(), adoption: self.adoption.clone() }
    }
}

/// The peer channel carries the batches (`peers::Cargo`).
impl crate::peers::Cargo for Takeover {
    fn take(&self, from: &str, datagram: &[u8]) -> Result<(), crate::peers::tracker::Refusal> {
        use crate::peers::tracker::Refusal;
        let batch = wire::parse(datagram).map_err(|_| Refusal::Malformed)?;
        if batch.sender != from {
            return Err(Refusal::WrongName);
        }
        self.inbox.take(batch);
        Ok(())
    }

    fn outgoing(&self) -> Vec<(String, Vec<u8>)> {
        self.outbox.batches()
    }

    fn every(&self) -> Duration {
        outbox::BATCH_EVERY
    }
}

/// What the HTTP path holds of takeover.
#[derive(Clone)]
pub struct Http {
    pub outbox: Arc<outbox::Outbox>,
    pub adoption: Arc<Adoption>,
}

/// Reads the XDP program's reports (`TAKEOVER_EVENTS`) and expires armed records, until
/// the agent stops.
pub async fn run(t: Arc<Takeover>, ring: RingBuf<MapData>) {
    // SAFETY: the ring buffer owns its descriptor, which stays open while the AsyncFd
    // holds it (the AsyncFd deregisters it before dropping the ring).
    let mut fd = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!(error = %e, "takeover reports: cannot wait on the ring buffer; takeover off");
            return;
        }
    };
    let mut expiry = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            guard = fd.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    t.inbox.report(&item, &t.adoption);
                }
                guard.clear_ready();
            }
            _ = expiry.tick() => {
                t.inbox.expire();
            }
        }
    }
}

/// When the busy connections' clients are probed again after a death, each after the
/// one before (0.3, 1 and 2 s after it: the survivors' tables converge within about a
/// second, and until then an answer may be steered to the dead host).
const PROBE_AGAIN: [Duration; 3] = [Duration::from_millis(300), Duration::from_millis(700), Duration::from_secs(1)];

/// Follows the live members (`shared`): a member that was alive and is not any more is
/// dead, and its records are armed (off the event loop: a map write per record).
pub async fn follow_deaths(t: Arc<Takeover>, mut alive: tokio::sync::watch::Receiver<Option<BTreeSet<String>>>) {
    let mut was: Option<BTreeSet<String>> = None;
    loop {
        let now = alive.borrow_and_update().clone();
        if let (Some(before), Some(now)) = (&was, &now) {
            for gone in before.difference(now) {
                let (t, gone) = (t.clone(), gone.clone());
                tokio::spawn(async move {
                    let armer = t.clone();
                    let _ = tokio::task::spawn_blocking(move || armer.inbox.dead(&gone)).await;
                    for after in PROBE_AGAIN {
                        tokio::time::sleep(after).await;
                        let prober = t.clone();
                        let _ = tokio::task::spawn_blocking(move || prober.inbox.probe_busy()).await;
                    }
                });
            }
        }
        if now.is_some() {
            was = now;
        }
        if alive.changed().await.is_err() {
            return;
        }
    }
}
