//! Which backend of a farm a request goes to: the first live owner among its session's
//! clone IDs that is a server of the farm; without a usable session, the farm's
//! balancing policy over its primary servers, or over its backup servers while no
//! primary is up. A session never leaves its route's farm: a clone ID owned by a server
//! of another farm counts as unknown there (balanced within the farm, never a misroute).

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Mutex,
    },
    time::Duration,
};

use dispatcher_common::BackendState;

use super::session::SessionId;
use crate::{
    capacity::PathStats,
    config::{Balance, HttpSettings, SessionFormat},
    state::{Backend, Servers},
};

/// A farm as the request path uses it: its balancing state, its session format, its
/// timeouts, its counters. One per farm, shared by every VIP and worker.
pub struct FarmCtx {
    /// The farm's name (an implicit farm's is its VIP's).
    pub name: std::sync::Arc<str>,
    /// Made from a VIP's own backends (`config::Farm::implicit`): logged and shown under
    /// the VIP's name.
    pub implicit: bool,
    pub route: FarmRoute,
    /// How the session ID names its server in this farm.
    pub session_format: SessionFormat,
    /// `[http]` with the farm's `connect_timeout` and `io_timeout` (`server_timeout`).
    pub settings: std::sync::Arc<HttpSettings>,
    pub stats: std::sync::Arc<PathStats>,
}

/// A route of a VIP as the request path uses it.
pub struct RouteCtx {
    /// Index in `Config::routes`.
    pub index: usize,
    pub farm: std::sync::Arc<FarmCtx>,
    /// The session cookie's name (the plug-in's `AffinityCookie`) and the URL's session
    /// parameter (`AffinityURLIdentifier`).
    pub cookie: Box<[u8]>,
    pub url_parameter: Box<[u8]>,
    pub stats: std::sync::Arc<PathStats>,
    /// Its name in the access log: `config::Route::name` (`None`: the implicit
    /// catch-all of a VIP's own farm, logged under the VIP's name).
    pub label: Option<std::sync::Arc<str>>,
}

/// The routes of one HTTP VIP: the matcher and, by its targets, the routes.
pub struct VipRoutes {
    table: crate::routes::Table,
    routes: Vec<RouteCtx>,
    /// The VIP's only route matches every request (its implicit catch-all): no lookup.
    always: bool,
}

impl VipRoutes {
    /// `patterns`: each route's (hosts, URIs), in the order of `routes`.
    pub fn new(routes: Vec<RouteCtx>, patterns: &[(Vec<String>, Vec<String>)]) -> Result<VipRoutes, String> {
        let matcher: Vec<crate::routes::Route> = (patterns.iter().enumerate())
            .map(|(target, (hosts, uris))| crate::routes::Route { hosts: hosts.clone(), uris: uris.clone(), target })
            .collect();
        let table = crate::routes::Table::new(&matcher).map_err(|e| e.to_string())?;
        let catch_all = |(h, u): &(Vec<String>, Vec<String>)| {
            h.iter().any(|h| h == "*:*") && u.iter().any(|u| u == "/*" || u == "*")
        };
        let always = routes.len() == 1 && patterns.first().is_some_and(catch_all);
        Ok(VipRoutes { table, routes, always })
    }

    /// The route of a request: `host` is the absolute-form authority or the Host header
    /// (`None`: neither), `path` the request's path.
    pub fn find(&self, host: Option<&str>, vip_port: u16, path: &str) -> Option<&RouteCtx> {
        if self.always {
            return self.routes.first();
        }
        self.table.find(host, vip_port, path).map(|m| &self.routes[m.target])
    }

    pub fn routes(&self) -> &[RouteCtx] {
        &self.routes
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// The session's owner (or, the owner being out, its peer replica).
    Affinity(usize),
    /// No usable session: balanced.
    Balanced(usize),
    /// The session's owner and replica are both out: never another server.
    SessionUnavailable,
    /// The session's owner is suspect: wait for its state to resolve.
    Hold(usize),
    /// No backend of the farm is eligible.
    NoBackend,
    /// `[cluster]`: the session's clone IDs are known to no one here yet; another
    /// dispatcher may have learned them a moment ago. Wait (bounded by `learn_wait`) for
    /// the shared table rather than send the session to a server that may not own it.
    AwaitShared,
}

/// The balancing state of one farm (shared by every VIP and worker that routes to it).
pub struct FarmRoute {
    /// Backend ids of the farm: its primary servers, then its backup servers.
    pub members: Vec<usize>,
    /// How many of `members` are primaries.
    primaries: usize,
    balance: Balance,
    /// `fail_back`: the cookie's clone IDs in their order (the first owner first), or
    /// newest first (the clone that took the session over keeps it).
    fail_back: bool,
    /// Smooth weighted round robin state, per member.
    current: Mutex<Vec<i64>>,
    rotate: AtomicUsize,
    /// `slow_start` per member (`None` for all when no member has one: no clock read).
    slow: Option<Vec<Option<Duration>>>,
}

/// The owner's own answer: held while it is suspect (ownership unknown: wait, never
/// guess), served while it keeps its sessions; `None` when it is out.
fn owner_decision(servers: &Servers, owner: usize, hold_expired: bool) -> Option<Decision> {
    let state = servers.backends[owner].state();
    if state == BackendState::Suspect && !hold_expired {
        return Some(Decision::Hold(owner));
    }
    if state.keeps() && state != BackendState::Suspect {
        servers.counters.affinity_hits.fetch_add(1, Ordering::Relaxed);
        return Some(Decision::Affinity(owner));
    }
    None
}

/// The owner being out, its replica: held while suspect, served while up or draining,
/// else nobody (never a third server).
fn replica_decision(servers: &Servers, replica: usize, hold_expired: bool) -> Decision {
    match servers.backends[replica].state() {
        BackendState::Suspect if !hold_expired => Decision::Hold(replica),
        BackendState::Up | BackendState::Drain => Decision::Affinity(replica),
        _ => Decision::SessionUnavailable,
    }
}

impl FarmRoute {
    /// A farm of primary servers only.
    pub fn new(members: Vec<usize>, balance: Balance, fail_back: bool) -> FarmRoute {
        let n = members.len();
        FarmRoute {
            members,
            primaries: n,
            balance,
            fail_back,
            current: Mutex::new(vec![0; n]),
            rotate: AtomicUsize::new(0),
            slow: None,
        }
    }

    /// Members' `slow_start`, in `members` order: a member that came back gets a share of
    /// new sessions that grows with its weight scaled from 5% to 100% over it.
    pub fn with_slow_start(mut self, slow: Vec<Option<Duration>>) -> FarmRoute {
        self.slow = slow.iter().any(Option::is_some).then_some(slow);
        self
    }

    /// Backup servers (after the primaries in `members`): balanced to only while no
    /// primary is up; a session one of them owns stays with it while it serves.
    pub fn with_backups(mut self, backups: &[usize]) -> FarmRoute {
        for &b in backups {
            if !self.members.contains(&b) {
                self.members.push(b);
            }
        }
        self.current = Mutex::new(vec![0; self.members.len()]);
        self
    }

    /// `hold_expired`: the request was already held for the whole hold time; a suspect
    /// owner is then treated as out (its replica serves, or 503). `learn_waited`: it
    /// waited for the shared table already (or need not): unknown clone IDs are balanced.
    pub fn route(
        &self,
        servers: &Servers,
        session: Option<&SessionId>,
        hold_expired: bool,
        learn_waited: bool,
    ) -> Decision {
        if let Some(s) = session {
            let mut first_known = None;
            // WebSphere appends the clone ID of a clone that takes a session over: without
            // fail-back, that newest owner comes first.
            let n = s.clones.len();
            for k in 0..n {
                let id = &s.clones[if self.fail_back { k } else { n - 1 - k }];
                let Some((owner, replica)) = servers.owner(id) else { continue };
                if !self.members.contains(&owner) {
                    continue;
                }
                if let Some(d) = owner_decision(servers, owner, hold_expired) {
                    return d;
                }
                first_known.get_or_insert(replica);
            }
            let unknown = first_known.is_none() && s.clones.iter().all(|id| servers.owner(id).is_none());
            if unknown && !s.clones.is_empty() && !learn_waited && servers.shared() {
                return Decision::AwaitShared;
            }
            if let Some(replica) = first_known {
                // The owner is out: only its replica holds the session's data.
                return match replica.filter(|r| self.members.contains(r)) {
                    Some(r) => replica_decision(servers, r, hold_expired),
                    None => Decision::SessionUnavailable,
                };
            }
        }
        match self.balanced(servers) {
            Some(b) => {
                servers.counters.balanced.fetch_add(1, Ordering::Relaxed);
                Decision::Balanced(b)
            }
            None => {
                servers.counters.no_backend.fetch_add(1, Ordering::Relaxed);
                Decision::NoBackend
            }
        }
    }

    /// A request kept on `backend` by the VIP's persistence cookie: the same rules as a
    /// session's owner (held while suspect, its replica while it is out, never a third
    /// server while it has one); a backend without a replica in the VIP, or no longer in
    /// the VIP, gives way to balancing.
    pub fn route_pinned(&self, servers: &Servers, backend: usize, hold_expired: bool) -> Decision {
        if !self.members.contains(&backend) {
            return self.route(servers, None, hold_expired, true);
        }
        if let Some(d) = owner_decision(servers, backend, hold_expired) {
            return d;
        }
        match servers.backends[backend].replica.filter(|r| self.members.contains(r)) {
            Some(r) => replica_decision(servers, r, hold_expired),
            // No replica to keep its state: balanced, as HAProxy redispatches a cookie
            // whose server is down (the response's cookie names the new server).
            None => self.route(servers, None, hold_expired, true),
        }
    }

    /// How well `session` fits this farm, for a request carrying several (0 best): 0 a
    /// clone ID of it names one of the farm's servers, 1 none is known (perhaps a server
    /// not learned yet), 2 they name other farms' servers only.
    pub fn rank(&self, servers: &Servers, session: &SessionId) -> u8 {
        let mut known = false;
        for id in &session.clones {
            if let Some((owner, _)) = servers.owner(id) {
                if self.members.contains(&owner) {
                    return 0;
                }
                known = true;
            }
        }
        if known {
            2
        } else {
            1
        }
    }

    /// Whether `backend` may serve a request of `session`: one of its clones' owners or
    /// their replicas (the misroute check). Only the clone IDs the farm's servers own
    /// count: a session of another farm is balanced within this one.
    pub fn may_serve(&self, servers: &Servers, session: &SessionId, backend: usize) -> bool {
        let mut known = false;
        for id in &session.clones {
            if let Some((owner, replica)) = servers.owner(id).filter(|(o, _)| self.members.contains(o)) {
                known = true;
                if owner == backend || replica == Some(backend) {
                    return true;
                }
            }
        }
        !known
    }

    fn balanced(&self, servers: &Servers) -> Option<usize> {
        // The primaries, or the backups while no primary is up.
        let primary_up = self.members[..self.primaries].iter().any(|&b| servers.backends[b].is_up());
        let backups = self.primaries..self.members.len();
        if !primary_up {
            return self.balanced_in(servers, backups);
        }
        // The last primary may go down meanwhile: then the backups.
        self.balanced_in(servers, 0..self.primaries).or_else(|| self.balanced_in(servers, backups))
    }

    /// A balanced pick among the members in `range`.
    fn balanced_in(&self, servers: &Servers, range: std::ops::Range<usize>) -> Option<usize> {
        // Servers at their `maxconn` are passed over while another has room; when all are
        // full, the pick queues on its server as usual.
        let any_room = self.members[range.clone()]
            .iter()
            .map(|&b| &servers.backends[b])
            .any(|be| be.is_up() && be.slots.has_room());
        // Other workers take slots meanwhile: the one with room may be full when asked
        // again, and then every up member is a candidate (the pick queues).
        self.pick(servers, range.clone(), any_room).or_else(|| {
            if any_room {
                self.pick(servers, range, false)
            } else {
                None
            }
        })
    }

    /// A balanced pick among the up members of `range`; with `room_only`, among those with
    /// a free slot.
    fn pick(&self, servers: &Servers, range: std::ops::Range<usize>, room_only: bool) -> Option<usize> {
        let eligible = |be: &Backend| be.is_up() && (!room_only || be.slots.has_room());
        // A member ramping up after its return (`slow_start`) weighs a share of its weight.
        let now = if self.slow.is_some() { crate::metrics::mono_ns() } else { 0 };
        let weight = |i: usize, be: &Backend| -> u64 {
            match &self.slow {
                None => be.weight() as u64,
                Some(slow) => be.ramped_weight(be.weight(), slow[i], now),
            }
        };
        // The eligible members of the range: (index in `members`, backend, weight).
        let candidates = range.filter_map(|i| {
            let be = &servers.backends[self.members[i]];
            eligible(be).then(|| (i, be, weight(i, be)))
        });
        match self.balance {
            Balance::RoundRobin => self.round_robin(candidates),
            Balance::LeastOutstanding => self.least_outstanding(candidates.collect()),
            Balance::Random => self.weighted_random(candidates),
        }
    }

    /// nginx's smooth weighted round robin: each pick adds every weight to its member's
    /// credit, takes the largest, and charges it the total.
    fn round_robin<'a>(&self, candidates: impl Iterator<Item = (usize, &'a Backend, u64)>) -> Option<usize> {
        let mut cur = self.current.lock().unwrap();
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for (i, _, w) in candidates {
            cur[i] += w as i64;
            total += w as i64;
            if best.is_none_or(|j| cur[i] > cur[j]) {
                best = Some(i);
            }
        }
        let i = best?;
        cur[i] -= total;
        Some(self.members[i])
    }

    /// Fewest in flight per unit of weight; ties rotate.
    fn least_outstanding(&self, candidates: Vec<(usize, &Backend, u64)>) -> Option<usize> {
        let n = candidates.len();
        let start = self.rotate.fetch_add(1, Ordering::Relaxed);
        let mut best: Option<(usize, u64, u64)> = None;
        for k in 0..n {
            let (i, be, w) = candidates[(start + k) % n];
            let o = be.outstanding.load(Ordering::Relaxed);
            if best.is_none_or(|(_, bo, bw)| o * bw < bo * w) {
                best = Some((self.members[i], o, w));
            }
        }
        best.map(|(b, _, _)| b)
    }

    /// Weighted random (the plug-in's `Random`): a draw over the eligible members' total
    /// weight.
    fn weighted_random<'a>(&self, candidates: impl Iterator<Item = (usize, &'a Backend, u64)>) -> Option<usize> {
        let candidates: Vec<(usize, u64)> = candidates.map(|(i, _, w)| (self.members[i], w)).collect();
        let total: u64 = candidates.iter().map(|(_, w)| w).sum();
        let mut draw = random(&self.rotate) % total.max(1);
        for (b, w) in candidates {
            if draw < w {
                return Some(b);
            }
            draw -= w;
        }
        None
    }
}

/// A random number from a shared counter (splitmix64: a counter stepped by the golden
/// ratio, then mixed): good enough to spread requests, and lock-free.
fn random(state: &AtomicUsize) -> u64 {
    let mut z = (state.fetch_add(0x9E37_79B9_7F4A_7C15_u64 as usize, Ordering::Relaxed) as u64)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::Config, http::session};
    use dispatcher_common::{Health, Operator};

    const CFG: &str = r#"
[dispatcher]
interface = "eth0"
[[backend]]
name = "a"
address = "10.0.0.1"
replica = "b"
clone_ids = ["cA"]
[[backend]]
name = "b"
address = "10.0.0.2"
replica = "a"
clone_ids = ["cB"]
weight = 300
[[backend]]
name = "c"
address = "10.0.0.3"
clone_ids = ["cC"]
logical_names = ["lnC"]
[[partition]]
id = "-42"
primary = "c"
replica = "a"
[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"
"#;

    fn setup(balance: Balance) -> (Servers, FarmRoute) {
        let cfg = Config::parse(CFG, "t").unwrap();
        let servers = Servers::new(&cfg, &[Health::Up; 3], &[Operator::None; 3], None);
        (servers, FarmRoute::new(vec![0, 1, 2], balance, true))
    }

    fn route(c: &Servers, r: &FarmRoute, cookie: &str) -> Decision {
        r.route(c, session::parse(cookie.as_bytes()).as_ref(), false, true)
    }

    #[test]
    fn ibmappid_goes_to_the_logical_names_owner_and_fails_over_with_it() {
        let (c, r) = setup(Balance::RoundRobin);
        let s = session::app_session(b"/app;ibmappid=lnC.1153242645968.4_2_2");
        assert_eq!(r.route(&c, s.as_ref(), false, true), Decision::Affinity(2));
        c.set_health(2, Health::Suspect);
        assert!(matches!(r.route(&c, s.as_ref(), false, true), Decision::Hold(_)), "held, as a clone ID is");
    }

    #[test]
    fn first_live_clone_in_order() {
        let (c, r) = setup(Balance::RoundRobin);
        assert_eq!(route(&c, &r, "0000x:cB"), Decision::Affinity(1));
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Affinity(0));
        c.set_health(0, Health::Down);
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Affinity(1), "next clone in the list");
        assert_eq!(route(&c, &r, "0000x:cA"), Decision::Affinity(1), "the owner's replica");
        assert_eq!(route(&c, &r, "0000x:unknown:cA"), Decision::Affinity(1), "unknown IDs are skipped");
    }

    #[test]
    fn without_fail_back_the_clone_that_took_a_session_over_keeps_it() {
        let (c, _) = setup(Balance::RoundRobin);
        let r = FarmRoute::new(vec![0, 1, 2], Balance::RoundRobin, false);
        // cB took cA's session over (its ID appended): cB keeps it, cA being up again.
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Affinity(1));
        assert_eq!(route(&c, &r, "0000x:cA"), Decision::Affinity(0), "not taken over: its owner");
        // The newest owner suspect: held for it, never sent back to cA meanwhile.
        c.set_health(1, Health::Suspect);
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Hold(1));
        c.set_health(1, Health::Down);
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Affinity(0), "its replica when it is down");
    }

    #[test]
    fn clustered_an_unknown_clone_id_waits_for_the_shared_table_once() {
        let (c, r) = setup(Balance::RoundRobin);
        let s = session::parse(b"0000x:cNew");
        // Standalone: balanced at once, as the plug-in does.
        assert!(matches!(r.route(&c, s.as_ref(), false, false), Decision::Balanced(_)));
        let _news = c.subscribe_news();
        assert_eq!(r.route(&c, s.as_ref(), false, false), Decision::AwaitShared);
        assert!(matches!(r.route(&c, s.as_ref(), false, true), Decision::Balanced(_)), "after the wait");
        // A known ID among them: no wait; no session at all: no wait.
        assert_eq!(r.route(&c, session::parse(b"0000x:cNew:cB").as_ref(), false, false), Decision::Affinity(1));
        assert!(matches!(r.route(&c, None, false, false), Decision::Balanced(_)));
        // Shared a moment later: its owner.
        c.adopt_shared_clone(b"cNew", 2);
        assert_eq!(r.route(&c, s.as_ref(), false, false), Decision::Affinity(2));
    }

    #[test]
    fn a_draining_owner_keeps_its_sessions_but_gets_no_new_ones() {
        let (c, r) = setup(Balance::RoundRobin);
        c.set_admin(1, Operator::Drain);
        assert_eq!(route(&c, &r, "0000x:cB"), Decision::Affinity(1));
        for _ in 0..10 {
            assert_ne!(r.route(&c, None, false, true), Decision::Balanced(1));
        }
    }

    #[test]
    fn a_suspect_owner_holds_its_sessions_until_the_hold_expires() {
        let (c, r) = setup(Balance::RoundRobin);
        c.set_health(0, Health::Suspect);
        assert_eq!(route(&c, &r, "0000x:cA"), Decision::Hold(0));
        assert_eq!(route(&c, &r, "0000x:cA:cB"), Decision::Hold(0), "order matters: cA first");
        let s = session::parse(b"0000x:cA");
        assert_eq!(r.route(&c, s.as_ref(), true, true), Decision::Affinity(1), "after the hold: the replica");
        c.set_health(1, Health::Down);
        assert_eq!(r.route(&c, s.as_ref(), true, true), Decision::SessionUnavailable);
        for _ in 0..5 {
            assert_ne!(r.route(&c, None, false, true), Decision::Balanced(0), "no new work for a suspect");
        }
    }

    #[test]
    fn partitions_resolve_through_the_table() {
        let (c, r) = setup(Balance::RoundRobin);
        assert_eq!(route(&c, &r, "0000x:-42"), Decision::Affinity(2));
        c.set_health(2, Health::Down);
        assert_eq!(route(&c, &r, "0000x:-42"), Decision::Affinity(0), "partition replica");
        c.set_health(0, Health::Down);
        assert_eq!(route(&c, &r, "0000x:-42"), Decision::SessionUnavailable, "never a third server");
    }

    #[test]
    fn no_usable_session_is_balanced_by_weight() {
        let (c, r) = setup(Balance::RoundRobin);
        let mut n = [0; 3];
        for _ in 0..500 {
            match route(&c, &r, "0000x:nobody") {
                Decision::Balanced(b) => n[b] += 1,
                d => panic!("{d:?}"),
            }
        }
        assert_eq!(n, [100, 300, 100], "smooth WRR is exact over a full cycle");
        assert_eq!(r.route(&c, None, false, true), Decision::Balanced(1));
    }

    #[tokio::test]
    async fn servers_at_maxconn_are_passed_over_until_all_are_full_but_sessions_stay() {
        let cfg = Config::parse(&CFG.replace("weight = 300", "weight = 300\nmaxconn = 1\nmaxqueue = 5"), "t").unwrap();
        let c = Servers::new(&cfg, &[Health::Up; 3], &[Operator::None; 3], None);
        for balance in [Balance::RoundRobin, Balance::LeastOutstanding] {
            let r = FarmRoute::new(vec![0, 1], balance, true);
            let full = c.backends[1].slots.take(std::time::Instant::now()).await.unwrap();
            for _ in 0..10 {
                assert_eq!(r.route(&c, None, false, true), Decision::Balanced(0), "b is full: a has room");
            }
            // b's own session still goes to b (it will queue there), never to a.
            assert_eq!(route(&c, &r, "0000x:cB"), Decision::Affinity(1));
            drop(full);
            let picks: Vec<_> = (0..8).map(|_| r.route(&c, None, false, true)).collect();
            assert!(picks.contains(&Decision::Balanced(1)), "room again: {picks:?}");
        }
        // Every server full: the pick is made as without limits (and queues).
        let cfg = Config::parse(&CFG.replace("address = \"10.0.0.", "maxconn = 1\naddress = \"10.0.0."), "t").unwrap();
        let c = Servers::new(&cfg, &[Health::Up; 3], &[Operator::None; 3], None);
        let mut _slots = Vec::new();
        for b in &c.backends {
            _slots.push(b.slots.take(std::time::Instant::now()).await.unwrap());
        }
        let r = FarmRoute::new(vec![0, 1, 2], Balance::RoundRobin, true);
        assert!(matches!(r.route(&c, None, false, true), Decision::Balanced(_)));
    }

    #[test]
    fn a_slot_taken_while_balancing_never_leaves_the_request_without_a_server() {
        // One server with maxconn 1, its slot taken and given back by another thread all
        // the while: the balancer may see room, then none; the request still gets its
        // server (and would queue there), never "no backend".
        let cfg = Config::parse(&CFG.replace("address = \"10.0.0.", "maxconn = 1\naddress = \"10.0.0."), "t").unwrap();
        let c = std::sync::Arc::new(Servers::new(&cfg, &[Health::Up; 3], &[Operator::None; 3], None));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let toggler = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
                for _ in 0..2_000_000 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    drop(rt.block_on(c.backends[0].slots.take(std::time::Instant::now())));
                }
            })
        };
        let r = FarmRoute::new(vec![0], Balance::RoundRobin, true);
        let picks: Vec<_> = (0..200_000).map(|_| r.route(&c, None, false, true)).collect();
        stop.store(true, Ordering::Relaxed);
        toggler.join().unwrap();
        assert!(
            picks.iter().all(|d| *d == Decision::Balanced(0)),
            "{:?}",
            picks.iter().find(|d| **d != Decision::Balanced(0))
        );
    }

    #[test]
    fn the_last_primary_going_down_while_balancing_leaves_the_backups() {
        // Primary a, backup b; a goes down and up all the while: a request is balanced to
        // one of them, never left with "no backend" because a went down between "a
        // primary is up" and the pick.
        let (c, _) = setup(Balance::RoundRobin);
        let c = std::sync::Arc::new(c);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let toggler = {
            let (c, stop) = (c.clone(), stop.clone());
            std::thread::spawn(move || {
                for i in 0..4_000_000u32 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    c.set_health(0, if i % 2 == 0 { Health::Down } else { Health::Up });
                }
                c.set_health(0, Health::Up);
            })
        };
        let r = FarmRoute::new(vec![0], Balance::RoundRobin, true).with_backups(&[1]);
        let picks: Vec<_> = (0..200_000).map(|_| r.route(&c, None, false, true)).collect();
        stop.store(true, Ordering::Relaxed);
        toggler.join().unwrap();
        let odd = picks.iter().find(|d| !matches!(d, Decision::Balanced(0 | 1)));
        assert!(odd.is_none(), "{odd:?}");
    }

    #[test]
    fn a_pinned_request_follows_its_backend_then_its_replica_only() {
        let (c, r) = setup(Balance::RoundRobin);
        assert_eq!(r.route_pinned(&c, 1, false), Decision::Affinity(1));
        c.set_health(1, Health::Suspect);
        assert_eq!(r.route_pinned(&c, 1, false), Decision::Hold(1));
        c.set_health(1, Health::Down);
        assert_eq!(r.route_pinned(&c, 1, false), Decision::Affinity(0), "its replica");
        c.set_health(0, Health::Down);
        assert_eq!(r.route_pinned(&c, 1, false), Decision::SessionUnavailable, "never a third server");
        assert_eq!(r.route_pinned(&c, 2, false), Decision::Affinity(2));
        c.set_health(2, Health::Down);
        c.set_health(0, Health::Up);
        assert_eq!(r.route_pinned(&c, 2, false), Decision::Balanced(0), "no replica: balanced, not refused");
        let only_c = FarmRoute::new(vec![2], Balance::RoundRobin, true);
        c.set_health(2, Health::Up);
        assert_eq!(only_c.route_pinned(&c, 1, false), Decision::Balanced(2), "not a member: balanced");
    }

    #[test]
    fn a_member_back_from_down_ramps_up_over_slow_start_and_its_sessions_return_at_once() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[Health::Up; 3], &[Operator::None; 3], None);
        let slow = Duration::from_millis(400);
        let r = FarmRoute::new(vec![0, 2], Balance::RoundRobin, true).with_slow_start(vec![Some(slow), Some(slow)]);
        let share =
            |r: &FarmRoute| (0..200).filter(|_| r.route(&c, None, false, true) == Decision::Balanced(0)).count();
        assert!((90..=110).contains(&share(&r)), "equal weights: half each");
        c.set_health(0, Health::Down);
        c.set_health(0, Health::Up);
        let early = share(&r);
        assert!(early <= 20, "just back: about 5% of new sessions, got {early} of 200");
        assert_eq!(route(&c, &r, "0000x:cA"), Decision::Affinity(0), "its own sessions return at once");
        std::thread::sleep(slow / 2);
        let mid = share(&r);
        assert!((40..=90).contains(&mid), "half way: about a third, got {mid} of 200");
        std::thread::sleep(slow);
        assert!((90..=110).contains(&share(&r)), "ramp done");
        // A suspect that recovers never left: no ramp.
        c.set_health(0, Health::Suspect);
        c.set_health(0, Health::Up);
        assert!((90..=110).contains(&share(&r)));
        let cfg = Config::parse(CFG, "t").unwrap();
        assert_eq!(cfg.vips[0].slow_start_of(&cfg, 0), None);
    }

    /// Backups (the plug-in's `BackupServers`) get no new session while any primary is
    /// up, whatever the balance; a session one of them owns stays with it.
    #[test]
    fn backups_take_new_sessions_only_while_no_primary_is_up() {
        let (c, _) = setup(Balance::RoundRobin);
        for balance in [Balance::RoundRobin, Balance::LeastOutstanding, Balance::Random] {
            for b in 0..3 {
                c.set_health(b, Health::Up);
            }
            let r = FarmRoute::new(vec![0, 1], balance, true).with_backups(&[2]);
            let picks: Vec<_> = (0..20).map(|_| r.route(&c, None, false, true)).collect();
            assert!(picks.iter().all(|d| matches!(d, Decision::Balanced(0 | 1))), "{balance:?}: {picks:?}");
            assert_eq!(route(&c, &r, "0000x:cC"), Decision::Affinity(2), "the backup's own session");
            c.set_health(0, Health::Down);
            assert!((0..10).all(|_| r.route(&c, None, false, true) == Decision::Balanced(1)), "{balance:?}");
            // A draining primary takes no new session: the backups do.
            c.set_admin(1, Operator::Drain);
            assert!((0..10).all(|_| r.route(&c, None, false, true) == Decision::Balanced(2)), "{balance:?}");
            c.set_admin(1, Operator::None);
            c.set_health(1, Health::Down);
            assert!((0..10).all(|_| r.route(&c, None, false, true) == Decision::Balanced(2)), "{balance:?}");
            c.set_health(0, Health::Up);
            assert_eq!(r.route(&c, None, false, true), Decision::Balanced(0), "{balance:?}: a primary is back");
        }
    }

    /// A session whose clone IDs belong to another farm is balanced within this one: never
    /// followed out of it, not held or awaited for it, and not a misroute.
    #[test]
    fn a_session_of_another_farm_is_balanced_within_the_farm() {
        let (c, _) = setup(Balance::RoundRobin);
        let shop = FarmRoute::new(vec![0, 1], Balance::RoundRobin, true);
        let other = FarmRoute::new(vec![2], Balance::RoundRobin, true);
        let s = session::parse(b"0000x:cC");
        for _ in 0..6 {
            let d = shop.route(&c, s.as_ref(), false, false);
            assert!(matches!(d, Decision::Balanced(0 | 1)), "{d:?}");
            let Decision::Balanced(b) = d else { unreachable!() };
            assert!(shop.may_serve(&c, s.as_ref().unwrap(), b), "not a misroute in this farm");
        }
        assert!(!other.may_serve(&c, s.as_ref().unwrap(), 0), "in its own farm, another server is one");
        assert_eq!(other.route(&c, s.as_ref(), false, false), Decision::Affinity(2));
        // Its owner suspect: nothing to hold for in this farm.
        c.set_health(2, Health::Suspect);
        assert!(matches!(shop.route(&c, s.as_ref(), false, false), Decision::Balanced(0 | 1)));
        // A clone of this farm among them: its owner.
        assert_eq!(shop.route(&c, session::parse(b"0000x:cC:cB").as_ref(), false, false), Decision::Affinity(1));
        // A partition whose primary is in another farm: balanced here too.
        assert!(matches!(shop.route(&c, session::parse(b"0000x:-42").as_ref(), false, false), Decision::Balanced(_)));
    }

    /// A request carrying two cookies of the route's name (a domain cookie of another
    /// farm's session first, then the host cookie of this farm's): this farm's session is
    /// the one routed, so it is neither balanced away nor lost.
    #[test]
    fn of_several_session_cookies_the_one_of_the_routes_farm_is_taken() {
        let (c, _) = setup(Balance::RoundRobin);
        let shop = FarmRoute::new(vec![0, 1], Balance::RoundRobin, true);
        let pick = |headers: &[&'static [u8]], target: &'static [u8]| {
            let s = session::find_ranked(
                headers.iter().copied(),
                target,
                b"JSESSIONID",
                b"jsessionid",
                crate::config::SessionFormat::WebSphere,
                |s| shop.rank(&c, s),
            );
            shop.route(&c, s.as_ref(), false, true)
        };
        let foreign_first: &[&[u8]] = &[b"JSESSIONID=0000a:cC; JSESSIONID=0000b:cB"];
        assert_eq!(pick(foreign_first, b"/"), Decision::Affinity(1));
        assert_eq!(pick(&[b"JSESSIONID=0000a:cC", b"JSESSIONID=0000b:cB"], b"/"), Decision::Affinity(1), "two fields");
        // Unknown before foreign: the unknown one (perhaps a server not learned yet).
        let s = session::find_ranked(
            [&b"JSESSIONID=0000a:cC; JSESSIONID=0000u:cNEW"[..]].into_iter(),
            b"/",
            b"JSESSIONID",
            b"jsessionid",
            crate::config::SessionFormat::WebSphere,
            |s| shop.rank(&c, s),
        );
        assert_eq!(s.unwrap().clones, vec![&b"cNEW"[..]]);
        // Both of this farm: the first, as before.
        assert_eq!(pick(&[b"JSESSIONID=0000a:cA; JSESSIONID=0000b:cB"], b"/"), Decision::Affinity(0));
        // Only another farm's: balanced within this one; the URL only without a cookie.
        assert!(matches!(pick(&[b"JSESSIONID=0000a:cC"], b"/;jsessionid=0000b:cB"), Decision::Balanced(0 | 1)));
        assert_eq!(pick(&[], b"/;jsessionid=0000b:cB"), Decision::Affinity(1));
    }

    #[test]
    fn least_outstanding_prefers_the_idle() {
        let (c, r) = setup(Balance::LeastOutstanding);
        c.backends[0].outstanding.store(5, Ordering::Relaxed);
        c.backends[1].outstanding.store(9, Ordering::Relaxed); // weight 3: 3 per unit
        c.backends[2].outstanding.store(4, Ordering::Relaxed);
        assert_eq!(r.route(&c, None, false, true), Decision::Balanced(1));
        for b in 0..c.backends.len() {
            c.set_health(b, Health::Down);
        }
        assert_eq!(r.route(&c, None, false, true), Decision::NoBackend);
    }

    #[test]
    fn learning_respects_configured_ids() {
        let (c, _) = setup(Balance::RoundRobin);
        assert_eq!(c.learn(b"newclone", 2), crate::state::Learned::New);
        assert_eq!(c.learn(b"newclone", 2), crate::state::Learned::Known);
        assert_eq!(c.learn(b"newclone", 0), crate::state::Learned::Conflict { owner: 2 });
        assert_eq!(c.learn(b"cA", 1), crate::state::Learned::Conflict { owner: 0 }, "configured wins");
        assert_eq!(c.owner(b"newclone"), Some((2, None)));
    }
}
