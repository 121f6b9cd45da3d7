//! SIP: SIPp's calls (INVITE, 200, ACK, BYE, 200) to four WebSphere-like SIP containers
//! in replica pairs, through the dispatcher's XDP SIP VIP (affinity by logical name,
//! Call-ID placement, direct server return) and through Kamailio with its dispatcher
//! module hashing the Call-ID (`ds_select_dst(set, "0")`, transaction-stateful relay,
//! failover by `ds_next_dst` and OPTIONS probing), each on a testbed of its own with the
//! same containers and the same SIPp.
//!
//! Load: a fixed call rate; SIPp's completed and failed calls, the requests the
//! containers received, the machine's CPU time per delivered request and the balancer's
//! own CPU time per request (the XDP program's run time from the kernel's BPF statistics
//! plus the agent's process time; Kamailio's processes' time).
//!
//! Failover: calls of 3 s at 25 calls/s; container b2 dies mid-call, then (next run) b1. SIPp's failed calls,
//! the containers' 481 answers, and in-dialog requests that reached a container holding
//! no copy of their dialog.
//!
//! Each over UDP, TCP (SIPp `-t t1`: one connection) and TLS (SIPp over TCP behind the
//! harness's TLS relay): the dispatcher's SIP VIP with that `transport` (TCP and TLS
//! terminated by the agent), Kamailio listening on that transport and relaying to the
//! containers over TCP for both stream transports.

use std::{
    collections::HashMap,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::{
    peers,
    report::{self, Row},
};
use dispatcher_testbed::{
    netns::{backend_ip, Testbed, CLIENT_IP, LB_IP},
    sipcontainer::SipCluster,
    sipp,
    tls::{certificate_entry, Pki},
};

/// How SIPp reaches the balancer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Transport {
    Udp,
    Tcp,
    Tls,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
        }
    }
}

/// Where SIPp sends its calls and with which options.
struct Caller {
    target: String,
    local_ip: &'static str,
    extra: &'static [&'static str],
}

/// The TLS relay's address in the client's namespace.
const RELAY: &str = "127.0.0.1:15061";
/// The name on the balancers' TLS certificates (what the relay checks).
const TLS_NAME: &str = "sip.example.test";

const VIP: &str = "10.99.100.70";
const BACKENDS: usize = 4;
/// The containers that die, one after the other, in the failover scenarios: b2 (its
/// replica is b3) and b1 (its replica is b0). Kamailio, which knows no replicas, hands
/// a dead destination's calls to the next active one of its list.
const VICTIMS: [usize; 2] = [2, 1];

#[derive(Default)]
struct Load {
    offered: f64,
    completed: u64,
    failed: u64,
    retransmissions: u64,
    requests: u64,
    secs: f64,
    machine_us: f64,
    balancer_us: f64,
}

#[derive(Default)]
struct Failover {
    victim: usize,
    calls: u32,
    completed: u64,
    failed: u64,
    not_found: u64,
    misroutes: usize,
    /// Where the victim's dialogs went after it died (container -> requests).
    went_to: HashMap<usize, usize>,
    /// SIPp's reasons for the failed calls (`FailedMaxUDPRetrans`, ...).
    why: Vec<String>,
}

/// CPU time (user + system) of a process and its descendants, in clock ticks.
fn tree_ticks(pid: u32) -> u64 {
    let mut total = 0;
    let mut stack = vec![pid];
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p: u32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let ppid = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    while let Some(p) = stack.pop() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            // Fields after the command: state ppid ... utime(14) stime(15), 1-based.
            let f: Vec<&str> = stat.rsplit(')').next().unwrap_or("").split_whitespace().collect();
            total += f.get(11).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            total += f.get(12).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        }
        stack.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
    }
    total
}

/// The XDP program attached to the dispatcher's interface: its cumulative run time (ns)
/// and run count from the kernel's BPF statistics.
fn xdp_runtime(tb: &Testbed) -> (u64, u64) {
    let link: serde_json::Value =
        serde_json::from_str(&tb.lb.exec(&["ip", "-j", "-d", "link", "show", "eth0"])).expect("ip -j link show");
    let id = link[0]["xdp"]["prog"]["id"].as_u64().expect("an XDP program on the dispatcher's eth0");
    let out = std::process::Command::new("bpftool")
        .args(["--json", "prog", "show", "id", &id.to_string()])
        .output()
        .expect("bpftool");
    let prog: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    (prog["run_time_ns"].as_u64().unwrap_or(0), prog["run_cnt"].as_u64().unwrap_or(0))
}

/// The machine's CPU time so far, in ns: every live task's run time (its scheduler
/// statistics; softirq work, this kernel having no IRQ time accounting, is charged to
/// the task it interrupted) plus what this process's reaped children used (SIPp, short
/// commands). `/proc/stat`'s tick samples miss most of a timer-paced load like SIPp's.
fn machine_ns() -> f64 {
    let mut total = 0u64;
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !p.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())) {
            continue;
        }
        for t in std::fs::read_dir(p.path().join("task")).into_iter().flatten().flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                total += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    let me = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let f: Vec<&str> = me.rsplit(')').next().unwrap_or("").split_whitespace().collect();
    let children: u64 = [13, 14].iter().filter_map(|&i| f.get(i)?.parse::<u64>().ok()).sum();
    total as f64 + children as f64 * 1e7
}

/// Requests (not OPTIONS) the containers have received so far.
fn delivered(sip: &SipCluster) -> u64 {
    sip.log.lock().unwrap().iter().filter(|s| s.method != "OPTIONS").count() as u64
}

/// A fixed call rate for `secs`; `balancer` reads the balancer's CPU so far (ns).
fn load(
    tb: &mut Testbed,
    sip: &SipCluster,
    caller: &Caller,
    rate: u32,
    secs: u32,
    balancer: &dyn Fn(&Testbed) -> f64,
) -> Load {
    let (client, before_req, before_cpu, before_bal) = (tb.client.clone(), delivered(sip), machine_ns(), balancer(tb));
    let start = Instant::now();
    let (target, local_ip) = (&caller.target, caller.local_ip);
    let run = sipp::Run { ns: &client, target, local_ip, calls: rate * secs, rate, pause_ms: 0, scenario: None };
    sipp::start_with(tb, &run, "sipp-load", caller.extra);
    let (_, c) = sipp::finish(tb, "sipp-load", Duration::from_secs(secs as u64 + 60));
    let took = start.elapsed().as_secs_f64();
    let requests = delivered(sip) - before_req;
    let (machine, bal) = (machine_ns() - before_cpu, balancer(tb) - before_bal);
    eprintln!(
        "      {requests} requests in {took:.1} s; machine CPU {:.0} ms, balancer {:.0} ms",
        machine / 1e6,
        bal / 1e6
    );
    let n = |k: &str| c.get(k).copied().unwrap_or(0);
    Load {
        offered: rate as f64,
        completed: n("SuccessfulCall"),
        failed: n("FailedCall"),
        retransmissions: n("Retransmissions"),
        requests,
        secs: took,
        machine_us: machine / 1e3 / requests.max(1) as f64,
        balancer_us: bal / 1e3 / requests.max(1) as f64,
    }
}

/// 150 calls of 3 s at 25 calls/s; the victim dies after 3.5 s.
fn failover(tb: &mut Testbed, sip: &SipCluster, caller: &Caller, victim: usize) -> Failover {
    let client = tb.client.clone();
    let (nf0, mis0) = (sip.not_found.load(Ordering::SeqCst), sip.misroutes().len());
    let calls = 150;
    let (target, local_ip) = (&caller.target, caller.local_ip);
    let run = sipp::Run { ns: &client, target, local_ip, calls, rate: 25, pause_ms: 3000, scenario: None };
    sipp::start_with(tb, &run, "sipp-failover", caller.extra);
    std::thread::sleep(Duration::from_millis(3500));
    let died_at = sip.log.lock().unwrap().len();
    tb.kill_servers_of(victim);
    sip.kill(victim);
    let (_, c) = sipp::finish(tb, "sipp-failover", Duration::from_secs(120));
    // The victim's dialogs (their INVITEs reached it), and where their later requests
    // went: a container without the dialog cannot tell whose it was.
    let seen = sip.seen();
    let its: std::collections::HashSet<&str> = seen[..died_at]
        .iter()
        .filter(|s| s.container == victim && s.method == "INVITE")
        .map(|s| s.call_id.as_str())
        .collect();
    let mut went_to = HashMap::new();
    for s in seen[died_at..].iter().filter(|s| its.contains(s.call_id.as_str())) {
        *went_to.entry(s.container).or_insert(0) += 1;
    }
    let n = |k: &str| c.get(k).copied().unwrap_or(0);
    Failover {
        victim,
        calls,
        completed: n("SuccessfulCall"),
        failed: n("FailedCall"),
        not_found: sip.not_found.load(Ordering::SeqCst) - nf0,
        misroutes: sip.misroutes().len() - mis0,
        went_to,
        why: {
            let mut why: Vec<String> = c
                .iter()
                .filter(|(k, v)| k.starts_with("Failed") && *k != "FailedCall" && **v > 0)
                .map(|(k, v)| format!("{} {v}", k.trim_start_matches("Failed")))
                .collect();
            why.sort();
            why
        },
    }
}

fn dispatcher_config(tb: &Testbed, t: Transport, pki: &Pki) -> String {
    let vip = match t {
        Transport::Udp => format!("address = \"{VIP}\"\nport = 5060\nmode = \"sip\"\n"),
        Transport::Tcp => format!("address = \"{VIP}\"\nport = 5060\nmode = \"sip\"\ntransport = \"tcp\"\n"),
        Transport::Tls => format!(
            "address = \"{VIP}\"\nport = 5061\nmode = \"sip\"\ntransport = \"tls\"\nbackend_port = 5060\n[vip.tls]\n{}",
            certificate_entry(&pki.dir.join("sip.pem"), &pki.dir.join("sip.key"), &[])
        ),
    };
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 2\n\n{}\n[[vip]]\nname = \"sip\"\n{vip}",
        tb.instance(),
        tb.backend_config(&[])
    )
}

fn start_kamailio(tb: &mut Testbed, t: Transport, pki: &Pki) {
    let dir = tb.workdir.clone();
    let list = dir.join("dispatcher.list");
    let param = if t == Transport::Udp { "" } else { ";transport=tcp" };
    let lines: String = (0..BACKENDS).map(|i| format!("1 sip:{}:5060{param}\n", backend_ip(i))).collect();
    std::fs::write(&list, lines).unwrap();
    let listen = match t {
        Transport::Udp => format!("udp:{LB_IP}:5060"),
        Transport::Tcp => format!("tcp:{LB_IP}:5060"),
        Transport::Tls => format!("tls:{LB_IP}:5061"),
    };
    let tls = if t == Transport::Tls {
        let cfg = dir.join("kamailio-tls.cfg");
        let (cert, key) = (pki.dir.join("sip.pem"), pki.dir.join("sip.key"));
        std::fs::write(
            &cfg,
            format!(
                "[server:default]\nmethod = TLSv1.2+\nverify_certificate = no\nrequire_certificate = no\nprivate_key = {}\ncertificate = {}\n\n[client:default]\nverify_certificate = no\nrequire_certificate = no\n",
                key.display(),
                cert.display()
            ),
        )
        .unwrap();
        format!("enable_tls=yes\nloadmodule \"tls.so\"\nmodparam(\"tls\", \"config\", \"{}\")", cfg.display())
    } else {
        String::new()
    };
    let values: [(&str, &dyn std::fmt::Display); 4] =
        [("LB_IP", &LB_IP), ("LIST", &list.display()), ("LISTEN", &listen), ("TLS", &tls)];
    let cfg = peers::write(&dir, "kamailio.cfg", peers::KAMAILIO, &values);
    let mut cmd = tb.lb.command("kamailio");
    cmd.arg("-DD").arg("-E").arg("-f").arg(&cfg).arg("-Y").arg(&dir).arg("-w").arg(&dir).args(["-m", "128"]);
    tb.start("kamailio", cmd);
    std::thread::sleep(Duration::from_millis(1500));
    if let Some(st) = tb.child_exited("kamailio") {
        panic!("kamailio exited ({st}):\n{}", tb.log("kamailio"));
    }
}

/// SIPp's way to `address`:`port` over `t` (TLS: through the harness's relay).
fn caller(tb: &mut Testbed, t: Transport, address: &str, pki: &Pki) -> Caller {
    match t {
        Transport::Udp => Caller { target: format!("{address}:5060"), local_ip: CLIENT_IP, extra: &[] },
        Transport::Tcp => Caller { target: format!("{address}:5060"), local_ip: CLIENT_IP, extra: &["-t", "t1"] },
        Transport::Tls => {
            let client = tb.client.clone();
            let target = format!("{address}:5061").parse().unwrap();
            sipp::start_tls_relay(tb, &client, RELAY.parse().unwrap(), target, &pki.dir.join("ca.pem"));
            Caller { target: RELAY.to_string(), local_ip: "127.0.0.1", extra: &["-t", "t1"] }
        }
    }
}

fn system(name: &str, t: Transport, rate: u32, secs: u32) -> (Load, Vec<Failover>) {
    let mut tb = Testbed::new(BACKENDS, &[VIP]);
    let sip = SipCluster::new(BACKENDS);
    if t == Transport::Udp {
        tb.start_sip(&sip, VIP, 5060);
    } else {
        tb.start_sip_tcp(&sip, 5060);
    }
    let pki = Pki::new(&tb.workdir);
    pki.leaf("ca", "sip", TLS_NAME, &[TLS_NAME], 20);
    let pid_of = |tb: &Testbed, what: &str| tb.pid_of(what).expect("running");
    if name == "kamailio" {
        start_kamailio(&mut tb, t, &pki);
        let caller = caller(&mut tb, t, LB_IP, &pki);
        let cpu = |tb: &Testbed| tree_ticks(pid_of(tb, "kamailio")) as f64 * 1e7;
        let l = load(&mut tb, &sip, &caller, rate, secs, &cpu);
        (l, VICTIMS.iter().map(|&v| failover(&mut tb, &sip, &caller, v)).collect())
    } else {
        if t != Transport::Udp {
            tb.add_local_vip(VIP);
        }
        let path = tb.write_config(&dispatcher_config(&tb, t, &pki));
        tb.start_dispatcher(&path);
        tb.wait_for_clone_table(BACKENDS as u64, Duration::from_secs(10));
        let caller = caller(&mut tb, t, VIP, &pki);
        let cpu = |tb: &Testbed| xdp_runtime(tb).0 as f64 + tree_ticks(pid_of(tb, "dispatcher")) as f64 * 1e7;
        let l = load(&mut tb, &sip, &caller, rate, secs, &cpu);
        (l, VICTIMS.iter().map(|&v| failover(&mut tb, &sip, &caller, v)).collect())
    }
}

/// `kernel.bpf_stats_enabled` on while it lives, then back to what it was.
struct BpfStats(String);

impl BpfStats {
    const PATH: &'static str = "/proc/sys/kernel/bpf_stats_enabled";

    fn enable() -> BpfStats {
        let before = std::fs::read_to_string(Self::PATH).unwrap_or_else(|_| "0".into());
        std::fs::write(Self::PATH, "1").expect("enable kernel.bpf_stats_enabled");
        BpfStats(before.trim().to_string())
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::PATH, &self.0);
    }
}

pub fn run(quick: bool) -> (String, String) {
    let (rate, secs) = if quick { (300, 4) } else { (600, 10) };
    eprintln!("==> SIP benchmark: SIPp at {rate} calls/s for {secs} s, then a container killed mid-call, per system");
    // The kernel's BPF run-time statistics, on for this benchmark only (even if it fails).
    let _stats = BpfStats::enable();
    let mut results = Vec::new();
    for t in [Transport::Udp, Transport::Tcp, Transport::Tls] {
        for name in ["dispatcher", "kamailio"] {
            eprintln!("    {name} over {}...", t.name());
            let label = if t == Transport::Udp { name.to_string() } else { format!("{name} {}", t.name()) };
            results.push((label, t, system(name, t, rate, secs)));
        }
    }
    drop(_stats);

    // Each system against Kamailio over the same transport.
    let kam = |t: Transport| &results.iter().find(|(n, rt, _)| *rt == t && n.starts_with("kamailio")).unwrap().2 .0;
    let failover_row = |name: &str, f: &Failover| {
        let mut went: Vec<String> = f.went_to.iter().map(|(c, n)| format!("b{c}: {n}")).collect();
        went.sort();
        let went_json: Vec<String> = f.went_to.iter().map(|(c, n)| format!("\"b{c}\":{n}")).collect();
        Row::new()
            .text("system", "", name)
            .text("container killed (its replica)", "", format!("b{} (b{})", f.victim, f.victim ^ 1))
            .json("victim", format!("\"b{}\"", f.victim))
            .int("calls (3 s, 25/s)", "calls", f.calls)
            .int("completed", "completed", f.completed)
            .int("failed", "failed", f.failed)
            .text("why (SIPp)", "", if f.why.is_empty() { "-".to_string() } else { f.why.join(", ") })
            .int("481 answers", "not_found_481", f.not_found)
            .int("requests to a container without the dialog", "non_owner_requests", f.misroutes)
            .text("the dead container's dialogs went to", "", went.join(", "))
            .json("victim_dialogs_went_to", format!("{{{}}}", went_json.join(",")))
    };
    let systems: Vec<Row> = results
        .iter()
        .map(|(name, t, (l, fs))| {
            Row::new()
                .text("system", "system", name)
                .num("calls/s offered", "calls_per_s_offered", l.offered, 0, 0)
                .md("calls completed/s", format!("{:.0}", l.completed as f64 / l.secs))
                .json("calls_completed", l.completed)
                .int("failed calls", "calls_failed", l.failed)
                .int("retransmissions", "retransmissions", l.retransmissions)
                .num("requests delivered/s", "requests_per_s", l.requests as f64 / l.secs, 0, 1)
                .num("machine CPU µs per request", "machine_cpu_us_per_request", l.machine_us, 1, 2)
                .num("balancer CPU µs per request", "balancer_cpu_us_per_request", l.balancer_us, 2, 3)
                .md("balancer CPU vs Kamailio", format!("{:.3}", l.balancer_us / kam(*t).balancer_us))
                .json("failover", report::json(&fs.iter().map(|f| failover_row(name, f)).collect::<Vec<_>>()))
        })
        .collect();
    let mut table = report::markdown(&systems);
    let failovers: Vec<Row> = results
        .iter()
        .flat_map(|(n, _, (_, fs))| fs.iter().map(move |f| (n, f)))
        .map(|(n, f)| failover_row(n, f))
        .collect();
    table += "\n";
    table += &report::markdown(&failovers);
    table += "\nSIPp's built-in UAC scenario; containers are the test harness's WebSphere-like SIP containers (b0/b1 and b2/b3 replica pairs, dialogs replicated at once, 481 for a dialog not held). Through the dispatcher the requests go by XDP alone and the answers straight back (direct server return); through Kamailio both pass its processes. Balancer CPU: the XDP program's run time (kernel BPF statistics) plus the agent's process time, against Kamailio's processes' time; machine CPU includes SIPp and the containers (the same for both). The dispatcher checks health every 200 ms (fall 2); Kamailio probes every 1 s (its minimum), 2 failures, and retries a transaction that timed out (1 s) on its next destination. Kamailio knows no replicas: a dead container's dialogs go to the next active destination of its list. Over TCP and TLS (\"dispatcher tcp\", \"kamailio tls\"...) SIPp keeps one connection (`-t t1`; TLS through the harness's rustls relay, the same for both), both balancers relay every message to the containers on TCP connections of their own, and each is compared with Kamailio over the same transport.\n";
    println!("\n{table}");
    (report::json(&systems), table)
}
