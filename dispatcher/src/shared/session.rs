//! One session with the store: a lease, this dispatcher's member key, what waited to be
//! written, a snapshot of everything under the prefix, then a watch from the snapshot's
//! revision on (nothing in between is missed), renewals and writes as they come. Any
//! failure or timeout ends the session; `super::run` begins the next one.

use std::{
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
    WatchOptions,
};
use tokio::sync::mpsc;

use super::{
    apply_all, apply_backend, backend_index, keep_pending, member_value, publish_peers,
    view::{self, Change},
    Inner, Publish,
};

/// A store request, bounded by `request_timeout`.
async fn timed<T>(
    inner: &Inner,
    what: &str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(inner.settings.request_timeout, f).await {
        Ok(r) => r.with_context(|| what.to_string()),
        Err(_) => bail!("{what}: no answer within {:?}", inner.settings.request_timeout),
    }
}

pub(super) async fn run(
    inner: &Arc<Inner>,
    rx: &mut mpsc::UnboundedReceiver<Publish>,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
    lease_out: &Arc<Mutex<Option<(Client, i64)>>>,
) -> anyhow::Error {
    match session(inner, rx, ready, lease_out).await {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn session(
    inner: &Arc<Inner>,
    rx: &mut mpsc::UnboundedReceiver<Publish>,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
    lease_out: &Arc<Mutex<Option<(Client, i64)>>>,
) -> anyhow::Result<std::convert::Infallible> {
    let s = &inner.settings;
    let opts = ConnectOptions::new()
        .with_connect_timeout(s.request_timeout)
        .with_timeout(s.request_timeout)
        .with_keep_alive(s.request_timeout, s.request_timeout);
    // One member per session, the next one after a failure: a client balanced over all of
    // them keeps sending to a dead member now and then, and every such request would end
    // the session.
    let k = inner.endpoint.load(Ordering::Relaxed) % s.endpoints.len();
    let endpoint = s.endpoints[k].clone();
    inner.state.lock().unwrap().via = endpoint.clone();
    let mut client = timed(inner, "connecting to the store", Client::connect([endpoint.as_str()], Some(opts)))
        .await
        .with_context(|| format!("via {endpoint}"))?;
    let prefix = s.key_prefix.clone();
    let ttl = s.lease_ttl.as_secs() as i64;
    let lease = timed(inner, "granting the membership lease", client.lease_grant(ttl, None)).await?.id();
    inner.counters.writes.fetch_add(1, Ordering::Relaxed);
    *lease_out.lock().unwrap() = Some((client.clone(), lease));
    let (mut keeper, mut renewed) = timed(inner, "renewing the lease", client.lease_keep_alive(lease)).await?;

    // What this dispatcher decided while the store was away, first: in etcd's order it
    // comes before anything the snapshot below does not hold yet.
    loop {
        let next = inner.pending.lock().unwrap().pop_front();
        let Some(p) = next else { break };
        if let Err(e) = write(inner, &mut client, &p).await {
            inner.pending.lock().unwrap().push_front(p);
            return Err(e);
        }
    }
    let member = member_value(inner);
    let key = view::member_key(&prefix, &s.name);
    timed(inner, "registering", client.put(key, member, Some(PutOptions::new().with_lease(lease)))).await?;
    inner.counters.writes.fetch_add(1, Ordering::Relaxed);

    let dir = format!("{prefix}/");
    let snap = timed(inner, "reading the shared state", client.get(dir.clone(), Some(GetOptions::new().with_prefix())))
        .await?;
    let revision = snap.header().map(|h| h.revision()).ok_or_else(|| anyhow!("a snapshot without a revision"))?;
    let mut v = view::View::default();
    for kv in snap.kvs() {
        if v.apply(&prefix, kv.key(), Some(kv.value())) == Change::Ignored {
            inner.counters.ignored_keys.fetch_add(1, Ordering::Relaxed);
        }
    }
    let mut watch = timed(
        inner,
        "watching the shared state",
        client.watch(dir, Some(WatchOptions::new().with_prefix().with_start_revision(revision + 1))),
    )
    .await?;
    store_health(inner, &mut client).await;
    apply_all(inner, &v);
    publish_peers(inner, &v);
    {
        let mut st = inner.state.lock().unwrap();
        st.view = v.clone();
        st.revision = revision;
        if !st.connected {
            st.since = Instant::now();
        }
        st.connected = true;
        st.last_error = None;
    }
    tracing::info!(revision, members = v.members.len(), clones = v.clones.len(), "shared store connected");
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }

    let mut tick = tokio::time::interval(renew_every(s.lease_ttl));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {
                // A renewal needs the store's leader: without a quorum it times out, and the
                // session ends (status: unreachable).
                inner.counters.renewals.fetch_add(1, Ordering::Relaxed);
                timed(inner, "renewing the lease", keeper.keep_alive()).await?;
                let r = timed(inner, "renewing the lease", renewed.message()).await?;
                match r {
                    Some(r) if r.ttl() > 0 => {}
                    _ => bail!("the membership lease expired"),
                }
                store_health(inner, &mut client).await;
            }
            msg = watch.message() => {
                let resp = msg.context("watching the shared state")?.ok_or_else(|| anyhow!("the store closed the watch"))?;
                if resp.canceled() {
                    bail!("the store cancelled the watch ({})", resp.cancel_reason());
                }
                let mut verdicts = false;
                let mut ops = Vec::new();
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let value = (ev.event_type() == EventType::Put).then(|| kv.value());
                    match v.apply(&prefix, kv.key(), value) {
                        Change::Verdicts => verdicts = true,
                        Change::Operator { backend, .. } => ops.push(backend),
                        Change::Clone { id, backend } => {
                            let cluster = inner.current.read().unwrap().1.clone();
                            if let Some(&i) = backend_index(&cluster).get(backend.as_str()) {
                                cluster.adopt_shared_clone(id.as_bytes(), i);
                            }
                        }
                        Change::Ignored => {
                            inner.counters.ignored_keys.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                let (cfg, cluster) = inner.current.read().unwrap().clone();
                let by_name = backend_index(&cluster);
                for b in ops {
                    if let Some(&i) = by_name.get(b.as_str()) {
                        apply_backend(&cfg, &cluster, &v, i, true);
                    }
                }
                if verdicts {
                    for i in 0..cluster.backends.len() {
                        apply_backend(&cfg, &cluster, &v, i, false);
                    }
                    publish_peers(inner, &v);
                }
                let mut st = inner.state.lock().unwrap();
                st.view = v.clone();
                if let Some(h) = resp.header() {
                    st.revision = h.revision();
                }
            }
            p = rx.recv() => {
                let Some(p) = p else { bail!("the agent is stopping") };
                let p = match p {
                    // The member key carries the verdicts, with the lease.
                    Publish::Verdicts => {
                        let key = view::member_key(&prefix, &s.name);
                        timed(inner, "publishing verdicts", client.put(key, member_value(inner), Some(PutOptions::new().with_lease(lease)))).await?;
                        inner.counters.writes.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    p => p,
                };
                if let Err(e) = write(inner, &mut client, &p).await {
                    keep_pending(inner, p);
                    return Err(e);
                }
            }
        }
    }
}

/// Renewals three times per lease: two may be lost before it expires.
fn renew_every(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(500))
}

/// A learned ID or an operator's command, written to the store.
async fn write(inner: &Inner, client: &mut Client, p: &Publish) -> anyhow::Result<()> {
    let prefix = &inner.settings.key_prefix;
    match p {
        Publish::Learned { id, backend } => {
            // Create-if-absent: the first learning in the store's order wins everywhere.
            let key = view::clone_key(prefix, id);
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(key.clone(), backend.clone(), None)])
                .or_else([TxnOp::get(key, None)]);
            let r = timed(inner, "sharing a learned clone ID", client.txn(txn)).await?;
            inner.counters.writes.fetch_add(1, Ordering::Relaxed);
            if !r.succeeded() {
                for op in r.op_responses() {
                    if let TxnOpResponse::Get(g) = op {
                        if let Some(kv) = g.kvs().first() {
                            let owner = String::from_utf8_lossy(kv.value());
                            if owner != *backend {
                                tracing::warn!(clone = %id, learned_here = %backend, shared = %owner, "clone ID learned for another backend first elsewhere");
                                let cluster = inner.current.read().unwrap().1.clone();
                                if let Some(&i) = backend_index(&cluster).get(owner.as_ref()) {
                                    cluster.adopt_shared_clone(id.as_bytes(), i);
                                }
                            }
                        }
                    }
                }
            }
        }
        Publish::Operator { backend, op } => {
            let key = view::operator_key(prefix, backend);
            match view::operator_value(*op) {
                Some(v) => {
                    timed(inner, "sharing an operator's command", client.put(key, v, None)).await?;
                }
                None => {
                    timed(inner, "sharing an operator's command", client.delete(key, None)).await?;
                }
            }
            inner.counters.writes.fetch_add(1, Ordering::Relaxed);
        }
        Publish::Verdicts => {}
    }
    Ok(())
}

/// The store's own health as the member this session talks to reports it (reads only).
async fn store_health(inner: &Inner, client: &mut Client) {
    let members = timed(inner, "listing the store's members", client.member_list()).await.map(|m| m.members().len());
    let leader = timed(inner, "reading the store's status", client.status()).await.map(|s| s.leader());
    let mut st = inner.state.lock().unwrap();
    if let Ok(n) = members {
        st.store_members = n;
    }
    if let Ok(l) = leader {
        st.leader = l;
    }
}
