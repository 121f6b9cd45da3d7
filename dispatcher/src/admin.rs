//! The admin endpoint: HTTP over a Unix socket (never reachable from the network).
//!
//! - `GET /metrics`: Prometheus text exposition (XDP counters, requests and latency per
//!   VIP and backend, health, holds, retries, failovers, misroutes).
//! - `GET /status`: the agent's view as JSON (`dispatcher status` merges it with the maps).
//! - `POST /backends/NAME/drain|disable|enable`: operator commands.

use std::{
    fmt::Write as _,
    path::Path,
    sync::{atomic::Ordering, Arc, Mutex},
    time::{Duration, Instant},
};

use dispatcher_common::stats;
use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};

use crate::{
    config::Config,
    control::{state_name, AdminCommand},
    dataplane::tables::Tables,
    state::{Cluster, Histogram},
};

/// What a reload replaces.
pub struct Live {
    pub cfg: Arc<Config>,
    pub cluster: Arc<Cluster>,
    pub commands: mpsc::UnboundedSender<AdminCommand>,
}

/// A reload request: the reply says what changed, or why nothing did.
pub type ReloadRequest = oneshot::Sender<Result<String, String>>;

pub struct Admin {
    pub live: std::sync::RwLock<Live>,
    pub tables: Arc<Mutex<Tables>>,
    pub reloads: mpsc::UnboundedSender<ReloadRequest>,
    pub started: Instant,
}

impl Admin {
    fn current(&self) -> (Arc<Config>, Arc<Cluster>, mpsc::UnboundedSender<AdminCommand>) {
        let l = self.live.read().unwrap();
        (l.cfg.clone(), l.cluster.clone(), l.commands.clone())
    }
}

/// Binds the socket (replacing a stale one), owner-only permissions.
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

pub async fn serve(admin: Arc<Admin>, listener: UnixListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let admin = admin.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(10), handle(&admin, stream)).await;
        });
    }
}

async fn handle(admin: &Admin, mut s: UnixStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let (method, path) = loop {
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                break (req.method.unwrap_or("").to_string(), req.path.unwrap_or("").to_string())
            }
            Ok(httparse::Status::Partial) if buf.len() < 8192 => continue,
            _ => return respond(&mut s, 400, "text/plain", "bad request\n").await,
        }
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method.as_str(), parts.as_slice()) {
        ("GET", ["metrics"]) => respond(&mut s, 200, "text/plain; version=0.0.4", &metrics(admin)).await,
        ("GET", ["status"]) => respond(&mut s, 200, "application/json", &status(admin).to_string()).await,
        ("POST", ["reload"]) => {
            let (tx, rx) = oneshot::channel();
            if admin.reloads.send(tx).is_err() {
                return respond(&mut s, 503, "application/json", &json!({"error": "agent stopping"}).to_string()).await;
            }
            match rx.await {
                Ok(Ok(what)) => respond(&mut s, 200, "application/json", &json!({"reloaded": what}).to_string()).await,
                Ok(Err(why)) => respond(&mut s, 400, "application/json", &json!({"error": why}).to_string()).await,
                Err(_) => respond(&mut s, 503, "application/json", &json!({"error": "no reply"}).to_string()).await,
            }
        }
        ("POST", ["backends", name, action]) => {
            let (_, cluster, commands) = admin.current();
            let Some(b) = cluster.backends.iter().position(|x| x.name == *name) else {
                return respond(
                    &mut s,
                    404,
                    "application/json",
                    &json!({"error": format!("no backend named {name}")}).to_string(),
                )
                .await;
            };
            let a = match *action {
                "drain" => dispatcher_common::STATE_DRAIN,
                "disable" => dispatcher_common::STATE_DISABLED,
                "enable" => 0,
                _ => {
                    return respond(&mut s, 404, "application/json", &json!({"error": "unknown action"}).to_string())
                        .await
                }
            };
            let (tx, rx) = oneshot::channel();
            if commands.send(AdminCommand { backend: b, admin: a, reply: tx }).is_err() {
                return respond(&mut s, 503, "application/json", &json!({"error": "control loop stopped"}).to_string())
                    .await;
            }
            match rx.await {
                Ok((from, to)) => {
                    let body = json!({"backend": name, "from": state_name(from), "to": state_name(to)});
                    respond(&mut s, 200, "application/json", &body.to_string()).await
                }
                Err(_) => respond(&mut s, 503, "application/json", &json!({"error": "no reply"}).to_string()).await,
            }
        }
        _ => respond(&mut s, 404, "text/plain", "not found\n").await,
    }
}

async fn respond(s: &mut UnixStream, status: u16, ctype: &str, body: &str) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(body.as_bytes()).await?;
    s.shutdown().await
}

fn status(a: &Admin) -> serde_json::Value {
    let (_, c, _) = a.current();
    let backends: Vec<_> = c
        .backends
        .iter()
        .map(|b| {
            json!({
                "name": b.name,
                "state": state_name(b.state.load(Ordering::SeqCst)),
                "health": state_name(b.health.load(Ordering::SeqCst)),
                "admin": match b.admin.load(Ordering::SeqCst) { 0 => "none", s => state_name(s) },
                "active": b.outstanding.load(Ordering::Relaxed),
                "requests": b.requests.load(Ordering::Relaxed),
                "errors": b.errors.load(Ordering::Relaxed),
            })
        })
        .collect();
    let k = &c.counters;
    json!({
        "pid": std::process::id(),
        "uptime_s": a.started.elapsed().as_secs(),
        "clones": c.clone_count(),
        "backends": backends,
        "counters": {
            "holds": k.holds.load(Ordering::Relaxed),
            "held_now": k.held_now.load(Ordering::Relaxed),
            "hold_timeouts": k.hold_timeouts.load(Ordering::Relaxed),
            "retries": k.retries.load(Ordering::Relaxed),
            "retry_budget_refusals": k.retry_budget_refusals.load(Ordering::Relaxed),
            "failovers": k.failovers.load(Ordering::Relaxed),
            "flow_rewrites": k.flow_rewrites.load(Ordering::Relaxed),
            "clone_rewrites": k.clone_rewrites.load(Ordering::Relaxed),
            "misroutes": k.misroutes.load(Ordering::Relaxed),
            "learned_clones": k.learned.load(Ordering::Relaxed),
            "learn_conflicts": k.learn_conflicts.load(Ordering::Relaxed),
        }
    })
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

fn metrics(a: &Admin) -> String {
    let (cfg, c, _) = a.current();
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
    gauge(&mut o, "dispatcher_clone_table_entries", "Entries in the clone table.", c.clone_count() as u64);

    let _ = writeln!(o, "# HELP dispatcher_backend_state Backend state: 1=up 2=suspect 3=down 4=drain 5=disabled.\n# TYPE dispatcher_backend_state gauge");
    for b in &c.backends {
        let _ = writeln!(o, "dispatcher_backend_state{{backend=\"{}\"}} {}", b.name, b.state.load(Ordering::SeqCst));
    }
    let per_backend = |o: &mut String, name: &str, kind: &str, value: &dyn Fn(&crate::state::Backend) -> u64| {
        let _ = writeln!(o, "# TYPE {name} {kind}");
        for b in &c.backends {
            let _ = writeln!(o, "{name}{{backend=\"{}\"}} {}", b.name, value(b));
        }
    };
    per_backend(&mut o, "dispatcher_backend_requests_total", "counter", &|b| b.requests.load(Ordering::Relaxed));
    per_backend(&mut o, "dispatcher_backend_errors_total", "counter", &|b| b.errors.load(Ordering::Relaxed));
    per_backend(&mut o, "dispatcher_backend_active_requests", "gauge", &|b| b.outstanding.load(Ordering::Relaxed));
    let _ = writeln!(o, "# HELP dispatcher_backend_response_seconds Time to the response head, per backend.\n# TYPE dispatcher_backend_response_seconds histogram");
    for b in &c.backends {
        histogram(&mut o, "dispatcher_backend_response_seconds", &format!("backend=\"{}\"", b.name), &b.latency);
    }
    let _ = writeln!(
        o,
        "# HELP dispatcher_hold_seconds How long held requests waited.\n# TYPE dispatcher_hold_seconds histogram"
    );
    histogram(&mut o, "dispatcher_hold_seconds", "scope=\"all\"", &c.hold_time);
    let _ = writeln!(o, "# HELP dispatcher_vip_response_seconds Time to the response head, per HTTP VIP.\n# TYPE dispatcher_vip_response_seconds histogram");
    for (i, v) in cfg.vips.iter().enumerate() {
        if let Some(h) = c.vip_latency.get(i) {
            histogram(&mut o, "dispatcher_vip_response_seconds", &format!("vip=\"{}\"", v.name), h);
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
    let _ = writeln!(o, "# TYPE dispatcher_xdp_vip_packets_total counter\n# TYPE dispatcher_xdp_vip_bytes_total counter\n# TYPE dispatcher_xdp_vip_new_flows_total counter");
    for (i, v) in cfg.vips.iter().enumerate() {
        let id = i as u32;
        if let (Ok(p), Ok(n)) =
            (t.counter(stats::vip_slot(id, stats::VIP_PACKETS)), t.counter(stats::vip_slot(id, stats::VIP_NEW_FLOWS)))
        {
            let _ = writeln!(o, "dispatcher_xdp_vip_packets_total{{vip=\"{}\"}} {}", v.name, p.packets);
            let _ = writeln!(o, "dispatcher_xdp_vip_bytes_total{{vip=\"{}\"}} {}", v.name, p.bytes);
            let _ = writeln!(o, "dispatcher_xdp_vip_new_flows_total{{vip=\"{}\"}} {}", v.name, n.packets);
        }
    }
    let _ = writeln!(o, "# TYPE dispatcher_xdp_backend_packets_total counter");
    for (i, b) in cfg.backends.iter().enumerate() {
        if let Ok(p) = t.counter(stats::backend_slot(i as u32, stats::BACKEND_PACKETS)) {
            let _ = writeln!(o, "dispatcher_xdp_backend_packets_total{{backend=\"{}\"}} {}", b.name, p.packets);
        }
    }
    o
}
