//! `cargo xtask demo`: a testbed in network namespaces, L4 traffic through the XDP
//! program, a backend drained and another failed on the way, live counters from the
//! pinned maps, a summary, and everything torn down.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use dispatcher::dataplane::tables::Tables;
use dispatcher_common::stats;
use dispatcher_tests::{
    netns::Testbed,
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.1";
const HTTP_VIP: &str = "10.99.100.8";
const HTTP_CLIENTS: usize = 6;
const CLIENT_THREADS: usize = 6;

#[derive(Default)]
struct Phase {
    conns: BTreeMap<String, u64>,
    errors: u64,
}

struct Shared {
    phase: Mutex<usize>,
    per_phase: Mutex<[Phase; 3]>,
}

fn main() {
    let seconds: u64 =
        std::env::args().skip_while(|a| a != "--seconds").nth(1).and_then(|s| s.parse().ok()).unwrap_or(12);
    let seconds = seconds.clamp(6, 600);
    println!("dispatcher demo: a client, the dispatcher and 4 backends (replica pairs b0/b1, b2/b3)");
    println!("  L4:   VIP {VIP} tcp/80, udp/5060 -> XDP (MAC forwarding, direct server return)");
    println!("  HTTP: VIP {HTTP_VIP}:80 -> the agent -> WebSphere-like clones on :8080, JSESSIONID affinity\n");

    let mut tb = Testbed::new(4, &[VIP, HTTP_VIP]);
    tb.add_local_vip(HTTP_VIP);
    let cfg_text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\npath = \"/health\"\ninterval = \"500ms\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\n\n[[vip]]\nname = \"sessions\"\naddress = \"{VIP}\"\nport = 5060\nprotocol = \"udp\"\n\n[[vip]]\nname = \"app\"\naddress = \"{HTTP_VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = 8080\n",
        tb.instance(),
        tb.backend_config(&[100, 100, 100, 100])
    );
    let cfg_path = tb.write_config(&cfg_text);
    let cfg_arg = cfg_path.to_str().unwrap().to_string();
    println!(
        "testbed {}: namespaces {}-{{cl,lb,sw,b0..b3}}, VIP {VIP} tcp/80 and udp/5060, MAC forwarding",
        tb.instance(),
        tb.instance()
    );
    tb.start_servers(&[80], &[(VIP, 5060)]);
    let app = websphere::Cluster::new(4);
    tb.start_websphere(&app, 8080);
    tb.start_dispatcher(&cfg_path);
    println!("dispatcher running in {} (maps pinned under {})\n", tb.lb.name, tb.pin_dir().display());

    // Long-lived UDP flows ("sessions"); make sure two of them sit on b2, which will fail.
    let mut sessions: Vec<(UdpSocket, String)> = Vec::new();
    for _ in 0..200 {
        if sessions.iter().filter(|(_, b)| b == "b2").count() >= 2 && sessions.len() >= 4 {
            break;
        }
        let s = udp_socket(&tb);
        if let Some(b) = udp_ask(&s) {
            if b == "b2" || sessions.len() < 2 {
                sessions.push((s, b));
            }
        }
    }

    let shared = Arc::new(Shared { phase: Mutex::new(0), per_phase: Mutex::new(Default::default()) });
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..CLIENT_THREADS {
        let (shared, stop) = (shared.clone(), stop.clone());
        clients.push(tb.client.spawn(move || client_loop(&shared, &stop)));
    }

    let http = Arc::new(HttpStats::default());
    let mut http_clients = Vec::new();
    for _ in 0..HTTP_CLIENTS {
        let (http, stop, ns) = (http.clone(), stop.clone(), tb.client.clone());
        http_clients.push(std::thread::spawn(move || http_client_loop(&ns, &http, &stop)));
    }

    let tables = Tables::from_pinned(&tb.pin_dir()).expect("pinned maps");
    let start = Instant::now();
    let mut drained = false;
    let mut failed = false;
    while start.elapsed() < Duration::from_secs(seconds) {
        std::thread::sleep(Duration::from_secs(1));
        let t = start.elapsed().as_secs();
        if !drained && t >= seconds / 3 {
            drained = true;
            println!("\n>>> t={t}s  dispatcher drain b0: b0 keeps its connections, takes no new ones");
            print!("    {}", tb.dispatcher_cmd(&["drain", "--config", &cfg_arg, "b0"]));
            // Connections counted from here on were opened after the drain took effect.
            *shared.phase.lock().unwrap() = 1;
        }
        if !failed && t >= 2 * seconds / 3 {
            failed = true;
            println!("\n>>> t={t}s  b2 fails (its servers stop) and is disabled: its flows move to its replica b3");
            // Connections that break while b2 dies count in the failure phase.
            *shared.phase.lock().unwrap() = 2;
            tb.kill_servers_of(2);
            print!("    {}", tb.dispatcher_cmd(&["disable", "--config", &cfg_arg, "b2"]));
        }
        print_live(&tables, &app, t);
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients.into_iter().chain(http_clients) {
        let _ = c.join();
    }

    println!("\n=== what happened ===");
    let per = shared.per_phase.lock().unwrap();
    for (i, name) in ["all up", "b0 drained", "b0 drained, b2 failed"].iter().enumerate() {
        let total: u64 = per[i].conns.values().sum();
        let spread: Vec<String> = per[i].conns.iter().map(|(b, n)| format!("{b}={n}")).collect();
        println!("{name:<24} {total:>6} new TCP connections: {}   broken: {}", spread.join(" "), per[i].errors);
    }
    let after_drain_b0: u64 =
        per[1].conns.get("b0").copied().unwrap_or(0) + per[2].conns.get("b0").copied().unwrap_or(0);
    println!("new connections to b0 after its drain: {after_drain_b0} (expected 0)");
    let after_fail_b2 = per[2].conns.get("b2").copied().unwrap_or(0);
    println!("new connections to b2 after its failure: {after_fail_b2} (expected 0)");
    for (s, before) in &sessions {
        let now = udp_ask(s).unwrap_or_else(|| "no answer".into());
        let note = if before == "b2" { "  <- moved to b2's peer replica" } else { "" };
        println!("UDP flow {:>5}: before {before}, now {now}{note}", s.local_addr().unwrap().port());
    }
    let hits = tables.counter(stats::vip_slot(1, stats::VIP_REPINNED)).map(|c| c.packets).unwrap_or(0);
    let agent_status: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--json"])).unwrap_or_default();
    println!(
        "flows moved to a replica: {} by the agent when b2 went out, {hits} by XDP on a packet before that",
        agent_status["agent"]["counters"]["flow_rewrites"]
    );

    println!("\nHTTP ({HTTP_CLIENTS} clients with cookie jars, new connection every 10 requests):");
    let requests = http.requests.load(Ordering::SeqCst);
    println!("  requests answered: {requests}, errors: {}", http.errors.load(Ordering::SeqCst));
    println!(
        "  session counters that continued without a gap: {} of {} responses",
        http.continued.load(Ordering::SeqCst),
        requests
    );
    println!("  sessions lost (a clone found no copy): {}", http.lost.load(Ordering::SeqCst));
    let (moved, misroutes) = session_moves(&app);
    println!("  sessions that moved to their replica when b2 failed: {moved}");
    println!("  misroutes (served by neither the session's owner nor its replica): {misroutes}");
    let status: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--json"])).unwrap_or_default();
    let k = &status["agent"]["counters"];
    println!(
        "  the agent counted: held {} (timed out {}), retries {}, failovers {}, misroutes {}",
        k["holds"], k["hold_timeouts"], k["retries"], k["failovers"], k["misroutes"]
    );
    println!("\nfinal status (dispatcher status):");
    print!("{}", tb.dispatcher_cmd(&["status", "--config", &cfg_arg]));
    drop(per);
    drop(tables);
    let name = tb.instance().to_string();
    drop(tb);
    println!("\ntestbed {name} torn down: processes stopped, namespaces deleted, pinned maps removed");
}

#[derive(Default)]
struct HttpStats {
    requests: AtomicU64,
    errors: AtomicU64,
    continued: AtomicU64,
    lost: AtomicU64,
}

fn http_client_loop(ns: &dispatcher_tests::netns::Ns, stats: &HttpStats, stop: &AtomicBool) {
    let addr: SocketAddr = format!("{HTTP_VIP}:80").parse().unwrap();
    let mut c = Client::new(ns, addr);
    let mut last = 0u64;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        n += 1;
        if n.is_multiple_of(10) {
            c.reconnect();
        }
        match c.get("/app/cart") {
            Ok(r) if r.status == 200 => {
                stats.requests.fetch_add(1, Ordering::SeqCst);
                let count: u64 = r.field("count").and_then(|v| v.parse().ok()).unwrap_or(0);
                if count == last + 1 {
                    stats.continued.fetch_add(1, Ordering::SeqCst);
                }
                if r.field("lost") == Some("1") {
                    stats.lost.fetch_add(1, Ordering::SeqCst);
                }
                last = count;
            }
            _ => {
                stats.errors.fetch_add(1, Ordering::SeqCst);
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// From the clones' own logs: sessions served by a second clone, and requests served by
/// a clone that was neither the session's first owner nor that owner's replica.
fn session_moves(app: &websphere::Cluster) -> (usize, usize) {
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

fn client_loop(shared: &Shared, stop: &AtomicBool) {
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    while !stop.load(Ordering::SeqCst) {
        let phase = *shared.phase.lock().unwrap();
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
        let mut per = shared.per_phase.lock().unwrap();
        match result {
            Ok(b) => *per[phase].conns.entry(b).or_default() += 1,
            Err(_) => per[phase].errors += 1,
        }
        drop(per);
        std::thread::sleep(Duration::from_millis(20));
    }
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

fn print_live(tables: &Tables, app: &websphere::Cluster, t: u64) {
    let hits = app.hits();
    let mut row = format!("t={t:>3}s  per backend: XDP packets/new flows, HTTP requests:");
    for b in 0..4u32 {
        let st = tables.backend(b).map(|i| i.state).unwrap_or(0);
        let state = match st {
            dispatcher_common::STATE_UP => "up",
            dispatcher_common::STATE_DRAIN => "drain",
            dispatcher_common::STATE_DISABLED => "disabled",
            _ => "down",
        };
        let p = tables.counter(stats::backend_slot(b, stats::BACKEND_PACKETS)).map(|c| c.packets).unwrap_or(0);
        let n = tables.counter(stats::backend_slot(b, stats::BACKEND_NEW_FLOWS)).map(|c| c.packets).unwrap_or(0);
        let h = hits.iter().filter(|x| x.backend == b as usize).count();
        row += &format!("  b{b}[{state}] {p}/{n} {h}");
    }
    println!("{row}");
}
