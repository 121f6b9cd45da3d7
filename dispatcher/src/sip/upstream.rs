//! The connections to the containers: one per container and port, opened on first use
//! within `connect_timeout`, every caller's messages multiplexed on it. What comes back:
//! a response goes to the caller connection our `Via` names; a container's request (a BYE
//! from the UAS) to the caller connection our `Route` names, with our `Via` naming the
//! container so that its answer comes back here.
//!
//! A request is kept (`Pending`, bounded per connection) until its final answer: when the
//! connection breaks or its container goes down first, those requests are routed again
//! (to the replica, by the owner's state), so a container's death loses no transaction.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
};

use dispatcher_common::BackendState;
use tokio::{
    io::AsyncReadExt,
    net::{tcp::OwnedReadHalf, TcpStream},
};

use super::{
    framing::{self, Frame},
    message::{self, Mark},
    wire::Wire,
    Hub, BACKLOG,
};

/// Room for each read from a container.
const READ: usize = 8192;

/// Requests one container connection keeps until their final answers.
pub const MAX_PENDING: usize = 4096;
/// How long an unanswered request is kept at most (64 x T1).
pub const PENDING_LIFETIME: std::time::Duration = std::time::Duration::from_secs(32);
/// The bytes of unanswered requests all container connections keep at most (a request
/// past it is sent without being kept for routing again).
pub const MAX_PENDING_BYTES: usize = 64 << 20;

/// A caller's request sent, not yet finally answered.
pub struct Pending {
    pub branch: Vec<u8>,
    pub vip: usize,
    pub client: u64,
    pub original: Vec<u8>,
    pub at: std::time::Instant,
    /// How many times it was already routed again (`MAX_RESENDS`).
    pub resent: u8,
}

/// How many times a request is routed again after the connections it went on ended
/// unanswered: a request whose answer itself breaks the connection (or a container that
/// dies on it) is not sent on and on.
pub const MAX_RESENDS: u8 = 2;

struct Link {
    /// Written by the task that has the message (`wire.rs`), read by the link's task.
    wire: Wire,
    pending: Mutex<HashMap<Vec<u8>, Pending>>,
    closed: AtomicBool,
}

/// Held while a connection to one container and port is being opened.
type Gate = Arc<tokio::sync::Mutex<()>>;

#[derive(Default)]
pub struct Pool {
    links: Mutex<HashMap<(usize, u16), Arc<Link>>>,
    /// One opening at a time per container and port (another container that cannot be
    /// reached delays nobody else's).
    connecting: Mutex<HashMap<(usize, u16), Gate>>,
    /// The bytes of the requests kept in every link's `pending` (`MAX_PENDING_BYTES`).
    pending_bytes: std::sync::atomic::AtomicUsize,
}

impl Pool {
    fn live(&self, b: usize, port: u16) -> Option<Arc<Link>> {
        self.links.lock().unwrap().get(&(b, port)).filter(|l| !l.closed.load(Ordering::SeqCst)).cloned()
    }

    /// Sends on the container's open connection only (an answer to its own request).
    pub fn send_existing(&self, b: usize, port: u16, bytes: Vec<u8>) -> bool {
        self.live(b, port).is_some_and(|l| l.wire.try_send(&bytes).is_ok())
    }

    /// Sends on container `b`'s connection, opening it if needed; `pending`: keep it
    /// until its final answer.
    pub async fn send(
        &self,
        hub: &Arc<Hub>,
        b: usize,
        port: u16,
        bytes: Vec<u8>,
        pending: Option<Pending>,
    ) -> std::io::Result<()> {
        let link = match self.live(b, port) {
            Some(l) => l,
            None => {
                let gate = self.connecting.lock().unwrap().entry((b, port)).or_default().clone();
                let _one = gate.lock().await;
                match self.live(b, port) {
                    Some(l) => l,
                    None => self.open(hub, b, port).await?,
                }
            }
        };
        let branch = pending.as_ref().map(|p| p.branch.clone());
        if let Some(p) = pending {
            self.keep(&link, p);
        }
        // A full backlog is back-pressure from a busy connection, not a failed container:
        // waited for a while, then `WouldBlock` (the caller is answered 503; the container
        // is not made suspect). A closed one is a failure.
        let sent = link.wire.send(&bytes, hub.bounds.connect_timeout).await;
        if sent.is_err() {
            // Not sent: nothing to route again when that connection ends.
            if let Some(br) = branch {
                self.forget(&link, &br);
            }
        }
        sent
    }

    /// Keeps a request sent on `link` until its final answer, within `MAX_PENDING` per
    /// link and `MAX_PENDING_BYTES` in all; past them it is sent, not kept (it would not
    /// be routed again).
    fn keep(&self, link: &Link, p: Pending) {
        let size = p.original.len();
        let mut map = link.pending.lock().unwrap();
        if map.len() >= MAX_PENDING || self.pending_bytes.load(Ordering::Relaxed) + size > MAX_PENDING_BYTES {
            // Requests a container never answered finally: forgotten after a
            // transaction's lifetime (64 x T1, RFC 3261 Timer B).
            map.retain(|_, old| {
                let keep = old.at.elapsed() < PENDING_LIFETIME;
                if !keep {
                    self.pending_bytes.fetch_sub(old.original.len(), Ordering::Relaxed);
                }
                keep
            });
        }
        if map.len() < MAX_PENDING && self.pending_bytes.load(Ordering::Relaxed) + size <= MAX_PENDING_BYTES {
            self.pending_bytes.fetch_add(size, Ordering::Relaxed);
            if let Some(old) = map.insert(p.branch.clone(), p) {
                self.pending_bytes.fetch_sub(old.original.len(), Ordering::Relaxed);
            }
        }
    }

    /// A kept request answered finally (or not sent): forgotten.
    fn forget(&self, link: &Link, branch: &[u8]) {
        if let Some(old) = link.pending.lock().unwrap().remove(branch) {
            self.pending_bytes.fetch_sub(old.original.len(), Ordering::Relaxed);
        }
    }

    async fn open(&self, hub: &Arc<Hub>, b: usize, port: u16) -> std::io::Result<Arc<Link>> {
        let addr = std::net::SocketAddr::from((hub.servers.backends[b].address, port));
        let stream = tokio::time::timeout(hub.bounds.connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let _ = stream.set_nodelay(true);
        let (rd, wr) = stream.into_split();
        let wire = Wire::new(wr, BACKLOG);
        let link = Arc::new(Link { wire, pending: Mutex::new(HashMap::new()), closed: AtomicBool::new(false) });
        self.links.lock().unwrap().insert((b, port), link.clone());
        tokio::spawn(run(hub.clone(), b, port, rd, link.clone()));
        Ok(link)
    }
}

/// Runs one container connection until it breaks or the container goes down; then routes
/// again what it still owed answers to.
async fn run(hub: Arc<Hub>, b: usize, port: u16, mut rd: OwnedReadHalf, link: Arc<Link>) {
    // What the socket did not take when it was sent.
    let writer = link.wire.flush();
    // Whether the container's bytes could not be cut into messages (the connection
    // cannot go on; the container is not failing for it).
    let reader = async {
        let mut buf = Vec::new();
        loop {
            loop {
                match framing::next(&mut buf, hub.bounds.container_limits) {
                    Ok(Some(Frame::Ping)) => {
                        let _ = link.wire.try_send(b"\r\n");
                    }
                    Ok(Some(Frame::Message(m))) => from_container(&hub, b, &link, m),
                    Ok(None) => break,
                    Err(_) => return true,
                }
            }
            buf.reserve(READ);
            match rd.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(_) => {}
            }
        }
    };
    let down = async {
        let be = &hub.servers.backends[b];
        loop {
            let changed = be.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if matches!(be.state(), BackendState::Down | BackendState::Disabled | BackendState::Unused) {
                return;
            }
            changed.await;
        }
    };
    let unframed = tokio::select! {
        _ = writer => false,
        unframed = reader => unframed,
        _ = down => false,
    };
    link.closed.store(true, Ordering::SeqCst);
    link.wire.set_closed();
    {
        let mut links = hub.pool.links.lock().unwrap();
        if links.get(&(b, port)).is_some_and(|l| Arc::ptr_eq(l, &link)) {
            links.remove(&(b, port));
        }
    }
    let owed: Vec<Pending> = link.pending.lock().unwrap().drain().map(|(_, p)| p).collect();
    let owed_bytes: usize = owed.iter().map(|p| p.original.len()).sum();
    hub.pool.pending_bytes.fetch_sub(owed_bytes, Ordering::Relaxed);
    if unframed {
        // What it sent was not SIP as we frame it (or past `container_limits`): counted
        // and logged; the container answers, so it is not made suspect for it.
        hub.count("container_framing");
        crate::ratelimit::warn(
            "a container's SIP connection could not be cut into messages; closed",
            &hub.servers.backends[b].name,
        );
    } else if !owed.is_empty() {
        // It failed with requests in flight: suspect at once (the checks confirm), and
        // each goes through routing again: held, then to the replica.
        hub.servers.passive_failure(b, crate::health::Cause::Refused);
        tracing::info!(backend = %hub.servers.backends[b].name, requests = owed.len(), "SIP requests routed again after their container's connection ended");
    }
    for p in owed {
        if hub.client_vip(p.client).is_none() {
            continue;
        }
        if p.resent >= MAX_RESENDS {
            // Sent on connections that ended unanswered too often: answered here.
            hub.count("resend_limit");
            if !message::method(&p.original).eq_ignore_ascii_case(b"ACK") {
                let head = &p.original[..framing::header_end(&p.original).unwrap_or(p.original.len())];
                hub.to_client(p.client, message::answer(head, 503, "Service Unavailable", None));
            }
            continue;
        }
        hub.count("rerouted");
        tokio::spawn(super::conn::dispatch(hub.clone(), p.vip, p.client, p.original, p.resent + 1));
    }
}

/// A whole message from container `b`.
fn from_container(hub: &Arc<Hub>, b: usize, link: &Link, mut msg: Vec<u8>) {
    if message::is_response(&msg) {
        // The request it answers finally is no longer owed (forgotten before our Via,
        // which names it, comes off).
        if final_status(&msg) {
            if let Some(key) = message::transaction_key(&msg, message::answers_cancel(&msg)) {
                hub.pool.forget(link, &key);
            }
        }
        match message::pop_our_via(&mut msg) {
            Some(Mark::Client(id)) => {
                if hub.to_client(id, msg) {
                    hub.count("response");
                }
            }
            _ => hub.count("stray"),
        }
        return;
    }
    // A request toward a caller: our Route names its connection.
    match message::pop_our_route(&mut msg) {
        Some(Mark::Client(id)) => match hub.client_vip(id) {
            Some(vi) => {
                let v = &hub.vips[vi];
                let fwd = message::forward_to_caller(&msg, b, id, &v.host, v.transport.name());
                if hub.to_client(id, fwd) {
                    hub.count("container_request");
                }
            }
            None => {
                // The caller's connection is gone (RFC 5923: nothing else reaches it).
                hub.count("stray");
                let head = &msg[..framing::header_end(&msg).unwrap_or(msg.len())];
                if !message::method(&msg).eq_ignore_ascii_case(b"ACK") {
                    let _ = link.wire.try_send(&message::answer(head, 430, "Flow Failed", None));
                }
            }
        },
        _ => hub.count("stray"),
    }
}

/// A final response (2xx-6xx).
fn final_status(msg: &[u8]) -> bool {
    msg.get(8).is_some_and(|c| (b'2'..=b'6').contains(c))
}
