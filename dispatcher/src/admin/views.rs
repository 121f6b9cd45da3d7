//! What the admin endpoint shows: the agent's view as JSON (`GET /status`) and the
//! Prometheus text exposition (`GET /metrics`).

use std::sync::atomic::Ordering;

use dispatcher_common::stats;

use super::Admin;
use crate::api::{
    AgentStatus, BackendStatus, CertificateStatus, ChangeStatus, FarmStatus, PathCounts, QueueStatus, RouteStatus,
    TlsStatus, VipStatus,
};
use crate::{
    capacity::{Capacity, PathStats, VipStats},
    config::{Config, Vip, VipMode},
    dataplane::tables::SIP_ROUTED_BY,
    metrics::{Exposition, Family, StatusClasses},
    state::{Backend, Servers},
};

fn tls_status(t: &crate::tls::server::TlsStats) -> TlsStatus {
    TlsStatus {
        handshakes_full: t.full.load(Ordering::Relaxed),
        handshakes_resumed: t.resumed.load(Ordering::Relaxed),
        failures: t.failures().map(|(n, v)| (n.to_string(), v)).collect(),
        certificates: t
            .certs
            .read()
            .unwrap()
            .iter()
            .map(|c| CertificateStatus {
                file: c.file.clone(),
                subject: c.subject.clone(),
                names: c.names.clone(),
                not_after: c.not_after,
                expires_in_s: c.seconds_left(),
            })
            .collect(),
    }
}

pub fn status(a: &Admin) -> AgentStatus {
    let (cfg, c, _) = a.current();
    let cap = a.capacity();
    let load = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    let backends = c
        .backends
        .iter()
        .zip(&cfg.backends)
        .map(|(b, conf)| BackendStatus {
            name: b.name.clone(),
            state: b.state().name().into(),
            health: b.health().name().into(),
            admin: b.operator().name().into(),
            active: load(&b.outstanding),
            connections: load(&b.connections),
            requests: load(&b.requests),
            errors: load(&b.errors),
            queue: b.slots.max().map(|maxconn| {
                let q = &b.slots;
                let waited = load(&q.waits.count);
                QueueStatus {
                    maxconn,
                    in_flight: q.in_flight(),
                    maxqueue: q.max_queue(),
                    queued: q.queued(),
                    queued_total: load(&q.queued_total),
                    refused_full: load(&q.refused_full),
                    refused_timeout: load(&q.refused_timeout),
                    refused_left: load(&q.refused_left),
                    wait_mean_ms: if waited == 0 { 0.0 } else { load(&q.waits.sum_us) as f64 / waited as f64 / 1000.0 },
                }
            }),
            last_change: b.changes.lock().unwrap().last.map(|ch| ChangeStatus {
                from: ch.from.name().into(),
                to: ch.to.name().into(),
                reason: ch.reason.to_string(),
                reason_kind: ch.reason.kind().into(),
                check_ms: ch.check.map(|d| d.as_millis() as u64),
                at_unix: ch.at_unix,
            }),
            last_check_ms: last_check(b).map(|s| s * 1000.0),
            responses: classes(&b.responses),
            weight: b.weight(),
            configured_weight: conf.weight,
            configured_maxconn: conf.maxconn.map(u64::from),
            checks_disabled: b.checks_disabled(),
        })
        .collect();
    let vips = cfg
        .vips
        .iter()
        .zip(&cap.vips)
        .filter(|(v, _)| v.serves_http())
        .map(|(v, s)| VipStatus {
            name: v.name.clone(),
            address: v.address.to_string(),
            port: v.port,
            mode: if v.http().is_some_and(|h| h.tls.is_some()) { "https" } else { "http" }.into(),
            requests: load(&s.requests),
            connections: load(&s.connections),
            tls: v.http().and_then(|h| h.tls.as_ref()).map(|_| tls_status(&s.tls)),
            no_route: load(&s.no_route),
            responses: classes(&s.responses),
        })
        .collect();
    let (farms, routes) = farms_and_routes(&cfg, &cap);
    let xdp_vips = xdp_vips(a, &cfg);
    AgentStatus {
        pid: std::process::id(),
        uptime_s: a.started.elapsed().as_secs(),
        version: env!("CARGO_PKG_VERSION").into(),
        clones: c.clone_count(),
        pins_missing: a.pins_missing.lock().unwrap().iter().map(|p| p.to_string()).collect(),
        warnings: crate::dataplane::veth_trap(&cfg, a.steering.is_some()).into_iter().collect(),
        backends,
        vips,
        xdp_vips,
        farms,
        routes,
        counters: c.counters.status(),
        cluster: a.shared.as_ref().map(|s| s.status()),
        steering: steering_status(a),
        announced: *a.announced.lock().unwrap(),
    }
}

/// The L4 and SIP VIPs with what XDP counted for them (a counter the maps cannot give
/// reads 0).
fn xdp_vips(a: &Admin, cfg: &Config) -> Vec<crate::api::XdpVipStatus> {
    let t = a.tables.lock().unwrap();
    cfg.vips
        .iter()
        .enumerate()
        .filter(|(_, v)| !v.retired && v.in_xdp())
        .map(|(i, v)| {
            let id = i as u32;
            let f = t.vip_figures(id).unwrap_or_default();
            let sip = if v.mode() == VipMode::Sip {
                t.sip_counters(id).unwrap_or_default().into_iter().map(|(k, n)| (k.to_string(), n)).collect()
            } else {
                Default::default()
            };
            crate::api::XdpVipStatus {
                name: v.name.clone(),
                address: v.address.to_string(),
                port: v.port,
                protocol: if v.protocol == crate::config::Protocol::Udp { "udp" } else { "tcp" }.into(),
                mode: if v.mode() == VipMode::Sip { "sip" } else { "l4" }.into(),
                packets: f.forwarded.packets,
                bytes: f.forwarded.bytes,
                new_flows: f.new_flows,
                drops: f.drops,
                sip,
            }
        })
        .collect()
}

/// Responses by class, for the status view.
fn classes(r: &StatusClasses) -> std::collections::BTreeMap<String, u64> {
    r.counts().map(|(c, n)| (c.to_string(), n)).collect()
}

/// What the backend's last health check took, in seconds.
fn last_check(b: &Backend) -> Option<f64> {
    let us = b.last_check_us.load(Ordering::Relaxed);
    (us != 0).then(|| (us - 1) as f64 / 1e6)
}

fn counts(s: &PathStats) -> PathCounts {
    let load = |x: &std::sync::atomic::AtomicU64| x.load(Ordering::Relaxed);
    PathCounts {
        requests: load(&s.requests),
        affinity_hits: load(&s.affinity_hits),
        failovers: load(&s.failovers),
        balanced: load(&s.balanced),
        misroutes: load(&s.misroutes),
    }
}

/// Every farm, and the configured routes (an implicit catch-all's numbers are its farm's).
fn farms_and_routes(cfg: &Config, cap: &Capacity) -> (Vec<FarmStatus>, Vec<RouteStatus>) {
    let names = |list: &[usize]| list.iter().filter_map(|&b| cfg.backends.get(b)).map(|b| b.name.clone()).collect();
    let farms = (cfg.farms.iter().zip(&cap.farms))
        .map(|(f, k)| FarmStatus {
            name: f.name.clone(),
            implicit: f.implicit,
            servers: names(&f.servers),
            backup_servers: names(&f.backup_servers),
            counts: counts(&k.stats),
        })
        .collect();
    let routes = (cfg.routes.iter().zip(&cap.routes).enumerate())
        .filter(|(_, (r, _))| !cfg.farms.get(r.farm).is_some_and(|f| f.implicit))
        .map(|(index, (r, k))| RouteStatus {
            name: r.name.clone(),
            index,
            vips: r.vips.iter().filter_map(|&v| cfg.vips.get(v)).map(|v| v.name.clone()).collect(),
            hosts: r.hosts.clone(),
            uris: r.uris.clone(),
            farm: cfg.farms.get(r.farm).map(|f| f.name.clone()).unwrap_or_default(),
            cookie: r.cookie.clone(),
            counts: counts(&k.stats),
        })
        .collect();
    (farms, routes)
}

/// The XDP program's steering counters: steered, second chances, kept local, TTL spent.
fn steer_counters(a: &Admin) -> [u64; 4] {
    let t = a.tables.lock().unwrap();
    [stats::STEERED, stats::STEER_SECOND_CHANCE, stats::STEER_KEPT_LOCAL, stats::STEER_TTL_EXPIRED]
        .map(|slot| t.counter(slot).map(|c| c.packets).unwrap_or(0))
}

/// Steering's status, with takeover's when on.
fn steering_status(a: &Admin) -> Option<crate::api::SteeringStatus> {
    let mut s = a.steering.as_ref()?.status(steer_counters(a));
    s.takeover = a.takeover.as_ref().map(|t| {
        let tables = a.tables.lock().unwrap();
        t.status(
            [stats::TAKEOVER_REPORTED, stats::TAKEOVER_DROPPED]
                .map(|slot| tables.counter(slot).map(|c| c.packets).unwrap_or(0)),
        )
    });
    Some(s)
}

/// `GET /metrics`: the Prometheus text exposition, one section at a time.
pub fn metrics(a: &Admin) -> String {
    let (cfg, c, _) = a.current();
    let cap = a.capacity();
    let mut o = Exposition::default();
    build_info(&mut o);
    super::process::expose(&mut o);
    c.counters.expose(&mut o);
    clients_and_clones(&mut o, &c, &cap);
    backends(&mut o, &c);
    backend_health(&mut o, &c);
    queues(&mut o, &c);
    o.family(&HOLD_SECONDS).histogram(&[("scope", "all")], &c.hold_time);
    let http_vips: Vec<_> = cfg.vips.iter().zip(&cap.vips).filter(|(v, _)| v.serves_http()).collect();
    http_vips_section(&mut o, &http_vips);
    let (farms, routes) = farms_and_routes(&cfg, &cap);
    paths_section(&mut o, &farms, &routes);
    tls_section(&mut o, &http_vips);
    xdp_section(&mut o, a, &cfg);
    if let Some(sh) = &a.shared {
        cluster_section(&mut o, &sh.status(), &c);
    }
    if let Some(st) = steering_status(a) {
        steering_section(&mut o, &st);
    }
    if let Some(up) = *a.announced.lock().unwrap() {
        o.single(&ANNOUNCED, up as u64);
    }
    o.finish()
}

const SOURCES_TRACKED: Family = Family::gauge(
    "dispatcher_client_sources_tracked",
    "Source addresses (IPv6: /64) in the per-source connection table.",
);
const SOURCES_UNTRACKED: Family = Family::counter(
    "dispatcher_client_sources_untracked_total",
    "Client connections let through without a per-source count because the source table was full.",
);
const CLONE_TABLE_ENTRIES: Family = Family::gauge("dispatcher_clone_table_entries", "Entries in the clone table.");

/// The per-source connection table and the clone table.
fn clients_and_clones(o: &mut Exposition, c: &Servers, cap: &Capacity) {
    o.single(&SOURCES_TRACKED, cap.sources.tracked());
    o.single(&SOURCES_UNTRACKED, cap.sources.untracked.load(Ordering::Relaxed));
    o.single(&CLONE_TABLE_ENTRIES, c.clone_count());
}

/// Families with one series per backend, and where each one's value comes from.
type PerBackend = (Family, fn(&Backend) -> u64);

const BACKEND_SERIES: [PerBackend; 7] = [
    (
        Family::gauge(
            "dispatcher_backend_state",
            "Backend state: 1=up 2=suspect 3=down 4=drain 5=disabled (kept; dispatcher_backend_state_info labels it).",
        ),
        |b| b.state() as u64,
    ),
    (Family::counter("dispatcher_backend_requests_total", "Requests sent to the backend."), |b| {
        b.requests.load(Ordering::Relaxed)
    }),
    (Family::counter("dispatcher_backend_errors_total", "Failed requests to the backend."), |b| {
        b.errors.load(Ordering::Relaxed)
    }),
    (Family::gauge("dispatcher_backend_active_requests", "Requests in flight to the backend."), |b| {
        b.outstanding.load(Ordering::Relaxed)
    }),
    (Family::gauge("dispatcher_backend_connections", "Open upstream connections to the backend."), |b| {
        b.connections.load(Ordering::Relaxed)
    }),
    (
        Family::gauge(
            "dispatcher_backend_weight",
            "The weight the backend is balanced by (an operator's until reload).",
        ),
        |b| b.weight() as u64,
    ),
    (
        Family::gauge(
            "dispatcher_backend_checks_disabled",
            "1 while an operator has disabled the backend's health checks.",
        ),
        |b| b.checks_disabled() as u64,
    ),
];
const BACKEND_RESPONSE_SECONDS: Family =
    Family::histogram("dispatcher_backend_response_seconds", "Time to the response head, per backend.");

/// Each backend's state, requests, errors, connections and latency.
fn backends(o: &mut Exposition, c: &Servers) {
    for (family, value) in &BACKEND_SERIES {
        o.family(family);
        for b in &c.backends {
            o.sample(&[("backend", &b.name)], value(b));
        }
    }
    o.family(&BACKEND_RESPONSE_SECONDS);
    for b in &c.backends {
        o.histogram(&[("backend", &b.name)], &b.latency);
    }
    o.family(&BACKEND_RESPONSES);
    for b in &c.backends {
        for (class, n) in b.responses.counts() {
            o.sample(&[("backend", &b.name), ("class", class)], n);
        }
    }
}

const BACKEND_RESPONSES: Family = Family::counter(
    "dispatcher_backend_responses_total",
    "Final responses the backend returned, by status class (1xx..5xx, other).",
);
const BACKEND_STATE_INFO: Family = Family::gauge(
    "dispatcher_backend_state_info",
    "1 for the backend's current state (up, suspect, down, drain, disabled), 0 for the others.",
);
const BACKEND_TRANSITIONS: Family = Family::counter(
    "dispatcher_backend_transitions_total",
    "Backend state changes, by from, to and the kind of reason (refused, timeout, status_5xx, passive_..., operator...).",
);
const BACKEND_STATE_REASON: Family = Family::gauge(
    "dispatcher_backend_state_reason",
    "1 with the kind of reason of the backend's last state change (none before any).",
);
const BACKEND_LAST_CHECK: Family =
    Family::gauge("dispatcher_backend_last_check_duration_seconds", "What the backend's last health check took.");
const BUILD_INFO: Family = Family::gauge("dispatcher_build_info", "1, labelled with the agent's version.");

/// The states `dispatcher_backend_state_info` labels.
const STATES: [dispatcher_common::BackendState; 5] = {
    use dispatcher_common::BackendState as S;
    [S::Up, S::Suspect, S::Down, S::Drain, S::Disabled]
};

/// Each backend's state as a labelled gauge, its changes and their reasons, and what its
/// last check took.
fn backend_health(o: &mut Exposition, c: &Servers) {
    o.family(&BACKEND_STATE_INFO);
    for b in &c.backends {
        let now = b.state();
        for s in STATES {
            o.sample(&[("backend", &b.name), ("state", s.name())], (s == now) as u8);
        }
    }
    let changes: Vec<_> = c.backends.iter().map(|b| (b, b.changes.lock().unwrap())).collect();
    o.family(&BACKEND_TRANSITIONS);
    for (b, ch) in &changes {
        for ((from, to, kind), n) in &ch.counts {
            o.sample(&[("backend", &b.name), ("from", from), ("to", to), ("reason_kind", kind)], n);
        }
    }
    o.family(&BACKEND_STATE_REASON);
    for (b, ch) in &changes {
        let kind = ch.last.map_or("none", |l| l.reason.kind());
        o.sample(&[("backend", &b.name), ("reason", kind)], 1);
    }
    drop(changes);
    o.family(&BACKEND_LAST_CHECK);
    for b in &c.backends {
        if let Some(s) = last_check(b) {
            o.sample(&[("backend", &b.name)], s);
        }
    }
}

/// The agent's version (and the commit, when the build says it: `DISPATCHER_GIT_COMMIT`).
fn build_info(o: &mut Exposition) {
    o.family(&BUILD_INFO);
    match option_env!("DISPATCHER_GIT_COMMIT") {
        Some(commit) => o.sample(&[("version", env!("CARGO_PKG_VERSION")), ("commit", commit)], 1),
        None => o.sample(&[("version", env!("CARGO_PKG_VERSION"))], 1),
    };
}

const QUEUE_SERIES: [PerBackend; 3] = [
    (Family::gauge("dispatcher_backend_maxconn", "Requests the backend may have in flight at once."), |b| {
        b.slots.max().unwrap_or(0)
    }),
    (Family::gauge("dispatcher_backend_queue_length", "Requests waiting for a slot on the backend."), |b| {
        b.slots.queued()
    }),
    (Family::counter("dispatcher_backend_queued_total", "Requests that waited for a slot on the backend."), |b| {
        b.slots.queued_total.load(Ordering::Relaxed)
    }),
];
const QUEUE_REFUSED: Family = Family::counter(
    "dispatcher_backend_queue_refused_total",
    "Requests answered 503 for want of a slot: queue full, or none in time.",
);
const QUEUE_SECONDS: Family =
    Family::histogram("dispatcher_backend_queue_seconds", "How long queued requests waited for a slot.");

/// `maxconn` and its queue (backends without a limit have no such series).
fn queues(o: &mut Exposition, c: &Servers) {
    let limited: Vec<_> = c.backends.iter().filter(|b| b.slots.max().is_some()).collect();
    if limited.is_empty() {
        return;
    }
    for (family, value) in &QUEUE_SERIES {
        o.family(family);
        for b in &limited {
            o.sample(&[("backend", &b.name)], value(b));
        }
    }
    o.family(&QUEUE_REFUSED);
    for b in &limited {
        let q = &b.slots;
        for (reason, n) in [("full", &q.refused_full), ("timeout", &q.refused_timeout), ("left", &q.refused_left)] {
            o.sample(&[("backend", &b.name), ("reason", reason)], n.load(Ordering::Relaxed));
        }
    }
    o.family(&QUEUE_SECONDS);
    for b in &limited {
        o.histogram(&[("backend", &b.name)], &b.slots.waits);
    }
}

const HOLD_SECONDS: Family = Family::histogram("dispatcher_hold_seconds", "How long held requests waited.");
const VIP_REQUESTS: Family = Family::counter("dispatcher_vip_requests_total", "Request heads received, per HTTP VIP.");
const VIP_RESPONSES: Family = Family::counter(
    "dispatcher_vip_responses_total",
    "Final responses clients got, per HTTP VIP, by status class (the dispatcher's own answers included).",
);
const VIP_CONNECTIONS: Family = Family::gauge("dispatcher_vip_connections", "Open client connections, per HTTP VIP.");
const VIP_RESPONSE_SECONDS: Family =
    Family::histogram("dispatcher_vip_response_seconds", "Time to the response head, per HTTP VIP.");

const VIP_NO_ROUTE: Family =
    Family::counter("dispatcher_vip_no_route_total", "Requests no route matched (answered 404), per HTTP VIP.");

/// Per HTTP VIP: requests, requests no route matched, client connections, latency.
fn http_vips_section(o: &mut Exposition, vips: &[(&Vip, &VipStats)]) {
    o.family(&VIP_REQUESTS);
    for (v, s) in vips {
        o.sample(&[("vip", &v.name)], s.requests.load(Ordering::Relaxed));
    }
    o.family(&VIP_NO_ROUTE);
    for (v, s) in vips {
        o.sample(&[("vip", &v.name)], s.no_route.load(Ordering::Relaxed));
    }
    o.family(&VIP_RESPONSES);
    for (v, s) in vips {
        for (class, n) in s.responses.counts() {
            o.sample(&[("vip", &v.name), ("class", class)], n);
        }
    }
    o.family(&VIP_CONNECTIONS);
    for (v, s) in vips {
        o.sample(&[("vip", &v.name)], s.connections.load(Ordering::Relaxed));
    }
    o.family(&VIP_RESPONSE_SECONDS);
    for (v, s) in vips {
        o.histogram(&[("vip", &v.name)], &s.latency);
    }
}

/// Families with one series per farm and per route, and where each one's value comes from.
type PerPath = (Family, Family, fn(&PathCounts) -> u64);

const PATH_SERIES: [PerPath; 5] = [
    (
        Family::counter("dispatcher_farm_requests_total", "Requests routed to the farm."),
        Family::counter("dispatcher_route_requests_total", "Requests the route matched."),
        |c| c.requests,
    ),
    (
        Family::counter(
            "dispatcher_farm_affinity_hits_total",
            "Routing decisions that sent a request of the farm to the owner its session names.",
        ),
        Family::counter(
            "dispatcher_route_affinity_hits_total",
            "Routing decisions that sent a request of the route to the owner its session names.",
        ),
        |c| c.affinity_hits,
    ),
    (
        Family::counter(
            "dispatcher_farm_failovers_total",
            "Routing decisions that sent a session's request of the farm to its owner's replica (owner out).",
        ),
        Family::counter(
            "dispatcher_route_failovers_total",
            "Routing decisions that sent a session's request of the route to its owner's replica (owner out).",
        ),
        |c| c.failovers,
    ),
    (
        Family::counter("dispatcher_farm_balanced_total", "Routing decisions of the farm left to its balancer."),
        Family::counter(
            "dispatcher_route_balanced_total",
            "Routing decisions of the route left to its farm's balancer.",
        ),
        |c| c.balanced,
    ),
    (
        Family::counter(
            "dispatcher_farm_misroutes_total",
            "Session requests of the farm sent to neither the owner nor its replica (must stay 0).",
        ),
        Family::counter(
            "dispatcher_route_misroutes_total",
            "Session requests of the route sent to neither the owner nor its replica (must stay 0).",
        ),
        |c| c.misroutes,
    ),
];

/// Per farm (an implicit one under its VIP's name) and per configured route (its name
/// and its farm).
fn paths_section(o: &mut Exposition, farms: &[FarmStatus], routes: &[RouteStatus]) {
    for (farm_family, _, value) in &PATH_SERIES {
        o.family(farm_family);
        for f in farms {
            o.sample(&[("farm", &f.name)], value(&f.counts));
        }
    }
    if routes.is_empty() {
        return;
    }
    for (_, route_family, value) in &PATH_SERIES {
        o.family(route_family);
        for r in routes {
            o.sample(&[("route", &r.name), ("farm", &r.farm)], value(&r.counts));
        }
    }
}

const TLS_HANDSHAKES: Family =
    Family::counter("dispatcher_tls_handshakes_total", "Completed TLS handshakes, per HTTPS VIP, full or resumed.");
const TLS_FAILURES: Family =
    Family::counter("dispatcher_tls_handshake_failures_total", "Failed TLS handshakes, per HTTPS VIP, by reason.");
const TLS_NOT_AFTER: Family = Family::gauge(
    "dispatcher_tls_certificate_not_after_seconds",
    "End of a served certificate's validity (Unix time), per HTTPS VIP.",
);

/// HTTPS VIPs: handshakes, failures, certificates (none without an HTTPS VIP).
fn tls_section(o: &mut Exposition, http_vips: &[(&Vip, &VipStats)]) {
    let tls_vips: Vec<_> = http_vips.iter().filter(|(v, _)| v.http().is_some_and(|h| h.tls.is_some())).collect();
    if tls_vips.is_empty() {
        return;
    }
    o.family(&TLS_HANDSHAKES);
    for (v, s) in &tls_vips {
        for (kind, n) in [("full", &s.tls.full), ("resumed", &s.tls.resumed)] {
            o.sample(&[("vip", &v.name), ("kind", kind)], n.load(Ordering::Relaxed));
        }
    }
    o.family(&TLS_FAILURES);
    for (v, s) in &tls_vips {
        for (reason, n) in s.tls.failures() {
            o.sample(&[("vip", &v.name), ("reason", reason)], n);
        }
    }
    o.family(&TLS_NOT_AFTER);
    for (v, s) in &tls_vips {
        for c in s.tls.certs.read().unwrap().iter() {
            o.sample(&[("vip", &v.name), ("file", &c.file), ("subject", &c.subject)], c.not_after);
        }
    }
}

const XDP_EVENTS: Family = Family::counter("dispatcher_xdp_events_total", "XDP verdicts by reason.");
/// Per VIP, from XDP's counters: the family, the slot (`None`: forwarded, both pin
/// paths added), bytes rather than packets.
const XDP_PER_VIP: [(Family, Option<u32>, bool); 3] = [
    (Family::counter("dispatcher_xdp_vip_packets_total", "Packets to the VIP XDP forwarded."), None, false),
    (Family::counter("dispatcher_xdp_vip_bytes_total", "Bytes to the VIP XDP forwarded."), None, true),
    (
        Family::counter("dispatcher_xdp_vip_new_flows_total", "New flows pinned by XDP."),
        Some(stats::VIP_NEW_FLOWS),
        false,
    ),
];
const SIP_MESSAGES: Family = Family::counter(
    "dispatcher_sip_messages_total",
    "SIP messages on a SIP VIP by outcome: forwarded by where their affinity came from (route, via, to_tag, from_tag, call_id), or dropped (held: owner suspect; unknown_ln; invalid).",
);
const SIP_ROUTED: Family = Family::counter(
    "dispatcher_sip_routed_total",
    "SIP messages a SIP VIP forwarded, by how their container was chosen: by logical name (ln), by their dialog's pin (pin: Call-ID), placed on the ring (ring: a new dialog).",
);
const XDP_FRAGMENTS: Family = Family::counter(
    "dispatcher_xdp_fragments_total",
    "IP fragments of UDP datagrams to an L4 or SIP VIP by outcome: first (dispatched and recorded), followed (a later fragment sent where its first went), no_first (a later fragment dropped: no live record of its first), over_budget (a first fragment dropped beyond the per-CPU budget of new records).",
);
const XDP_BACKEND_PACKETS: Family =
    Family::counter("dispatcher_xdp_backend_packets_total", "Packets XDP forwarded to the backend.");

/// The data plane's counters, summed over CPUs.
fn xdp_section(o: &mut Exposition, a: &Admin, cfg: &Config) {
    let t = a.tables.lock().unwrap();
    o.family(&XDP_EVENTS);
    if let Ok(g) = t.global_counters() {
        for (name, v) in g {
            o.sample(&[("reason", name)], v.packets);
        }
    }
    for (family, slot, bytes) in &XDP_PER_VIP {
        o.family(family);
        for (i, v) in cfg.vips.iter().enumerate() {
            let read = match slot {
                Some(slot) => t.counter(stats::vip_slot(i as u32, *slot)),
                None => t.vip_forwarded(i as u32),
            };
            if let Ok(p) = read {
                o.sample(&[("vip", &v.name)], if *bytes { p.bytes } else { p.packets });
            }
        }
    }
    let sip: Vec<_> = cfg.vips.iter().enumerate().filter(|(_, v)| v.mode() == VipMode::Sip && v.in_xdp()).collect();
    if !sip.is_empty() {
        let counts: Vec<_> = sip.iter().map(|(i, v)| (v, t.sip_counters(*i as u32).unwrap_or_default())).collect();
        o.family(&SIP_MESSAGES);
        for (v, c) in &counts {
            for (what, n) in c.iter().filter(|(w, _)| !w.starts_with(SIP_ROUTED_BY)) {
                o.sample(&[("vip", &v.name), ("outcome", what)], *n);
            }
        }
        o.family(&SIP_ROUTED);
        for (v, c) in &counts {
            for (what, n) in c.iter().filter_map(|(w, n)| Some((w.strip_prefix(SIP_ROUTED_BY)?, n))) {
                o.sample(&[("vip", &v.name), ("by", what)], *n);
            }
        }
    }
    let udp: Vec<_> = cfg.vips.iter().enumerate().filter(|(_, v)| v.takes_fragments()).collect();
    if !udp.is_empty() {
        o.family(&XDP_FRAGMENTS);
        for (i, v) in &udp {
            for (what, n) in t.fragment_counters(*i as u32).unwrap_or_default() {
                o.sample(&[("vip", &v.name), ("outcome", what)], n);
            }
        }
    }
    o.family(&XDP_BACKEND_PACKETS);
    for (i, b) in cfg.backends.iter().enumerate() {
        if let Ok(p) = t.counter(stats::backend_slot(i as u32, stats::BACKEND_PACKETS)) {
            o.sample(&[("backend", &b.name)], p.packets);
        }
    }
}

/// Families with one unlabelled sample, and where its value comes from.
type Single<T> = (Family, fn(&T) -> u64);

const STEERING_SERIES: [Single<crate::api::SteeringStatus>; 7] = [
    (
        Family::gauge(
            "dispatcher_steering_generation",
            "Generation of the installed ownership table (one more per membership change seen here).",
        ),
        |s| s.generation as u64,
    ),
    (Family::gauge("dispatcher_steering_dispatchers", "Dispatchers in the current ownership table."), |s| {
        s.dispatchers.len() as u64
    }),
    (
        Family::gauge(
            "dispatcher_steering_joined",
            "1 while this dispatcher takes connections (0 after dispatcher leave).",
        ),
        |s| s.joined as u64,
    ),
    (
        Family::gauge(
            "dispatcher_steering_second_chance_active",
            "1 while the previous ownership table serves second chances.",
        ),
        |s| !s.previous.is_empty() as u64,
    ),
    (
        Family::counter(
            "dispatcher_steered_packets_total",
            "HTTP VIP packets XDP sent on to the dispatcher that owns their connection.",
        ),
        |s| s.steered,
    ),
    (
        Family::counter(
            "dispatcher_steer_second_chance_packets_total",
            "Packets sent to their owner under the previous ownership table.",
        ),
        |s| s.second_chances,
    ),
    (
        Family::counter(
            "dispatcher_steer_kept_local_packets_total",
            "Packets kept here against the current table (a connection from before a change).",
        ),
        |s| s.kept_local,
    ),
];
const ANNOUNCED: Family =
    Family::gauge("dispatcher_announced", "1 while this dispatcher announces its VIPs (BIRD, [announce]).");

/// Connection steering behind ECMP.
fn steering_section(o: &mut Exposition, s: &crate::api::SteeringStatus) {
    for (family, value) in &STEERING_SERIES {
        o.single(family, value(s));
    }
    if let Some(t) = &s.takeover {
        o.family(&TAKEOVER_RECORDS);
        o.sample(&[("state", "tracked")], t.tracked);
        o.sample(&[("state", "held")], t.held);
        o.sample(&[("state", "armed")], t.armed_now);
        o.family(&TAKEOVER_SENT);
        o.sample(&[("what", "records")], t.records_sent);
        o.sample(&[("what", "bytes")], t.bytes_sent);
        o.single(&TAKEOVER_BUSY, t.busy_ns as f64 / 1e9);
        o.family(&TAKEOVER_OUTCOMES);
        for (outcome, n) in [
            ("registered", t.registered),
            ("untracked", t.untracked),
            ("armed", t.armed),
            ("rebuilt", t.rebuilt),
            ("rebuilt_with_data", t.given),
            ("reset", t.reset),
            ("failed", t.failed),
            ("batch_refused", t.batches_refused),
            ("record_refused", t.records_refused),
            ("report_refused", t.reports_refused),
            ("waited", t.waited),
            ("probed", t.probed),
            ("implausible", t.implausible),
            ("segment_reported", t.segments_reported),
            ("segment_dropped", t.segments_dropped),
        ] {
            o.sample(&[("outcome", outcome)], n);
        }
    }
}

const TAKEOVER_RECORDS: Family = Family::gauge(
    "dispatcher_takeover_records",
    "Connection records: this dispatcher's registered (tracked), other dispatchers' held here, and armed (their dispatcher died).",
);
const TAKEOVER_SENT: Family =
    Family::counter("dispatcher_takeover_sent_total", "Takeover records and bytes sent to the peers.");
const TAKEOVER_BUSY: Family = Family::counter(
    "dispatcher_takeover_busy_seconds_total",
    "Time spent registering connections and building takeover batches (the sending side's CPU).",
);
const TAKEOVER_OUTCOMES: Family = Family::counter(
    "dispatcher_takeover_total",
    "Connection takeover by outcome: registered at accept, rebuilt and adopted, reset (busy at the death), and refusals.",
);

const CLUSTER_SERIES: [Single<crate::api::ClusterStatus>; 8] = [
    (
        Family::gauge("dispatcher_cluster_store_up", "1 while the shared store (etcd) answers, 0 while it does not."),
        |s| (s.store == "connected") as u64,
    ),
    (Family::gauge("dispatcher_cluster_members", "Live dispatchers (holding a lease), this one included."), |s| {
        s.members.len() as u64
    }),
    (
        Family::counter(
            "dispatcher_cluster_store_writes_total",
            "Writes sent to the shared store (puts, deletes, transactions, lease grants).",
        ),
        |s| s.writes,
    ),
    (Family::counter("dispatcher_cluster_lease_renewals_total", "Membership lease renewals sent."), |s| s.renewals),
    (
        Family::counter(
            "dispatcher_cluster_sessions_total",
            "Sessions begun with the store (one more after every loss of it).",
        ),
        |s| s.sessions,
    ),
    (Family::gauge("dispatcher_cluster_pending_writes", "Writes waiting for the store to answer again."), |s| {
        s.pending_writes as u64
    }),
    (
        Family::counter(
            "dispatcher_cluster_dropped_writes_total",
            "Writes dropped because too many waited for an unreachable store.",
        ),
        |s| s.dropped_writes,
    ),
    (
        Family::gauge(
            "dispatcher_cluster_store_insecure",
            "1 when anyone who can reach the store can write to it (plaintext, or TLS without credentials).",
        ),
        |s| s.insecure as u64,
    ),
];
const CLUSTER_REFUSED_KEYS: Family = Family::counter(
    "dispatcher_cluster_refused_keys_total",
    "Keys read from the shared store and not taken, by reason.",
);
const CLUSTER_BACKEND_OUT: Family = Family::gauge(
    "dispatcher_cluster_backend_out",
    "Backends out by the shared rule (most live dispatchers see them down).",
);

const PEER_REACHABLE: Family = Family::gauge(
    "dispatcher_peer_reachable",
    "1 while this dispatcher hears a peer's heartbeats, 0 once it missed heartbeat_misses of them.",
);
const PEER_HEARTBEATS: Family =
    Family::counter("dispatcher_peer_heartbeats_total", "Peer heartbeats sent and received (taken).");
const PEER_REFUSED: Family =
    Family::counter("dispatcher_peer_datagrams_refused_total", "Datagrams on the peer channel not taken, by reason.");
const PEER_OUT: Family = Family::gauge(
    "dispatcher_steering_out_unreachable",
    "Dispatchers out of every ownership table because most of the others cannot reach them.",
);

/// `[cluster]`: the shared store and the shared rule.
fn cluster_section(o: &mut Exposition, s: &crate::api::ClusterStatus, c: &Servers) {
    if s.heartbeat_address.is_some() {
        o.family(&PEER_REACHABLE);
        for p in &s.heartbeats {
            o.sample(&[("peer", &p.name)], p.reachable as u64);
        }
        o.family(&PEER_HEARTBEATS);
        o.sample(&[("direction", "sent")], s.heartbeats_sent);
        o.sample(&[("direction", "received")], s.heartbeats_received);
        o.family(&PEER_REFUSED);
        for (reason, n) in &s.heartbeats_refused {
            o.sample(&[("reason", reason)], n);
        }
        o.single(&PEER_OUT, s.out_unreachable.len());
    }
    for (family, value) in &CLUSTER_SERIES {
        o.single(family, value(s));
    }
    o.family(&CLUSTER_REFUSED_KEYS);
    for (reason, n) in &s.refused_keys {
        o.sample(&[("reason", reason)], n);
    }
    o.family(&CLUSTER_BACKEND_OUT);
    for b in &c.backends {
        o.sample(&[("backend", &b.name)], b.peers_out() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::tests::check_format;

    const CFG: &str = "[dispatcher]\ninterface = \"lo\"\n\n[[backend]]\nname = \"a\"\naddress = \"10.0.0.1\"\nmaxconn = 2\n\n[[backend]]\nname = \"b\"\naddress = \"10.0.0.2\"\n\n[[vip]]\nname = \"app\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n";

    /// Every section the agent writes without the data plane is valid exposition as a
    /// whole (each family once, its samples under it), with the series it should have.
    #[test]
    fn the_sections_make_one_valid_exposition() {
        let cfg = Config::parse(CFG, "t").unwrap();
        let c = Servers::new(&cfg, &[], &[], None);
        c.backends[0].requests.store(7, Ordering::Relaxed);
        c.counters.affinity_hits.store(3, Ordering::Relaxed);
        c.backends[0].responses.record(200);
        c.backends[0].responses.record(503);
        c.backends[1].last_check_us.store(1_500_001, Ordering::Relaxed);
        c.backends[1].changes.lock().unwrap().record(crate::state::Change {
            from: dispatcher_common::BackendState::Up,
            to: dispatcher_common::BackendState::Suspect,
            reason: crate::health::Reason::Check(crate::health::Cause::Status(503)),
            check: Some(std::time::Duration::from_millis(3)),
            at_unix: 1,
        });
        c.set_health(1, dispatcher_common::Health::Suspect);
        let mut o = Exposition::default();
        build_info(&mut o);
        super::super::process::expose(&mut o);
        c.counters.expose(&mut o);
        let cap = Capacity::new(&cfg);
        cap.vips[0].responses.record(404);
        cap.vips[0].responses.record(0);
        clients_and_clones(&mut o, &c, &cap);
        backends(&mut o, &c);
        backend_health(&mut o, &c);
        queues(&mut o, &c);
        o.family(&HOLD_SECONDS).histogram(&[("scope", "all")], &c.hold_time);
        let http_vips: Vec<_> = cfg.vips.iter().zip(&cap.vips).collect();
        http_vips_section(&mut o, &http_vips);
        let (farms, routes) = farms_and_routes(&cfg, &cap);
        paths_section(&mut o, &farms, &routes);
        tls_section(&mut o, &http_vips);
        let cluster = crate::api::ClusterStatus {
            store: "connected".into(),
            refused_keys: vec![("bad\"key".into(), 2)],
            heartbeat_address: Some("10.99.0.3:7405".into()),
            heartbeats: vec![crate::api::PeerStatus { name: "d2".into(), reachable: false, ..Default::default() }],
            heartbeats_sent: 5,
            heartbeats_refused: vec![("unknown_sender".into(), 1)],
            out_unreachable: vec!["d2 (unreachable for d0,d1)".into()],
            ..Default::default()
        };
        cluster_section(&mut o, &cluster, &c);
        steering_section(&mut o, &Default::default());
        o.single(&ANNOUNCED, 1);
        let text = o.finish();
        let s = check_format(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let get = |name: &str, labels: &str| s.get(&(name.to_string(), labels.to_string())).copied();
        assert_eq!(get("dispatcher_affinity_hits_total", ""), Some(3.0));
        assert_eq!(get("dispatcher_backend_requests_total", "backend=\"a\""), Some(7.0));
        assert_eq!(get("dispatcher_backend_maxconn", "backend=\"a\""), Some(2.0));
        assert_eq!(get("dispatcher_backend_maxconn", "backend=\"b\""), None, "b has no maxconn");
        assert_eq!(get("dispatcher_backend_queue_refused_total", "backend=\"a\",reason=\"left\""), Some(0.0));
        assert_eq!(get("dispatcher_vip_requests_total", "vip=\"app\""), Some(0.0));
        assert_eq!(get("dispatcher_vip_no_route_total", "vip=\"app\""), Some(0.0));
        assert_eq!(get("dispatcher_farm_requests_total", "farm=\"app\""), Some(0.0), "the VIP's implicit farm");
        assert_eq!(get("dispatcher_route_requests_total", "route=\"0\",farm=\"app\""), None, "no configured route");
        assert_eq!(get("dispatcher_cluster_store_up", ""), Some(1.0));
        assert_eq!(get("dispatcher_cluster_refused_keys_total", "reason=\"bad\\\"key\""), Some(2.0));
        assert_eq!(get("dispatcher_peer_reachable", "peer=\"d2\""), Some(0.0));
        assert_eq!(get("dispatcher_peer_heartbeats_total", "direction=\"sent\""), Some(5.0));
        assert_eq!(get("dispatcher_peer_datagrams_refused_total", "reason=\"unknown_sender\""), Some(1.0));
        assert_eq!(get("dispatcher_steering_out_unreachable", ""), Some(1.0));
        assert_eq!(get("dispatcher_client_connections_refused_total", "reason=\"source_rate\""), Some(0.0));
        assert!(!text.contains("dispatcher_tls_"), "no HTTPS VIP, no TLS families");
        let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
        assert_eq!(get("dispatcher_build_info", &version), Some(1.0));
        assert!(get("process_open_fds", "").is_some_and(|n| n >= 3.0));
        assert!(get("process_start_time_seconds", "").is_some_and(|t| t > 1e9));
        assert_eq!(get("dispatcher_backend_responses_total", "backend=\"a\",class=\"2xx\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_responses_total", "backend=\"a\",class=\"5xx\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_responses_total", "backend=\"b\",class=\"other\""), Some(0.0));
        assert_eq!(get("dispatcher_vip_responses_total", "vip=\"app\",class=\"4xx\""), Some(1.0));
        assert_eq!(get("dispatcher_vip_responses_total", "vip=\"app\",class=\"other\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_state_info", "backend=\"b\",state=\"suspect\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_state_info", "backend=\"b\",state=\"up\""), Some(0.0));
        assert_eq!(get("dispatcher_backend_state_info", "backend=\"a\",state=\"up\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_state", "backend=\"b\""), Some(2.0), "the numeric one kept");
        let t = "backend=\"b\",from=\"up\",to=\"suspect\",reason_kind=\"status_5xx\"";
        assert_eq!(get("dispatcher_backend_transitions_total", t), Some(1.0));
        assert_eq!(get("dispatcher_backend_state_reason", "backend=\"b\",reason=\"status_5xx\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_state_reason", "backend=\"a\",reason=\"none\""), Some(1.0));
        assert_eq!(get("dispatcher_backend_last_check_duration_seconds", "backend=\"b\""), Some(1.5));
        assert_eq!(get("dispatcher_backend_last_check_duration_seconds", "backend=\"a\""), None, "never checked");
    }
}
