//! `cargo xtask demo`: the tour of the product. A client, the dispatcher and four
//! WebSphere-like clones in replica pairs (b0/b1, b2/b3), each in its own network
//! namespace. L4 traffic (TCP connections, UDP flows) goes through the XDP program, HTTP
//! sessions through the agent. While it runs, a live status view follows an operator
//! draining b0, b2 crashing (requests for its sessions are held, then served by its
//! replica b3), b2 coming back and b0 being enabled again. It ends with a summary
//! (requests, sessions kept, misroutes, failover times) and tears everything down.
//! SIPp calls go through a SIP VIP meanwhile (`sip`): b2's dialogs move to b3 with it.
//! `--dispatchers N`: the tour behind a router instead (`scale_out`). `--tls`: the HTTP
//! VIP is an HTTPS VIP (the agent terminates TLS) and the HTTP clients speak HTTPS.

mod scale_out;
mod sip;

use dispatcher::api::{AgentStatus, BackendStatus};
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, IsTerminal, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant, SystemTime},
};

use dispatcher::dataplane::tables::Tables;
use dispatcher_common::stats;
use dispatcher_testbed::{
    netns::{Ns, Testbed},
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.1";
const HTTP_VIP: &str = "10.99.100.8";
const HTTP_CLIENTS: usize = 8;
const L4_THREADS: usize = 4;
const BACKENDS: usize = 4;

/// Where the story is; L4 connections are counted per phase.
const PHASES: [&str; 6] =
    ["all up", "b0 drained", "b2 crashed, not yet detected", "b2 down (replica b3 serves)", "b2 back", "b0 enabled"];
const CRASHED: usize = 2;
const DOWN: usize = 3;

#[derive(Default)]
struct L4Stats {
    /// Per phase: new TCP connections per backend, and connections that broke.
    conns: Mutex<[BTreeMap<String, u64>; PHASES.len()]>,
    broken: [AtomicU64; PHASES.len()],
}

#[derive(Default)]
struct HttpStats {
    requests: AtomicU64,
    errors: AtomicU64,
    lost: AtomicU64,
    /// Clients whose session counter went on without a gap from start to end.
    sessions_kept: AtomicU64,
    /// The longest request, in microseconds (a held request waits for the failover).
    slowest_us: AtomicU64,
    /// Requests that took longer than 100 ms.
    slow: AtomicU64,
}

fn main() {
    let seconds: u64 =
        std::env::args().skip_while(|a| a != "--seconds").nth(1).and_then(|s| s.parse().ok()).unwrap_or(24);
    let seconds = seconds.clamp(12, 600);
    let dispatchers: Option<usize> =
        std::env::args().skip_while(|a| a != "--dispatchers").nth(1).and_then(|s| s.parse().ok());
    if let Some(n) = dispatchers.filter(|&n| n > 1) {
        scale_out::run(n, seconds);
        return;
    }
    let tls = std::env::args().any(|a| a == "--tls");
    let (http_port, scheme) = if tls { (443, "HTTPS") } else { (80, "HTTP") };
    println!("dispatcher demo: a client, the dispatcher and {BACKENDS} clones in replica pairs (b0/b1, b2/b3)");
    println!("  L4:   VIP {VIP} tcp/80 and udp/5060 -> XDP, MAC forwarding (direct server return)");
    println!(
        "  {scheme}: VIP {HTTP_VIP}:{http_port} -> the agent{} -> WebSphere-like clones on :8080, JSESSIONID affinity",
        if tls { " (TLS terminated, certificate for shop.example)" } else { "" }
    );
    println!("  SIP:  VIP {}:5060 -> XDP, affinity by logical name (ln0..ln3) -> SIP containers\n", sip::SIP_VIP);

    println!("[1/4] network namespaces, veth pairs, a switch");
    let mut tb = Testbed::new(BACKENDS, &[VIP, HTTP_VIP, sip::SIP_VIP]);
    tb.add_local_vip(HTTP_VIP);
    // HTTPS: a CA and a certificate for shop.example, made with openssl.
    let tls_section = if tls {
        let pki = dispatcher_testbed::tls::Pki::new(&tb.workdir);
        let (cert, key) = pki.leaf("ca", "shop", "shop.example", &["shop.example"], 30);
        format!("[vip.tls]\n{}", dispatcher_testbed::tls::certificate_entry(&cert, &key, &[]))
    } else {
        String::new()
    };
    let cfg_text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\npath = \"/health\"\ninterval = \"250ms\"\ntimeout = \"200ms\"\nfall = 2\nrise = 2\n\n[http]\nhold_time = \"3s\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\n\n[[vip]]\nname = \"sessions\"\naddress = \"{VIP}\"\nport = 5060\nprotocol = \"udp\"\n\n[[vip]]\nname = \"app\"\naddress = \"{HTTP_VIP}\"\nport = {http_port}\nmode = \"http\"\nbackend_port = 8080\n{tls_section}\n{}",
        tb.instance(),
        tb.backend_config_with(&[100; BACKENDS], sip::backend_lines),
        sip::vip_config()
    );
    let cfg_path = tb.write_config(&cfg_text);
    let cfg_arg = cfg_path.to_str().unwrap().to_string();
    println!("      testbed {}: namespaces {}-{{cl,lb,sw,b0..b3}}", tb.instance(), tb.instance());
    println!(
        "[2/4] backends: a line/datagram echo server (L4), a WebSphere-like clone (HTTP) and a SIP container on each"
    );
    tb.start_servers(&[80], &[(VIP, 5060)]);
    let app = websphere::Clones::new(BACKENDS);
    tb.start_websphere(&app, 8080);
    println!("[3/4] dispatcher run --config {cfg_arg}");
    tb.start_dispatcher(&cfg_path);
    println!("      XDP attached to {}/eth0, maps pinned under {}", tb.lb.name, tb.pin_dir().display());

    println!(
        "[4/4] traffic: {L4_THREADS} TCP clients, UDP flows, {HTTP_CLIENTS} HTTP clients with cookie jars, SIPp calls\n"
    );
    let sessions = udp_sessions(&tb);
    let calls = sip::start(&mut tb, seconds);
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let l4 = Arc::new(L4Stats::default());
    let http = Arc::new(HttpStats::default());
    let mut threads = Vec::new();
    for _ in 0..L4_THREADS {
        let (l4, phase, stop) = (l4.clone(), phase.clone(), stop.clone());
        threads.push(tb.client.spawn(move || l4_client(&l4, &phase, &stop)));
    }
    let tls_client = tls.then(|| websphere::tls_client_config(&tb.workdir.join("pki/ca.pem")));
    for _ in 0..HTTP_CLIENTS {
        let (http, stop, ns, tls_client) = (http.clone(), stop.clone(), tb.client.clone(), tls_client.clone());
        threads.push(std::thread::spawn(move || http_client(&ns, http_port, tls_client, &http, &stop)));
    }

    let tables = Tables::from_pinned(&tb.pin_dir()).expect("pinned maps");
    let mut view = View::new(std::io::stdout().is_terminal());
    let start = Instant::now();
    let at = |f: u64| Duration::from_millis(seconds * 1000 * f / 6);
    let mut step = 0;
    let mut crash_at = None;
    let mut back_at = None;
    let mut times = FailoverTimes::default();
    let mut hits_at_return = 0;
    let mut changes = StateChanges::default();
    view.baseline(&agent_status(&tb), &tables);
    let mut next_draw = Duration::from_secs(1);
    while start.elapsed() < Duration::from_secs(seconds) {
        let now = start.elapsed();
        if step < 4 && now >= at(step as u64 + 1) {
            match step {
                0 => {
                    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg_arg, "b0"]);
                    view.event(now, format!("operator: dispatcher drain b0 -> {}", out.trim()));
                    // After the command: connections counted as "drained" started after it.
                    phase.store(1, Ordering::SeqCst);
                }
                1 => {
                    phase.store(CRASHED, Ordering::SeqCst);
                    crash_at = Some(SystemTime::now());
                    tb.kill_servers_of(2);
                    app.kill(2);
                    calls.crash(2);
                    view.event(now, "b2 crashes (its clone and servers die; nobody tells the dispatcher)".into());
                }
                2 => {
                    // Timed from the restart's start, as the crash is from its start.
                    back_at = Some(SystemTime::now());
                    app.revive(2);
                    tb.start_websphere_on(&app, 2, 8080);
                    tb.start_servers_on(2, &[80], &[(VIP, 5060)]);
                    calls.restart(&mut tb, 2);
                    hits_at_return = app.hits().len();
                    view.event(now, "b2 restarts (its clone copies its sessions back from b3)".into());
                    phase.store(4, Ordering::SeqCst);
                }
                _ => {
                    // The phase first: a connection counted in the previous phase must
                    // have started before b0 could take new ones again.
                    phase.store(5, Ordering::SeqCst);
                    let out = tb.dispatcher_cmd(&["enable", "--config", &cfg_arg, "b0"]);
                    view.event(now, format!("operator: dispatcher enable b0 -> {}", out.trim()));
                }
            }
            step += 1;
        }
        // State changes as the agent logs them (every one, even a suspect state shorter
        // than this loop's pauses), timed by the agent's clock from the crash and the restart.
        let status = agent_status(&tb);
        for change in changes.read(&tb.log("dispatcher")) {
            let mut note = String::new();
            if change.backend == "b2" {
                // Which event a change follows is decided by the agent's time of it, not by
                // when this loop read it.
                let since = |t: Option<SystemTime>| t.and_then(|t| change.at.duration_since(t).ok());
                if let Some(d) = since(back_at) {
                    let ms = d.as_millis() as u64;
                    note = format!(" ({ms} ms after the restart)");
                    if change.to == "up" && times.up_ms.is_none() {
                        times.up_ms = Some(ms);
                    }
                } else if let Some(d) = since(crash_at) {
                    let ms = d.as_millis() as u64;
                    note = format!(" ({ms} ms after the crash)");
                    match change.to.as_str() {
                        "suspect" if times.suspect_ms.is_none() => times.suspect_ms = Some(ms),
                        "down" if times.down_ms.is_none() => {
                            times.down_ms = Some(ms);
                            phase.store(DOWN, Ordering::SeqCst);
                        }
                        _ => {}
                    }
                }
            }
            view.event(now, format!("agent: {} {} -> {}{note}", change.backend, change.from, change.to));
        }
        if now >= next_draw {
            view.draw(now, PHASES[phase.load(Ordering::SeqCst)], &status, &tables, &http);
            next_draw = now + Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let status = agent_status(&tb);
    view.draw(start.elapsed(), "done", &status, &tables, &http);

    println!("\n=== summary ===");
    let requests = http.requests.load(Ordering::SeqCst);
    println!("{scheme} ({HTTP_CLIENTS} clients, one session each, a new connection every 10 requests):");
    println!("  requests answered {requests}, errors {}", http.errors.load(Ordering::SeqCst));
    if let Some(t) = status.vips.iter().find(|v| v.name == "app").and_then(|v| v.tls.as_ref()) {
        let failed: u64 = t.failures.values().sum();
        println!(
            "  TLS handshakes: {} full, {} resumed (the clients resume their sessions on reconnect), failed {failed}",
            t.handshakes_full, t.handshakes_resumed
        );
    }
    println!(
        "  sessions kept (counter went on without a gap, start to end): {} of {HTTP_CLIENTS}; lost (no copy found): {}",
        http.sessions_kept.load(Ordering::SeqCst),
        http.lost.load(Ordering::SeqCst)
    );
    let (moved, misroutes) = session_moves(&app);
    let returned = returned_to_b2(&app, hits_at_return);
    println!(
        "  sessions that moved to their replica when b2 crashed: {moved}; back on b2 after its restart: {returned}"
    );
    println!("  misroutes (served by neither the session's owner nor its replica): {misroutes} (expected 0)");
    let k = &status.counters;
    println!(
        "  the agent counted: held {} (timed out {}), retries {}, failovers {}, misroutes {}",
        k.holds, k.hold_timeouts, k.retries, k.failovers, k.misroutes
    );
    println!(
        "  slowest request {} ms ({} took over 100 ms: held until the failover)",
        http.slowest_us.load(Ordering::SeqCst) / 1000,
        http.slow.load(Ordering::SeqCst)
    );
    println!("failover times (health checks every 250 ms, fall 2, rise 2):");
    let ms = |v: Option<u64>| v.map(|v| format!("{v} ms")).unwrap_or_else(|| "not seen".into());
    println!("  b2 crash -> suspect (requests for its sessions held): {}", ms(times.suspect_ms));
    println!("  b2 crash -> down (its sessions and flows go to b3):    {}", ms(times.down_ms));
    println!("  b2 restart -> up (its sessions come back):             {}", ms(times.up_ms));

    println!("L4 (new TCP connections per phase, by backend):");
    let conns = l4.conns.lock().unwrap();
    for (i, name) in PHASES.iter().enumerate() {
        let spread: Vec<String> = conns[i].iter().map(|(b, n)| format!("{b}={n}")).collect();
        let broken = l4.broken[i].load(Ordering::SeqCst);
        println!("  {name:<30} {:>6}: {}   broken: {broken}", conns[i].values().sum::<u64>(), spread.join(" "));
    }
    let b0_drained: u64 = (1..5).map(|p| conns[p].get("b0").copied().unwrap_or(0)).sum();
    println!("  new connections to b0 while drained: {b0_drained} (expected 0)");
    println!("  new connections to b2 while down: {} (expected 0)", conns[DOWN].get("b2").copied().unwrap_or(0));
    for (s, before) in &sessions {
        let now = udp_ask(s).unwrap_or_else(|| "no answer".into());
        println!("  UDP flow :{:<5} pinned to {before}, now answered by {now}", s.local_addr().unwrap().port());
    }
    println!("  flows moved to a replica by the agent: {}", status.counters.flow_rewrites);
    calls.summary(&mut tb, &tables, CRASHED);

    println!("\nfinal status (dispatcher status):");
    print!("{}", tb.dispatcher_cmd(&["status", "--config", &cfg_arg]));
    drop(conns);
    drop(tables);
    let name = tb.instance().to_string();
    drop(tb);
    println!("\ntestbed {name} torn down: processes stopped, namespaces deleted, pinned maps removed");
}

/// The agent's backend state changes, read from its log as it grows.
#[derive(Default)]
struct StateChanges {
    /// Bytes of the log already read (complete lines only).
    read: usize,
}

struct StateChange {
    /// The agent's time of the change.
    at: SystemTime,
    backend: String,
    from: String,
    to: String,
}

impl StateChanges {
    /// The changes logged since the last call. A line reads
    /// `<RFC 3339 time> INFO dispatcher::control: backend b2 up -> suspect: <reason>; ... backend=b2 from="up" to="suspect" reason_kind="timeout"`.
    fn read(&mut self, log: &str) -> Vec<StateChange> {
        let complete = log.rfind('\n').map_or(0, |i| i + 1);
        let new = log.get(self.read..complete).unwrap_or_default();
        self.read = self.read.max(complete);
        new.lines()
            .filter(|l| l.contains("dispatcher::control: backend ") && l.contains(" from="))
            .filter_map(|l| {
                let at = humantime::parse_rfc3339_weak(l.split_whitespace().next()?).ok()?;
                let field = |k: &str| {
                    l.split_whitespace()
                        .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
                        .map(|v| v.trim_matches('"').to_string())
                };
                Some(StateChange { at, backend: field("backend")?, from: field("from")?, to: field("to")? })
            })
            .collect()
    }
}

#[derive(Default)]
struct FailoverTimes {
    suspect_ms: Option<u64>,
    down_ms: Option<u64>,
    up_ms: Option<u64>,
}

/// The agent's view (empty while it does not answer).
fn agent_status(tb: &Testbed) -> AgentStatus {
    tb.admin("GET", "/status").and_then(|(_, body)| serde_json::from_str(&body).ok()).unwrap_or_default()
}

/// Backend `i` as the agent reports it ("?" states while it does not answer).
fn backend_of(status: &AgentStatus, i: usize) -> BackendStatus {
    status.backends.get(i).cloned().unwrap_or_else(|| BackendStatus {
        state: "?".into(),
        health: "?".into(),
        ..BackendStatus::default()
    })
}

/// The live view: redrawn in place on a terminal; otherwise events as they happen and
/// one line per second.
struct View {
    tty: bool,
    events: Vec<String>,
    drawn_lines: usize,
    /// Per backend: XDP packets and agent requests at the last draw (for rates).
    last: Vec<(u64, u64)>,
    last_at: Duration,
}

impl View {
    fn new(tty: bool) -> View {
        View { tty, events: Vec::new(), drawn_lines: 0, last: vec![(0, 0); BACKENDS], last_at: Duration::ZERO }
    }

    /// The counters at the start, so that the first rates cover a whole second.
    fn baseline(&mut self, status: &AgentStatus, tables: &Tables) {
        for i in 0..BACKENDS {
            let pkts =
                tables.counter(stats::backend_slot(i as u32, stats::BACKEND_PACKETS)).map(|c| c.packets).unwrap_or(0);
            self.last[i] = (pkts, backend_of(status, i).requests);
        }
    }

    fn event(&mut self, at: Duration, text: String) {
        let line = format!("t={:>5.1}s  {text}", at.as_secs_f64());
        if !self.tty {
            println!(">>> {line}");
        }
        self.events.push(line);
    }

    fn draw(&mut self, now: Duration, phase: &str, status: &AgentStatus, tables: &Tables, http: &HttpStats) {
        let dt = (now - self.last_at).as_secs_f64().max(0.001);
        self.last_at = now;
        let mut rows = Vec::new();
        for i in 0..BACKENDS {
            let b = backend_of(status, i);
            let pkts =
                tables.counter(stats::backend_slot(i as u32, stats::BACKEND_PACKETS)).map(|c| c.packets).unwrap_or(0);
            let (lp, lr) = std::mem::replace(&mut self.last[i], (pkts, b.requests));
            rows.push((
                format!("b{i}"),
                b.state,
                b.health,
                (pkts.saturating_sub(lp) as f64 / dt) as u64,
                (b.requests.saturating_sub(lr) as f64 / dt) as u64,
                b.active,
                b.connections,
            ));
        }
        let k = &status.counters;
        if !self.tty {
            let cells: Vec<String> =
                rows.iter().map(|r| format!("{}[{}] {} pkt/s {} req/s", r.0, r.1, r.3, r.4)).collect();
            println!(
                "t={:>5.1}s  {}  | held now {} holds {} failovers {} misroutes {}",
                now.as_secs_f64(),
                cells.join("  "),
                k.held_now,
                k.holds,
                k.failovers,
                k.misroutes
            );
            return;
        }
        let mut out = String::new();
        if self.drawn_lines > 0 {
            // Back to the top of the previous view, and clear below.
            out += &format!("\x1b[{}A\x1b[J", self.drawn_lines);
        }
        let mut lines = vec![
            format!("t={:>5.1}s  phase: {phase}", now.as_secs_f64()),
            format!(
                "  {:<8} {:<9} {:<8} {:>12} {:>10} {:>7} {:>6}",
                "BACKEND", "STATE", "HEALTH", "XDP pkts/s", "HTTP req/s", "ACTIVE", "CONNS"
            ),
        ];
        for r in &rows {
            lines.push(format!("  {:<8} {:<9} {:<8} {:>12} {:>10} {:>7} {:>6}", r.0, r.1, r.2, r.3, r.4, r.5, r.6));
        }
        lines.push(format!(
            "  HTTP: answered {} errors {} | held now {} holds {} retries {} failovers {} misroutes {} | clone table {}",
            http.requests.load(Ordering::SeqCst),
            http.errors.load(Ordering::SeqCst),
            k.held_now,
            k.holds,
            k.retries,
            k.failovers,
            k.misroutes,
            status.clones
        ));
        lines.push("  events:".into());
        let from = self.events.len().saturating_sub(8);
        lines.extend(self.events[from..].iter().map(|e| format!("    {e}")));
        for l in &lines {
            out += l;
            out.push('\n');
        }
        self.drawn_lines = lines.len();
        print!("{out}");
        let _ = std::io::stdout().flush();
    }
}

/// One session per client for the whole demo; a new connection every 10 requests.
fn http_client(
    ns: &Ns,
    port: u16,
    tls: Option<Arc<dispatcher_testbed::rustls::ClientConfig>>,
    stats: &HttpStats,
    stop: &AtomicBool,
) {
    let addr: SocketAddr = format!("{HTTP_VIP}:{port}").parse().unwrap();
    let mut c = Client::new(ns, addr);
    if let Some(config) = tls {
        c = c.over_tls(config, "shop.example");
    }
    let mut last = 0u64;
    let mut kept = true;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        if n.is_multiple_of(10) {
            c.reconnect();
        }
        let started = Instant::now();
        let r = c.get("/app/cart");
        let us = started.elapsed().as_micros() as u64;
        stats.slowest_us.fetch_max(us, Ordering::SeqCst);
        if us > 100_000 {
            stats.slow.fetch_add(1, Ordering::SeqCst);
        }
        match r {
            Ok(r) if r.status == 200 => {
                stats.requests.fetch_add(1, Ordering::SeqCst);
                let count: u64 = r.field("count").and_then(|v| v.parse().ok()).unwrap_or(0);
                if count != last + 1 {
                    kept = false;
                }
                if r.field("lost") == Some("1") {
                    stats.lost.fetch_add(1, Ordering::SeqCst);
                    kept = false;
                }
                last = count;
            }
            _ => {
                stats.errors.fetch_add(1, Ordering::SeqCst);
                c.reconnect();
            }
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    if kept && last > 0 {
        stats.sessions_kept.fetch_add(1, Ordering::SeqCst);
    }
}

/// From the clones' own logs: sessions served by a second clone, and requests served by
/// a clone that was neither the session's first owner nor that owner's replica.
fn session_moves(app: &websphere::Clones) -> (usize, usize) {
    let mut first: std::collections::HashMap<String, usize> = Default::default();
    let mut moved = std::collections::HashSet::new();
    let mut misroutes = 0;
    for h in app.hits() {
        let owner = *first.entry(h.session.clone()).or_insert(h.backend);
        if h.backend != owner {
            if h.backend == owner ^ 1 {
                moved.insert(h.session.clone());
            } else {
                misroutes += 1;
            }
        }
    }
    (moved.len(), misroutes)
}

/// Sessions first served by b2 that b2 served again after its restart.
fn returned_to_b2(app: &websphere::Clones, since: usize) -> usize {
    let hits = app.hits();
    let mut first: std::collections::HashMap<&str, usize> = Default::default();
    for h in &hits {
        first.entry(h.session.as_str()).or_insert(h.backend);
    }
    let back: std::collections::HashSet<&str> = hits[since.min(hits.len())..]
        .iter()
        .filter(|h| h.backend == 2 && first.get(h.session.as_str()) == Some(&2))
        .map(|h| h.session.as_str())
        .collect();
    back.len()
}

/// Short TCP connections (five lines each, all answered by the same backend).
fn l4_client(l4: &L4Stats, phase: &AtomicUsize, stop: &AtomicBool) {
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    while !stop.load(Ordering::SeqCst) {
        let p = phase.load(Ordering::SeqCst);
        let result = (|| -> std::io::Result<String> {
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            let mut w = s.try_clone()?;
            let mut r = BufReader::new(s);
            let mut first = String::new();
            for i in 0..5 {
                w.write_all(b"who\n")?;
                let mut line = String::new();
                if r.read_line(&mut line)? == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                if i == 0 {
                    first = line.trim().to_string();
                } else if line.trim() != first {
                    return Err(std::io::Error::other("connection moved between backends"));
                }
            }
            Ok(first)
        })();
        match result {
            Ok(b) => *l4.conns.lock().unwrap()[p].entry(b).or_default() += 1,
            // Counted in the phase in which it broke.
            Err(_) => {
                l4.broken[phase.load(Ordering::SeqCst)].fetch_add(1, Ordering::SeqCst);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A few long-lived UDP flows, two of them pinned to b2 (which will crash).
fn udp_sessions(tb: &Testbed) -> Vec<(UdpSocket, String)> {
    let mut sessions: Vec<(UdpSocket, String)> = Vec::new();
    for _ in 0..200 {
        if sessions.iter().filter(|(_, b)| b == "b2").count() >= 2 && sessions.len() >= 4 {
            break;
        }
        let s = udp_socket(tb);
        if let Some(b) = udp_ask(&s) {
            if b == "b2" || sessions.len() < 2 {
                sessions.push((s, b));
            }
        }
    }
    sessions
}

fn udp_socket(tb: &Testbed) -> UdpSocket {
    let addr: SocketAddr = format!("{VIP}:5060").parse().unwrap();
    let s = tb.client.run(move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(addr).unwrap();
        s
    });
    s.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    s
}

fn udp_ask(s: &UdpSocket) -> Option<String> {
    let mut buf = [0u8; 64];
    for _ in 0..4 {
        let _ = s.send(b"who");
        if let Ok(n) = s.recv(&mut buf) {
            return Some(String::from_utf8_lossy(&buf[..n]).trim().to_string());
        }
    }
    None
}
