//! Faults under load from clients with cookie jars: a clone killed, a clone stopped
//! (accepts TCP, never answers), a replica pair lost, every clone lost. Whatever happens,
//! no request of a session reaches a server that is neither its owner nor its replica,
//! no session whose owner or replica lives loses data, and every failed request gets a
//! 5xx answer.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::Testbed,
    websphere::{self, Client, Load, Seen},
};

const VIP: &str = "10.99.100.30";
const PORT: u16 = 8080;
const HOLD: Duration = Duration::from_secs(3);
const SERVER_TIMEOUT: Duration = Duration::from_secs(1);

fn start_load(tb: &Testbed, addr: SocketAddr, clients: usize) -> Load {
    Load::start((0..clients).map(|k| (Client::new(&tb.client, addr), format!("/app/{k}"))).collect())
}

fn bed(n: usize) -> (Testbed, Arc<websphere::Clones>, SocketAddr, String) {
    bed_with(n, "")
}

/// `vip`: more lines for the VIP.
fn bed_with(n: usize, vip: &str) -> (Testbed, Arc<websphere::Clones>, SocketAddr, String) {
    let cluster = websphere::Clones::new(n);
    let (tb, addr, cfg) = bed_for(&cluster, vip, false);
    (tb, cluster, addr, cfg)
}

/// A testbed serving `cluster`; `configured`: each backend's clone ID is in the
/// configuration (else the agent learns them from `Set-Cookie`).
fn bed_for(cluster: &Arc<websphere::Clones>, vip: &str, configured: bool) -> (Testbed, SocketAddr, String) {
    let n = cluster.clone_ids.len();
    let mut tb = Testbed::new(n, &[VIP]);
    tb.add_local_vip(VIP);
    tb.start_websphere(cluster, PORT);
    let backends =
        if configured { tb.backend_config_with_clones(&[], &cluster.clone_ids) } else { tb.backend_config(&[]) };
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nhold_time = \"{}ms\"\nserver_timeout = \"{}ms\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"300ms\"\nrise = 2\nfall = 2\n\n{}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {PORT}\nring_size = 1009\n{vip}",
        tb.instance(),
        HOLD.as_millis(),
        SERVER_TIMEOUT.as_millis(),
        backends
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    (tb, format!("{VIP}:80").parse().unwrap(), cfg)
}

/// No session was served by a clone other than its first owner or that owner's peer.
fn assert_no_misroute(cluster: &websphere::Clones) {
    let m = cluster.misroutes();
    assert!(m.is_empty(), "{m:?}");
}

/// Each client's session counter continues across answers: never back (data lost), and
/// a step of more than one only for requests that failed with a 5xx yet ran on a server
/// (a 504 whose request the stopped server finished after it was thawed).
fn assert_sessions_kept(seen: &[Vec<Seen>]) {
    for (k, s) in seen.iter().enumerate() {
        let mut last = 0;
        let mut unexplained_allowed = 0u64;
        for x in s {
            if x.status != 200 {
                unexplained_allowed += 1;
                continue;
            }
            assert!(!x.lost, "client {k}: session lost");
            assert!(x.count > last, "client {k}: counter went back from {last} to {}", x.count);
            let extra = x.count - last - 1;
            assert!(
                extra <= unexplained_allowed,
                "client {k}: counter went from {last} to {} with only {unexplained_allowed} failed requests before",
                x.count
            );
            unexplained_allowed -= extra;
            last = x.count;
        }
        assert!(last > 5, "client {k} made progress");
    }
}

/// Every request that did not succeed got a 5xx answer, within the hold bound.
fn assert_failures_answered(seen: &[Vec<Seen>], bound: Duration) {
    for s in seen {
        for x in s {
            assert!(x.status == 200 || (500..600).contains(&x.status), "a request ended without a 5xx: {x:?}");
            assert!(x.status != 503 || x.retry_after, "a 503 says when to retry: {x:?}");
            assert!(x.took < bound, "a request took {:?} (bound {bound:?})", x.took);
        }
    }
}

/// The agent's open descriptors and resident memory.
fn agent_footprint(tb: &Testbed) -> (usize, u64) {
    let pid = tb.pid_of("dispatcher").expect("agent pid");
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (fds, rss)
}

#[test]
fn a_killed_clone_hands_its_sessions_to_its_replica() {
    let (mut tb, cluster, addr, cfg) = bed(4);
    let (fds_before, rss_before) = agent_footprint(&tb);
    let load = start_load(&tb, addr, 8);
    std::thread::sleep(Duration::from_millis(1500));
    tb.kill_servers_of(0);
    cluster.kill(0);
    std::thread::sleep(Duration::from_millis(3500));
    let seen = load.finish();

    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    // The sessions b0 owned are now served by b1, with their data.
    let moved = seen
        .iter()
        .filter(|s| s.iter().any(|x| x.clone == "clone0x") && s.last().is_some_and(|x| x.clone == "clone1x"))
        .count();
    assert!(
        moved >= 1,
        "b0's sessions continue on b1: {:?}",
        seen.iter().map(|s| s.last().map(|x| x.clone.clone())).collect::<Vec<_>>()
    );
    let errors: usize = seen.iter().map(|s| s.iter().filter(|x| x.status != 200).count()).sum();
    assert!(errors <= 8, "at most the requests in flight on b0 fail: {errors}");

    // The agent counted no misroute, holds nothing now, and is back to its footprint
    // plus the idle pooled upstream connections.
    std::thread::sleep(Duration::from_millis(500));
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["counters"]["misroutes"], 0);
    assert_eq!(st["agent"]["counters"]["held_now"], 0);
    assert_eq!(st["agent"]["backends"][0]["state"], "down");
    // The change says why, in the status, the log and the metrics (issue 33: HAProxy's
    // "Server b0 is DOWN, reason: Layer4 connection problem ... 3 active servers left").
    let b0 = st["agent"]["backends"][0]["name"].as_str().unwrap().to_string();
    let last = &st["agent"]["backends"][0]["last_change"];
    assert_eq!(last["to"], "down", "{last}");
    let kind = last["reason_kind"].as_str().unwrap_or_default();
    assert!(["refused", "reset", "closed", "timeout", "passive"].contains(&kind), "why b0 went down: {last}");
    assert!(!last["reason"].as_str().unwrap_or_default().is_empty(), "{last}");
    let log = tb.log("dispatcher");
    let line =
        log.lines().find(|l| l.contains(&format!("backend {b0} ")) && l.contains("-> down: ")).unwrap_or_default();
    assert!(line.contains("of 4 servers of VIP"), "the log line names the reason and what is left: {line:?}\n{log}");
    let metrics = tb.dispatcher_cmd(&["metrics", "--config", &cfg]);
    assert!(
        metrics.lines().any(|l| l.starts_with("dispatcher_backend_transitions_total{")
            && l.contains(&format!("backend=\"{b0}\""))
            && l.contains("to=\"down\"")
            && l.contains(&format!("reason_kind=\"{kind}\""))),
        "transitions by reason:\n{metrics}"
    );
    // Every hold was timed.
    let timed: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("dispatcher_hold_seconds_count{scope=\"all\"} "))
        .and_then(|v| v.trim().parse().ok())
        .expect("hold histogram");
    assert!(timed >= st["agent"]["counters"]["holds"].as_u64().unwrap(), "holds timed: {timed}");
    let (fds_after, rss_after) = agent_footprint(&tb);
    // Every descriptor beyond the start is an upstream connection the pools keep (the
    // agent counts them), and those are bounded: one per client per live backend at most.
    let pooled: u64 = (0..4).map(|b| st["agent"]["backends"][b]["connections"].as_u64().unwrap()).sum();
    assert!(pooled <= 8 * 3, "pooled upstream connections: {pooled}");
    assert!(fds_after <= fds_before + pooled as usize + 4, "descriptors {fds_before} -> {fds_after}, {pooled} pooled");
    assert!(rss_after <= rss_before + 8 * 1024, "RSS {rss_before} KiB -> {rss_after} KiB");
}

/// Load, clone 0 killed: its sessions must continue on clone 1 (its replica) with their
/// data, and no session may reach a third clone.
fn first_clone_killed_under_load(tb: &mut Testbed, cluster: &Arc<websphere::Clones>, addr: SocketAddr) {
    let load = start_load(tb, addr, 8);
    std::thread::sleep(Duration::from_millis(1500));
    tb.kill_servers_of(0);
    cluster.kill(0);
    std::thread::sleep(Duration::from_millis(3000));
    let seen = load.finish();
    assert_no_misroute(cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    let (first, replica) = (&cluster.clone_ids[0], &cluster.clone_ids[1]);
    let moved = seen
        .iter()
        .filter(|s| s.iter().any(|x| &x.clone == first) && s.last().is_some_and(|x| &x.clone == replica))
        .count();
    let were_on_first = seen.iter().filter(|s| s.iter().any(|x| &x.clone == first)).count();
    assert!(
        were_on_first >= 1 && moved == were_on_first,
        "{moved} of {were_on_first} sessions of {first} went on at {replica}"
    );
}

/// `session_format = "jvmroute"`: Tomcat or WildFly clones name themselves after the last
/// `.` of the session ID. Routes are learned from `Set-Cookie`; when a clone dies its
/// replica takes the session over and rewrites the route to its own (Tomcat's
/// JvmRouteBinderValve), which the agent learns: the session stays there.
#[test]
fn jvm_route_sessions_stick_and_fail_over_to_the_replica() {
    let routes = (0..4).map(|i| format!("tomcat{i}")).collect();
    let cluster = websphere::Clones::with_ids(routes, websphere::IdStyle::JvmRoute);
    let (mut tb, addr, _) = bed_for(&cluster, "session_format = \"jvmroute\"\n", false);
    first_clone_killed_under_load(&mut tb, &cluster, addr);
}

/// Liberty writes WebSphere's form with its own clone IDs (`<httpSessionManager
/// cloneId=...>`, any token): configured ones route from the first request on.
#[test]
fn liberty_clone_ids_in_websphere_form_stick_and_fail_over() {
    let ids = (0..4).map(|i| format!("lib-{i}7f3e_Q9zK")).collect();
    let cluster = websphere::Clones::with_ids(ids, websphere::IdStyle::WebSphere);
    let (mut tb, addr, _) = bed_for(&cluster, "", true);
    first_clone_killed_under_load(&mut tb, &cluster, addr);
}

#[test]
fn a_stopped_clone_gets_no_replay_storm_and_its_sessions_move_on() {
    let (tb, cluster, addr, _) = bed(4);
    let load = start_load(&tb, addr, 8);
    std::thread::sleep(Duration::from_millis(1000));
    cluster.freeze(2, true);
    std::thread::sleep(Duration::from_millis(4000));
    let during = cluster.received_frozen[2].load(Ordering::SeqCst);
    cluster.freeze(2, false);
    std::thread::sleep(Duration::from_millis(1500));
    let seen = load.finish();

    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    // Only the requests in flight when it stopped reached it: no replays over the pool.
    assert!(during <= 8, "the stopped clone received {during} requests");
    let timeouts: usize = seen.iter().map(|s| s.iter().filter(|x| x.status == 504).count()).sum();
    assert!(timeouts >= 1, "requests in flight on the stopped clone end with 504");
}

#[test]
fn owner_and_replica_lost_means_503_with_retry_after_not_another_server() {
    let (mut tb, cluster, addr, _) = bed(4);
    // A session on b2 first.
    let mut c = Client::new(&tb.client, addr);
    let mut on_b2 = None;
    for _ in 0..8 {
        let mut fresh = Client::new(&tb.client, addr);
        if fresh.get("/").unwrap().field("clone") == Some("clone2x") {
            on_b2 = fresh.jar.clone();
            break;
        }
    }
    c.jar = Some(on_b2.expect("a session on b2"));
    tb.kill_servers_of(2);
    cluster.kill(2);
    tb.kill_servers_of(3);
    cluster.kill(3);
    let t = Instant::now();
    let r = c.get("/").unwrap();
    assert_eq!(r.status, 503, "{r:?}");
    assert!(r.header("retry-after").is_some(), "{r:?}");
    assert!(t.elapsed() < HOLD + Duration::from_secs(2), "answered within the hold bound: {:?}", t.elapsed());
    assert_no_misroute(&cluster);
    // Sessions of the surviving pair still work.
    let mut other = Client::new(&tb.client, addr);
    assert_eq!(other.get("/").unwrap().status, 200);
}

#[test]
fn all_clones_lost_means_503_within_the_hold_bound() {
    let (mut tb, cluster, addr, _) = bed(2);
    let mut c = Client::new(&tb.client, addr);
    assert_eq!(c.get("/").unwrap().status, 200);
    for i in 0..2 {
        tb.kill_servers_of(i);
        cluster.kill(i);
    }
    let t = Instant::now();
    let r = c.get("/").unwrap();
    assert_eq!(r.status, 503);
    assert!(r.header("retry-after").is_some());
    assert!(t.elapsed() < HOLD + Duration::from_secs(2), "{:?}", t.elapsed());
    let mut fresh = Client::new(&tb.client, addr);
    let t = Instant::now();
    let r = fresh.get("/").unwrap();
    assert_eq!(r.status, 503, "no session, no server: 503");
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn a_flapping_clone_does_not_make_ownership_oscillate() {
    let (tb, cluster, addr, _) = bed(4);
    let load = start_load(&tb, addr, 8);
    std::thread::sleep(Duration::from_millis(800));
    // Stopped and resumed every 300 ms for 3 s.
    for _ in 0..5 {
        cluster.freeze(1, true);
        std::thread::sleep(Duration::from_millis(300));
        cluster.freeze(1, false);
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_millis(800));
    let seen = load.finish();
    drop(tb);

    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    // Each session changes the clone serving it a bounded number of times.
    let mut last: HashMap<String, usize> = HashMap::new();
    let mut switches: HashMap<String, usize> = HashMap::new();
    for h in cluster.hits() {
        if let Some(prev) = last.insert(h.session.clone(), h.backend) {
            if prev != h.backend {
                *switches.entry(h.session.clone()).or_default() += 1;
            }
        }
    }
    let worst = switches.values().copied().max().unwrap_or(0);
    assert!(worst <= 2, "a session changed clones {worst} times: {switches:?}");
}

/// Under load from 8 clients, clone0x dies, then restarts: it takes its sessions' copies
/// back from its peer and the checks see it up again (rise 2). What the clients saw.
fn clone0_dies_and_returns(tb: &mut Testbed, cluster: &Arc<websphere::Clones>, addr: SocketAddr) -> Vec<Vec<Seen>> {
    let load = start_load(tb, addr, 8);
    std::thread::sleep(Duration::from_millis(1000));
    tb.kill_servers_of(0);
    cluster.kill(0);
    std::thread::sleep(Duration::from_millis(1500));
    cluster.revive(0);
    tb.start_websphere_on(cluster, 0, PORT);
    std::thread::sleep(Duration::from_millis(2000));
    load.finish()
}

#[test]
fn a_clone_that_comes_back_gets_its_sessions_back_with_their_data() {
    let (mut tb, cluster, addr, _) = bed(4);
    // The first clone in each cookie is live again once it is back.
    let seen = clone0_dies_and_returns(&mut tb, &cluster, addr);
    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    // Sessions whose cookie names clone0x first are served by clone0x again.
    let back = seen
        .iter()
        .filter(|s| s.iter().any(|x| x.clone == "clone0x") && s.last().is_some_and(|x| x.clone == "clone0x"))
        .count();
    let were_on_0 = seen.iter().filter(|s| s.iter().any(|x| x.clone == "clone0x")).count();
    assert!(were_on_0 >= 1 && back == were_on_0, "{back} of {were_on_0} sessions back on clone0x");
}

/// `fail_back = false`: a clone that comes back does not get back the sessions its
/// replica took over (its copies may be stale); sessions it never lost stay with it.
#[test]
fn without_fail_back_taken_over_sessions_stay_with_the_replica() {
    let (mut tb, cluster, addr, _) = bed_with(4, "fail_back = false\n");
    let seen = clone0_dies_and_returns(&mut tb, &cluster, addr);
    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    // Sessions that were on clone0x moved to clone1x and stayed there.
    let were_on_0: Vec<_> = seen.iter().filter(|s| s.iter().any(|x| x.clone == "clone0x")).collect();
    assert!(!were_on_0.is_empty(), "no session was on clone0x");
    for s in &were_on_0 {
        let after: Vec<&str> = s
            .iter()
            .skip_while(|x| x.clone != "clone1x")
            .filter(|x| x.status == 200)
            .map(|x| x.clone.as_str())
            .collect();
        assert!(!after.is_empty() && after.iter().all(|c| *c == "clone1x"), "{after:?}");
    }
}

/// The operator's state and the health are two dimensions: a drained clone that dies
/// fails over like any other (its sessions continue on its replica with their data), and
/// draining a clone that is down leaves it down (its sessions are not sent back to it).
#[test]
fn a_drained_clone_that_dies_fails_over_and_a_dead_one_stays_out_when_drained() {
    let (mut tb, cluster, addr, cfg) = bed(4);
    let load = start_load(&tb, addr, 8);
    std::thread::sleep(Duration::from_millis(1000));
    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg, "b0"]);
    assert!(out.contains("b0: up -> drain"), "{out}");
    std::thread::sleep(Duration::from_millis(500));
    tb.kill_servers_of(0);
    cluster.kill(0);
    // b2 dies, is found down, and only then does the operator drain it.
    tb.kill_servers_of(2);
    cluster.kill(2);
    let deadline = Instant::now() + Duration::from_secs(5);
    let state = |tb: &Testbed, b: usize| -> serde_json::Value {
        let st: serde_json::Value =
            serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
        st["agent"]["backends"][b].clone()
    };
    while state(&tb, 2)["state"] != "down" || state(&tb, 0)["state"] != "down" {
        assert!(Instant::now() < deadline, "b0 and b2 not down: {} {}", state(&tb, 0), state(&tb, 2));
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = tb.dispatcher_cmd(&["drain", "--config", &cfg, "b2"]);
    assert!(out.contains("b2: down -> down"), "draining a dead backend keeps it out: {out}");
    std::thread::sleep(Duration::from_millis(2500));
    let seen = load.finish();

    assert_no_misroute(&cluster);
    assert_sessions_kept(&seen);
    assert_failures_answered(&seen, HOLD + SERVER_TIMEOUT + Duration::from_secs(1));
    for (from, to) in [("clone0x", "clone1x"), ("clone2x", "clone3x")] {
        let moved = seen
            .iter()
            .filter(|s| s.iter().any(|x| x.clone == from) && s.last().is_some_and(|x| x.clone == to))
            .count();
        assert!(moved >= 1, "{from}'s sessions continue on {to}");
    }
    // Only the requests in flight when they died (and those held meanwhile) fail: not the
    // rest of the run.
    let errors: usize = seen.iter().map(|s| s.iter().filter(|x| x.status != 200).count()).sum();
    assert!(errors <= 16, "{errors} failed requests");
    for b in [0, 2] {
        let s = state(&tb, b);
        assert_eq!(
            (s["state"].as_str(), s["health"].as_str(), s["admin"].as_str()),
            (Some("down"), Some("down"), Some("drain")),
            "{s}"
        );
    }
    let table = tb.dispatcher_cmd(&["status", "--config", &cfg]);
    let row = table.lines().find(|l| l.starts_with("b0 ")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[2..5], ["down", "down", "drain"], "STATE, HEALTH and OPERATOR: {table}");
}

/// `slow_start`: a backend that comes back gets a share of new work that grows over the
/// ramp, in both planes — new HTTP sessions (smooth weights) and new L4 flows (the Maglev
/// ring rebuilt in steps) — while its own sessions return to it at once.
#[test]
fn a_returning_backend_ramps_up_in_both_planes_and_gets_its_sessions_at_once() {
    const L4_VIP: &str = "10.99.100.31";
    let mut tb = Testbed::new(2, &[VIP, L4_VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(2);
    tb.start_websphere(&cluster, PORT);
    let backends = tb.backend_config_with(&[], |i| if i == 0 { "slow_start = \"3s\"\n".into() } else { String::new() });
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\npath = \"/health\"\ninterval = \"100ms\"\nrise = 1\nfall = 1\n\n{backends}\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {PORT}\nring_size = 1009\nbackends = [\"b0\", \"b1\"]\n\n[[vip]]\nname = \"l4\"\naddress = \"{L4_VIP}\"\nport = 9000\nring_size = 1009\nbackends = [\"b0\", \"b1\"]\n",
        tb.instance()
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap().to_string();
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();
    let state = |tb: &Testbed| {
        let st: serde_json::Value =
            serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", &cfg, "--json"])).unwrap();
        st["agent"]["backends"][0]["state"].as_str().unwrap_or("").to_string()
    };
    let b0_slots = |tb: &Testbed| {
        let mut t = dispatcher::dataplane::tables::Tables::from_pinned(&tb.pin_dir()).expect("pinned maps");
        t.adopt_ring(1, 1009).unwrap();
        t.ring(1).unwrap().iter().filter(|&&b| b == 0).count()
    };
    // Share of new sessions (no cookie) that b0 gets out of `n`.
    let new_sessions = |tb: &Testbed, n: usize| {
        (0..n)
            .filter(|_| Client::new(&tb.client, addr).get("/plain").unwrap().field("clone") == Some("clone0x"))
            .count()
    };
    assert!((450..=560).contains(&b0_slots(&tb)), "equal weights: about half the ring");
    // A session of b0's, then b0 dies and comes back.
    let mut own = None;
    for _ in 0..6 {
        let mut c = Client::new(&tb.client, addr);
        if c.get("/app").unwrap().field("clone") == Some("clone0x") {
            own = Some(c);
            break;
        }
    }
    let mut own = own.expect("a session on b0 within 6 new ones");
    tb.kill_servers_of(0);
    cluster.kill(0);
    let t = Instant::now();
    while state(&tb) != "down" {
        assert!(t.elapsed() < Duration::from_secs(5), "b0 never went down");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(b0_slots(&tb), 0);
    cluster.revive(0);
    tb.start_websphere_on(&cluster, 0, PORT);
    let t = Instant::now();
    while state(&tb) != "up" {
        assert!(t.elapsed() < Duration::from_secs(5), "b0 never came back");
        std::thread::sleep(Duration::from_millis(20));
    }
    let back = Instant::now();
    // Its own session is its at once (the cookie names clone0x first).
    assert_eq!(own.get("/app").unwrap().field("clone"), Some("clone0x"));
    // Early in the ramp: a small share of the ring and of new sessions.
    let early_slots = b0_slots(&tb);
    let early_sessions = new_sessions(&tb, 40);
    assert!(back.elapsed() < Duration::from_millis(1200), "the early samples took {:?}", back.elapsed());
    assert!(early_slots <= 260, "ring share early: {early_slots} of 1009");
    assert!(early_sessions <= 14, "new sessions early: {early_sessions} of 40");
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(back.elapsed()));
    let mid_slots = b0_slots(&tb);
    assert!(mid_slots > early_slots && mid_slots < 480, "the ring grows in steps: {early_slots} then {mid_slots}");
    std::thread::sleep(Duration::from_millis(3600).saturating_sub(back.elapsed()));
    let late_slots = b0_slots(&tb);
    let late_sessions = new_sessions(&tb, 40);
    assert!((450..=560).contains(&late_slots), "full weight after the ramp: {late_slots} of 1009");
    assert!((14..=26).contains(&late_sessions), "half of new sessions after the ramp: {late_sessions} of 40");
    eprintln!("slow start: ring slots {early_slots} -> {mid_slots} -> {late_slots} of 1009; new sessions {early_sessions} then {late_sessions} of 40");
    assert_no_misroute(&cluster);
}

/// Every log line of the request path says whose it is: the VIP and the client (the
/// connection's span); at debug level also which of the connection's requests (the
/// request's span, off at the default level for its cost).
#[test]
fn request_path_log_lines_name_their_connection_and_request() {
    let (mut tb, cluster, addr, _) = bed(2);
    let mut c = Client::new(&tb.client, addr);
    let owner = c.get("/").unwrap().field("clone").map(str::to_string);
    let i = if owner.as_deref() == Some("clone0x") { 0 } else { 1 };
    tb.kill_servers_of(i);
    cluster.kill(i);
    // The session's owner refuses: suspect at once (a warning), the replica answers.
    assert_eq!(c.get("/").unwrap().status, 200);
    let log = tb.log("dispatcher");
    let line = log
        .lines()
        .find(|l| l.contains("backend suspect after a failed request"))
        .unwrap_or_else(|| panic!("no suspect warning:\n{log}"));
    assert!(line.contains("conn{vip=app client="), "no connection span: {line}");
    assert!(!line.contains("request{n="), "the request span is a debug one: {line}");
    assert_no_misroute(&cluster);
}
