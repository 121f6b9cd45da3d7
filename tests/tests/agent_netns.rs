//! The agent as a process: one per instance, and a command line that tells apart an agent
//! that is not running from one it cannot reach, and never writes the maps behind one.

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    os::unix::net::UnixStream,
    time::Duration,
};

use dispatcher_testbed::netns::{dispatcher_bin, Testbed};

const VIP: &str = "10.99.100.1";

/// Two backends behind an L4 VIP on port 80, the agent started; returns the config path.
fn l4_bed() -> (Testbed, String) {
    let mut tb = Testbed::new(2, &[VIP]);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\nxdp_mode = \"native\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    let path = tb.write_config(&text);
    tb.start_servers(&[80], &[]);
    tb.start_dispatcher(&path);
    (tb, path.to_str().unwrap().to_string())
}

/// A TCP connection through the VIP; each line sent is answered with the backend's name.
struct Conn(BufReader<TcpStream>, TcpStream);

impl Conn {
    fn open(tb: &Testbed) -> Conn {
        let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
        let s = tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(3))).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        Conn(BufReader::new(s.try_clone().unwrap()), s)
    }

    fn ask(&mut self) -> String {
        self.1.write_all(b"who\n").unwrap();
        let mut line = String::new();
        self.0.read_line(&mut line).expect("an answer through the VIP");
        line.trim().to_string()
    }
}

/// `n` connections through the VIP, each with the backend that answered it.
fn open_conns(tb: &Testbed, n: usize) -> Vec<(Conn, String)> {
    (0..n)
        .map(|_| {
            let mut c = Conn::open(tb);
            let b = c.ask();
            (c, b)
        })
        .collect()
}

/// Runs the CLI, which is expected to fail: (exit code, stdout + stderr).
fn cli_fails(tb: &Testbed, args: &[&str]) -> (Option<i32>, String) {
    let out = tb.lb.command(dispatcher_bin()).args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

fn agent_pid(tb: &Testbed, cfg: &str) -> serde_json::Value {
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", cfg, "--json"])).unwrap();
    st["agent"]["pid"].clone()
}

#[test]
fn a_second_agent_for_the_instance_is_refused() {
    let (tb, cfg) = l4_bed();
    let first = tb.pid_of("dispatcher").unwrap();
    let mut conns = open_conns(&tb, 4);
    let (code, out) = cli_fails(&tb, &["run", "--config", &cfg]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(&format!("is held by pid {first}: another agent")), "{out}");
    // The first one is untouched: same agent answering, same program, flows going on.
    assert_eq!(agent_pid(&tb, &cfg), first);
    assert!(tb.pin_dir().join("link").exists() && tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"));
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b);
    }
}

#[test]
fn the_cli_tells_why_the_agent_does_not_answer_and_never_writes_behind_it() {
    let (mut tb, cfg) = l4_bed();
    let pid = tb.pid_of("dispatcher").unwrap();
    let sock = format!("/run/dispatcher/{}.sock", tb.instance());

    // Every socket slot taken by idle connections: they give way, the agent answers.
    let idle: Vec<UnixStream> = (0..32).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    let table = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(table.contains("agent running"), "{table}");
    drop(idle);

    // Busy: what answers on the socket closes every connection unanswered (an agent
    // whose slots are all taken by requests in progress does that).
    std::fs::remove_file(&sock).unwrap();
    let closing = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let closer = {
        let done = done.clone();
        std::thread::spawn(move || {
            for c in closing.incoming() {
                drop(c);
                if done.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
            }
        })
    };
    let table = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(table.contains("busy") && !table.contains("NOT running"), "{table}");
    let (code, out) = cli_fails(&tb, &["drain", "--config", &cfg, "b0"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("busy") && out.contains("nothing changed"), "{out}");
    // One more connection wakes the closer to end.
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    drop(UnixStream::connect(&sock));
    closer.join().unwrap();

    // The socket gone under a running agent: not "not running", and nothing written.
    std::fs::remove_file(&sock).unwrap();
    let table = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(table.contains(&format!("an agent (pid {pid}) holds instance")), "{table}");
    let (code, out) = cli_fails(&tb, &["drain", "--config", &cfg, "b0"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("nothing changed"), "{out}");
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    assert_eq!(st["backends"][0]["state"], "up", "the maps were not written: {st}");
    let (code, out) = cli_fails(&tb, &["stop", "--config", &cfg, "--detach"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(tb.pin_dir().join("link").exists(), "the data plane was not removed behind the agent");

    // Killed: the lock goes with the process; now the maps are the place to write.
    tb.kill_hard("dispatcher");
    let table = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(table.contains("agent NOT running"), "{table}");
    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg, "b0"]);
    assert!(out.contains("writing the pinned maps directly") && out.contains("b0: up -> drain"), "{out}");
}

/// A restart adopts the pinned maps by name: with the backend blocks of the file
/// reordered while the agent was stopped, long-lived L4 connections keep their backend,
/// an operator's drain stays on the backend it was given to, and a learned clone ID is
/// still served by the clone that issued it.
#[test]
fn a_restart_matches_backends_by_name_not_position() {
    const APP: &str = "10.99.100.9";
    let mut tb = Testbed::new(4, &[VIP, APP]);
    tb.add_local_vip(APP);
    let clones = dispatcher_testbed::websphere::Clones::new(4);
    tb.start_websphere(&clones, 9080);
    tb.start_servers(&[80], &[]);
    let vips = format!(
        "[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n\n[[vip]]\nname = \"app\"\naddress = \"{APP}\"\nport = 80\nmode = \"http\"\nbackend_port = 9080\nring_size = 1009\n"
    );
    let head = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\nxdp_mode = \"native\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n",
        tb.instance()
    );
    let blocks = tb.backend_config(&[]);
    let path = tb.write_config(&format!("{head}{blocks}\n{vips}"));
    let cfg = path.to_str().unwrap().to_string();
    tb.start_dispatcher(&path);

    let mut conns = open_conns(&tb, 8);
    let app: SocketAddr = format!("{APP}:80").parse().unwrap();
    let mut session = dispatcher_testbed::websphere::Client::new(&tb.client, app);
    let first = session.get("/app/restart").unwrap();
    let clone = first.field("clone").unwrap().to_string();
    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg, "b1"]);
    assert!(out.contains("b1: up -> drain"), "{out}");
    tb.dispatcher_cmd(&["stop", "--config", &cfg]);

    // The same backends, their blocks in another order.
    let mut parts: Vec<&str> = blocks.split("[[backend]]").filter(|p| !p.trim().is_empty()).collect();
    parts.reverse();
    let reordered: String = parts.iter().map(|p| format!("[[backend]]{p}")).collect();
    std::fs::write(&path, format!("{head}{reordered}\n{vips}")).unwrap();
    tb.start_dispatcher(&path);

    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "a long-lived connection keeps its backend across the restart");
    }
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    for b in st["agent"]["backends"].as_array().unwrap() {
        let want = if b["name"] == "b1" { "drain" } else { "none" };
        assert_eq!(b["admin"], want, "the drain stays with b1: {st}");
    }
    for b in st["backends"].as_array().unwrap() {
        let want = if b["name"] == "b1" { "drain" } else { "-" };
        assert_eq!(b["operator"], want, "the maps, read by name: {st}");
    }
    session.reconnect();
    let again = session.get("/app/restart").unwrap();
    assert_eq!(again.field("clone"), Some(clone.as_str()), "the learned clone ID still reaches its clone");
    assert_eq!(again.field("count"), Some("2"), "with its session data");
    assert_eq!(st["agent"]["counters"]["misroutes"], 0);
}

/// Pins removed under a running agent (rm -r of its bpffs directory): the agent notices
/// and pins its maps, program and link again, so that `stop` keeps its word — forwarding
/// goes on without the agent — and a restart adopts the flows.
#[test]
fn pins_removed_under_a_running_agent_are_restored() {
    let (mut tb, cfg) = l4_bed();
    let mut conns = open_conns(&tb, 4);
    for e in std::fs::read_dir(tb.pin_dir()).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    std::fs::remove_dir(tb.pin_dir()).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !(tb.pin_dir().join("link").exists() && tb.pin_dir().join("FLOWS").exists()) {
        assert!(std::time::Instant::now() < deadline, "pins not restored: {}", tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(tb.log("dispatcher").contains("data plane pinned again"), "{}", tb.log("dispatcher"));
    let out = tb.dispatcher_cmd(&["stop", "--config", &cfg]);
    assert!(out.contains("XDP forwarding goes on"), "{out}");
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "forwarding goes on after the agent left");
    }
    tb.start_dispatcher(std::path::Path::new(&cfg));
    assert!(tb.log("dispatcher").contains("adopted pinned maps"), "{}", tb.log("dispatcher"));
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    assert_eq!(st["flows"], 4, "the restart found the flows: {st}");
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b);
    }
}

/// `ip netns exec` gives the command a mount namespace of its own with a fresh /sys: an
/// agent started that way would pin everything on a private bpffs. It refuses and says
/// how to start it; the CLI says the same instead of a bare BPF_OBJ_GET error.
#[test]
fn ip_netns_exec_is_refused_with_the_way_out() {
    let (tb, cfg) = l4_bed();
    let other = format!("{}-second", tb.instance());
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        &format!("instance = \"{}\"", tb.instance()),
        &format!("instance = \"{other}\"\nadmin_socket = \"/run/dispatcher/{other}.sock\""),
    );
    let second = tb.workdir.join("second.toml");
    std::fs::write(&second, text).unwrap();
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &tb.lb.name])
        .arg(dispatcher_bin())
        .args(["run", "--config", second.to_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("nsenter --net="), "{said}");
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &tb.lb.name])
        .arg(dispatcher_bin())
        .args(["status", "--config", &cfg])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("nsenter --net="), "{said}");
    // Nothing of the refused agent is left: no pins, no lock held (its lock file, which
    // is never removed by an agent, goes with the test).
    assert_eq!(dispatcher::instance::holder(&other), None);
    let _ = std::fs::remove_file(dispatcher::instance::lock_path(&other));
    assert!(!std::path::Path::new(&format!("/sys/fs/bpf/dispatcher/{other}")).exists());
}

/// Maps pinned by another version (another layout or size) are refused with the way
/// out, never adopted and read wrong; `stop --detach` clears the way.
#[test]
fn maps_pinned_by_another_version_are_refused_with_the_way_out() {
    let mut tb = Testbed::new(2, &[VIP]);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    let path = tb.write_config(&text);
    let cfg = path.to_str().unwrap().to_string();
    // An older STATS: fewer slots.
    std::fs::create_dir_all(tb.pin_dir()).unwrap();
    let stats = tb.pin_dir().join("STATS");
    let made = std::process::Command::new("bpftool")
        .args(["map", "create"])
        .arg(&stats)
        .args(["type", "percpu_array", "key", "4", "value", "16", "entries", "100", "name", "STATS"])
        .output()
        .unwrap();
    assert!(made.status.success(), "bpftool: {}", String::from_utf8_lossy(&made.stderr));
    let (code, out) = cli_fails(&tb, &["run", "--config", &cfg]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("made by another version") && out.contains("100 entries"), "{out}");
    assert!(out.contains("stop --detach"), "the way out: {out}");
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "nothing attached");
    // The way out works.
    let (code, out) = cli_fails(&tb, &["stop", "--detach", "--config", &cfg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!stats.exists());
    tb.start_dispatcher(&path);
    assert!(tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"));
}

/// `dispatcher run` expected to be refused: (exit code, output). An agent that starts
/// instead is stopped (by its pid) after 20 s and the test fails.
fn run_refused(tb: &Testbed, cfg: &str) -> (Option<i32>, String) {
    let mut child = tb
        .lb
        .command(dispatcher_bin())
        .args(["run", "--config", cfg])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("`run` was not refused (still running after 20 s): {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// `l4_bed`'s configuration, not started, with `extra` lines in `[dispatcher]`.
fn l4_config_with(tb: &Testbed, extra: &str) -> String {
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n{extra}\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    tb.write_config(&text).to_str().unwrap().to_string()
}

/// `dispatcher.admin_socket` naming a file that is not a socket, or another process's
/// live socket: `run` refuses before it touches anything, and leaves the file as it was.
/// A stale socket (nobody listens) is replaced.
#[test]
fn an_admin_socket_path_that_is_not_ours_is_refused_and_left_alone() {
    let mut tb = Testbed::new(2, &[VIP]);
    let precious = tb.workdir.join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    let cfg = l4_config_with(&tb, &format!("admin_socket = \"{}\"", precious.display()));
    let (code, out) = run_refused(&tb, &cfg);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("admin_socket") && out.contains("exists and is not a socket"), "{out}");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "nothing attached");

    // Another process listens there: in use, refused, its socket left.
    let live = tb.workdir.join("live.sock");
    let listener = std::os::unix::net::UnixListener::bind(&live).unwrap();
    let cfg = l4_config_with(&tb, &format!("admin_socket = \"{}\"", live.display()));
    let (code, out) = run_refused(&tb, &cfg);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("in use by another agent"), "{out}");
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "nothing attached");
    UnixStream::connect(&live).expect("the other process's socket still answers");

    // Stale (its listener gone, the file left): ours to replace.
    drop(listener);
    assert!(live.exists());
    tb.start_dispatcher(std::path::Path::new(&cfg));
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["pid"], tb.pid_of("dispatcher").unwrap(), "{st}");
}

/// Is `dir` a mount point (in this process's mount namespace, the agent's: the tests
/// enter only network namespaces)?
fn mounted_on(dir: &std::path::Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(dir))
}

/// `dispatcher.bpffs` naming a directory that holds something and is not a bpffs: `run`
/// refuses, mounts nothing over it. An empty directory gets a bpffs of the agent's, which
/// `stop --detach` unmounts (nothing else pinned on it).
#[test]
fn bpffs_is_mounted_only_on_an_empty_directory_and_unmounted_at_detach() {
    // Removed after the testbed (declared first, dropped last): unpinned, unmounted.
    struct Dirs(Vec<std::path::PathBuf>);
    impl Drop for Dirs {
        fn drop(&mut self) {
            for d in &self.0 {
                for inst in std::fs::read_dir(d.join("dispatcher")).into_iter().flatten().flatten() {
                    let _ = dispatcher::dataplane::unpin_all(&inst.path());
                }
                if mounted_on(d) {
                    let _ = nix::mount::umount2(d.as_path(), nix::mount::MntFlags::MNT_DETACH);
                }
                let _ = std::fs::remove_dir_all(d);
            }
        }
    }
    let base = std::env::temp_dir().join(format!("dispatcher-bpffs-{}", std::process::id()));
    let (full, empty) = (base.join("full"), base.join("empty"));
    let _dirs = Dirs(vec![full.clone(), empty.clone(), base.clone()]);
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(full.join("data"), "keep me").unwrap();
    let mut tb = Testbed::new(2, &[VIP]);
    tb.start_servers(&[80], &[]);

    let cfg = l4_config_with(&tb, &format!("bpffs = \"{}\"", full.display()));
    let (code, out) = run_refused(&tb, &cfg);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("dispatcher.bpffs") && out.contains("is not a bpffs and not empty"), "{out}");
    assert!(!mounted_on(&full), "nothing mounted over it");
    assert_eq!(std::fs::read_to_string(full.join("data")).unwrap(), "keep me");
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "nothing attached");

    let cfg = l4_config_with(&tb, &format!("bpffs = \"{}\"", empty.display()));
    tb.start_dispatcher(std::path::Path::new(&cfg));
    assert!(mounted_on(&empty), "a bpffs on the empty directory");
    assert!(dispatcher::dataplane::is_bpffs(&empty));
    let mut c = Conn::open(&tb);
    assert!(!c.ask().is_empty(), "forwarding through the agent's own bpffs");
    let (code, out) = cli_fails(&tb, &["stop", "--detach", "--config", &cfg]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!mounted_on(&empty), "unmounted at stop --detach: {out}\n{}", tb.log("dispatcher"));
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none(), "left as it was: empty");
}

/// 40 connections to the admin socket that never send a request (more than its 32 slots):
/// the operator's `GET /status` is still answered at once (the oldest idle connection
/// gives up its slot), and the idle ones are closed after `admin::HEAD_TIME`.
#[test]
fn idle_admin_connections_never_lock_the_operator_out() {
    let (tb, cfg) = l4_bed();
    let sock = std::path::PathBuf::from(format!("/run/dispatcher/{}.sock", tb.instance()));
    let opened = std::time::Instant::now();
    let idle: Vec<UnixStream> = (0..40).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    let asked = std::time::Instant::now();
    let (code, body) = tb.admin("GET", "/status").expect("an answer with 40 idle connections open");
    let took = asked.elapsed();
    assert_eq!(code, 200, "{body}");
    assert!(took < Duration::from_secs(1), "GET /status took {took:?}");
    let out = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(!out.is_empty());
    // Every idle connection is closed, the last ones after the idle time, not before.
    let limit = dispatcher::admin::HEAD_TIME + Duration::from_secs(2);
    for (i, mut s) in idle.into_iter().enumerate() {
        s.set_read_timeout(Some(limit.saturating_sub(opened.elapsed()).max(Duration::from_millis(1)))).unwrap();
        let mut b = [0u8; 1];
        let r = std::io::Read::read(&mut s, &mut b);
        assert!(
            matches!(r, Ok(0)) || matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "idle connection {i} not closed within {limit:?}: {r:?}"
        );
        if i == 39 {
            let after = opened.elapsed();
            assert!(after >= dispatcher::admin::HEAD_TIME - Duration::from_millis(200), "closed after {after:?}");
        }
    }
}

/// A start that fails after it loaded, pinned and attached (its HTTP VIP's port is held
/// by another process) removes what it pinned and detaches: the next start does not
/// adopt a failed start's leftovers, and the interface forwards nothing of it.
#[test]
fn a_start_that_fails_before_serving_leaves_no_pins_and_nothing_attached() {
    let tb = Testbed::new(2, &[VIP]);
    let lb_ip = dispatcher_testbed::netns::LB_IP;
    // The port taken without SO_REUSEPORT: the agent's listeners cannot share it.
    let hold = "import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', 8080))\ns.listen()\nprint('held', flush=True)\ntime.sleep(60)\n";
    let mut holder = tb.lb.command("python3").args(["-c", hold]).stdout(std::process::Stdio::piped()).spawn().unwrap();
    struct Stop(std::process::Child);
    impl Drop for Stop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(holder.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "held");
    let _holder = Stop(holder);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n{}\n[[vip]]\nname = \"web\"\naddress = \"{lb_ip}\"\nport = 8080\nmode = \"http\"\nbackends = [\"b0\", \"b1\"]\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    let cfg = tb.write_config(&text).to_str().unwrap().to_string();
    let (code, out) = run_refused(&tb, &cfg);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("8080"), "the port it could not take: {out}");
    assert!(out.contains("removed the pins it made"), "{out}");
    assert!(!tb.pin_dir().join("VIPS").exists(), "no map left pinned under {}", tb.pin_dir().display());
    assert!(!tb.pin_dir().join("link").exists());
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "nothing left attached");
}
