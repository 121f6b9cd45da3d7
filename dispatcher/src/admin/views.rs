//! What the admin endpoint shows: the agent's view as JSON (`GET /status`) and the
//! Prometheus text exposition (`GET /metrics`).

use std::{fmt::Write as _, sync::atomic::Ordering};

use dispatcher_common::stats;

use super::Admin;
use crate::api::{AgentStatus, BackendStatus, CertificateStatus, CounterStatus, QueueStatus, TlsStatus, VipStatus};
use crate::{metrics::Histogram, state::Backend};

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
        .map(|b| BackendStatus {
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
        })
        .collect();
    let vips = cfg
        .vips
        .iter()
        .zip(&cap.vips)
        .filter(|(v, _)| v.serves_http())
        .map(|(v, s)| VipStatus {
            name: v.name.clone(),
            requests: load(&s.requests),
            connections: load(&s.connections),
            tls: v.tls.as_ref().map(|_| tls_status(&s.tls)),
        })
        .collect();
    let k = &c.counters;
    AgentStatus {
        pid: std::process::id(),
        uptime_s: a.started.elapsed().as_secs(),
        clones: c.clone_count(),
        pins_missing: a.pins_missing.lock().unwrap().iter().map(|p| p.to_string()).collect(),
        backends,
        vips,
        counters: CounterStatus {
            holds: load(&k.holds),
            held_now: load(&k.held_now),
            hold_timeouts: load(&k.hold_timeouts),
            retries: load(&k.retries),
            retry_budget_refusals: load(&k.retry_budget_refusals),
            failovers: load(&k.failovers),
            flow_rewrites: load(&k.flow_rewrites),
            clone_rewrites: load(&k.clone_rewrites),
            misroutes: load(&k.misroutes),
            learned_clones: load(&k.learned),
            learn_conflicts: load(&k.learn_conflicts),
            clones_full: load(&k.clones_full),
            clone_ids_refused: load(&k.clone_ids_refused),
            queue_timeouts: load(&k.queue_timeouts),
            local_errors: load(&k.local_errors),
            connections_refused: load(&k.conn_refused),
        },
        cluster: a.shared.as_ref().map(|s| s.status()),
        steering: a.steering.as_ref().map(|st| st.status(steer_counters(a))),
        announced: *a.announced.lock().unwrap(),
    }
}

/// The XDP program's steering counters: steered, second chances, kept local, TTL spent.
fn steer_counters(a: &Admin) -> [u64; 4] {
    let t = a.tables.lock().unwrap();
    [stats::STEERED, stats::STEER_SECOND_CHANCE, stats::STEER_KEPT_LOCAL, stats::STEER_TTL_EXPIRED]
        .map(|slot| t.counter(slot).map(|c| c.packets).unwrap_or(0))
}

/// A label value as the exposition format wants it: backslash, double quote and newline
/// escaped.
fn esc(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// One metric with a series per backend of `backends`.
fn backend_series(
    o: &mut String,
    backends: &[&Backend],
    name: &str,
    kind: &str,
    help: &str,
    value: &dyn Fn(&Backend) -> u64,
) {
    let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for b in backends {
        let _ = writeln!(o, "{name}{{backend=\"{}\"}} {}", esc(&b.name), value(b));
    }
}

fn histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    let mut cumulative = 0;
    for (i, le) in Histogram::BOUNDS_US.iter().enumerate() {
        cumulative += h.buckets[i].load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}", *le as f64 / 1e6);
    }
    let count = h.count.load(Ordering::Relaxed);
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {count}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
    let _ = writeln!(out, "{name}_count{{{labels}}} {count}");
}

pub fn metrics(a: &Admin) -> String {
    let (cfg, c, _) = a.current();
    let cap = a.capacity();
    let k = &c.counters;
    let mut o = String::new();
    let counter = |o: &mut String, name: &str, help: &str, v: u64| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}");
    };
    let gauge = |o: &mut String, name: &str, help: &str, v: u64| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
    };
    counter(
        &mut o,
        "dispatcher_misroutes_total",
        "Session requests sent to neither the owner nor its replica (must stay 0).",
        k.misroutes.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_holds_total",
        "Requests held while their session's owner was suspect.",
        k.holds.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_hold_timeouts_total",
        "Holds that ended at the hold time.",
        k.hold_timeouts.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_learn_waits_total",
        "Requests whose clone IDs no one here knew that waited for the shared table ([cluster] learn_wait).",
        k.learn_waits.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_hold_refused_total",
        "Requests refused because max_held were held.",
        k.hold_refused.load(Ordering::Relaxed),
    );
    gauge(&mut o, "dispatcher_held_requests", "Requests held now.", k.held_now.load(Ordering::Relaxed));
    counter(
        &mut o,
        "dispatcher_retries_total",
        "Extra attempts after a failure before any response byte.",
        k.retries.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_retry_budget_refusals_total",
        "Retries refused by the cluster-wide budget.",
        k.retry_budget_refusals.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_failovers_total",
        "Backends that went out of service.",
        k.failovers.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_clone_rewrites_total",
        "CLONES entries rewritten on failover and return.",
        k.clone_rewrites.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_flow_rewrites_total",
        "FLOWS entries moved off a failed backend.",
        k.flow_rewrites.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_state_transitions_total",
        "Backend state changes.",
        k.transitions.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_passive_failures_total",
        "Backends made suspect by a failed request.",
        k.passive_failures.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_learned_clones_total",
        "Clone IDs learned from Set-Cookie.",
        k.learned.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_learn_conflicts_total",
        "Clone IDs claimed by a second backend.",
        k.learn_conflicts.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_clones_table_full_total",
        "New clone IDs not kept because the clone table was full (its sessions are balanced).",
        k.clones_full.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_clone_ids_refused_total",
        "Clone IDs not kept: empty, too long or not printable.",
        k.clone_ids_refused.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_access_log_lines_total",
        "Access log lines written.",
        k.access_log_lines.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_access_log_dropped_total",
        "Access log lines dropped because the writer was behind (requests are never delayed for the log).",
        k.access_log_dropped.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_queue_timeouts_total",
        "Requests answered 503 busy: no connection or maxconn slot came free in time, or the backend's queue was full.",
        k.queue_timeouts.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_local_errors_total",
        "Shortages on this host (descriptors, ports, buffers) met accepting or connecting; never a backend failure.",
        k.local_errors.load(Ordering::Relaxed),
    );
    let _ = writeln!(
        o,
        "# HELP dispatcher_client_connections_refused_total Client connections refused at once (503, or closed on HTTPS VIPs), by the cap they met.\n# TYPE dispatcher_client_connections_refused_total counter"
    );
    for cap in crate::http::listener::Cap::ALL {
        let v = k.conn_refused_by[cap as usize].load(Ordering::Relaxed);
        let _ = writeln!(o, "dispatcher_client_connections_refused_total{{reason=\"{}\"}} {v}", cap.label());
    }
    gauge(
        &mut o,
        "dispatcher_client_sources_tracked",
        "Source addresses (IPv6: /64) in the per-source connection table.",
        cap.sources.tracked() as u64,
    );
    counter(
        &mut o,
        "dispatcher_client_sources_untracked_total",
        "Client connections let through without a per-source count because the source table was full.",
        cap.sources.untracked.load(Ordering::Relaxed),
    );
    counter(
        &mut o,
        "dispatcher_http_loops_total",
        "Requests that came back carrying this dispatcher's own Via marker (a forwarding loop), answered 508.",
        k.loops.load(Ordering::Relaxed),
    );
    gauge(&mut o, "dispatcher_clone_table_entries", "Entries in the clone table.", c.clone_count() as u64);

    let _ = writeln!(o, "# HELP dispatcher_backend_state Backend state: 1=up 2=suspect 3=down 4=drain 5=disabled.\n# TYPE dispatcher_backend_state gauge");
    for b in &c.backends {
        let _ = writeln!(o, "dispatcher_backend_state{{backend=\"{}\"}} {}", esc(&b.name), b.state() as u8);
    }
    let all: Vec<_> = c.backends.iter().collect();
    let per_backend = |o: &mut String, name: &str, kind: &str, help: &str, value: &dyn Fn(&Backend) -> u64| {
        backend_series(o, &all, name, kind, help, value)
    };
    per_backend(&mut o, "dispatcher_backend_requests_total", "counter", "Requests sent to the backend.", &|b| {
        b.requests.load(Ordering::Relaxed)
    });
    per_backend(&mut o, "dispatcher_backend_errors_total", "counter", "Failed requests to the backend.", &|b| {
        b.errors.load(Ordering::Relaxed)
    });
    per_backend(&mut o, "dispatcher_backend_active_requests", "gauge", "Requests in flight to the backend.", &|b| {
        b.outstanding.load(Ordering::Relaxed)
    });
    per_backend(&mut o, "dispatcher_backend_connections", "gauge", "Open upstream connections to the backend.", &|b| {
        b.connections.load(Ordering::Relaxed)
    });
    // `maxconn` and its queue (backends without a limit have no such series).
    let limited: Vec<_> = c.backends.iter().filter(|b| b.slots.max().is_some()).collect();
    if !limited.is_empty() {
        let each = |o: &mut String, name: &str, kind: &str, help: &str, value: &dyn Fn(&Backend) -> u64| {
            backend_series(o, &limited, name, kind, help, value)
        };
        each(&mut o, "dispatcher_backend_maxconn", "gauge", "Requests the backend may have in flight at once.", &|b| {
            b.slots.max().unwrap_or(0)
        });
        each(&mut o, "dispatcher_backend_queue_length", "gauge", "Requests waiting for a slot on the backend.", &|b| {
            b.slots.queued()
        });
        each(
            &mut o,
            "dispatcher_backend_queued_total",
            "counter",
            "Requests that waited for a slot on the backend.",
            &|b| b.slots.queued_total.load(Ordering::Relaxed),
        );
        let _ = writeln!(o, "# HELP dispatcher_backend_queue_refused_total Requests answered 503 for want of a slot: queue full, or none in time.\n# TYPE dispatcher_backend_queue_refused_total counter");
        for b in &limited {
            let reasons = [
                ("full", &b.slots.refused_full),
                ("timeout", &b.slots.refused_timeout),
                ("left", &b.slots.refused_left),
            ];
            for (reason, n) in reasons {
                let _ = writeln!(
                    o,
                    "dispatcher_backend_queue_refused_total{{backend=\"{}\",reason=\"{reason}\"}} {}",
                    esc(&b.name),
                    n.load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(o, "# HELP dispatcher_backend_queue_seconds How long queued requests waited for a slot.\n# TYPE dispatcher_backend_queue_seconds histogram");
        for b in &limited {
            histogram(
                &mut o,
                "dispatcher_backend_queue_seconds",
                &format!("backend=\"{}\"", esc(&b.name)),
                &b.slots.waits,
            );
        }
    }
    let _ = writeln!(o, "# HELP dispatcher_backend_response_seconds Time to the response head, per backend.\n# TYPE dispatcher_backend_response_seconds histogram");
    for b in &c.backends {
        histogram(&mut o, "dispatcher_backend_response_seconds", &format!("backend=\"{}\"", esc(&b.name)), &b.latency);
    }
    let _ = writeln!(
        o,
        "# HELP dispatcher_hold_seconds How long held requests waited.\n# TYPE dispatcher_hold_seconds histogram"
    );
    histogram(&mut o, "dispatcher_hold_seconds", "scope=\"all\"", &c.hold_time);
    let http_vips: Vec<_> = cfg.vips.iter().zip(&cap.vips).filter(|(v, _)| v.serves_http()).collect();
    let _ = writeln!(o, "# HELP dispatcher_vip_requests_total Request heads received, per HTTP VIP.\n# TYPE dispatcher_vip_requests_total counter");
    for (v, s) in &http_vips {
        let _ = writeln!(
            o,
            "dispatcher_vip_requests_total{{vip=\"{}\"}} {}",
            esc(&v.name),
            s.requests.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(o, "# HELP dispatcher_vip_connections Open client connections, per HTTP VIP.\n# TYPE dispatcher_vip_connections gauge");
    for (v, s) in &http_vips {
        let _ = writeln!(
            o,
            "dispatcher_vip_connections{{vip=\"{}\"}} {}",
            esc(&v.name),
            s.connections.load(Ordering::Relaxed)
        );
    }
    let _ = writeln!(o, "# HELP dispatcher_vip_response_seconds Time to the response head, per HTTP VIP.\n# TYPE dispatcher_vip_response_seconds histogram");
    for (v, s) in &http_vips {
        histogram(&mut o, "dispatcher_vip_response_seconds", &format!("vip=\"{}\"", esc(&v.name)), &s.latency);
    }

    let tls_vips: Vec<_> = http_vips.iter().filter(|(v, _)| v.tls.is_some()).collect();
    if !tls_vips.is_empty() {
        let _ = writeln!(o, "# HELP dispatcher_tls_handshakes_total Completed TLS handshakes, per HTTPS VIP, full or resumed.\n# TYPE dispatcher_tls_handshakes_total counter");
        for (v, s) in &tls_vips {
            for (kind, n) in [("full", &s.tls.full), ("resumed", &s.tls.resumed)] {
                let _ = writeln!(
                    o,
                    "dispatcher_tls_handshakes_total{{vip=\"{}\",kind=\"{kind}\"}} {}",
                    esc(&v.name),
                    n.load(Ordering::Relaxed)
                );
            }
        }
        let _ = writeln!(o, "# HELP dispatcher_tls_handshake_failures_total Failed TLS handshakes, per HTTPS VIP, by reason.\n# TYPE dispatcher_tls_handshake_failures_total counter");
        for (v, s) in &tls_vips {
            for (reason, n) in s.tls.failures() {
                let _ = writeln!(
                    o,
                    "dispatcher_tls_handshake_failures_total{{vip=\"{}\",reason=\"{reason}\"}} {n}",
                    esc(&v.name)
                );
            }
        }
        let _ = writeln!(o, "# HELP dispatcher_tls_certificate_not_after_seconds End of a served certificate's validity (Unix time), per HTTPS VIP.\n# TYPE dispatcher_tls_certificate_not_after_seconds gauge");
        for (v, s) in &tls_vips {
            for c in s.tls.certs.read().unwrap().iter() {
                let _ = writeln!(
                    o,
                    "dispatcher_tls_certificate_not_after_seconds{{vip=\"{}\",file=\"{}\",subject=\"{}\"}} {}",
                    esc(&v.name),
                    esc(&c.file),
                    esc(&c.subject),
                    c.not_after
                );
            }
        }
    }

    // The data plane's counters, summed over CPUs.
    let t = a.tables.lock().unwrap();
    let _ = writeln!(
        o,
        "# HELP dispatcher_xdp_events_total XDP verdicts by reason.\n# TYPE dispatcher_xdp_events_total counter"
    );
    if let Ok(g) = t.global_counters() {
        for (name, v) in g {
            let _ = writeln!(o, "dispatcher_xdp_events_total{{reason=\"{name}\"}} {}", v.packets);
        }
    }
    // One family at a time: the exposition format wants each family's samples together.
    let per_vip = [
        ("dispatcher_xdp_vip_packets_total", "Packets to the VIP XDP forwarded.", None, false),
        ("dispatcher_xdp_vip_bytes_total", "Bytes to the VIP XDP forwarded.", None, true),
        ("dispatcher_xdp_vip_new_flows_total", "New flows pinned by XDP.", Some(stats::VIP_NEW_FLOWS), false),
    ];
    for (name, help, slot, bytes) in per_vip {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} counter");
        for (i, v) in cfg.vips.iter().enumerate() {
            let read = match slot {
                Some(slot) => t.counter(stats::vip_slot(i as u32, slot)),
                None => t.vip_forwarded(i as u32),
            };
            if let Ok(p) = read {
                let _ = writeln!(o, "{name}{{vip=\"{}\"}} {}", esc(&v.name), if bytes { p.bytes } else { p.packets });
            }
        }
    }
    let sip: Vec<(usize, &crate::config::Vip)> =
        cfg.vips.iter().enumerate().filter(|(_, v)| v.mode == crate::config::VipMode::Sip).collect();
    if !sip.is_empty() {
        let _ = writeln!(o, "# HELP dispatcher_sip_messages_total SIP messages on a SIP VIP by outcome: forwarded by where their affinity came from (route, via, to_tag, from_tag, call_id), or dropped (held: owner suspect; unknown_ln; invalid).\n# TYPE dispatcher_sip_messages_total counter");
        for (i, v) in &sip {
            for (what, n) in t.sip_counters(*i as u32).unwrap_or_default() {
                let _ = writeln!(o, "dispatcher_sip_messages_total{{vip=\"{}\",outcome=\"{what}\"}} {n}", esc(&v.name));
            }
        }
    }
    let _ = writeln!(o, "# HELP dispatcher_xdp_backend_packets_total Packets XDP forwarded to the backend.\n# TYPE dispatcher_xdp_backend_packets_total counter");
    for (i, b) in cfg.backends.iter().enumerate() {
        if let Ok(p) = t.counter(stats::backend_slot(i as u32, stats::BACKEND_PACKETS)) {
            let _ = writeln!(o, "dispatcher_xdp_backend_packets_total{{backend=\"{}\"}} {}", esc(&b.name), p.packets);
        }
    }
    drop(t);
    if let Some(sh) = &a.shared {
        cluster_metrics(&mut o, &sh.status(), &c);
    }
    if let Some(st) = &a.steering {
        let s = st.status(steer_counters(a));
        let mut one = |name: &str, kind: &str, help: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        one(
            "dispatcher_steering_generation",
            "gauge",
            "Generation of the installed ownership table (one more per membership change seen here).",
            s.generation as u64,
        );
        one(
            "dispatcher_steering_dispatchers",
            "gauge",
            "Dispatchers in the current ownership table.",
            s.dispatchers.len() as u64,
        );
        one(
            "dispatcher_steering_joined",
            "gauge",
            "1 while this dispatcher takes connections (0 after dispatcher leave).",
            s.joined as u64,
        );
        one(
            "dispatcher_steering_second_chance_active",
            "gauge",
            "1 while the previous ownership table serves second chances.",
            !s.previous.is_empty() as u64,
        );
        one(
            "dispatcher_steered_packets_total",
            "counter",
            "HTTP VIP packets XDP sent on to the dispatcher that owns their connection.",
            s.steered,
        );
        one(
            "dispatcher_steer_second_chance_packets_total",
            "counter",
            "Packets sent to their owner under the previous ownership table.",
            s.second_chances,
        );
        one(
            "dispatcher_steer_kept_local_packets_total",
            "counter",
            "Packets kept here against the current table (a connection from before a change).",
            s.kept_local,
        );
    }
    if let Some(up) = *a.announced.lock().unwrap() {
        let _ = writeln!(o, "# HELP dispatcher_announced 1 while this dispatcher announces its VIPs (BIRD, [announce]).\n# TYPE dispatcher_announced gauge\ndispatcher_announced {}", up as u64);
    }
    o
}

/// `[cluster]`: the shared store and the shared rule.
fn cluster_metrics(o: &mut String, s: &crate::api::ClusterStatus, c: &crate::state::Cluster) {
    let one = |o: &mut String, name: &str, kind: &str, help: &str, v: u64| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
    };
    one(
        o,
        "dispatcher_cluster_store_up",
        "gauge",
        "1 while the shared store (etcd) answers, 0 while it does not.",
        (s.store == "connected") as u64,
    );
    one(
        o,
        "dispatcher_cluster_members",
        "gauge",
        "Live dispatchers (holding a lease), this one included.",
        s.members.len() as u64,
    );
    one(
        o,
        "dispatcher_cluster_store_writes_total",
        "counter",
        "Writes sent to the shared store (puts, deletes, transactions, lease grants).",
        s.writes,
    );
    one(o, "dispatcher_cluster_lease_renewals_total", "counter", "Membership lease renewals sent.", s.renewals);
    one(
        o,
        "dispatcher_cluster_sessions_total",
        "counter",
        "Sessions begun with the store (one more after every loss of it).",
        s.sessions,
    );
    one(
        o,
        "dispatcher_cluster_pending_writes",
        "gauge",
        "Writes waiting for the store to answer again.",
        s.pending_writes as u64,
    );
    one(
        o,
        "dispatcher_cluster_dropped_writes_total",
        "counter",
        "Writes dropped because too many waited for an unreachable store.",
        s.dropped_writes,
    );
    one(
        o,
        "dispatcher_cluster_store_insecure",
        "gauge",
        "1 when anyone who can reach the store can write to it (plaintext, or TLS without credentials).",
        s.insecure as u64,
    );
    let _ = writeln!(o, "# HELP dispatcher_cluster_refused_keys_total Keys read from the shared store and not taken, by reason.\n# TYPE dispatcher_cluster_refused_keys_total counter");
    for (reason, n) in &s.refused_keys {
        let _ = writeln!(o, "dispatcher_cluster_refused_keys_total{{reason=\"{}\"}} {n}", esc(reason));
    }
    let _ = writeln!(o, "# HELP dispatcher_cluster_backend_out Backends out by the shared rule (most live dispatchers see them down).\n# TYPE dispatcher_cluster_backend_out gauge");
    for b in &c.backends {
        let _ = writeln!(o, "dispatcher_cluster_backend_out{{backend=\"{}\"}} {}", esc(&b.name), b.peers_out() as u64);
    }
}
