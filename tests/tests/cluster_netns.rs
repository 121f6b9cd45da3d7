//! Several dispatchers, one truth: three dispatchers share their state through a real
//! 3-member etcd cluster (each in its own namespace). A clone ID learned through one is
//! routed by all; an operator's command on one reaches all and survives a restart; the
//! maps that decide where traffic goes are the same on all; a clone killed under load
//! through all three loses no session and reaches no non-owner; the store's faults
//! (a member lost, the quorum lost, a dispatcher cut off) change none of that.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use dispatcher_testbed::cluster::Multi;

/// What a dispatcher learns is used by the others within this bound.
const SHARE_BOUND: Duration = Duration::from_secs(2);

fn backend_field(m: &Multi, i: usize, backend: &str, f: fn(&dispatcher::api::BackendStatus) -> String) -> String {
    m.status(i).backends.iter().find(|b| b.name == backend).map(f).unwrap_or_default()
}

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Sessions created through dispatcher `i` until one is owned by a clone whose ID the
/// cluster has not learned yet; returns (clone index, cookie).
fn new_session_on_unlearned_clone(m: &Multi, i: usize, learned: &[usize]) -> (usize, String) {
    for _ in 0..200 {
        let mut c = m.client(i);
        let r = c.get("/app/new").expect("a new session");
        assert_eq!(r.status, 200, "{r:?}");
        let clone = r.field("clone").unwrap().to_string();
        let k = m.clones.clone_ids.iter().position(|x| *x == clone).unwrap();
        if !learned.contains(&k) {
            return (k, c.jar.clone().unwrap());
        }
    }
    panic!("no session landed on a clone outside {learned:?}");
}

/// The request with `cookie` through dispatcher `i`: the clone that answered.
fn served_by(m: &Multi, i: usize, cookie: &str) -> (String, bool) {
    let mut c = m.client(i);
    c.jar = Some(cookie.to_string());
    let r = c.get("/app/again").expect("a session request");
    assert_eq!(r.status, 200, "{r:?}");
    (r.field("clone").unwrap().to_string(), r.field("lost") == Some("1"))
}

#[test]
fn learning_operator_commands_and_decisions_are_shared() {
    let mut m = Multi::new(3, 4);
    for i in 0..3 {
        m.start_dispatcher(i);
    }
    // Every dispatcher lists the same live dispatchers.
    m.wait_for("three members everywhere", Duration::from_secs(5), || {
        (0..3).all(|i| m.status(i).cluster.is_some_and(|c| c.members.len() == 3 && c.store == "connected"))
    });
    let names: Vec<Vec<String>> =
        (0..3).map(|i| m.status(i).cluster.unwrap().members.iter().map(|x| x.name.clone()).collect()).collect();
    assert!(names.iter().all(|n| *n == ["d0", "d1", "d2"]), "{names:?}");

    // A clone ID learned through d0 is routed by d1 and d2 (not balanced): measured.
    let (k, cookie) = new_session_on_unlearned_clone(&m, 0, &[]);
    let t = Instant::now();
    let key_present = |i: usize| m.decision_maps(i).clones.len() == m.decision_maps(0).clones.len();
    m.wait_for("the learned clone ID on d1 and d2", SHARE_BOUND, || key_present(1) && key_present(2));
    let learned_in = t.elapsed();
    for i in [1, 2] {
        for _ in 0..5 {
            let (clone, lost) = served_by(&m, i, &cookie);
            assert_eq!(clone, m.clones.clone_ids[k], "d{i} routes the session to its owner");
            assert!(!lost);
        }
    }
    eprintln!("clone ID learned on d0 was in d1's and d2's tables after {learned_in:?}");

    // An operator's drain on d1 reaches d0 and d2; enable on d2 clears it everywhere.
    ok(m.cmd(1, &["drain", "b2"]));
    let t = Instant::now();
    m.wait_for("drain of b2 everywhere", SHARE_BOUND, || {
        (0..3).all(|i| backend_field(&m, i, "b2", |b| b.admin.clone()) == "drain")
    });
    eprintln!("drain on d1 reached all after {:?}", t.elapsed());
    ok(m.cmd(2, &["enable", "b2"]));
    m.wait_for("enable of b2 everywhere", SHARE_BOUND, || {
        (0..3).all(|i| backend_field(&m, i, "b2", |b| b.admin.clone()) == "none")
    });

    // The operator's word survives a dispatcher's restart: taken before it serves.
    ok(m.cmd(1, &["disable", "b3"]));
    m.wait_for("disable of b3 everywhere", SHARE_BOUND, || {
        (0..3).all(|i| backend_field(&m, i, "b3", |b| b.admin.clone()) == "disabled")
    });
    m.stop_dispatcher(0);
    // Detached on stop: the restart loads afresh, with no pinned state of its own.
    m.wait_for("d0 gone from the members", Duration::from_secs(2), || {
        m.status(1).cluster.unwrap().members.iter().all(|x| x.name != "d0")
    });
    ok(m.cmd(2, &["drain", "b1"]));
    m.wait_for("drain of b1 on d2", SHARE_BOUND, || backend_field(&m, 2, "b1", |b| b.admin.clone()) == "drain");
    m.start_dispatcher(0);
    let s = m.status(0);
    let admin: HashMap<String, String> = s.backends.iter().map(|b| (b.name.clone(), b.admin.clone())).collect();
    assert_eq!(admin["b3"], "disabled", "restarted d0 took the shared state before serving: {admin:?}");
    assert_eq!(admin["b1"], "drain", "including what was said while it was away: {admin:?}");
    let (clone, _) = served_by(&m, 0, &cookie);
    assert_eq!(clone, m.clones.clone_ids[k], "and the learned clone table");

    // Same configuration and same shared state: the same rings, states and clone table.
    m.wait_for("identical decisions", Duration::from_secs(3), || {
        let d0 = m.decision_maps(0);
        (1..3).all(|i| m.decision_maps(i) == d0)
    });
    let d0 = m.decision_maps(0);
    assert_eq!(d0.states[3].1, dispatcher_common::STATE_DISABLED, "b3 disabled in BACKENDS");
    assert!(!d0.rings[1].contains(&3), "and out of the L4 ring");
    assert!(!d0.clones.is_empty());
}

/// One answer a client saw.
#[derive(Clone, Debug)]
struct Seen {
    status: u16,
    lost: bool,
}

struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// `per` clients with sessions through each dispatcher, keep-alive, a reconnect now and
/// then; each client's session is created on the first request and kept.
fn start_load(m: &Multi, dispatchers: &[usize], per: usize) -> Load {
    let stop = Arc::new(AtomicBool::new(false));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for &i in dispatchers {
        for _ in 0..per {
            let mut c = m.client(i);
            let (stop, seen) = (stop.clone(), seen.clone());
            threads.push(std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) && n < 20_000 {
                    n += 1;
                    if n.is_multiple_of(11) {
                        c.reconnect();
                    }
                    let s = match c.get(&format!("/app/{n}")) {
                        Ok(r) => Seen { status: r.status, lost: r.header("X-Session-Lost").is_some() },
                        Err(_) => {
                            c.reconnect();
                            Seen { status: 0, lost: false }
                        }
                    };
                    seen.lock().unwrap().push(s);
                    std::thread::sleep(Duration::from_millis(10));
                }
            }));
        }
    }
    Load { stop, threads, seen }
}

impl Load {
    fn finish(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        self.seen.lock().unwrap().clone()
    }
}

fn assert_clean(m: &Multi, seen: &[Seen]) {
    let misroutes = m.clones.misroutes();
    assert!(misroutes.is_empty(), "requests reached a non-owner: {misroutes:?}");
    let lost = seen.iter().filter(|s| s.lost).count();
    assert_eq!(lost, 0, "sessions lost");
    let failed = seen.iter().filter(|s| s.status != 200).count();
    assert!(seen.len() > 100, "the load ran: {}", seen.len());
    assert_eq!(failed, 0, "failed requests of {}", seen.len());
    for i in 0..m.dispatchers.len() {
        if m.tb.pid_of(&format!("dispatcher-d{i}")).is_some() {
            assert_eq!(m.status(i).counters.misroutes, 0, "d{i} counted a misroute");
        }
    }
}

/// A clone killed under load through three dispatchers: its sessions go to its replica
/// on all of them; nothing reaches a non-owner, no session is lost.
#[test]
fn a_clone_killed_under_load_through_three_dispatchers() {
    let mut m = Multi::new(3, 4);
    for i in 0..3 {
        m.start_dispatcher(i);
    }
    let load = start_load(&m, &[0, 1, 2], 3);
    std::thread::sleep(Duration::from_millis(1500));
    m.tb.kill_servers_of(1);
    m.clones.kill(1);
    // Every dispatcher sees it out, by its own checks and by the shared rule.
    let t = Instant::now();
    m.wait_for("b1 out everywhere", Duration::from_secs(3), || {
        (0..3).all(|i| backend_field(&m, i, "b1", |b| b.state.clone()) == "down")
    });
    eprintln!("b1 out on all three after {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(2000));
    let seen = load.finish();
    assert_clean(&m, &seen);
    let s = m.status(2).cluster.unwrap();
    assert_eq!(s.members.iter().filter(|x| x.down == ["b1"]).count(), 3, "all three publish b1 down: {s:?}");
}

/// etcd faults: a member killed changes nothing; the quorum lost leaves every dispatcher
/// forwarding with its last state and its own checks (and saying so); what is learned
/// meanwhile reaches the others when the quorum is back. A dispatcher cut off from the
/// store still fails a dead clone over to its replica.
#[test]
fn the_store_failing_changes_no_routing() {
    let mut m = Multi::new(3, 4);
    for i in 0..3 {
        m.start_dispatcher(i);
    }
    m.wait_for("three members", Duration::from_secs(5), || m.status(0).cluster.unwrap().members.len() == 3);
    let (k0, cookie0) = new_session_on_unlearned_clone(&m, 0, &[]);

    // One member killed: no effect.
    m.kill_etcd(2);
    let load = start_load(&m, &[0, 1, 2], 2);
    ok(m.cmd(0, &["drain", "b3"]));
    m.wait_for("drain with one etcd member down", Duration::from_secs(5), || {
        (0..3).all(|i| backend_field(&m, i, "b3", |b| b.admin.clone()) == "drain")
    });
    // The quorum lost: every dispatcher says so and keeps forwarding.
    m.kill_etcd(1);
    m.wait_for("the store unreachable everywhere", Duration::from_secs(10), || {
        (0..3).all(|i| m.status(i).cluster.unwrap().store == "unreachable")
    });
    let metrics = ok(m.cmd(1, &["metrics"]));
    assert!(metrics.contains("dispatcher_cluster_store_up 0"), "{metrics}");
    let human = ok(m.cmd(1, &["status"]));
    assert!(human.contains("UNREACHABLE"), "{human}");
    // Learned while the store is away: another clone's ID, through d1.
    let (k1, cookie1) = new_session_on_unlearned_clone(&m, 1, &[k0, 3]);
    assert_eq!(served_by(&m, 0, &cookie0).0, m.clones.clone_ids[k0], "the last shared state routes on");
    // The quorum back: the learning reaches d0 and d2.
    m.start_etcd(1);
    m.start_etcd(2);
    m.wait_etcd_healthy(3);
    let t = Instant::now();
    m.wait_for("the store back everywhere", Duration::from_secs(10), || {
        (0..3).all(|i| m.status(i).cluster.unwrap().store == "connected")
    });
    let entries = m.decision_maps(1).clones.len();
    m.wait_for("learned meanwhile, shared", SHARE_BOUND, || (0..3).all(|i| m.decision_maps(i).clones.len() == entries));
    eprintln!("converged {:?} after the quorum returned", t.elapsed());
    for i in [0, 2] {
        assert_eq!(served_by(&m, i, &cookie1).0, m.clones.clone_ids[k1], "d{i} routes what d1 learned offline");
    }

    // d2 cut off from the store (its routes to etcd black-holed) while clone k0 dies.
    for e in 0..3 {
        m.dispatchers[2].ns.ip(&[
            "route",
            "add",
            "blackhole",
            &format!("{}/32", dispatcher_testbed::cluster::etcd_ip(e)),
        ]);
    }
    m.wait_for("d2 sees the store unreachable", Duration::from_secs(10), || {
        m.status(2).cluster.unwrap().store == "unreachable"
    });
    m.tb.kill_servers_of(k0);
    m.clones.kill(k0);
    let name = format!("b{k0}");
    m.wait_for("d2 fails the dead clone over by its own checks", Duration::from_secs(3), || {
        backend_field(&m, 2, &name, |b| b.state.clone()) == "down"
    });
    let (clone, lost) = served_by(&m, 2, &cookie0);
    assert_eq!(clone, m.clones.clone_ids[k0 ^ 1], "the replica serves the session through d2");
    assert!(!lost);
    std::thread::sleep(Duration::from_millis(1000));
    let seen = load.finish();
    assert_clean(&m, &seen);
}

/// The shared health rule: a backend that most live dispatchers see down is out on all
/// of them, also on one whose own checks still reach it; one that only a minority sees
/// down stays in on the others (the minority, which cannot reach it, routes around it).
#[test]
fn the_majority_decides_a_backend_out_everywhere() {
    let mut m = Multi::new(3, 4);
    for i in 0..3 {
        m.start_dispatcher(i);
    }
    m.wait_for("three members", Duration::from_secs(5), || m.status(0).cluster.unwrap().members.len() == 3);
    let b2 = dispatcher_testbed::netns::backend_ip(2).to_string();
    let state = |m: &Multi, i: usize| backend_field(m, i, "b2", |b| b.state.clone());
    let health = |m: &Multi, i: usize| backend_field(m, i, "b2", |b| b.health.clone());
    // Only d0 loses its path to b2: a minority.
    m.dispatchers[0].ns.ip(&["route", "add", "blackhole", &format!("{b2}/32")]);
    m.wait_for("d0 sees b2 down", Duration::from_secs(3), || state(&m, 0) == "down");
    // d0's view reaches the others through the store (a fixed sleep here was too short on
    // a loaded machine); once it has, they must still keep b2 in.
    let differs =
        |m: &Multi, i: usize| m.status(i).cluster.unwrap().differing.iter().any(|d| d.starts_with("b2: down for d0"));
    m.wait_for("status says where views differ (d1, d2)", SHARE_BOUND, || differs(&m, 1) && differs(&m, 2));
    std::thread::sleep(Duration::from_millis(300));
    for i in [1, 2] {
        assert_eq!(state(&m, i), "up", "one of three is no majority (d{i})");
    }
    // d1 loses it too: now most see it down, and d2 takes it out although its own checks pass.
    m.dispatchers[1].ns.ip(&["route", "add", "blackhole", &format!("{b2}/32")]);
    let t = Instant::now();
    m.wait_for("b2 out on d2 by the majority", Duration::from_secs(3), || state(&m, 2) == "down");
    eprintln!("majority verdict reached d2 {:?} after d1's path went", t.elapsed());
    assert_eq!(health(&m, 2), "up", "d2's own checks still pass");
    let d = m.decision_maps(2);
    assert!(!d.rings[1].contains(&2), "b2 is out of d2's L4 ring");
    m.wait_for("the same decisions on all three", Duration::from_secs(3), || {
        let d0 = m.decision_maps(0);
        (1..3).all(|i| m.decision_maps(i) == d0)
    });
    // The paths come back: b2 returns everywhere.
    for i in [0, 1] {
        m.dispatchers[i].ns.ip(&["route", "del", "blackhole", &format!("{b2}/32")]);
    }
    m.wait_for("b2 back on all three", Duration::from_secs(5), || (0..3).all(|i| state(&m, i) == "up"));
}

/// Requests whose clone ID no dispatcher knows yet, waiting on d1, while d0 learns the IDs
/// (a browser's second connection, or ECMP, a moment after the first response): d1 waits
/// for the shared table (`[cluster] learn_wait`) and sends each to its owner, never
/// balances it.
#[test]
fn a_clone_id_learned_elsewhere_a_moment_ago_is_waited_for_not_balanced() {
    let mut m = Multi::new(2, 4);
    for i in 0..2 {
        m.start_dispatcher(i);
    }
    m.wait_for("two members", Duration::from_secs(5), || m.status(1).cluster.unwrap().members.len() == 2);
    let n = m.clones.clone_ids.len();
    // One request per clone through d1, all at once, each naming a clone nobody learned.
    let waiting: Vec<_> = (0..n)
        .map(|k| {
            let mut c = m.client(1);
            c.jar = Some(format!("0000waiting{k}:{}", m.clones.clone_ids[k]));
            std::thread::spawn(move || c.get("/app/again").map(|r| r.field("clone").unwrap_or("").to_string()))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    // Meanwhile d0 gives every clone a session (and learns its ID).
    let mut learned = Vec::new();
    for _ in 0..n {
        learned.push(new_session_on_unlearned_clone(&m, 0, &learned).0);
    }
    for (k, w) in waiting.into_iter().enumerate() {
        let clone = w.join().unwrap().expect("an answer");
        assert_eq!(clone, m.clones.clone_ids[k], "d1 balanced a session of clone {k} instead of waiting for its owner");
    }
    let metrics = ok(m.cmd(1, &["metrics"]));
    let waits = metrics.lines().find(|l| l.starts_with("dispatcher_learn_waits_total")).unwrap_or("").to_string();
    assert_eq!(waits, format!("dispatcher_learn_waits_total {n}"));
}
