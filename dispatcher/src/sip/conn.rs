//! One caller's connection: messages framed (`framing`), each request routed (`route`),
//! held while its owner is suspect, sent on the container's pooled connection with our
//! `Via`; responses to a container's request sent back on that container's connection.
//! What the connection is told is written by the task that has it when the connection is
//! plain TCP (`wire.rs`: queued only when the socket takes no more), through a bounded
//! queue its writer task drains over TLS.
//!
//! Timeouts: `header_timeout` from a message's first byte to the end of its header
//! section (slowloris), `body_timeout` more for its body (a `Content-Length` larger than
//! what follows), `idle_timeout` between messages; each closes the connection.

use std::{
    sync::{atomic::Ordering, Arc},
    time::Instant,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

use super::{
    framing::{self, Frame},
    message::{self, Mark},
    route::{self, Choice},
    wire::Wire,
    CallerTx, Hub, BACKLOG, QUEUE,
};
use crate::health::Cause;

/// Room for the first read of a message (what an idle connection holds).
const IDLE_READ: usize = 512;
/// Room for each further read.
const READ: usize = 4096;

/// Serves plain caller connection `id` on VIP `vi` until it closes or breaks a rule;
/// whoever has a message for it writes it (`wire.rs`).
pub async fn serve_plain(hub: &Arc<Hub>, vi: usize, id: u64, stream: TcpStream) {
    let (mut rd, wr) = stream.into_split();
    let wire = Arc::new(Wire::new(wr, BACKLOG));
    // Idle but for what the socket did not take at once.
    let writer = tokio::spawn({
        let wire = wire.clone();
        async move { wire.flush().await }
    });
    serve(hub, vi, id, &mut rd, CallerTx::Plain(wire), writer).await;
}

/// Serves TLS caller connection `id`: what it is told goes through a bounded queue its
/// writer task drains (the TLS state is that task's).
pub async fn serve_tls<S: AsyncRead + AsyncWrite + Send + 'static>(hub: &Arc<Hub>, vi: usize, id: u64, stream: S) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(QUEUE);
    let queued = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = tokio::spawn({
        let queued = queued.clone();
        async move {
            while let Some(bytes) = rx.recv().await {
                let written = wr.write_all(&bytes).await;
                queued.fetch_sub(bytes.len(), Ordering::SeqCst);
                if written.is_err() {
                    break;
                }
                // A closing answer: empty bytes after it end the connection.
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = wr.shutdown().await;
        }
    });
    serve(hub, vi, id, &mut rd, CallerTx::Tls(tx, queued), writer).await;
}

async fn serve<R: AsyncRead + Unpin>(
    hub: &Arc<Hub>,
    vi: usize,
    id: u64,
    rd: &mut R,
    tx: CallerTx,
    mut writer: tokio::task::JoinHandle<()>,
) {
    hub.clients.lock().unwrap().insert(id, (tx.clone(), vi));
    read_loop(hub, vi, id, rd, &tx).await;
    hub.clients.lock().unwrap().remove(&id);
    // What is queued is still written (a TLS writer ends when the last sender goes), for
    // 2 s at most: a caller that reads nothing does not keep its socket and slot.
    if let CallerTx::Plain(w) = &tx {
        w.close_after_flush();
    }
    drop(tx);
    if tokio::time::timeout(std::time::Duration::from_secs(2), &mut writer).await.is_err() {
        writer.abort();
    }
}

async fn read_loop<R: AsyncRead + Unpin>(hub: &std::sync::Arc<Hub>, vi: usize, id: u64, rd: &mut R, tx: &CallerTx) {
    let b = hub.bounds;
    // No read buffer of its own: reads go into `buf`'s spare room, which an idle
    // connection keeps small.
    let mut buf: Vec<u8> = Vec::new();
    // When the message now in `buf` began.
    let mut started: Option<Instant> = None;
    // One timer for the connection's life, re-armed lazily: moved earlier when a deadline
    // comes sooner, and only when it fires early moved on to the deadline now in force
    // (an armed timer per read would cost a timer-wheel insert and removal per message).
    let timer = tokio::time::sleep(b.idle_timeout);
    tokio::pin!(timer);
    loop {
        // Take every whole frame first.
        loop {
            match framing::next(&mut buf, b.limits) {
                Ok(Some(Frame::Ping)) => {
                    hub.count("keepalive");
                    let _ = tx.send(b"\r\n".to_vec());
                }
                Ok(Some(Frame::Message(m))) => {
                    started = None;
                    from_caller(hub, vi, id, m).await;
                }
                Ok(None) => break,
                Err(fault) => {
                    hub.count(fault.outcome());
                    if !buf.is_empty() && !message::is_response(&buf) {
                        let head = &buf[..framing::header_end(&buf).unwrap_or(buf.len())];
                        let (status, reason) = fault.answer();
                        // Never waited for: a caller that reads nothing must not keep the
                        // connection (and its slot) by filling the queue.
                        let _ = tx.send(message::answer(head, status, reason, None));
                    }
                    tx.close();
                    return;
                }
            }
        }
        // Nothing, or a lone CRLF (ignored: maybe half a ping), waits as an idle
        // connection does; anything else is a message begun.
        if buf.len() < 4 && b"\r\n\r\n".starts_with(&buf) {
            started = None;
            if buf.is_empty() && buf.capacity() > 2 * READ {
                buf = Vec::new();
            }
        } else if started.is_none() {
            started = Some(Instant::now());
        }
        let deadline = match started {
            None => tokio::time::Instant::now() + b.idle_timeout,
            Some(t) => {
                let head_done = framing::header_end(&buf).is_some();
                let limit = if head_done { b.header_timeout + b.body_timeout } else { b.header_timeout };
                (t + limit).into()
            }
        };
        buf.reserve(if buf.is_empty() { IDLE_READ } else { READ });
        if deadline < timer.deadline() {
            timer.as_mut().reset(deadline);
        }
        let read = loop {
            tokio::select! {
                biased;
                r = rd.read_buf(&mut buf) => break Some(r),
                () = &mut timer => {
                    if tokio::time::Instant::now() >= deadline {
                        break None;
                    }
                    timer.as_mut().reset(deadline);
                }
            }
        };
        match read {
            Some(Ok(0)) | Some(Err(_)) => return,
            Some(Ok(_)) => {}
            None => {
                if started.is_some() {
                    hub.count("incomplete");
                }
                tx.close();
                return;
            }
        }
    }
}

/// A whole message from caller `id`.
async fn from_caller(hub: &std::sync::Arc<Hub>, vi: usize, id: u64, mut msg: Vec<u8>) {
    if message::is_response(&msg) {
        // An answer to a container's request: back on that container's connection, when
        // our Via on that request was sealed for this caller and names a container of
        // this VIP (a forged one reaches nobody).
        let to = message::sealed_container(&msg, id).filter(|b| hub.vips[vi].members.contains(b));
        let sent = match (to, message::pop_our_via(&mut msg)) {
            (Some(b), Some(Mark::Container(c))) if b == c => hub.pool.send_existing(b, hub.vips[vi].backend_port, msg),
            _ => false,
        };
        hub.count(if sent { "response" } else { "stray" });
        return;
    }
    // Our own Route (from our Record-Route) comes off (RFC 3261 16.4).
    message::pop_our_route(&mut msg);
    // A hop fewer (16.6); none left: 483, never forwarded (a loop ends here).
    match message::take_hop(&mut msg) {
        true => dispatch(hub.clone(), vi, id, msg, 0).await,
        false => {
            hub.count("invalid");
            if !message::method(&msg).eq_ignore_ascii_case(b"ACK") {
                let head = &msg[..framing::header_end(&msg).unwrap_or(msg.len())];
                hub.to_client(id, message::answer(head, 483, "Too Many Hops", None));
            }
        }
    }
}

/// Routes a caller's request and sends it; answers it ourselves when no container may
/// take it. Also what an unanswered request goes through again after its container went
/// down (boxed: the pool's connection task spawns it, and it opens the pool's
/// connections).
pub fn dispatch(
    hub: std::sync::Arc<Hub>,
    vi: usize,
    id: u64,
    msg: Vec<u8>,
    resent: u8,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(route_and_send(hub, vi, id, msg, resent))
}

async fn route_and_send(hub: std::sync::Arc<Hub>, vi: usize, id: u64, msg: Vec<u8>, resent: u8) {
    let head_len = framing::header_end(&msg).unwrap_or(msg.len());
    let scan = route::scan(&msg[..head_len]);
    let is_ack = message::method(&msg).eq_ignore_ascii_case(b"ACK");
    let deadline = Instant::now() + hub.bounds.hold_time;
    let v = &hub.vips[vi];
    // One of `max_held` while it waits, given back however it ends.
    let mut held: Option<Held> = None;
    // Our own answer instead of a container's (none to an ACK), counted.
    let refuse = |outcome: &str, status: u16, reason: &str, retry_after: Option<u32>| {
        hub.count(outcome);
        if !is_ack {
            hub.to_client(id, message::answer(&msg[..head_len], status, reason, retry_after));
        }
    };
    // Each round either sends, answers, or waits for a state change; bounded.
    for _ in 0..16 {
        let (choice, src) = route::choose(&hub.servers, vi, &v.members, &hub.pins, &scan);
        match choice {
            Choice::To { backend, replica } => {
                let fwd = message::forward_request(&msg, Mark::Client(id), &v.host, v.transport.name());
                let pending = (!is_ack).then(|| upstream_pending(&fwd, vi, id, &msg, resent));
                match hub.pool.send(&hub, backend, v.backend_port, fwd, pending).await {
                    Ok(()) => {
                        hub.count(route::source_name(src));
                        if replica {
                            hub.count("replica");
                        }
                        return;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Its connection is busy (a queue full for a while): this caller
                        // is told to come back; the container is not suspect for it.
                        return refuse("busy", 503, "Service Unavailable", Some(1));
                    }
                    Err(_) => {
                        // Refused or broken: suspect now; the next round holds or fails over.
                        hub.servers.passive_failure(backend, Cause::Refused);
                        continue;
                    }
                }
            }
            Choice::Hold(b) => {
                if held.is_none() {
                    let now = &hub.servers.counters.held_now;
                    if now.fetch_add(1, Ordering::SeqCst) >= hub.bounds.max_held as u64 {
                        now.fetch_sub(1, Ordering::SeqCst);
                        break;
                    }
                    held = Some(Held(hub.clone()));
                    hub.count("held");
                }
                let be = &hub.servers.backends[b];
                let changed = be.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if be.state() != dispatcher_common::BackendState::Suspect {
                    continue;
                }
                if tokio::time::timeout_at(deadline.into(), changed).await.is_err() {
                    break;
                }
            }
            Choice::NoBackend => break,
            Choice::UnknownLn => return refuse("unknown_ln", 481, "Call/Transaction Does Not Exist", None),
            Choice::Invalid => return refuse("invalid", 400, "Bad Request", None),
        }
    }
    refuse("rejected", 503, "Service Unavailable", Some(5));
}

/// A message held (`held_now`), counted down when it is dropped.
struct Held(std::sync::Arc<Hub>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.servers.counters.held_now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What the pool keeps of a request until its final answer: our branch, and the
/// caller's message to route again if the container goes down first.
fn upstream_pending(fwd: &[u8], vi: usize, id: u64, original: &[u8], resent: u8) -> super::upstream::Pending {
    super::upstream::Pending {
        branch: message::transaction_key(fwd, message::method(original).eq_ignore_ascii_case(b"CANCEL"))
            .unwrap_or_default(),
        vip: vi,
        client: id,
        original: original.to_vec(),
        at: Instant::now(),
        resent,
    }
}
