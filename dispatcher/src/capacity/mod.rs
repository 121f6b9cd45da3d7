//! What the request path may take of this host and of each backend, shared by every
//! worker and handed to a reload's successor: the client connections open, the TLS
//! handshakes in progress, the descriptor budget of idle upstream connections
//! (`Capacity`, owned by the HTTP server's generation), `maxconn` slots with their queue
//! per backend (`queue`), and per-source client connection limits (`sources`); it carries
//! the ring of refused requests (`refusals`) across reloads. Depends on the configuration,
//! the metrics, the TLS statistics and that ring only.

pub mod queue;
pub mod sources;

use std::sync::{
    atomic::{AtomicU64, AtomicUsize, Ordering},
    Arc,
};

use crate::{config::Config, metrics::Histogram, tls::server::TlsStats};

/// The request path's capacity over all HTTP VIPs: made with the first configuration,
/// handed by each HTTP server generation to the one a reload replaces it with
/// (`successor`), so that no cap is doubled while the previous listeners drain and the
/// per-VIP totals go on.
pub struct Capacity {
    /// Open client connections over all HTTP VIPs (the global cap).
    pub client_connections: Arc<AtomicUsize>,
    /// Idle upstream connections all pools may keep.
    pub idle_budget: Arc<IdleBudget>,
    /// TLS handshakes in progress over all HTTPS VIPs (`http.max_tls_handshakes`, and the
    /// semaphore that enforces it).
    pub tls_handshakes: (usize, Arc<tokio::sync::Semaphore>),
    /// Client connections per source address.
    pub sources: Arc<sources::SourceLimiter>,
    /// Per VIP, indexed like `Config::vips`.
    pub vips: Vec<VipStats>,
    /// Per farm, indexed like `Config::farms`, and per route, like `Config::routes`:
    /// shared with a reload's predecessor and successor by name (a farm) or by what it
    /// matches (a route), so that totals go on.
    pub farms: Vec<Keyed<PathStats>>,
    pub routes: Vec<Keyed<PathStats>>,
    /// The last requests refused as malformed (`GET /errors`), kept across reloads.
    pub refusals: Arc<crate::refusals::Refusals>,
}

/// Statistics and what identifies their subject across a reload.
pub struct Keyed<T> {
    pub key: String,
    pub stats: Arc<T>,
}

/// What the request path counts per farm and per route.
#[derive(Default)]
pub struct PathStats {
    /// Requests routed to it.
    pub requests: AtomicU64,
    /// Routing decisions that sent a request to the owner its session names.
    pub affinity_hits: AtomicU64,
    /// Routing decisions that sent a session's request to the owner's replica (the owner
    /// out).
    pub failovers: AtomicU64,
    /// Routing decisions left to the balancer.
    pub balanced: AtomicU64,
    /// Session requests sent to neither the owner nor its replica (must stay 0).
    pub misroutes: AtomicU64,
}

/// What the request path counts per HTTP VIP.
#[derive(Default)]
pub struct VipStats {
    /// Time to the response head.
    pub latency: Histogram,
    /// Request heads received (answered by a backend or by the dispatcher itself).
    pub requests: AtomicU64,
    /// Open client connections (shared with a reload's successor: the per-VIP cap counts
    /// the draining connections too).
    pub connections: Arc<AtomicU64>,
    /// TLS handshakes (HTTPS VIPs), shared with a reload's successor.
    pub tls: Arc<TlsStats>,
    /// Requests no route matched (answered 404).
    pub no_route: AtomicU64,
    /// Final statuses clients got, by class (the dispatcher's own answers included).
    pub responses: crate::metrics::StatusClasses,
}

impl Capacity {
    /// For a first configuration.
    pub fn new(cfg: &Config) -> Capacity {
        Capacity {
            client_connections: Default::default(),
            idle_budget: Arc::new(IdleBudget::for_descriptors(descriptor_limit())),
            tls_handshakes: (
                cfg.http.max_tls_handshakes,
                Arc::new(tokio::sync::Semaphore::new(cfg.http.max_tls_handshakes)),
            ),
            sources: Default::default(),
            vips: cfg.vips.iter().map(|_| VipStats::default()).collect(),
            farms: (cfg.farms.iter()).map(|f| Keyed { key: f.name.clone(), stats: Default::default() }).collect(),
            // A route's identity across reloads is its name: its counters go on when its
            // patterns change, and stay its own when routes are inserted before it.
            routes: (cfg.routes.iter()).map(|r| Keyed { key: r.name.clone(), stats: Default::default() }).collect(),
            refusals: Default::default(),
        }
    }

    /// For `cfg`, replacing this one on a reload (VIP ids kept by name): the same counts,
    /// budget and per-source table; the same handshake semaphore when the cap is the same;
    /// per VIP the same connection gauge and TLS statistics, and the request totals go on.
    pub fn successor(&self, cfg: &Config) -> Capacity {
        let mut c = Capacity::new(cfg);
        c.client_connections = self.client_connections.clone();
        c.sources = self.sources.clone();
        c.idle_budget = self.idle_budget.clone();
        c.refusals = self.refusals.clone();
        if c.tls_handshakes.0 == self.tls_handshakes.0 {
            c.tls_handshakes = self.tls_handshakes.clone();
        }
        for (new, prev) in c.vips.iter_mut().zip(&self.vips) {
            new.connections = prev.connections.clone();
            new.tls = prev.tls.clone();
            new.requests.store(prev.requests.load(Ordering::Relaxed), Ordering::Relaxed);
            new.no_route.store(prev.no_route.load(Ordering::Relaxed), Ordering::Relaxed);
            for (to, from) in new.responses.0.iter().zip(&prev.responses.0) {
                to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
        for (news, prevs) in [(&mut c.farms, &self.farms), (&mut c.routes, &self.routes)] {
            for new in news.iter_mut() {
                if let Some(prev) = prevs.iter().find(|p| p.key == new.key) {
                    new.stats = prev.stats.clone();
                }
            }
        }
        c
    }
}

/// The descriptor limit this process runs with.
pub fn descriptor_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|(soft, _)| soft).unwrap_or(1024)
}

/// How many idle upstream connections all pools may keep together: every one is a
/// descriptor, and a burst on one VIP followed by a burst on another must not leave the
/// first one's idle connections eating the descriptors the second needs.
pub struct IdleBudget {
    count: AtomicU64,
    cap: u64,
}

impl IdleBudget {
    pub fn new(cap: u64) -> IdleBudget {
        IdleBudget { count: AtomicU64::new(0), cap }
    }

    /// For a descriptor limit: an eighth of it (at least 16).
    pub fn for_descriptors(nofile: u64) -> IdleBudget {
        IdleBudget::new(idle_cap(nofile))
    }

    pub(crate) fn take(self: &Arc<Self>) -> Option<IdleSlot> {
        let mut n = self.count.load(Ordering::Relaxed);
        loop {
            if n >= self.cap {
                return None;
            }
            match self.count.compare_exchange_weak(n, n + 1, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(IdleSlot(self.clone())),
                Err(now) => n = now,
            }
        }
    }

    pub fn idle(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// The idle connections all pools may keep for a descriptor limit.
pub fn idle_cap(nofile: u64) -> u64 {
    (nofile / 8).max(16)
}

/// An idle connection's place in the budget, given back when it leaves the idle list.
pub(crate) struct IdleSlot(Arc<IdleBudget>);

impl Drop for IdleSlot {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload that inserts a route before a named one: its counters go on under its
    /// name, and the new route starts from zero.
    #[test]
    fn a_routes_counters_follow_its_name_across_a_reload() {
        let base = "[dispatcher]\ninterface = \"eth0\"\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\n\
                    [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n\
                    [[farm]]\nname = \"f\"\nservers = [\"a\"]\n";
        let shop = "[[route]]\nname = \"shop\"\nhosts = [\"*\"]\nuris = [\"/shop/*\"]\nfarm = \"f\"\n";
        let new = "[[route]]\nname = \"new\"\nhosts = [\"*\"]\nuris = [\"/new/*\"]\nfarm = \"f\"\n";
        let before = Config::parse(&format!("{base}{shop}"), "t").unwrap();
        let cap = Capacity::new(&before);
        cap.routes[0].stats.requests.store(7, Ordering::Relaxed);
        let after = Config::parse(&format!("{base}{new}{shop}"), "t").unwrap();
        assert_eq!((after.routes[0].name.as_str(), after.routes[1].name.as_str()), ("new", "shop"));
        let next = cap.successor(&after);
        let load = |i: usize| next.routes[i].stats.requests.load(Ordering::Relaxed);
        assert_eq!((load(0), load(1)), (0, 7));
    }
}
