//! Failover: clients with cookie jars against WebSphere-like clones; one clone is killed
//! (kill -9: memory lost) or stopped (SIGSTOP: accepts TCP, answers nothing) under load.
//! The dispatcher and HAProxy (cookie persistence by clone ID with `option redispatch`,
//! the same health-check timing) each get a fresh testbed with the same scenario; both are
//! judged from the clones' own logs.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use crate::{
    peers,
    report::{self, Row},
};
use dispatcher_testbed::{
    netns::Testbed,
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.40";
const PORT: u16 = 8080;
const CLIENTS: usize = 16;

#[derive(Clone, Copy, PartialEq)]
pub enum Fault {
    Kill,
    Stop,
}

struct Outcome {
    system: &'static str,
    fault: &'static str,
    requests: usize,
    failed: usize,
    lost_sessions: usize,
    misroutes: usize,
    first_moved_ms: Option<f64>,
    longest_ms: f64,
    stopped_clone_got: u64,
    /// The dispatcher's own counters (held requests, retries); HAProxy: none.
    held: Option<u64>,
    retries: Option<u64>,
}

fn config(tb: &Testbed) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nworkers = 1\nhold_time = \"3s\"\nserver_timeout = \"1s\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"300ms\"\nrise = 2\nfall = 2\n\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {PORT}\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    )
}

/// Runs one scenario on a fresh testbed against `system` ("dispatcher" or "haproxy").
fn scenario(system: &'static str, fault: Fault, secs: u64) -> Outcome {
    let mut tb = Testbed::new(4, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(4);
    tb.start_websphere(&cluster, PORT);
    let port = if system == "dispatcher" {
        let path = tb.write_config(&config(&tb));
        tb.start_dispatcher(&path);
        80
    } else {
        let (use_servers, servers) = peers::haproxy_clone_servers(PORT, " check inter 200ms fall 2 rise 2");
        let conf = peers::write(
            &tb.workdir,
            "haproxy.cfg",
            peers::HAPROXY_FAILOVER,
            &[
                ("DIR", &tb.workdir.display()),
                ("BIND", &format!("{VIP}:81")),
                ("USE_SERVERS", &use_servers),
                ("SERVERS", &servers),
            ],
        );
        let mut cmd = tb.lb.command("haproxy");
        cmd.arg("-db").arg("-f").arg(&conf);
        tb.start("haproxy", cmd);
        std::thread::sleep(Duration::from_millis(800));
        81
    };
    let addr: SocketAddr = format!("{VIP}:{port}").parse().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let fault_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    // Per request: (sent at, took, status, clone that answered, session was on clone0 before).
    type Row = (Instant, Duration, u16, String);
    let logs: Vec<Arc<Mutex<Vec<Row>>>> = (0..CLIENTS).map(|_| Arc::new(Mutex::new(Vec::new()))).collect();
    let mut threads = Vec::new();
    for log in &logs {
        let (log, stop, ns) = (log.clone(), stop.clone(), tb.client.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(&ns, addr);
            while !stop.load(Ordering::SeqCst) {
                let t = Instant::now();
                let (status, clone) = match c.get("/app") {
                    Ok(r) => (r.status, r.field("clone").unwrap_or("").to_string()),
                    Err(_) => (0, String::new()),
                };
                log.lock().unwrap().push((t, t.elapsed(), status, clone));
                if status != 200 {
                    c.reconnect();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    std::thread::sleep(Duration::from_secs(2));
    let t_fault = Instant::now();
    *fault_at.lock().unwrap() = Some(t_fault);
    match fault {
        Fault::Kill => {
            tb.kill_servers_of(0);
            cluster.kill(0);
        }
        Fault::Stop => cluster.freeze(0, true),
    }
    std::thread::sleep(Duration::from_secs(secs));
    let stopped_got = cluster.received_frozen[0].load(Ordering::SeqCst);
    let counters = (system == "dispatcher").then(|| {
        let st: dispatcher::api::AgentStatus =
            tb.admin("GET", "/status").and_then(|(_, body)| serde_json::from_str(&body).ok()).unwrap_or_default();
        (st.counters.holds, st.counters.retries)
    });
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    cluster.freeze(0, false);

    let hits = cluster.hits();
    let lost_sessions = hits.iter().filter(|h| h.lost).count();
    // A request whose cookie names a clone served by a clone that is neither that clone
    // nor its peer replica.
    let misroutes = hits
        .iter()
        .filter(|h| {
            h.cookie_clones
                .first()
                .and_then(|c| c.trim_start_matches("clone").trim_end_matches('x').parse::<usize>().ok())
                .is_some_and(|o| h.backend != o && h.backend != o ^ 1)
        })
        .count();
    let mut requests = 0;
    let mut failed = 0;
    let mut first_moved: Option<Duration> = None;
    let mut longest = Duration::ZERO;
    for log in &logs {
        let rows = log.lock().unwrap();
        let was_on_0 = rows.iter().any(|r| r.0 < t_fault && r.3 == "clone0x");
        for r in rows.iter() {
            requests += 1;
            if r.2 != 200 {
                failed += 1;
            }
            if r.0 >= t_fault {
                longest = longest.max(r.1);
                if was_on_0 && r.2 == 200 && r.3 == "clone1x" {
                    let at = (r.0 + r.1).duration_since(t_fault);
                    first_moved = Some(first_moved.map_or(at, |f| f.min(at)));
                }
            }
        }
    }
    Outcome {
        system,
        fault: if fault == Fault::Kill { "kill -9" } else { "SIGSTOP" },
        requests,
        failed,
        lost_sessions,
        misroutes,
        first_moved_ms: first_moved.map(|d| d.as_secs_f64() * 1000.0),
        longest_ms: longest.as_secs_f64() * 1000.0,
        stopped_clone_got: stopped_got,
        held: counters.map(|c| c.0),
        retries: counters.map(|c| c.1),
    }
}

pub fn run(quick: bool) -> (String, String) {
    let secs = if quick { 4 } else { 8 };
    eprintln!(
        "==> failover benchmark: {CLIENTS} cookie-jar clients, a clone killed or stopped after 2 s, {secs} s after"
    );
    let mut rows = Vec::new();
    for fault in [Fault::Kill, Fault::Stop] {
        for system in ["dispatcher", "haproxy"] {
            let o = scenario(system, fault, secs);
            eprintln!(
                "    {:<8} {:<10} requests {:>5}  failed {:>3}  lost sessions {:>3}  misroutes {:>3}  first moved {}  longest {:.0} ms",
                o.fault,
                o.system,
                o.requests,
                o.failed,
                o.lost_sessions,
                o.misroutes,
                o.first_moved_ms.map(|m| format!("{m:.0} ms")).unwrap_or_else(|| "-".into()),
                o.longest_ms
            );
            rows.push(o);
        }
    }
    let table_rows: Vec<Row> = rows
        .iter()
        .map(|o| {
            let count = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or("-".into());
            Row::new()
                .text("fault", "fault", o.fault)
                .text("system", "system", o.system)
                .int("requests", "requests", o.requests)
                .int("failed (5xx or error)", "failed", o.failed)
                .int("sessions lost", "lost_sessions", o.lost_sessions)
                .int("misroutes", "misroutes", o.misroutes)
                .md(
                    "replica serves a moved session after",
                    o.first_moved_ms.map(|m| format!("{m:.0} ms")).unwrap_or_else(|| "-".into()),
                )
                .json("first_moved_ms", o.first_moved_ms.map(|m| format!("{m:.1}")).unwrap_or("null".into()))
                .md("longest request", format!("{:.0} ms", o.longest_ms))
                .json("longest_ms", format!("{:.1}", o.longest_ms))
                .md("requests held", count(o.held))
                .md("retries", count(o.retries))
                .md(
                    "requests the stopped clone received",
                    if o.fault == "SIGSTOP" { o.stopped_clone_got.to_string() } else { "-".into() },
                )
                .json("stopped_clone_received", o.stopped_clone_got)
        })
        .collect();
    let mut table = report::markdown(&table_rows);
    table += &format!("\n{CLIENTS} clients, one request every ~20 ms each; clone b0 (replica b1) fails 2 s in; {secs} s measured after. Health checks every 200 ms, fall 2, rise 2, server timeout 1 s, for both. Misroutes and lost sessions are counted from the clones' own logs.\n");
    println!("\n{table}");
    (report::json(&table_rows), table)
}
