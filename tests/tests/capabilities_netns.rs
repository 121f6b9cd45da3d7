//! The agent with only the capabilities its unit grants (CAP_BPF, CAP_PERFMON,
//! CAP_NET_ADMIN, CAP_NET_BIND_SERVICE; as root's uid, the bounding set cut to those, as
//! `dispatcher@.service` runs it): it attaches, fills its maps and serves the demo's
//! kinds of traffic (L4 through XDP, HTTP sessions through the agent). Without
//! CAP_NET_ADMIN the kernel refuses to load its XDP program, and it says so. (Without
//! CAP_PERFMON the verifier refuses the program too: checked by hand, not kept as a test.)

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::{dispatcher_bin, Testbed},
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.1";
const HTTP_VIP: &str = "10.99.100.8";
/// As dispatcher@.service grants them.
const CAPS: &str = "+bpf,+perfmon,+net_admin,+net_bind_service";

/// The `dispatcher run` command under setpriv with only `caps` (root's uid, no others
/// in any set).
fn limited(tb: &Testbed, config: &std::path::Path, caps: &str) -> std::process::Command {
    let mut cmd = tb.lb.command("setpriv");
    cmd.arg(format!("--bounding-set=-all,{caps}"))
        .arg(format!("--inh-caps=-all,{caps}"))
        .arg(format!("--ambient-caps=-all,{caps}"))
        .arg("--")
        .arg(dispatcher_bin())
        .args(["run", "--config"])
        .arg(config);
    cmd
}

fn config(tb: &Testbed) -> std::path::PathBuf {
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n[health]\npath = \"/health\"\ninterval = \"250ms\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n\n[[vip]]\nname = \"app\"\naddress = \"{HTTP_VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = 8080\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    tb.write_config(&text)
}

/// `n` connections to the L4 VIP from the client: each one's answer (the backend's name).
fn l4_answers(tb: &Testbed, n: usize) -> Vec<String> {
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    tb.client.run(move || {
        (0..n)
            .map(|_| {
                let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).expect("connect to the L4 VIP");
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                let mut w = s.try_clone().unwrap();
                w.write_all(b"who\n").unwrap();
                let mut line = String::new();
                BufReader::new(s).read_line(&mut line).expect("an answer");
                line.trim().to_string()
            })
            .collect()
    })
}

/// The effective capability mask of a process.
fn cap_eff(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:")).unwrap().trim().to_string();
    u64::from_str_radix(&hex, 16).unwrap()
}

/// A testbed with `n` backends serving both VIPs (L4 line servers on 80, clones on 8080)
/// and the agent's configuration.
fn served_bed(n: usize) -> (Testbed, std::sync::Arc<websphere::Clones>, std::path::PathBuf) {
    let mut tb = Testbed::new(n, &[VIP, HTTP_VIP]);
    tb.add_local_vip(HTTP_VIP);
    tb.start_servers(&[80], &[]);
    let app = websphere::Clones::new(n);
    tb.start_websphere(&app, 8080);
    let path = config(&tb);
    (tb, app, path)
}

#[test]
fn the_agent_serves_with_only_the_capabilities_its_unit_grants() {
    let (mut tb, app, path) = served_bed(4);
    let cmd = limited(&tb, &path, CAPS);
    tb.start_dispatcher_command(cmd);
    // setpriv exec'd the agent: same pid. Its effective set is exactly the four.
    let pid = tb.pid_of("dispatcher").unwrap();
    let (bpf, perfmon, net_admin, net_bind) = (1u64 << 39, 1u64 << 38, 1u64 << 12, 1u64 << 10);
    assert_eq!(cap_eff(pid), bpf | perfmon | net_admin | net_bind, "CapEff of the agent");
    // L4 through XDP: connections answered by the backends.
    let answers = l4_answers(&tb, 20);
    assert!(answers.iter().all(|a| a.starts_with('b')), "{answers:?}");
    // HTTP through the agent: one session, kept.
    let mut c = Client::new(&tb.client, format!("{HTTP_VIP}:80").parse().unwrap());
    for i in 1..=10 {
        let r = c.get("/app/cart").expect("an HTTP answer");
        assert_eq!(r.status, 200);
        assert_eq!(r.field("count"), Some(i.to_string().as_str()));
    }
    // The admin socket answers, and status reads the pinned maps.
    let cfg = path.display().to_string();
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(status.contains("agent running"), "{status}");
    assert_eq!(app.misroutes(), Vec::<String>::new());
    // A backend fails: the agent walks FLOWS and moves its flows to the replica (through
    // its own descriptor of the map: reopening it by id takes CAP_SYS_ADMIN).
    tb.kill_servers_of(0);
    app.kill(0);
    let flow_rewrites = || {
        let (_, body) = tb.admin("GET", "/status").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        v["counters"]["flow_rewrites"].as_u64().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while flow_rewrites() == 0 {
        assert!(Instant::now() < deadline, "no flow moved to b0's replica:\n{}", tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(100));
    }
    // A pin removed under the agent is put back (from its own handles of the maps).
    let pin = tb.pin_dir().join("FLOWS");
    std::fs::remove_file(&pin).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pin.exists() {
        assert!(Instant::now() < deadline, "FLOWS not pinned again:\n{}", tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = tb.log("dispatcher");
    assert!(!log.contains("Operation not permitted") && !log.contains("ERROR"), "{log}");
}

/// The system calls `dispatcher@.service` allows (`SystemCallFilter=`, its groups expanded
/// as `systemd-analyze syscall-filter` lists them, with `@default`, which systemd always
/// allows).
fn unit_allowed_syscalls() -> std::collections::BTreeSet<String> {
    let unit =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../packaging/systemd/dispatcher@.service"))
            .unwrap();
    let mut wanted: Vec<String> = vec!["@default".into()];
    for line in unit.lines() {
        if let Some(v) = line.strip_prefix("SystemCallFilter=") {
            assert!(!v.starts_with('~'), "an allow list is expected: {line}");
            wanted.extend(v.split_whitespace().map(str::to_string));
        }
    }
    assert!(wanted.len() > 1, "the unit has no SystemCallFilter=");
    let out = std::process::Command::new("systemd-analyze").args(["syscall-filter", "--no-pager"]).output().unwrap();
    assert!(out.status.success(), "systemd-analyze syscall-filter");
    let mut groups: std::collections::HashMap<String, Vec<String>> = Default::default();
    let mut current = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with('@') {
            current = Some(line.trim().to_string());
            groups.entry(line.trim().to_string()).or_default();
        } else if let (Some(g), item) = (&current, line.trim()) {
            if !item.is_empty() && !item.starts_with('#') {
                groups.get_mut(g).unwrap().push(item.to_string());
            }
        }
    }
    let mut allowed = std::collections::BTreeSet::new();
    while let Some(w) = wanted.pop() {
        if w.starts_with('@') {
            let items = groups.get(&w).unwrap_or_else(|| panic!("no group {w} in systemd-analyze syscall-filter"));
            wanted.extend(items.iter().cloned());
        } else {
            allowed.insert(w);
        }
    }
    allowed
}

/// The system calls in an `strace -c` summary.
fn summary_syscalls(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.trim_start().starts_with(|c: char| c.is_ascii_digit()))
        .filter_map(|l| l.split_whitespace().last())
        .filter(|n| *n != "total")
        .map(str::to_string)
        .collect()
}

/// The agent, with its unit's capabilities, under `strace -f` while it attaches, serves
/// L4 and HTTP, answers status, reloads and stops: every system call it made is one the
/// unit's `SystemCallFilter=` allows (one it did not would fail with EPERM as a service).
#[test]
fn the_agent_makes_only_the_system_calls_its_unit_allows() {
    let allowed = unit_allowed_syscalls();
    let (mut tb, _app, path) = served_bed(2);
    let summary = tb.workdir.join("strace.summary");
    let inner = limited(&tb, &path, CAPS);
    let mut cmd = tb.lb.command("strace");
    cmd.args(["-f", "-c", "-o"]).arg(&summary).arg("--").arg(inner.get_program()).args(inner.get_args());
    tb.start_dispatcher_command(cmd);
    assert!(l4_answers(&tb, 5).iter().all(|a| a.starts_with('b')));
    let mut c = Client::new(&tb.client, format!("{HTTP_VIP}:80").parse().unwrap());
    for _ in 0..5 {
        assert_eq!(c.get("/app/cart").expect("an HTTP answer").status, 200);
    }
    let cfg = path.display().to_string();
    assert!(tb.dispatcher_cmd(&["status", "--config", &cfg]).contains("agent running"));
    assert_eq!(tb.admin("POST", "/reload").map(|(s, _)| s), Some(200), "reload:\n{}", tb.log("dispatcher"));
    assert_eq!(c.get("/app/cart").expect("an HTTP answer after the reload").status, 200);
    // Stopped through its admin endpoint: strace writes its summary when the agent exits.
    tb.dispatcher_cmd(&["stop", "--config", &cfg]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while tb.child_exited("dispatcher").is_none() {
        assert!(Instant::now() < deadline, "the agent did not stop:\n{}", tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&summary).unwrap();
    let used = summary_syscalls(&text);
    assert!(used.iter().any(|s| s == "bpf") && used.len() > 20, "strace summary:\n{text}");
    let outside: Vec<&String> = used.iter().filter(|s| !allowed.contains(*s)).collect();
    assert!(outside.is_empty(), "system calls the unit's filter refuses: {outside:?}\n{text}");
}

#[test]
fn without_cap_net_admin_the_agent_cannot_load_its_program_and_says_so() {
    let mut tb = Testbed::new(2, &[VIP, HTTP_VIP]);
    tb.add_local_vip(HTTP_VIP);
    let path = config(&tb);
    let cmd = limited(&tb, &path, "+bpf,+perfmon,+net_bind_service");
    tb.start("dispatcher", cmd);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = tb.child_exited("dispatcher") {
            break s;
        }
        assert!(Instant::now() < deadline, "still running:\n{}", tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success());
    let log = tb.log("dispatcher");
    assert!(log.contains("dispatcher: loading the data plane") && log.contains("Operation not permitted"), "{log}");
    assert!(!log.contains("dispatcher running"), "{log}");
}
