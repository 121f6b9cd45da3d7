//! L4 through the real XDP program in network namespaces: a client sends TCP and UDP to
//! the VIPs, `dispatcher run` forwards by MAC rewriting or IPIP, backends answer with
//! their name straight to the client (direct server return).

use std::{
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream, UdpSocket},
    time::Duration,
};

use dispatcher::{
    config::Config,
    dataplane::tables::{addr_key, initial_states, ring_table, Tables},
};
use dispatcher_common::{hash::flow_hash, FlowKey, STATE_DISABLED, STATE_DRAIN};
use dispatcher_testbed::netns::{Testbed, CLIENT_IP};

const VIP_MAC: &str = "10.99.100.1";
const VIP_IPIP: &str = "10.99.100.2";
const VIP_STICKY: &str = "10.99.100.3";
const TIMEOUT: Duration = Duration::from_secs(3);

fn config(tb: &Testbed, weights: &[u32], vips: &str) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\nxdp_mode = \"native\"\n\n{}\n{vips}",
        tb.instance(),
        tb.backend_config(weights)
    )
}

/// A TCP VIP on port 80 and a UDP VIP on port 53, both on VIP_MAC.
fn web_and_dns() -> String {
    format!(
        "[[vip]]\nname = \"web\"\naddress = \"{VIP_MAC}\"\nport = 80\nring_size = 1009\n\n[[vip]]\nname = \"dns\"\naddress = \"{VIP_MAC}\"\nport = 53\nprotocol = \"udp\"\nring_size = 1009\n"
    )
}

struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
    sport: u16,
}

impl Conn {
    fn open(tb: &Testbed, vip: &str, port: u16) -> Conn {
        let addr: SocketAddr = format!("{vip}:{port}").parse().unwrap();
        let s = tb.client.run(move || TcpStream::connect_timeout(&addr, TIMEOUT)).expect("connect to the VIP");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        let sport = s.local_addr().unwrap().port();
        Conn { w: s.try_clone().unwrap(), r: BufReader::new(s), sport }
    }

    /// One request line; the answer names the backend.
    fn ask(&mut self) -> String {
        self.w.write_all(b"who\n").unwrap();
        let mut line = String::new();
        self.r.read_line(&mut line).expect("answer from a backend");
        line.trim().to_string()
    }
}

/// The backend the dispatcher must pick for a new flow from the client.
fn predicted(cfg: &Config, vip: usize, states: &[u8], sport: u16, proto: u8) -> String {
    let table = ring_table(&cfg.vips[vip], cfg, states);
    let key = FlowKey {
        src: addr_key(CLIENT_IP.parse().unwrap()).0,
        dst: addr_key(cfg.vips[vip].address).0,
        sport: sport.to_be(),
        dport: cfg.vips[vip].port.to_be(),
        proto,
        family: 2,
        _pad: 0,
    };
    let b = table[(flow_hash(&key) % table.len() as u32) as usize];
    cfg.backends[b as usize].name.clone()
}

fn udp_client(tb: &Testbed, vip: &str, port: u16) -> UdpSocket {
    let addr: SocketAddr = format!("{vip}:{port}").parse().unwrap();
    let s = tb.client.run(move || {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(addr).unwrap();
        s
    });
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    s
}

fn udp_ask(s: &UdpSocket) -> String {
    // UDP may lose the very first datagram while ARP resolves: retry a few times.
    let mut buf = [0u8; 64];
    for _ in 0..5 {
        s.send(b"who").unwrap();
        if let Ok(n) = s.recv(&mut buf) {
            return String::from_utf8_lossy(&buf[..n]).trim().to_string();
        }
    }
    panic!("no UDP answer from the VIP");
}

/// Opens UDP clients until `want` of them land on `backend`; bounded, so a
/// hash that never picks it fails the test instead of spinning.
fn udp_flows_on(tb: &Testbed, vip: &str, port: u16, backend: &str, want: usize) -> Vec<UdpSocket> {
    let mut on = Vec::new();
    for _ in 0..200 {
        let s = udp_client(tb, vip, port);
        if udp_ask(&s) == backend {
            on.push(s);
            if on.len() == want {
                return on;
            }
        }
    }
    panic!("only {} of 200 UDP flows landed on {backend}", on.len());
}

#[test]
fn mac_forwarding_pins_connections_and_spreads_by_maglev() {
    let mut tb = Testbed::new(4, &[VIP_MAC]);
    let vips = web_and_dns();
    let text = config(&tb, &[100, 100, 200, 100], &vips);
    let cfg = Config::parse(&text, "t").unwrap();
    let path = tb.write_config(&text);
    tb.start_servers(&[80], &[(VIP_MAC, 53)]);
    tb.start_dispatcher(&path);
    let states = initial_states(&cfg);

    let mut per_backend = std::collections::HashMap::new();
    let mut conns: Vec<(Conn, String)> = Vec::new();
    for _ in 0..48 {
        let mut c = Conn::open(&tb, VIP_MAC, 80);
        let first = c.ask();
        assert_eq!(first, predicted(&cfg, 0, &states, c.sport, 6), "new flow goes where the Maglev table says");
        *per_backend.entry(first.clone()).or_insert(0) += 1;
        conns.push((c, first));
    }
    // Every connection stays on its backend for its whole life.
    for round in 0..3 {
        for (c, b) in &mut conns {
            assert_eq!(&c.ask(), b, "round {round}: connection moved");
        }
    }
    assert_eq!(per_backend.len(), 4, "all backends used: {per_backend:?}");
    // The table the agent wrote is the weighted Maglev table: b2 (weight 200) holds
    // twice the slots of each other backend.
    let mut tables = Tables::from_pinned(&tb.pin_dir()).expect("pinned maps");
    tables.adopt_ring(0, 1009).unwrap();
    let ring = tables.ring(0).unwrap().to_vec();
    assert_eq!(ring, ring_table(&cfg.vips[0], &cfg, &states), "RINGS holds the Maglev table");
    let slots = |b: u32| ring.iter().filter(|&&x| x == b).count() as f64;
    let share = slots(2) / slots(0);
    assert!((1.8..2.2).contains(&share), "weight 200 vs 100: {share}");

    for _ in 0..8 {
        let s = udp_client(&tb, VIP_MAC, 53);
        let sport = s.local_addr().unwrap().port();
        let b = udp_ask(&s);
        assert_eq!(b, predicted(&cfg, 1, &states, sport, 17));
        assert_eq!(udp_ask(&s), b, "a UDP flow stays pinned");
    }

    let status = tb.dispatcher_cmd(&["status", "--config", path.to_str().unwrap(), "--json"]);
    let st: serde_json::Value = serde_json::from_str(&status).expect("status --json is JSON");
    assert_eq!(st["vips"][0]["name"], "web", "{status}");
    assert!(st["agent"]["pid"].is_u64(), "the agent answers: {status}");
    let flows = st["flows"].as_u64().expect("flow count");
    assert!(flows >= 56, "each TCP and UDP flow is in FLOWS: {flows}");
}

#[test]
fn ipip_forwarding_reaches_backends_through_decap() {
    let mut tb = Testbed::new(2, &[VIP_IPIP]);
    let vips = format!("[[vip]]\nname = \"tls\"\naddress = \"{VIP_IPIP}\"\nport = 443\nforwarding = \"ipip\"\nencap_source = \"10.99.0.1\"\nring_size = 1009\n");
    let text = config(&tb, &[], &vips);
    let cfg = Config::parse(&text, "t").unwrap();
    let path = tb.write_config(&text);
    tb.start_servers(&[443], &[]);
    tb.start_decap();
    tb.start_dispatcher(&path);
    let states = initial_states(&cfg);
    let mut seen = std::collections::HashSet::new();
    for _ in 0..16 {
        let mut c = Conn::open(&tb, VIP_IPIP, 443);
        let b = c.ask();
        assert_eq!(b, predicted(&cfg, 0, &states, c.sport, 6));
        assert_eq!(c.ask(), b);
        seen.insert(b);
    }
    assert_eq!(seen.len(), 2, "both backends reached through IPIP");
}

#[test]
fn drain_keeps_flows_and_disable_moves_them_to_the_replica() {
    let mut tb = Testbed::new(4, &[VIP_MAC]);
    let vips = web_and_dns();
    let text = config(&tb, &[], &vips);
    let cfg = Config::parse(&text, "t").unwrap();
    let path = tb.write_config(&text);
    let cfg_arg = path.to_str().unwrap().to_string();
    tb.start_servers(&[80], &[(VIP_MAC, 53)]);
    tb.start_dispatcher(&path);

    // Open connections until b0 has some.
    let mut conns: Vec<(Conn, String)> = Vec::new();
    while conns.iter().filter(|(_, b)| b == "b0").count() < 3 {
        assert!(conns.len() < 200, "b0 never chosen");
        let mut c = Conn::open(&tb, VIP_MAC, 80);
        let b = c.ask();
        conns.push((c, b));
    }
    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg_arg, "b0"]);
    assert!(out.contains("b0: up -> drain"), "{out}");
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "drain keeps existing connections");
    }
    let mut states = initial_states(&cfg);
    states[0] = STATE_DRAIN;
    for _ in 0..40 {
        let mut c = Conn::open(&tb, VIP_MAC, 80);
        let b = c.ask();
        assert_ne!(b, "b0", "no new connection to a drained backend");
        assert_eq!(b, predicted(&cfg, 0, &states, c.sport, 6));
    }

    // UDP flows on b2; then b2 fails: its flows must reach its replica b3.
    let on_b2 = udp_flows_on(&tb, VIP_MAC, 53, "b2", 3);
    tb.kill_servers_of(2);
    let out = tb.dispatcher_cmd(&["disable", "--config", &cfg_arg, "b2"]);
    assert!(out.contains("b2: up -> disabled"), "{out}");
    states[2] = STATE_DISABLED;
    for s in &on_b2 {
        assert_eq!(udp_ask(s), "b3", "the failed backend's flow reaches its peer replica");
    }
    let out = tb.dispatcher_cmd(&["status", "--config", &cfg_arg]);
    assert!(out.contains("disabled") && out.contains("drain"), "{out}");
}

#[test]
fn source_affinity_holds_for_the_sticky_time_across_ports() {
    let mut tb = Testbed::new(4, &[VIP_STICKY]);
    let vips = format!(
        "[[vip]]\nname = \"a\"\naddress = \"{VIP_STICKY}\"\nport = 80\nsticky_time = \"2s\"\nport_group = \"app\"\nring_size = 1009\n\n[[vip]]\nname = \"b\"\naddress = \"{VIP_STICKY}\"\nport = 8080\nsticky_time = \"2s\"\nport_group = \"app\"\nring_size = 1009\n"
    );
    let text = config(&tb, &[], &vips);
    let cfg = Config::parse(&text, "t").unwrap();
    let path = tb.write_config(&text);
    tb.start_servers(&[80, 8080], &[]);
    tb.start_dispatcher(&path);
    let states = initial_states(&cfg);

    let mut first = Conn::open(&tb, VIP_STICKY, 80);
    let owner = first.ask();
    let mut would_differ = 0;
    for i in 0..20 {
        let (vip, port) = if i % 2 == 0 { (0, 80) } else { (1, 8080) };
        let mut c = Conn::open(&tb, VIP_STICKY, port);
        if predicted(&cfg, vip, &states, c.sport, 6) != owner {
            would_differ += 1;
        }
        assert_eq!(c.ask(), owner, "connection {i} (port {port}) follows the client's affinity");
    }
    assert!(would_differ > 5, "the ring alone would have spread these connections");
    drop(first);

    // After the sticky time without a new connection, the ring decides again.
    std::thread::sleep(Duration::from_millis(2300));
    let mut c = Conn::open(&tb, VIP_STICKY, 80);
    assert_eq!(c.ask(), predicted(&cfg, 0, &states, c.sport, 6), "affinity expired");
}

#[test]
fn agent_exit_keeps_or_removes_the_dataplane_and_a_restart_adopts_it() {
    let mut tb = Testbed::new(2, &[VIP_MAC]);
    let vips = format!("[[vip]]\nname = \"web\"\naddress = \"{VIP_MAC}\"\nport = 80\nring_size = 1009\n");
    let text = config(&tb, &[], &vips);
    let path = tb.write_config(&text);
    let cfg_arg = path.to_str().unwrap().to_string();
    tb.start_servers(&[80], &[]);
    tb.start_dispatcher_with(&path, &["--keep-dataplane"]);
    let mut conns: Vec<(Conn, String)> = (0..6)
        .map(|_| {
            let mut c = Conn::open(&tb, VIP_MAC, 80);
            let b = c.ask();
            (c, b)
        })
        .collect();

    // SIGTERM with --keep-dataplane: the program stays attached, pinned flows keep going.
    tb.stop("dispatcher");
    assert!(tb.pin_dir().join("link").exists() && tb.pin_dir().join("FLOWS").exists(), "pins kept");
    assert!(tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "program still attached");
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "forwarding goes on without the agent");
    }
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st["flows"], 6, "status works from the pins alone: {status}");
    assert!(st["agent"].is_null(), "and says the agent is not running: {status}");
    // Watching: a frame every 0.2 s, three of them, each the whole table.
    let started = std::time::Instant::now();
    let watch = tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--watch", "0.2", "--count", "3"]);
    assert_eq!(watch.matches("\n--- ").count() + watch.starts_with("--- ") as usize, 3, "{watch}");
    assert_eq!(watch.matches("agent NOT running").count(), 3, "{watch}");
    assert!(started.elapsed() >= Duration::from_millis(400), "two waits between three frames");

    // A new agent adopts the maps and swaps its program into the pinned link.
    tb.start_dispatcher(&path);
    assert!(tb.log("dispatcher").contains("adopted pinned maps"), "{}", tb.log("dispatcher"));
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "flows survive the restart");
    }
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--json"]);
    let st: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(st["flows"], 6, "flow table adopted, not reset: {status}");

    // `dispatcher stop`: the agent exits (cleanly), the data plane stays.
    let out = tb.dispatcher_cmd(&["stop", "--config", &cfg_arg]);
    assert!(out.contains("stopped after") && out.contains("XDP forwarding goes on"), "{out}");
    assert_eq!(tb.child_exited("dispatcher").map(|s| s.success()), Some(true), "the agent exited cleanly");
    assert!(tb.pin_dir().join("link").exists() && tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"));
    for (c, b) in &mut conns {
        assert_eq!(&c.ask(), b, "forwarding goes on after `dispatcher stop`");
    }
    let out = tb.dispatcher_cmd(&["stop", "--config", &cfg_arg]);
    assert!(out.contains("no agent running"), "{out}");

    // `dispatcher stop --detach` with an agent running: everything goes.
    tb.start_dispatcher(&path);
    let out = tb.dispatcher_cmd(&["stop", "--config", &cfg_arg, "--detach"]);
    assert!(out.contains("stopped after") && out.contains("data plane removed"), "{out}");
    assert_eq!(tb.child_exited("dispatcher").map(|s| s.success()), Some(true), "the agent exited cleanly");
    assert_data_plane_gone(&tb);

    // SIGTERM without --keep-dataplane: detached and unpinned.
    tb.start_dispatcher(&path);
    tb.stop("dispatcher");
    assert_data_plane_gone(&tb);
    // And `stop --detach` with nothing left is not an error.
    let out = tb.dispatcher_cmd(&["stop", "--config", &cfg_arg, "--detach"]);
    assert!(out.contains("data plane removed"), "{out}");
}

fn assert_data_plane_gone(tb: &Testbed) {
    assert!(!tb.pin_dir().exists(), "pins removed");
    assert!(!tb.lb.ip(&["link", "show", "eth0"]).contains("xdp"), "program detached");
    let addr: SocketAddr = format!("{VIP_MAC}:80").parse().unwrap();
    let r = tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_millis(700)));
    assert!(r.is_err(), "without the data plane the VIP is not served");
}

#[test]
fn a_backend_failing_its_checks_hands_its_flows_to_its_replica() {
    let mut tb = Testbed::new(4, &[VIP_MAC]);
    let vips = web_and_dns();
    let text = config(&tb, &[], &vips).replace(
        "xdp_mode = \"native\"\n",
        "xdp_mode = \"native\"\n\n[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nfall = 2\n",
    );
    let path = tb.write_config(&text);
    let cfg_arg = path.to_str().unwrap().to_string();
    tb.start_servers(&[80], &[(VIP_MAC, 53)]);
    tb.start_dispatcher(&path);
    let on_b2 = udp_flows_on(&tb, VIP_MAC, 53, "b2", 3);
    // b2 dies; nobody tells the dispatcher: its TCP check fails, it goes down.
    tb.kill_servers_of(2);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let status = tb.dispatcher_cmd(&["status", "--config", &cfg_arg, "--json"]);
        let st: serde_json::Value = serde_json::from_str(&status).unwrap();
        if st["backends"][2]["state"] == "down" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "b2 not marked down: {status}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // The agent moved the pinned flows (not only XDP on the next packet).
    let data = aya::maps::MapData::from_pin(tb.pin_dir().join("FLOWS")).unwrap();
    let flows: aya::maps::HashMap<_, dispatcher_common::FlowKey, dispatcher_common::FlowValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).unwrap()).unwrap();
    // (The walk runs beside the control loop: give it a moment.)
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let on_down = flows.iter().filter_map(|r| r.ok()).filter(|(_, v)| v.backend == 2).count();
        if on_down == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{on_down} flows left pinned to the down backend");
        std::thread::sleep(Duration::from_millis(50));
    }
    for s in &on_b2 {
        assert_eq!(udp_ask(s), "b3", "the failed backend's flows reach its replica");
    }
}

/// A failover with a million pinned flows: the walk that moves them to the replica runs
/// beside the control loop, so the operator's command is answered at once and the admin
/// endpoint answers while the flows are still being moved (their progress counted).
#[test]
fn a_failover_with_a_million_flows_leaves_the_agent_responsive() {
    const N: u32 = 1_000_000;
    let mut tb = Testbed::new(2, &[VIP_MAC]);
    let vips = format!("[[vip]]\nname = \"web\"\naddress = \"{VIP_MAC}\"\nport = 80\nring_size = 1009\n");
    let text = config(&tb, &[], &vips)
        .replace("xdp_mode = \"native\"\n", "xdp_mode = \"native\"\nflow_table_size = 4194304\n");
    let path = tb.write_config(&text);
    let cfg_arg = path.to_str().unwrap().to_string();
    tb.start_servers(&[80], &[]);
    tb.start_dispatcher(&path);
    // A million flows pinned to b0, written as XDP would have.
    let data = aya::maps::MapData::from_pin(tb.pin_dir().join("FLOWS")).unwrap();
    let mut flows: aya::maps::HashMap<_, FlowKey, dispatcher_common::FlowValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::from_map_data(data).unwrap()).unwrap();
    let (vip, _) = addr_key(VIP_MAC.parse().unwrap());
    let filled = std::time::Instant::now();
    for i in 0..N {
        let key = FlowKey {
            src: [u32::from_be_bytes([10, 200, (i >> 16) as u8, (i >> 8) as u8]), 0, 0, 0],
            dst: vip,
            sport: ((i & 0xff) as u16 + 1024).to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            family: dispatcher_common::AF_INET,
            _pad: 0,
        };
        let v = dispatcher_common::FlowValue { backend: 0, vip: 0, cookie_hash: 0, pinned_ns: 0 };
        flows.insert(key, v, 0).unwrap();
    }
    let fill_time = filled.elapsed();
    let rewrites = |tb: &Testbed| -> u64 {
        let (_, body) = tb.admin("GET", "/status").expect("the agent answers");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["counters"]["flow_rewrites"].as_u64().unwrap()
    };
    let started = std::time::Instant::now();
    let out = tb.dispatcher_cmd(&["disable", "--config", &cfg_arg, "b0"]);
    let command_time = started.elapsed();
    assert!(out.contains("b0: up -> disabled"), "{out}");
    let first = rewrites(&tb);
    assert!(first < N as u64, "the command was answered before the walk ended ({first} of {N} moved)");
    // The admin endpoint's latency while the walk goes on.
    let mut slowest = Duration::ZERO;
    let mut polls = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let t = std::time::Instant::now();
        let n = rewrites(&tb);
        slowest = slowest.max(t.elapsed());
        polls += 1;
        if n >= N as u64 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "only {n} of {N} flows moved after 120 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    let failover_time = started.elapsed();
    let on_b0 = flows.iter().filter_map(|r| r.ok()).filter(|(_, v)| v.backend == 0).count();
    assert_eq!(on_b0, 0, "every flow moved to the replica");
    println!(
        "1M flows: filled in {fill_time:?}; disable answered in {command_time:?}; all moved after {failover_time:?}; \
         admin /status slowest {slowest:?} over {polls} requests during the walk"
    );
}

/// The veth trap: native XDP on a veth whose peer runs no XDP program loses every
/// forwarded frame without a count. The agent says so (log and status, naming the peer and
/// the ways out), and `dispatcher xdp-pass` is the way out.
#[test]
fn the_veth_trap_is_reported_and_xdp_pass_gets_the_frames_through() {
    let mut tb = Testbed::new(2, &[VIP_MAC]);
    tb.remove_switch_pass();
    let text = config(&tb, &[100, 100], &web_and_dns());
    let path = tb.write_config(&text);
    tb.start_servers(&[80], &[(VIP_MAC, 53)]);
    tb.start_dispatcher(&path);
    let sw = tb.switch.name.clone();
    let cfg = path.to_str().unwrap();
    let connects = |tb: &Testbed| {
        let addr: SocketAddr = format!("{VIP_MAC}:80").parse().unwrap();
        tb.client.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(1))).is_ok()
    };
    assert!(!connects(&tb), "the trap: forwarded SYNs are dropped at the peer");
    let way_out = format!("`dispatcher xdp-pass --netns {sw} lb`");
    let log = tb.log("dispatcher");
    assert!(
        log.contains(&format!("its peer lb (in network namespace {sw}) runs no XDP program")) && log.contains(&way_out),
        "the agent names the peer and the way out:\n{log}"
    );
    let warning = |tb: &Testbed| {
        let st: serde_json::Value = serde_json::from_str(&tb.dispatcher_cmd(&["status", "-c", cfg, "--json"])).unwrap();
        st["agent"]["warnings"]
            .as_array()
            .expect("warnings in status")
            .iter()
            .any(|w| w.as_str().unwrap().contains(&way_out))
    };
    assert!(warning(&tb), "status --json carries the warning");
    assert!(tb.dispatcher_cmd(&["status", "-c", cfg]).contains("WARNING: eth0 is a veth"), "and status says it");

    let out = tb.dispatcher_cmd(&["xdp-pass", "--netns", &sw, "lb"]);
    assert!(out.contains("pass program attached in native mode"), "{out}");
    assert!(tb.switch.ip(&["link", "show", "lb"]).contains("prog/xdp"), "attached, and it stays after the command");
    let mut c = Conn::open(&tb, VIP_MAC, 80);
    assert!(c.ask().starts_with('b'), "frames get through");
    assert!(!warning(&tb), "status no longer warns");
    let again = tb.dispatcher_cmd(&["xdp-pass", "--netns", &sw, "lb"]);
    assert!(again.contains("already runs the pass program"), "idempotent: {again}");

    let out = tb.dispatcher_cmd(&["xdp-pass", "--netns", &sw, "--detach", "lb"]);
    assert!(out.contains("pass program removed"), "{out}");
    assert!(!tb.switch.ip(&["link", "show", "lb"]).contains("prog/xdp"));
    assert!(warning(&tb), "the trap again, said again");
    let bad =
        tb.lb.command(dispatcher_testbed::netns::dispatcher_bin()).args(["xdp-pass", "nosuch0"]).output().unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("no interface named nosuch0"), "{err}");
}
