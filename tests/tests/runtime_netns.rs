//! Runtime settings (issue 33): a backend's weight and maxconn changed in the running
//! agent until a reload, its health checks disabled and enabled again, the counters
//! cleared — each through the CLI, seen in the traffic and in `dispatcher status`.

use std::{collections::HashMap, net::SocketAddr, time::Duration};

use dispatcher::api::AgentStatus;
use dispatcher_testbed::{
    netns::Testbed,
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.60";
const BACKEND_PORT: u16 = 8080;

/// `n` WebSphere-like backends behind an HTTP VIP (round robin); `health`: lines for
/// `[health]`. Returns the testbed, its clones, the VIP and the configuration's path.
fn runtime_testbed(n: usize, health: &str) -> (Testbed, std::sync::Arc<websphere::Clones>, SocketAddr, String) {
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(n);
    tb.start_websphere(&cluster, BACKEND_PORT);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n{health}\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    (tb, cluster, addr, path.to_str().unwrap().to_string())
}

/// New sessions (a fresh client each): how many each clone took.
fn new_sessions(tb: &Testbed, addr: SocketAddr, n: usize) -> HashMap<String, usize> {
    let mut on = HashMap::new();
    for _ in 0..n {
        let r = Client::new(&tb.client, addr).get("/").expect("response");
        assert_eq!(r.status, 200, "{r:?}");
        *on.entry(r.field("clone").expect("clone field").to_string()).or_default() += 1;
    }
    on
}

fn agent_status(tb: &Testbed) -> AgentStatus {
    let (code, body) = tb.admin("GET", "/status").expect("the agent answers");
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).expect("status JSON")
}

/// A backend's ring slots in the pinned RINGS map (VIP 0, ring size 1009).
fn ring_slots(tb: &Testbed, backend: u32) -> usize {
    let mut t = dispatcher::dataplane::tables::Tables::from_pinned(&tb.pin_dir()).expect("pinned maps");
    t.adopt_ring(0, 1009).expect("reading RINGS");
    t.ring(0).expect("ring").iter().filter(|&&b| b == backend).count()
}

/// Waits until backend `name` is in `state` in the agent's view (bounded).
fn wait_state(tb: &Testbed, name: &str, state: &str) {
    let state_of = || agent_status(tb).backends.into_iter().find(|b| b.name == name).map(|b| b.state);
    for _ in 0..100 {
        if state_of().as_deref() == Some(state) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("backend {name} not {state} within 10 s: {:?}", state_of());
}

#[test]
fn a_runtime_weight_shifts_new_sessions_and_the_ring_until_a_reload() {
    let (tb, _cluster, addr, cfg) = runtime_testbed(2, "");
    std::thread::sleep(Duration::from_millis(500));
    let even = new_sessions(&tb, addr, 40);
    assert_eq!((even.get("clone0x"), even.get("clone1x")), (Some(&20), Some(&20)), "equal weights: {even:?}");

    let out = tb.dispatcher_cmd(&["weight", "--config", &cfg, "b1", "300"]);
    assert_eq!(out.trim(), "backend b1: weight 100 -> 300 (until reload; configured 100)");
    // Smooth weighted round robin: 1 in 4 new sessions on b0 (give or take the picks
    // under way when the weight changed).
    let shifted = new_sessions(&tb, addr, 40);
    let on0 = shifted.get("clone0x").copied().unwrap_or(0);
    assert!((9..=11).contains(&on0), "1:3: {shifted:?}");
    // The L4 plane's Maglev table weighs it so too (about 3 of 4 slots).
    let (s0, s1) = (ring_slots(&tb, 0), ring_slots(&tb, 1));
    assert!(s1 > 2 * s0 && s0 > 0, "ring slots b0 {s0}, b1 {s1}");
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(status.contains("backend b1: weight 300 (runtime; configured 100); until reload"), "{status}");
    let b1 = agent_status(&tb).backends.into_iter().find(|b| b.name == "b1").unwrap();
    assert_eq!((b1.weight, b1.configured_weight), (300, 100));

    // Out of range: refused in words, nothing changed.
    let (code, body) = tb.admin("POST", "/backends/b1/weight?value=0").unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("must be a whole number in 1..=10000"), "{body}");
    let (code, body) = tb.admin("POST", "/backends/nope/weight?value=5").unwrap();
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("known: b0, b1"), "{body}");

    // A reload returns to the configuration's weight, and says so.
    let out = tb.dispatcher_cmd(&["reload", "--config", &cfg]);
    assert!(out.contains("backend b1: runtime weight 300 ended, 100 from the configuration"), "{out}");
    let back = new_sessions(&tb, addr, 40);
    let on0 = back.get("clone0x").copied().unwrap_or(0);
    assert!((19..=21).contains(&on0), "after reload: {back:?}");
    let (s0, s1) = (ring_slots(&tb, 0), ring_slots(&tb, 1));
    assert!(s0.abs_diff(s1) < 50, "ring slots b0 {s0}, b1 {s1} after reload");
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(!status.contains("runtime;"), "{status}");
}

#[test]
fn a_runtime_maxconn_of_one_queues_the_requests_in_flight() {
    let (tb, cluster, addr, cfg) = runtime_testbed(1, "");
    std::thread::sleep(Duration::from_millis(500));
    let burst = |n: usize| {
        let threads: Vec<_> = (0..n)
            .map(|_| {
                let ns = tb.client.clone();
                std::thread::spawn(move || Client::new(&ns, addr).get("/slow/400").map(|r| r.status))
            })
            .collect();
        let statuses: Vec<_> = threads.into_iter().map(|t| t.join().unwrap().expect("response")).collect();
        assert_eq!(statuses, vec![200; n], "all served: {}\n{:?}", tb.log("dispatcher"), tb.admin("GET", "/status"));
    };
    burst(3);
    assert!(cluster.busy_max[0].load(std::sync::atomic::Ordering::SeqCst) >= 2, "no limit: requests in parallel");

    let out = tb.dispatcher_cmd(&["maxconn", "--config", &cfg, "b0", "1"]);
    assert_eq!(out.trim(), "backend b0: maxconn none -> 1 (until reload; configured none)");
    cluster.busy_max[0].store(0, std::sync::atomic::Ordering::SeqCst);
    burst(3);
    assert_eq!(cluster.busy_max[0].load(std::sync::atomic::Ordering::SeqCst), 1, "one in flight at a time");
    let b0 = agent_status(&tb).backends.into_iter().next().unwrap();
    let q = b0.queue.expect("a queue with maxconn");
    assert_eq!(q.maxconn, 1);
    assert!(q.queued_total >= 2, "the others queued: {q:?}");
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(status.contains("backend b0: maxconn 1 (runtime; configured none); until reload"), "{status}");

    let (code, body) = tb.admin("POST", "/backends/b0/maxconn?value=abc").unwrap();
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("1..=1000000"), "{body}");
    let out = tb.dispatcher_cmd(&["maxconn", "--config", &cfg, "b0", "none"]);
    assert_eq!(out.trim(), "backend b0: maxconn 1 -> none (the configuration's)");
}

#[test]
fn with_checks_disabled_a_failing_backend_serves_and_enabled_again_it_goes_down() {
    // The checks go to a port nothing listens on: every check fails.
    let (tb, cluster, addr, cfg) = runtime_testbed(2, "port = 9\nfall = 2\n");
    wait_state(&tb, "b0", "down");
    wait_state(&tb, "b1", "down");

    let out = tb.dispatcher_cmd(&["checks", "--config", &cfg, "disable", "b0"]);
    assert!(out.contains("backend b0: health checks enabled -> disabled (until reload; configured enabled)"), "{out}");
    assert!(out.contains("backend b0: down -> up"), "{out}");
    wait_state(&tb, "b0", "up");
    // It stays up over many check intervals and takes the new sessions.
    std::thread::sleep(Duration::from_millis(1000));
    let on = new_sessions(&tb, addr, 10);
    assert_eq!(on.get("clone0x"), Some(&10), "{on:?}");
    assert!(cluster.hits().iter().all(|h| h.backend == 0));
    let st = agent_status(&tb);
    assert!(st.backends[0].checks_disabled && !st.backends[1].checks_disabled);
    assert_eq!(st.backends[0].state, "up");
    let status = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    assert!(status.contains("backend b0: health checks disabled; until reload"), "{status}");

    tb.dispatcher_cmd(&["checks", "--config", &cfg, "enable", "b0"]);
    wait_state(&tb, "b0", "down");
    let (code, body) = tb.admin("POST", "/backends/b0/melt-checks").unwrap();
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("disable-checks, enable-checks"), "{body}");
}

#[test]
fn counters_cleared_read_zero_and_count_again() {
    let (tb, _cluster, addr, cfg) = runtime_testbed(2, "");
    std::thread::sleep(Duration::from_millis(500));
    new_sessions(&tb, addr, 10);
    // The connections' last packets go by before the clearing.
    std::thread::sleep(Duration::from_millis(500));
    let before = agent_status(&tb);
    assert_eq!(before.backends.iter().map(|b| b.requests).sum::<u64>(), 10);
    assert_eq!(before.vips[0].requests, 10);

    let out = tb.dispatcher_cmd(&["clear-counters", "--config", &cfg, "--all"]);
    assert!(out.starts_with("cleared: the agent's counters"), "{out}");
    let after = agent_status(&tb);
    for b in &after.backends {
        assert_eq!((b.requests, b.errors), (0, 0), "{b:?}");
        assert!(b.responses.values().all(|&n| n == 0), "{b:?}");
    }
    assert_eq!(after.vips[0].requests, 0);
    assert!(after.farms.iter().all(|f| f.counts.requests == 0 && f.counts.balanced == 0), "{:?}", after.farms);
    let json = tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["vips"][0]["packets"], 0, "XDP's counters too: {json}");

    new_sessions(&tb, addr, 3);
    assert_eq!(agent_status(&tb).vips[0].requests, 3, "counting again from zero");
}
