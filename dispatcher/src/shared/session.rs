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
    view::{self, Change, Policy},
    Inner, Publish,
};

/// Keys read per request of the snapshot: a store holding more (a flood) is read in pages
/// rather than in one answer that outgrows the client's message limit.
const SNAPSHOT_PAGE: i64 = 256;

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

/// What one session works with once its lease is granted.
struct Session<'a> {
    inner: &'a Arc<Inner>,
    client: Client,
    lease: i64,
    prefix: String,
    /// `prefix/`: everything shared.
    dir: String,
    /// This dispatcher's member key.
    my_key: String,
    policy: Policy,
    /// Events at or below it are in the view already (a snapshot read again mid-session).
    seen_upto: i64,
    /// The revisions of this dispatcher's own last writes of its member key: a put of it
    /// at another revision is someone else's, even under this dispatcher's lease (any
    /// writer of the prefix may attach a key to a lease it sees).
    mine: std::collections::VecDeque<i64>,
}

/// How many of its own member-key writes a session remembers (their watch events may
/// come after several more writes).
const MINE_KEPT: usize = 32;

async fn session(
    inner: &Arc<Inner>,
    rx: &mut mpsc::UnboundedReceiver<Publish>,
    ready: &mut Option<tokio::sync::oneshot::Sender<()>>,
    lease_out: &Arc<Mutex<Option<(Client, i64)>>>,
) -> anyhow::Result<std::convert::Infallible> {
    let mut client = connect(inner).await?;
    let s = &inner.settings;
    let ttl = s.lease_ttl.as_secs() as i64;
    let lease = timed(inner, "granting the membership lease", client.lease_grant(ttl, None)).await?.id();
    inner.counters.writes.fetch_add(1, Ordering::Relaxed);
    *lease_out.lock().unwrap() = Some((client.clone(), lease));
    let (keeper, renewed) = timed(inner, "renewing the lease", client.lease_keep_alive(lease)).await?;
    // Renewals run on their own from here on: a long replay or snapshot (a store holding
    // many keys) never lets the lease lapse. Their failure ends the session.
    let (lost_tx, mut lost) = tokio::sync::oneshot::channel();
    let _renewing = AbortOnDrop(tokio::spawn(renew(inner.clone(), client.clone(), keeper, renewed, lost_tx)));
    let prefix = s.key_prefix.clone();
    let mut se = Session {
        inner,
        client,
        lease,
        dir: format!("{prefix}/"),
        my_key: view::member_key(&prefix, &s.name),
        prefix,
        policy: Policy::for_config(&inner.current.read().unwrap().0),
        seen_upto: 0,
        mine: std::collections::VecDeque::new(),
    };
    let mut watch = se.begin().await?;
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }
    loop {
        tokio::select! {
            e = &mut lost => return Err(e.unwrap_or_else(|_| anyhow!("the lease renewals stopped"))),
            msg = watch.message() => {
                let resp = msg.context("watching the shared state")?.ok_or_else(|| anyhow!("the store closed the watch"))?;
                if resp.canceled() {
                    bail!("the store cancelled the watch ({})", resp.cancel_reason());
                }
                se.watched(&resp).await?;
            }
            p = rx.recv() => {
                let Some(p) = p else { bail!("the agent is stopping") };
                se.publish(p).await?;
            }
        }
    }
}

/// A client of one member: one per session, the next one after a failure (a client
/// balanced over all of them keeps sending to a dead member now and then, and every such
/// request would end the session).
async fn connect(inner: &Inner) -> anyhow::Result<Client> {
    let s = &inner.settings;
    let opts = super::credentials::apply(
        s,
        ConnectOptions::new()
            .with_connect_timeout(s.request_timeout)
            .with_timeout(s.request_timeout)
            .with_keep_alive(s.request_timeout, s.request_timeout),
    )?;
    let k = inner.endpoint.load(Ordering::Relaxed) % s.endpoints.len();
    let endpoint = s.endpoints[k].clone();
    inner.state.lock().unwrap().via = endpoint.clone();
    timed(inner, "connecting to the store", Client::connect([endpoint.as_str()], Some(opts)))
        .await
        .with_context(|| format!("via {endpoint}"))
}

/// What one watch message changed.
#[derive(Default)]
struct Watched {
    verdicts: bool,
    ops: Vec<String>,
    clones: Vec<(String, String)>,
    gone: Vec<String>,
    mine_overwritten: bool,
}

impl Session<'_> {
    /// What waited, the member key, the snapshot applied, and the watch from there on.
    async fn begin(&mut self) -> anyhow::Result<etcd_client::WatchStream> {
        let inner = self.inner;
        // What this dispatcher decided while the store was away, first: in etcd's order it
        // comes before anything the snapshot below does not hold yet.
        loop {
            let next = inner.pending.lock().unwrap().pop_front();
            let Some(p) = next else { break };
            if let Err(e) = write(inner, &mut self.client, &p).await {
                inner.pending.lock().unwrap().push_front(p);
                return Err(e);
            }
        }
        self.register("registering").await?;
        let (v, revision) = snapshot(inner, &mut self.client, &self.policy, &self.dir).await?;
        self.seen_upto = revision;
        // Written by someone else between the registration and the snapshot (the watch
        // begins after it): written again, as a watch event would have it.
        let own =
            timed(inner, "reading this dispatcher's member key", self.client.get(self.my_key.clone(), None)).await?;
        if own.kvs().first().is_none_or(|kv| kv.lease() != self.lease || !self.mine.contains(&kv.mod_revision())) {
            self.register_again().await?;
        }
        let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let watch =
            timed(inner, "watching the shared state", self.client.watch(self.dir.clone(), Some(options))).await?;
        store_health(inner, &mut self.client).await;
        apply_all(inner, &v);
        publish_peers(inner, &v);
        let mut st = inner.state.lock().unwrap();
        tracing::info!(
            revision,
            members = v.members.len(),
            clones = v.clones.len(),
            security = %inner.settings.security.describe(),
            "shared store connected"
        );
        st.view = v;
        st.revision = revision;
        if !st.connected {
            st.since = Instant::now();
        }
        st.connected = true;
        st.last_error = None;
        Ok(watch)
    }

    /// Writes this dispatcher's member key (its verdicts), with the lease.
    async fn register(&mut self, what: &str) -> anyhow::Result<()> {
        let put = PutOptions::new().with_lease(self.lease);
        let r =
            timed(self.inner, what, self.client.put(self.my_key.clone(), member_value(self.inner), Some(put))).await?;
        if let Some(h) = r.header() {
            if self.mine.len() >= MINE_KEPT {
                self.mine.pop_front();
            }
            self.mine.push_back(h.revision());
        }
        self.inner.counters.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// This dispatcher's member key was written by someone else (or deleted): said, and
    /// written again with this dispatcher's lease and verdicts.
    async fn register_again(&mut self) -> anyhow::Result<()> {
        crate::ratelimit::warn_that(
            "member key overwritten",
            &format_args!("this dispatcher's member key {} was written by someone else: writing it again", self.my_key),
        );
        self.register("registering again").await
    }

    /// A watch message: each event applied to the view in place (a flood costs what each
    /// key costs, never a copy of everything per message), then to the cluster.
    async fn watched(&mut self, resp: &etcd_client::WatchResponse) -> anyhow::Result<()> {
        let w = self.apply_events(resp);
        let (cfg, servers) = self.inner.current.read().unwrap().clone();
        let by_name = backend_index(&servers);
        for (id, b) in w.clones {
            if let Some(&i) = by_name.get(b.as_str()) {
                servers.adopt_shared_clone(id.as_bytes(), i);
            }
        }
        for id in w.gone {
            servers.forget_shared_clone(id.as_bytes());
        }
        {
            let st = self.inner.state.lock().unwrap();
            for b in w.ops {
                if let Some(&i) = by_name.get(b.as_str()) {
                    apply_backend(&cfg, &servers, &st.view, i, true);
                }
            }
            if w.verdicts {
                for i in 0..servers.backends.len() {
                    apply_backend(&cfg, &servers, &st.view, i, false);
                }
                publish_peers(self.inner, &st.view);
            }
        }
        if w.mine_overwritten {
            // Another writer put this dispatcher's member key: it is written again, with
            // this dispatcher's lease and verdicts.
            self.register_again().await?;
        }
        Ok(())
    }

    fn apply_events(&self, resp: &etcd_client::WatchResponse) -> Watched {
        let mut w = Watched::default();
        let mut st = self.inner.state.lock().unwrap();
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            if kv.mod_revision() <= self.seen_upto {
                continue;
            }
            let put = ev.event_type() == EventType::Put;
            // This dispatcher's own member key, written by someone else (another lease,
            // or this one at a revision it did not write) or deleted: written again.
            if kv.key() == self.my_key.as_bytes()
                && (!put || kv.lease() != self.lease || !self.mine.contains(&kv.mod_revision()))
            {
                w.mine_overwritten = true;
            }
            let change = st.view.apply(&self.policy, &self.prefix, kv.key(), put.then(|| kv.value()), kv.lease());
            note_refused(self.inner, &change, kv.key());
            match change {
                Change::Verdicts => w.verdicts = true,
                Change::Operator { backend, .. } => w.ops.push(backend),
                Change::Clone { id, backend } => w.clones.push((id, backend)),
                Change::CloneGone { id } => w.gone.push(id),
                Change::None | Change::Refused(_) => {}
            }
        }
        if let Some(h) = resp.header() {
            st.revision = h.revision();
        }
        w
    }

    /// What the agent or the cluster asks to be told.
    async fn publish(&mut self, p: Publish) -> anyhow::Result<()> {
        let inner = self.inner;
        match p {
            Publish::Reloaded => {
                let cfg = inner.current.read().unwrap().0.clone();
                match refresh(inner, &mut self.client, &mut self.policy, &cfg, &self.dir).await? {
                    Some(rev) => self.seen_upto = rev,
                    None => {
                        // Same peers and backends: the new cluster takes the shared state
                        // as it stands.
                        let st = inner.state.lock().unwrap();
                        apply_all(inner, &st.view);
                    }
                }
                Ok(())
            }
            // The member key carries the verdicts, with the lease.
            Publish::Verdicts => self.register("publishing verdicts").await,
            p => {
                if let Err(e) = write(inner, &mut self.client, &p).await {
                    keep_pending(inner, p);
                    return Err(e);
                }
                Ok(())
            }
        }
    }
}

/// Everything under `dir`, page by page at one revision, each key judged by `policy` as
/// it comes: the view and its revision.
async fn snapshot(inner: &Inner, client: &mut Client, policy: &Policy, dir: &str) -> anyhow::Result<(view::View, i64)> {
    let prefix = &inner.settings.key_prefix;
    let mut v = view::View::default();
    let mut from = dir.as_bytes().to_vec();
    let mut end = dir.as_bytes().to_vec();
    *end.last_mut().unwrap() += 1;
    let mut revision = 0;
    loop {
        let mut opts = GetOptions::new().with_range(end.clone()).with_limit(SNAPSHOT_PAGE);
        if revision != 0 {
            opts = opts.with_revision(revision);
        }
        let page = timed(inner, "reading the shared state", client.get(from.clone(), Some(opts))).await?;
        if revision == 0 {
            revision = page.header().map(|h| h.revision()).ok_or_else(|| anyhow!("a snapshot without a revision"))?;
        }
        for kv in page.kvs() {
            let change = v.apply(policy, prefix, kv.key(), Some(kv.value()), kv.lease());
            note_refused(inner, &change, kv.key());
        }
        match page.kvs().last() {
            Some(last) if page.more() => {
                from = last.key().to_vec();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((v, revision))
}

/// Counts and logs (rate-limited) a key the view did not take.
fn note_refused(inner: &Inner, change: &Change, key: &[u8]) {
    if let Change::Refused(r) = change {
        inner.counters.refused[*r as usize].fetch_add(1, Ordering::Relaxed);
        crate::ratelimit::warn_that(
            "shared key refused",
            &format_args!(
                "refused a key from the shared store ({}): {}",
                r.label(),
                String::from_utf8_lossy(&key[..key.len().min(160)]).escape_debug()
            ),
        );
    }
}

/// Aborts a task when dropped (the session's renewals end with the session).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The lease renewals and the store's health, three times per lease, until one fails
/// (then `lost` says why).
async fn renew(
    inner: Arc<Inner>,
    mut client: Client,
    mut keeper: etcd_client::LeaseKeeper,
    mut renewed: etcd_client::LeaseKeepAliveStream,
    lost: tokio::sync::oneshot::Sender<anyhow::Error>,
) {
    let mut tick = tokio::time::interval(renew_every(inner.settings.lease_ttl));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let err = loop {
        tick.tick().await;
        // A renewal needs the store's leader: without a quorum it times out, and the
        // session ends (status: unreachable).
        inner.counters.renewals.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = timed(&inner, "renewing the lease", keeper.keep_alive()).await {
            break e;
        }
        match timed(&inner, "renewing the lease", renewed.message()).await {
            Ok(Some(r)) if r.ttl() > 0 => {}
            Ok(_) => break anyhow!("the membership lease expired"),
            Err(e) => break e,
        }
        store_health(&inner, &mut client).await;
    };
    let _ = lost.send(err);
}

/// After a reload: when the peers or the backends changed (`policy` differs from what
/// `cfg` says), the store is read again and applied to the new cluster; returns the new
/// snapshot's revision (watch events at or below it are in the view already).
async fn refresh(
    inner: &Inner,
    client: &mut Client,
    policy: &mut Policy,
    cfg: &crate::config::Config,
    dir: &str,
) -> anyhow::Result<Option<i64>> {
    let next = Policy::for_config(cfg);
    if next == *policy {
        return Ok(None);
    }
    *policy = next;
    let (fresh, rev) = snapshot(inner, client, policy, dir).await?;
    apply_all(inner, &fresh);
    publish_peers(inner, &fresh);
    {
        let mut st = inner.state.lock().unwrap();
        st.view = fresh;
        st.revision = rev;
    }
    tracing::info!(revision = rev, "shared state read again for the reloaded configuration");
    Ok(Some(rev))
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
                                crate::ratelimit::warn_that(
                                    "shared clone owner",
                                    &format_args!("clone ID {id} learned for {backend} here and for {owner} elsewhere first: taking the shared owner"),
                                );
                                let servers = inner.current.read().unwrap().1.clone();
                                if let Some(&i) = backend_index(&servers).get(owner.as_ref()) {
                                    servers.adopt_shared_clone(id.as_bytes(), i);
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
        Publish::Verdicts | Publish::Reloaded => {}
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
