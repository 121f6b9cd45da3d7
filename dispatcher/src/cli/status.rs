use dispatcher::api::{AgentStatus, BackendStatus, TlsStatus, VipStatus};

/// One HTTPS VIP's line: handshakes, the resumption rate, failures, and when each
/// certificate expires.
fn tls_line(name: &str, t: &TlsStatus) -> String {
    let all = t.handshakes_full + t.handshakes_resumed;
    let rate = if all == 0 { 0.0 } else { 100.0 * t.handshakes_resumed as f64 / all as f64 };
    let failed: Vec<String> = t.failures.iter().filter(|(_, n)| **n > 0).map(|(r, n)| format!("{r} {n}")).collect();
    let certs: Vec<String> = t
        .certificates
        .iter()
        .map(|c| {
            let days = c.expires_in_s.div_euclid(86_400);
            let when = if c.expires_in_s <= 0 { "EXPIRED".to_string() } else { format!("expires in {days} days") };
            format!("{} ({}) {when}", c.subject, c.names.join(" "))
        })
        .collect();
    format!(
        "tls {name}: handshakes {all} (resumed {}, {rate:.0}%), failed: {}; certificates: {}",
        t.handshakes_resumed,
        if failed.is_empty() { "none".to_string() } else { failed.join(", ") },
        certs.join("; ")
    )
}
use std::{
    fmt::Write as _,
    io::{IsTerminal, Write as _},
    path::Path,
    process::ExitCode,
};

use anyhow::Context as _;
use dispatcher::{
    config::{Config, Vip, VipMode},
    dataplane::tables::Tables,
};
use dispatcher_common::{stats, BackendInfo, Counter};

/// The name of a `BACKENDS` state byte.
fn state_name(v: u8) -> &'static str {
    dispatcher_common::BackendState::from_u8(v).name()
}

/// How a frame is printed: the aligned tables, one line of JSON, or CSV.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Json,
    Csv,
}

impl Format {
    pub fn of(json: bool, csv: bool) -> Format {
        match (json, csv) {
            (true, _) => Format::Json,
            (_, true) => Format::Csv,
            _ => Format::Table,
        }
    }
}

/// `status`, once or (`--watch SECS`) every SECS seconds, `count` times or until
/// interrupted; on a terminal each frame replaces the previous one.
pub fn status(path: &Path, format: Format, watch: Option<f64>, count: Option<u64>) -> anyhow::Result<ExitCode> {
    // Ids as the pinned maps know them (by name), not file positions.
    let cfg = dispatcher::dataplane::ids::placed(Config::load(path)?).map_err(|e| anyhow::anyhow!(e))?;
    let Some(every) = watch else {
        print!("{}", render(&cfg, format)?);
        return Ok(ExitCode::SUCCESS);
    };
    anyhow::ensure!(every.is_finite() && every >= 0.1, "--watch takes seconds, at least 0.1");
    let tty = std::io::stdout().is_terminal() && format == Format::Table;
    let mut frames = 0u64;
    loop {
        // An agent or maps that go away while watching are shown, not fatal.
        let frame = render(&cfg, format).unwrap_or_else(|e| format!("{e:#}\n"));
        let stamp = utc_clock();
        if tty {
            print!("\x1b[H\x1b[2J{stamp}  (every {every} s; Ctrl-C to stop)\n\n{frame}");
        } else if format != Format::Table {
            print!("{frame}");
        } else {
            print!("--- {stamp}\n{frame}\n");
        }
        let _ = std::io::stdout().flush();
        frames += 1;
        if count.is_some_and(|n| frames >= n) {
            return Ok(ExitCode::SUCCESS);
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(every));
    }
}

/// Configured farms and routes, one line each (a VIP's implicit farm is the VIP's line).
fn paths_section(o: &mut String, a: &AgentStatus) {
    let counts = |c: &dispatcher::api::PathCounts| {
        format!(
            "requests={} affinity={} failovers={} balanced={} misroutes={}",
            c.requests, c.affinity_hits, c.failovers, c.balanced, c.misroutes
        )
    };
    for f in a.farms.iter().filter(|f| !f.implicit) {
        let backups = if f.backup_servers.is_empty() {
            String::new()
        } else {
            format!(" backups {}", f.backup_servers.join(","))
        };
        let _ = writeln!(o, "farm {} [{}{backups}]: {}", f.name, f.servers.join(","), counts(&f.counts));
    }
    for r in &a.routes {
        let _ = writeln!(
            o,
            "route {} {} {} -> {}: {}",
            r.name,
            r.hosts.join(","),
            r.uris.join(","),
            r.farm,
            counts(&r.counts)
        );
    }
}

/// Seconds since the epoch as UTC `HH:MM:SS` (enough to tell frames apart).
fn utc_clock() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{:02}:{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60, secs % 60)
}

/// One VIP's XDP figures: forwarded packets and bytes, new flows, flow hits, drops.
type VipRow<'c> = (&'c Vip, dispatcher::dataplane::tables::VipFigures);
/// One backend's map entry and XDP figures: packets and bytes, new flows.
type BackendRow<'c> = (&'c dispatcher::config::Backend, BackendInfo, Counter, u64);

/// What one frame shows: the pinned maps' figures and the agent's view, or why none.
struct Frame<'c> {
    cfg: &'c Config,
    tables: Tables,
    /// Entries in `FLOWS`.
    flows: usize,
    vips: Vec<VipRow<'c>>,
    backends: Vec<BackendRow<'c>>,
    /// The XDP verdict counters (packets).
    globals: Vec<(&'static str, u64)>,
    agent: Option<AgentStatus>,
    /// Why the agent did not answer (not running, not allowed, busy).
    unanswered: Option<String>,
}

/// One status frame: the aligned tables, one line of JSON, or CSV.
fn render(cfg: &Config, format: Format) -> anyhow::Result<String> {
    let f = Frame::read(cfg)?;
    let mut o = String::new();
    match format {
        Format::Json => {
            f.json(&mut o);
            return Ok(o);
        }
        Format::Csv => return Ok(dispatcher::admin::csv::status_csv(cfg, &f.tables, f.agent.as_ref())?),
        Format::Table => {}
    }
    f.header(&mut o);
    f.vip_table(&mut o)?;
    f.backend_table(&mut o);
    let nonzero: Vec<String> = f.globals.iter().filter(|(_, v)| *v > 0).map(|(n, v)| format!("{n}={v}")).collect();
    let _ =
        writeln!(o, "xdp: {}", if nonzero.is_empty() { "no pass/drop events".to_string() } else { nonzero.join(" ") });
    if let Some(c) = f.agent.as_ref().map(|a| &a.counters) {
        let _ = writeln!(o,
            "http: holds={} held_now={} hold_timeouts={} retries={} retry_budget_refusals={} failovers={} misroutes={} learned_clones={}",
            c.holds, c.held_now, c.hold_timeouts, c.retries, c.retry_budget_refusals, c.failovers, c.misroutes, c.learned_clones
        );
        if c.no_route > 0 {
            let _ = writeln!(o, "http: no_route={} (answered 404)", c.no_route);
        }
        if let Some(line) = protocols_line(c) {
            let _ = writeln!(o, "{line}");
        }
        if cfg.vips.iter().any(|v| !v.retired && v.sip_stream().is_some()) {
            let _ = writeln!(o, "{}", sip_stream_line(c));
        }
    }
    if let Some(a) = f.agent.as_ref() {
        paths_section(&mut o, a);
    }
    if let Some(c) = f.agent.as_ref().and_then(|a| a.cluster.as_ref()) {
        cluster_section(&mut o, c);
    }
    if let Some(a) = f.agent.as_ref() {
        steering_section(&mut o, a.steering.as_ref(), a.announced);
    }
    Ok(o)
}

impl<'c> Frame<'c> {
    /// The pinned maps (an error says why there are none) and the agent's answer.
    fn read(cfg: &'c Config) -> anyhow::Result<Frame<'c>> {
        let dir = cfg.pin_dir();
        let tables = Tables::from_pinned(&dir).with_context(|| {
            if dispatcher::dataplane::private_mount_namespace() && !dispatcher::dataplane::is_bpffs(&cfg.bpffs) {
                format!("opening the maps pinned under {}: {}", dir.display(), dispatcher::dataplane::PRIVATE_BPFFS_HINT)
            } else {
                format!(
                    "opening the maps pinned under {}: no data plane is loaded for instance {} (`dispatcher run` loads it)",
                    dir.display(),
                    cfg.instance
                )
            }
        })?;
        let flows = tables.flow_count();
        let mut vips = Vec::new();
        for (i, v) in cfg.vips.iter().enumerate() {
            let id = i as u32;
            vips.push((v, tables.vip_figures(id)?));
        }
        let mut backends = Vec::new();
        for (i, b) in cfg.backends.iter().enumerate() {
            let id = i as u32;
            let info = tables.backend(id)?;
            let pk = tables.counter(stats::backend_slot(id, stats::BACKEND_PACKETS))?;
            let nf = tables.counter(stats::backend_slot(id, stats::BACKEND_NEW_FLOWS))?;
            backends.push((b, info, pk, nf.packets));
        }
        let globals = tables.global_counters()?.into_iter().map(|(n, c)| (n, c.packets)).collect();
        // The agent's view if it answers; otherwise why not (not running, not allowed, busy).
        let (agent, unanswered) = match dispatcher::admin::client::request(&cfg.admin_socket, "GET", "/status") {
            Ok((200, body)) => match serde_json::from_str::<AgentStatus>(&body) {
                Ok(a) => (Some(a), None),
                Err(e) => (None, Some(format!("the agent's status is unreadable: {e}"))),
            },
            Ok((code, body)) => {
                (None, Some(format!("the agent answered {code}: {}", dispatcher::admin::client::refusal(&body))))
            }
            Err(e) => (None, Some(dispatcher::admin::client::explain(&e, &cfg.instance))),
        };
        Ok(Frame { cfg, tables, flows, vips, backends, globals, agent, unanswered })
    }

    /// `--json`: one line.
    fn json(&self, o: &mut String) {
        let vips: Vec<_> = self
            .vips
            .iter()
            .enumerate()
            .map(|(i, (v, f))| {
                let mut j = serde_json::json!({"name": v.name, "address": v.address.to_string(), "port": v.port, "packets": f.forwarded.packets,
                    "bytes": f.forwarded.bytes, "new_flows": f.new_flows, "flow_hits": f.flow_hits, "drops": f.drops});
                if v.mode() == VipMode::Sip && v.in_xdp() {
                    let sip: serde_json::Map<String, serde_json::Value> =
                        self.tables.sip_counters(i as u32).unwrap_or_default().into_iter().map(|(n, c)| (n.to_string(), c.into())).collect();
                    j["sip"] = sip.into();
                }
                if v.takes_fragments() {
                    let frags: serde_json::Map<String, serde_json::Value> = self
                        .tables
                        .fragment_counters(i as u32)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|(n, c)| (n.to_string(), c.into()))
                        .collect();
                    j["fragments"] = frags.into();
                }
                j
            })
            .collect();
        let bes: Vec<_> = self
            .backends
            .iter()
            .map(|(b, info, pk, nf)| {
                serde_json::json!({"name": b.name, "address": b.address.to_string(), "state": state_name(info.state),
                    "operator": operator_name(info.admin), "weight": info.weight, "packets": pk.packets, "bytes": pk.bytes, "new_flows": nf})
            })
            .collect();
        let xdp: serde_json::Map<String, serde_json::Value> =
            self.globals.iter().map(|(n, v)| (n.to_string(), (*v).into())).collect();
        let cfg = self.cfg;
        let out = serde_json::json!({"instance": cfg.instance, "flows": self.flows, "flow_table_size": cfg.flow_table_size, "vips": vips, "backends": bes, "xdp": xdp, "agent": self.agent});
        let _ = writeln!(o, "{out}");
    }

    /// The instance, the agent (or why it does not answer), the tables' fill, missing pins.
    fn header(&self, o: &mut String) {
        let (cfg, flow_count) = (self.cfg, self.flows);
        let dir = cfg.pin_dir();
        let occupancy = format!(
            "flow table {flow_count} of {} entries ({:.1}%)",
            cfg.flow_table_size,
            flow_count as f64 * 100.0 / cfg.flow_table_size.max(1) as f64
        );
        let _ = match &self.agent {
            Some(a) => writeln!(
                o,
                "instance {}: agent running (pid {}, up {} s), clone table {} of {} entries{}, {occupancy}",
                cfg.instance,
                a.pid,
                a.uptime_s,
                a.clones,
                dispatcher_common::MAX_CLONES,
                if a.counters.clones_full > 0 {
                    format!(" (FULL: {} new IDs not kept)", a.counters.clones_full)
                } else {
                    String::new()
                }
            ),
            None => writeln!(
                o,
                "instance {}: {} - showing the pinned maps under {} only; {occupancy}",
                cfg.instance,
                self.unanswered
                    .as_deref()
                    .unwrap_or("agent not answering")
                    .replace("agent not running", "agent NOT running"),
                dir.display()
            ),
        };
        if let Some(missing) = self.agent.as_ref().map(|a| &a.pins_missing).filter(|m| !m.is_empty()) {
            let _ = writeln!(
                o,
                "WARNING: pins missing under {} and not restored ({}): the data plane will go with the agent",
                dir.display(),
                missing.join(", ")
            );
        }
        for w in self.agent.iter().flat_map(|a| &a.warnings) {
            let _ = writeln!(o, "WARNING: {w}");
        }
        let _ = writeln!(o);
    }

    /// Per VIP: XDP's figures and (HTTP VIPs) the agent's; TLS and SIP lines.
    fn vip_table(&self, o: &mut String) -> anyhow::Result<()> {
        // Per-VIP figures only the agent has (HTTP VIPs: requests, client connections).
        let agent_vip =
            |name: &str| -> Option<&VipStatus> { self.agent.as_ref()?.vips.iter().find(|v| v.name == name) };
        let _ = writeln!(
            o,
            "{:<16} {:<28} {:<5} {:>12} {:>14} {:>10} {:>10} {:>8} {:>9} {:>6}",
            "VIP", "ADDRESS", "MODE", "PACKETS", "BYTES", "NEW FLOWS", "FLOW HITS", "DROPS", "REQUESTS", "CONNS"
        );
        for (v, f) in &self.vips {
            let (p, nf, hits, drops) = (&f.forwarded, f.new_flows, f.flow_hits, f.drops);
            let addr = format!("{}:{}/{:?}", v.address, v.port, v.protocol).to_lowercase();
            let a = agent_vip(&v.name);
            let field = |f: fn(&VipStatus) -> u64| a.map(|x| f(x).to_string()).unwrap_or_else(|| "-".into());
            let mode = format!("{:?}", v.mode()).to_lowercase();
            let _ = writeln!(
                o,
                "{:<16} {:<28} {:<5} {:>12} {:>14} {:>10} {:>10} {:>8} {:>9} {:>6}",
                v.name,
                addr,
                mode,
                p.packets,
                p.bytes,
                nf,
                hits,
                drops,
                field(|x| x.requests),
                field(|x| x.connections)
            );
        }
        for t in self.agent.iter().flat_map(|a| &a.vips).filter_map(|v| Some((&v.name, v.tls.as_ref()?))) {
            let _ = writeln!(o, "{}", tls_line(t.0, t.1));
        }
        for (i, v) in self.cfg.vips.iter().enumerate().filter(|(_, v)| v.mode() == VipMode::Sip && v.in_xdp()) {
            let counts = self.tables.sip_counters(i as u32)?;
            let line: Vec<String> = counts.iter().map(|(n, c)| format!("{n} {c}")).collect();
            let _ = writeln!(o, "sip {}: {}", v.name, line.join(", "));
        }
        for (i, v) in self.cfg.vips.iter().enumerate().filter(|(_, v)| v.takes_fragments()) {
            let counts = self.tables.fragment_counters(i as u32)?;
            if counts.iter().all(|(_, c)| *c == 0) {
                continue;
            }
            let line: Vec<String> = counts.iter().map(|(n, c)| format!("{n} {c}")).collect();
            let _ = writeln!(o, "fragments {}: {}", v.name, line.join(", "));
        }
        let _ = writeln!(o);
        Ok(())
    }

    /// Per backend: the maps' state and XDP figures, the agent's health and requests;
    /// `maxconn` queues.
    fn backend_table(&self, o: &mut String) {
        // Per-backend figures only the agent has (requests, errors, active, health).
        let agent_backend =
            |name: &str| -> Option<&BackendStatus> { self.agent.as_ref()?.backends.iter().find(|b| b.name == name) };
        let _ = writeln!(
            o,
            "{:<12} {:<15} {:<9} {:<8} {:<9} {:>6} {:<12} {:>10} {:>9} {:>7} {:>6} {:>9} {:>7}  LAST CHANGE",
            "BACKEND",
            "ADDRESS",
            "STATE",
            "HEALTH",
            "OPERATOR",
            "WEIGHT",
            "REPLICA",
            "XDP PKTS",
            "NEW FLOWS",
            "ACTIVE",
            "CONNS",
            "REQUESTS",
            "ERRORS"
        );
        for (b, info, pk, nf) in &self.backends {
            let replica = b.replica.map(|r| self.cfg.backends[r].name.as_str()).unwrap_or("-");
            let a = agent_backend(&b.name);
            let field = |f: fn(&BackendStatus) -> String| a.map(f).unwrap_or_else(|| "-".into());
            let _ = writeln!(
                o,
                "{:<12} {:<15} {:<9} {:<8} {:<9} {:>6} {:<12} {:>10} {:>9} {:>7} {:>6} {:>9} {:>7}  {}",
                b.name,
                b.address.to_string(),
                state_name(info.state),
                field(|x| x.health.clone()),
                operator_name(info.admin),
                info.weight,
                replica,
                pk.packets,
                nf,
                field(|x| x.active.to_string()),
                field(|x| x.connections.to_string()),
                field(|x| x.requests.to_string()),
                field(|x| x.errors.to_string()),
                a.and_then(|x| x.last_change.as_ref()).map(last_change).unwrap_or_else(|| "-".into())
            );
        }
        for (name, q) in self.agent.iter().flat_map(|a| &a.backends).filter_map(|b| Some((&b.name, b.queue.as_ref()?)))
        {
            let _ = writeln!(
                o,
                "queue {name}: {} of maxconn {} in flight, {} of {} queued; queued {} (mean wait {:.1} ms), refused: full {} timeout {} left {}",
                q.in_flight, q.maxconn, q.queued, q.maxqueue, q.queued_total, q.wait_mean_ms, q.refused_full, q.refused_timeout, q.refused_left
            );
        }
        for line in self.agent.iter().flat_map(|a| &a.backends).filter_map(runtime_line) {
            let _ = writeln!(o, "{line}");
        }
        let _ = writeln!(o);
    }
}

/// What an operator set at runtime on a backend and the configuration says otherwise
/// (until the next reload): `backend b1: weight 50 (runtime; configured 100), health
/// checks disabled; until reload`; none when it runs as configured.
fn runtime_line(b: &BackendStatus) -> Option<String> {
    let limit = |m: Option<u64>| m.map_or_else(|| "none".to_string(), |m| m.to_string());
    let mut said = Vec::new();
    if b.weight != b.configured_weight && b.configured_weight != 0 {
        said.push(format!("weight {} (runtime; configured {})", b.weight, b.configured_weight));
    }
    let maxconn = b.queue.as_ref().map(|q| q.maxconn);
    if maxconn != b.configured_maxconn {
        said.push(format!("maxconn {} (runtime; configured {})", limit(maxconn), limit(b.configured_maxconn)));
    }
    if b.checks_disabled {
        said.push("health checks disabled".into());
    }
    (!said.is_empty()).then(|| format!("backend {}: {}; until reload", b.name, said.join(", ")))
}

/// A backend's last change of state, beside its state: `up -> suspect: timeout after
/// 2.0s (check 2001 ms), 42 s ago`.
fn last_change(c: &dispatcher::api::ChangeStatus) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let check = c.check_ms.map(|ms| format!(" (check {ms} ms)")).unwrap_or_default();
    format!("{} -> {}: {}{check}, {} s ago", c.from, c.to, c.reason, now.saturating_sub(c.at_unix))
}

/// Behind ECMP: the announcements and the ownership table of HTTP connections.
fn steering_section(o: &mut String, s: Option<&dispatcher::api::SteeringStatus>, announced: Option<bool>) {
    if let Some(up) = announced {
        let _ = writeln!(
            o,
            "announced: {}",
            if up { "yes (BIRD exports the VIPs)" } else { "NO (withdrawn: left or stopping)" }
        );
    }
    let Some(s) = s else { return };
    let table =
        if s.active { format!("generation {}, {}", s.generation, s.dispatchers.join(" ")) } else { "none yet".into() };
    let _ = writeln!(
        o,
        "steering: {}; table {table}",
        if s.joined { "joined" } else { "LEFT (connections close after their next response)" }
    );
    if let (Some(ago), Some(what)) = (s.changed_s_ago, &s.last_change) {
        let _ = writeln!(o, "  last change: {what}, {ago:.1} s ago");
    }
    if !s.previous.is_empty() {
        let _ = writeln!(
            o,
            "  second chance: previous table {} for {:.0} s more",
            s.previous.join(" "),
            s.second_chance_left_s.unwrap_or(0.0)
        );
    }
    let _ = writeln!(
        o,
        "  packets: steered {}, second chances {}, kept here {}, TTL spent {}",
        s.steered, s.second_chances, s.kept_local, s.ttl_expired
    );
    if let Some(t) = &s.takeover {
        let _ = writeln!(
            o,
            "  takeover: {} connections registered here ({} sent, {} bytes; {} not registered); {} of others' held, {} armed",
            t.tracked, t.records_sent, t.bytes_sent, t.untracked, t.held, t.armed_now
        );
        let _ = writeln!(
            o,
            "    taken over: {} rebuilt ({} with the client's segment), {} reset (busy at the death), {} failed; refused: {} batches, {} records, {} reports",
            t.rebuilt, t.given, t.reset, t.failed, t.batches_refused, t.records_refused, t.reports_refused
        );
    }
}

/// `[cluster]`: the store, the live dispatchers and where their views differ.
fn cluster_section(o: &mut String, c: &dispatcher::api::ClusterStatus) {
    let _ = writeln!(o);
    let store = match (&*c.store, &c.last_error) {
        ("connected", _) => format!(
            "connected for {} s via {}, {} etcd members, leader {}, revision {}",
            c.store_for_s, c.via, c.store_members, c.leader, c.revision
        ),
        (_, Some(e)) => {
            format!("UNREACHABLE for {} s ({e}): forwarding with the last shared state and own checks", c.store_for_s)
        }
        _ => format!("UNREACHABLE for {} s", c.store_for_s),
    };
    let _ = writeln!(o, "cluster: this dispatcher is {}; store {store}", c.name);
    let _ = writeln!(o, "  endpoints: {}", c.endpoints.join(", "));
    let warn = if c.insecure { "WARNING: " } else { "" };
    let _ = writeln!(o, "  security: {warn}{}", c.security);
    let refused: Vec<String> = c.refused_keys.iter().filter(|(_, n)| *n > 0).map(|(r, n)| format!("{r}={n}")).collect();
    if !refused.is_empty() {
        let _ = writeln!(o, "  keys refused: {}", refused.join(" "));
    }
    let members: Vec<String> = c
        .members
        .iter()
        .map(|m| {
            let left = if m.mac.is_some() && !m.joined { " [left]" } else { "" };
            let mut says = Vec::new();
            if !m.down.is_empty() {
                says.push(format!("sees down: {}", m.down.join(",")));
            }
            if !m.unreachable.is_empty() {
                says.push(format!("cannot reach: {}", m.unreachable.join(",")));
            }
            if says.is_empty() {
                format!("{}{left}", m.name)
            } else {
                format!("{}{left} ({})", m.name, says.join("; "))
            }
        })
        .collect();
    let _ = writeln!(o, "  live dispatchers ({}): {}", c.members.len(), members.join(", "));
    for d in &c.differing {
        let _ = writeln!(o, "  views differ: {d}");
    }
    if let Some(a) = &c.heartbeat_address {
        let peers: Vec<String> = c
            .heartbeats
            .iter()
            .map(|p| {
                let heard = p.last_heard_ms.map_or("never heard".to_string(), |ms| format!("heard {ms} ms ago"));
                let state = if p.reachable { "alive" } else { "UNREACHABLE" };
                format!("{} {state} ({heard})", p.name)
            })
            .collect();
        let refused: Vec<String> =
            c.heartbeats_refused.iter().filter(|(_, n)| *n > 0).map(|(r, n)| format!(" {r}={n}")).collect();
        let _ = writeln!(
            o,
            "  heartbeats on {a}: {}; sent {}, received {}{}",
            if peers.is_empty() { "no peer".to_string() } else { peers.join(", ") },
            c.heartbeats_sent,
            c.heartbeats_received,
            if refused.is_empty() { String::new() } else { format!(", refused{}", refused.join("")) }
        );
    }
    for d in &c.out_unreachable {
        let _ = writeln!(o, "  out of the ownership table: {d}");
    }
    let ops = if c.operators.is_empty() { "none".to_string() } else { c.operators.join(" ") };
    let _ = writeln!(
        o,
        "  operator states: {ops}; shared clone IDs: {}; writes {} (pending {}, dropped {}), lease renewals {}, sessions {}",
        c.shared_clones, c.writes, c.pending_writes, c.dropped_writes, c.renewals, c.sessions
    );
}

/// The operator's state as the maps keep it (`BackendInfo::admin`).
fn operator_name(admin: u8) -> &'static str {
    match admin {
        0 => "-",
        a => state_name(a),
    }
}

/// `sip over tcp/tls: connections=C refused=R messages <outcome>:n,...` (the outcomes
/// that happened), for a configuration with SIP VIPs over TCP or TLS.
fn sip_stream_line(c: &dispatcher::api::CounterStatus) -> String {
    let outcomes: Vec<String> = c
        .by_label
        .get("sip_stream_messages")
        .into_iter()
        .flatten()
        .filter(|(_, n)| **n > 0)
        .map(|(o, n)| format!("{o}:{n}"))
        .collect();
    format!(
        "sip over tcp/tls: connections={} refused={} messages {}",
        c.sip_stream_connections,
        c.sip_stream_refused,
        if outcomes.is_empty() { "none".to_string() } else { outcomes.join(",") }
    )
}

/// `protocols: h1 requests=R connections=C; h2 requests=R connections=C open=O
/// streams_in_flight=S refused=N resets_sent=<reason>:n,... resets_received=...
/// goaways=<reason>:n,...` — once a client spoke HTTP/2 (`None` before).
fn protocols_line(c: &dispatcher::api::CounterStatus) -> Option<String> {
    let of = |key: &str, label: &str| c.by_label.get(key).and_then(|m| m.get(label)).copied().unwrap_or(0);
    if of("connections_by_protocol", "h2") == 0 {
        return None;
    }
    let reasons = |key: &str| {
        let nonzero: Vec<String> = c
            .by_label
            .get(key)
            .into_iter()
            .flatten()
            .filter(|(_, n)| **n > 0)
            .map(|(r, n)| format!("{r}:{n}"))
            .collect();
        if nonzero.is_empty() {
            "0".to_string()
        } else {
            nonzero.join(",")
        }
    };
    Some(format!(
        "protocols: h1 requests={} connections={}; h2 requests={} connections={} open={} streams_in_flight={} refused={} resets_sent={} resets_received={} goaways={}",
        of("requests_by_protocol", "h1"),
        of("connections_by_protocol", "h1"),
        of("requests_by_protocol", "h2"),
        of("connections_by_protocol", "h2"),
        c.h2_connections_open,
        c.h2_streams_in_flight,
        c.h2_refused,
        reasons("h2_resets_sent"),
        reasons("h2_resets_received"),
        reasons("h2_goaways"),
    ))
}

#[cfg(test)]
mod protocol_tests {
    use super::*;

    #[test]
    fn runtime_settings_are_said_against_the_configuration() {
        let b = BackendStatus { name: "b1".into(), weight: 100, configured_weight: 100, ..Default::default() };
        assert_eq!(runtime_line(&b), None, "as configured");
        let q = dispatcher::api::QueueStatus { maxconn: 1, ..Default::default() };
        let b = BackendStatus { weight: 50, queue: Some(q), checks_disabled: true, ..b };
        assert_eq!(
            runtime_line(&b).unwrap(),
            "backend b1: weight 50 (runtime; configured 100), maxconn 1 (runtime; configured none), \
             health checks disabled; until reload"
        );
        let b = BackendStatus { weight: 100, queue: None, checks_disabled: false, configured_maxconn: Some(5), ..b };
        assert_eq!(runtime_line(&b).unwrap(), "backend b1: maxconn none (runtime; configured 5); until reload");
    }

    #[test]
    fn the_sip_stream_line_names_the_outcomes_that_happened() {
        let mut c = dispatcher::api::CounterStatus::default();
        assert_eq!(sip_stream_line(&c), "sip over tcp/tls: connections=0 refused=0 messages none");
        let split = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        c.by_label.insert("sip_stream_messages".into(), split(&[("call_id", 3), ("held", 0), ("to_tag", 6)]));
        c.sip_stream_connections = 2;
        assert_eq!(sip_stream_line(&c), "sip over tcp/tls: connections=2 refused=0 messages call_id:3,to_tag:6");
    }

    #[test]
    fn the_protocols_line_appears_once_a_client_spoke_http2_and_names_each_reason() {
        let mut c = dispatcher::api::CounterStatus::default();
        let split = |pairs: &[(&str, u64)]| pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        c.by_label.insert("connections_by_protocol".into(), split(&[("h1", 4), ("h2", 0)]));
        assert_eq!(protocols_line(&c), None, "no HTTP/2 client yet");
        c.by_label.insert("connections_by_protocol".into(), split(&[("h1", 4), ("h2", 2)]));
        c.by_label.insert("requests_by_protocol".into(), split(&[("h1", 10), ("h2", 30)]));
        c.by_label.insert("h2_goaways".into(), split(&[("stop", 1), ("rapid_reset", 1), ("idle", 0)]));
        c.h2_streams_in_flight = 3;
        assert_eq!(
            protocols_line(&c).unwrap(),
            "protocols: h1 requests=10 connections=4; h2 requests=30 connections=2 open=0 streams_in_flight=3 refused=0 resets_sent=0 resets_received=0 goaways=rapid_reset:1,stop:1"
        );
    }
}
