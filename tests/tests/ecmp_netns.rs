//! Dispatchers behind a router with BIRD and ECMP: joins, graceful leaves, a killed agent
//! and a dead host under steady load of keep-alive HTTP clients with sessions and
//! long-lived L4 TCP flows (needs root; real etcd and BIRD).

use std::time::{Duration, Instant};

use dispatcher_testbed::{
    cluster::dispatcher_ip,
    ecmp::{ms, Ecmp, Load},
};

const HTTP_CONNS: usize = 24;
/// Clients that open a new connection for every request: new connections at every moment
/// of a death.
const NEW_CONNS: usize = 6;
const L4_FLOWS: usize = 6;
const PACE: Duration = Duration::from_millis(25);

fn no_misroutes_or_lost_sessions(e: &Ecmp) {
    let misroutes = e.m.clones.misroutes();
    assert!(misroutes.is_empty(), "requests to a non-owner: {misroutes:?}");
    let lost = e.m.clones.hits().iter().filter(|h| h.lost).count();
    assert_eq!(lost, 0, "sessions lost");
}

/// When dispatcher `i`'s current ownership table was installed, as an offset from `t`
/// (from its own `status`, not from when a poll saw it).
fn table_changed_after(e: &Ecmp, i: usize, t: Instant) -> Duration {
    let ago = e.m.status(i).steering.and_then(|s| s.changed_s_ago).expect("a table");
    (Instant::now() - Duration::from_secs_f64(ago)).saturating_duration_since(t)
}

/// The target of issue 31 part 2: a new connection that begins later than this after a
/// dispatcher's death does not fail (the router's BFD takes 0.5 s; the survivors' peer
/// heartbeats take it out of their tables within about as long).
const NO_FAILURE_AFTER: Duration = Duration::from_secs(1);

#[test]
fn steering_keeps_connections_through_joins_leaves_and_deaths() {
    let mut e = Ecmp::new(4, 4, true);
    e.up(3);
    let load = Load::start_with_new(&e.clients, HTTP_CONNS, NEW_CONNS, L4_FLOWS, PACE);
    let warm = load.during(Duration::from_secs(2));
    assert!(warm.requests > 100 && warm.failed == 0, "warm-up: {warm:?} {:?}", load.take_errors());

    // A 4th dispatcher joins.
    let before = load.snapshot();
    let t = Instant::now();
    e.start(3);
    e.wait_next_hops(&[0, 1, 2, 3], Duration::from_secs(20));
    for i in 0..4 {
        e.wait_table(i, &["d0", "d1", "d2", "d3"], Duration::from_secs(10));
    }
    eprintln!("join: routed and steered by all after {} ms", ms(t));
    std::thread::sleep(Duration::from_secs(3));
    let join = load.snapshot() - before;
    eprintln!("join: {join:?}");
    for i in 0..4 {
        eprintln!("d{i}: {:?}", e.m.status(i).steering);
    }
    assert_eq!((join.broken, join.failed, join.l4_broken), (0, 0, 0), "join: {:?}", load.take_errors());
    assert!(join.requests > 200, "the load ran: {join:?}");
    let st = e.m.status(3).steering.unwrap();
    assert!(st.active && st.joined);
    assert!(st.steered + e.m.status(0).steering.unwrap().steered > 0, "packets were steered");
    let text = String::from_utf8_lossy(&e.m.cmd(3, &["status"]).stdout).into_owned();
    assert!(
        text.contains("steering: joined; table generation") && text.contains("announced: yes"),
        "status shows the steering and the announcements:\n{text}"
    );

    // The steering metrics are valid exposition (promtool).
    let metrics = String::from_utf8_lossy(&e.m.cmd(0, &["metrics"]).stdout).into_owned();
    assert!(metrics.contains("dispatcher_steering_dispatchers 4") && metrics.contains("dispatcher_announced 1"));
    if let Err(said) = dispatcher_testbed::promtool_check(&metrics) {
        panic!("promtool check metrics: {said}");
    }

    // d0 leaves and joins again at once: two membership changes in a row (the table
    // before the previous one serves too).
    let before = load.snapshot();
    for (verb, names) in [("leave", &["d1", "d2", "d3"][..]), ("join", &["d0", "d1", "d2", "d3"][..])] {
        let out = e.m.cmd(0, &[verb]);
        assert!(out.status.success(), "{verb}: {}", String::from_utf8_lossy(&out.stderr));
        for i in 0..4 {
            e.wait_table(i, names, Duration::from_secs(10));
        }
    }
    e.wait_next_hops(&[0, 1, 2, 3], Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(2));
    let flap = load.snapshot() - before;
    eprintln!("d0 left and joined again: {flap:?}");
    assert_eq!((flap.broken, flap.failed), (0, 0), "leave + join: {:?}", load.take_errors());

    // d1 leaves gracefully: withdrawn, out of the table, connections closed after their
    // next response; then stopped.
    let before = load.snapshot();
    let out = e.m.cmd(1, &["leave", "--wait", "10"]);
    assert!(out.status.success(), "leave: {}", String::from_utf8_lossy(&out.stdout));
    e.wait_next_hops(&[0, 2, 3], Duration::from_secs(5));
    e.m.stop_dispatcher(1);
    for i in [0, 2, 3] {
        e.wait_table(i, &["d0", "d2", "d3"], Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_secs(2));
    let leave = load.snapshot() - before;
    eprintln!("leave: {leave:?}");
    assert_eq!((leave.broken, leave.failed, leave.l4_broken), (0, 0, 0), "leave: {:?}", load.take_errors());

    // d2's agent is killed: its HTTP VIP is withdrawn within a bound (the TUN device goes
    // with the process; BIRD follows the interface at once). L4 flows go on.
    let held = e.held(2);
    let before = load.snapshot();
    let t = Instant::now();
    e.m.kill_dispatcher(2);
    // Its last beacon was written before this.
    let killed = Instant::now();
    // The bound: BIRD withdraws at the interface event; the router has it within BGP's
    // update delay. 2 s is generous; the measured time is printed.
    let withdrawn =
        e.m.wait_for("d2's HTTP VIP withdrawn", Duration::from_secs(2), || !e.next_hops().contains(&dispatcher_ip(2)));
    eprintln!("agent killed: HTTP VIP withdrawn after {} ms", withdrawn.as_millis());
    // The survivors stop hearing its heartbeats and take it out of their tables together
    // (before, only when its lease expired: lease_ttl, 5 s here).
    let mut kill_changed = Duration::ZERO;
    for i in [0, 3] {
        e.wait_table(i, &["d0", "d3"], Duration::from_secs(10));
        let changed = table_changed_after(&e, i, killed);
        eprintln!("agent killed: d{i}'s table without d2 {} ms after the kill", changed.as_millis());
        kill_changed = kill_changed.max(changed);
    }
    assert!(kill_changed < NO_FAILURE_AFTER, "the killed agent's host left the tables {kill_changed:?} after the kill");
    std::thread::sleep(Duration::from_secs(2));
    let kill = load.snapshot() - before;
    let errors = load.take_errors();
    eprintln!("agent killed ({} ms, {held} client connections on it): {kill:?} errors {errors:?}", ms(t));
    assert_eq!(kill.l4_broken, 0, "L4 flows across a killed agent: {errors:?}\n{}", e.state_changes());
    // Its own connections break, nobody else's. New connections steered to it are refused
    // until its XDP program takes the agent for gone (no beacon for STEER_AGENT_STALE_NS),
    // never after: attempts that began later find a live owner.
    assert!(
        kill.broken <= held + kill.refused,
        "{held} connections on the killed agent, {} broken, {} of them refused: {errors:?}",
        kill.broken,
        kill.refused
    );
    let stale = Duration::from_nanos(dispatcher_common::STEER_AGENT_STALE_NS);
    let refused: Vec<u128> = load.refused_after(killed).iter().map(|d| d.as_millis()).collect();
    eprintln!("refused attempts began {refused:?} ms after the kill (the beacon goes stale within {stale:?})");
    assert!(
        refused.iter().all(|ms| *ms <= stale.as_millis() + 100),
        "attempts refused that began after the beacon went stale: {refused:?} ms after the kill; {errors:?}"
    );
    // Nor after the others took it out of their tables: no SYN is steered to it then.
    assert!(
        refused.iter().all(|ms| *ms <= (kill_changed + Duration::from_millis(100)).as_millis()),
        "attempts refused that began after the tables changed ({kill_changed:?}): {refused:?} ms after the kill"
    );

    // d2's agent starts again (its BIRD never stopped): three dispatchers for the death.
    e.m.start_dispatcher(2);
    e.wait_next_hops(&[0, 2, 3], Duration::from_secs(20));
    for i in [0, 2, 3] {
        e.wait_table(i, &["d0", "d2", "d3"], Duration::from_secs(10));
    }
    std::thread::sleep(Duration::from_secs(1));

    // d3's host dies (its link goes down): only connections it terminated break; clients
    // reconnect and keep their sessions. The survivors stop steering to it once most of
    // them miss its heartbeats: no new connection fails that begins later than
    // NO_FAILURE_AFTER after the death.
    // A SYN steered to the dead host is a failed connection, not one its retransmission
    // after 1 s saves.
    load.set_new_connect_timeout(Duration::from_millis(900));
    let held = e.held(3);
    let before = load.snapshot();
    let died = Instant::now();
    e.cut_host(3);
    let routed = e.wait_next_hops(&[0, 2], Duration::from_secs(5));
    eprintln!("host died: the router dropped it after {} ms", routed.as_millis());
    let mut changed = Vec::new();
    for i in [0, 2] {
        e.wait_table(i, &["d0", "d2"], Duration::from_secs(10));
        changed.push(table_changed_after(&e, i, died));
    }
    eprintln!("host died: d0's and d2's tables without d3 after {changed:?}");
    assert!(
        changed.iter().all(|c| *c < NO_FAILURE_AFTER),
        "the survivors' tables dropped the dead host {changed:?} after its death"
    );
    // Before d3's lease expires: status says who cannot reach whom and why d3 is out.
    let said = String::from_utf8_lossy(&e.m.cmd(0, &["status"]).stdout).into_owned();
    let said: Vec<&str> = said
        .lines()
        .filter(|l| {
            l.contains("dispatchers (") || l.contains("heartbeats") || l.contains("out of") || l.contains("change")
        })
        .collect();
    eprintln!("host died: d0's status:\n{}", said.join("\n"));
    let served_all = load.wait_recovered(before, Duration::from_secs(15));
    let death = load.snapshot() - before;
    eprintln!("host died ({held} client connections on it): {death:?} errors {:?}", load.take_errors());
    assert!(served_all, "every client is served again after the host died: {death:?}");
    assert_eq!(death.l4_broken, 0, "L4 flows do not terminate on a dispatcher\n{}", e.state_changes());
    let after = load.during(Duration::from_secs(2));
    assert!(after.failed == 0 && after.requests > 100, "after the death, all served by d0 and d2: {after:?}");
    // Every failed attempt of a new connection has been counted by now (the connect
    // timeout is 3 s).
    let failed: Vec<u128> = load.failed_new_after(died).iter().map(|d| d.as_millis()).collect();
    eprintln!("host died: {} new connections failed, begun {failed:?} ms after the death", failed.len());
    assert!(
        failed.iter().all(|ms| *ms <= NO_FAILURE_AFTER.as_millis()),
        "new connections that began more than {NO_FAILURE_AFTER:?} after the death failed: {failed:?} ms after it; tables changed after {changed:?}"
    );
    assert!(
        said.iter().any(|l| l.contains("out of the ownership table: d3 (unreachable for d0,d2)"))
            && said.iter().any(|l| l.contains("d3 UNREACHABLE"))
            && said.iter().any(|l| l.contains("last change: -d3")),
        "{said:?}"
    );
    // Besides those, only the connections the dead host held break.
    assert!(
        death.broken <= held + failed.len() as u64,
        "only the dead host's connections break ({held}, and {} new ones in the first second): {death:?}",
        failed.len()
    );
    let total = load.stop();
    eprintln!("total: {total:?}");
    // The backend set never changed: an L4 flow got the same backend from whichever
    // dispatcher ECMP sent it to (Maglev, the same everywhere).
    assert_eq!((total.l4_switched, total.udp_switched), (0, 0), "{total:?}");
    assert!(total.udp_answers > 100, "the UDP flows ran: {total:?}");
    no_misroutes_or_lost_sessions(&e);
}

/// The same join and leave with plain ECMP (steering off): connections break when the
/// router's next-hop set changes. What steering saves.
#[test]
fn plain_ecmp_breaks_connections_when_the_next_hops_change() {
    let mut e = Ecmp::new(4, 4, false);
    e.up(3);
    let load = Load::start(&e.clients, HTTP_CONNS, L4_FLOWS, PACE);
    let warm = load.during(Duration::from_secs(2));
    assert!(warm.requests > 100 && warm.failed == 0, "warm-up: {warm:?} {:?}", load.take_errors());
    assert!(e.m.status(0).steering.is_none(), "steering off");

    let before = load.snapshot();
    e.start(3);
    e.wait_next_hops(&[0, 1, 2, 3], Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(3));
    let join = load.snapshot() - before;
    eprintln!("plain ECMP, join: {join:?}");
    load.take_errors();

    let before = load.snapshot();
    // Without steering the connections d1 terminated cannot finish there: their packets
    // go to the others once the route is withdrawn. No waiting for them.
    let out = e.m.cmd(1, &["leave"]);
    assert!(out.status.success(), "leave: {}", String::from_utf8_lossy(&out.stdout));
    e.wait_next_hops(&[0, 2, 3], Duration::from_secs(5));
    e.m.stop_dispatcher(1);
    std::thread::sleep(Duration::from_secs(2));
    let leave = load.snapshot() - before;
    eprintln!("plain ECMP, leave: {leave:?}");
    let total = load.stop();
    // Hash-threshold ECMP moves about half the flows when a 4th next hop comes; each
    // moved connection lands on a dispatcher without its socket and is reset.
    assert!(join.broken > 0, "a join without steering broke nothing? {join:?}");
    // L4 flows are not hurt either way: Maglev picks the same backend on every dispatcher.
    assert_eq!(
        (total.l4_broken, total.l4_switched, total.udp_switched),
        (0, 0, 0),
        "{total:?}\nbackend state changes:\n{}",
        e.state_changes()
    );
    no_misroutes_or_lost_sessions(&e);
}

/// A dispatcher that starts while the store is down has no membership to build its
/// ownership table from: it announces nothing (the router would bring it connections it
/// cannot steer) until the store is back, then joins by itself.
#[test]
fn a_dispatcher_started_without_the_store_joins_only_once_it_is_back() {
    let mut e = Ecmp::new(3, 4, true);
    e.up(2);
    for k in 0..3 {
        e.m.kill_etcd(k);
    }
    e.start(2);
    std::thread::sleep(Duration::from_secs(2));
    let st = e.m.status(2);
    assert_eq!(st.announced, Some(false), "announced without a table");
    assert!(!st.steering.unwrap().joined);
    let mut two = vec![dispatcher_ip(0), dispatcher_ip(1)];
    two.sort();
    assert_eq!(e.next_hops(), two, "the router must not route to it");
    for k in 0..3 {
        e.m.start_etcd(k);
    }
    e.m.wait_etcd_healthy(3);
    let t = Instant::now();
    e.wait_next_hops(&[0, 1, 2], Duration::from_secs(20));
    for i in 0..3 {
        e.wait_table(i, &["d0", "d1", "d2"], Duration::from_secs(15));
    }
    eprintln!("joined {} ms after the store was back", ms(t));
    assert_eq!(e.m.status(2).announced, Some(true));

    // d0's BIRD freezes past BFD's detection time (as on a starved host): the router drops
    // the session and its route, and takes d0 back within seconds once BIRD runs again
    // (BIRD's default error wait would refuse it for a minute).
    let bird = nix::unistd::Pid::from_raw(e.m.tb.pid_of("bird-d0").expect("d0's BIRD") as i32);
    nix::sys::signal::kill(bird, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let dropped =
        e.m.wait_for("d0 dropped by the router", Duration::from_secs(5), || !e.next_hops().contains(&dispatcher_ip(0)));
    std::thread::sleep(Duration::from_millis(500));
    nix::sys::signal::kill(bird, nix::sys::signal::Signal::SIGCONT).unwrap();
    let t = Instant::now();
    e.wait_next_hops(&[0, 1, 2], Duration::from_secs(15));
    eprintln!(
        "d0's BIRD frozen: dropped after {} ms, routed again {} ms after it ran again",
        dropped.as_millis(),
        ms(t)
    );
}

/// Staging (issue 31): a dispatcher started with `--stay-out` serves but is neither routed
/// to nor in anybody's ownership table until `dispatcher join`; an operator's `leave`
/// outlives a restart of the agent until `join`.
#[test]
fn a_staged_or_left_dispatcher_stays_out_until_it_joins() {
    let mut e = Ecmp::new(3, 4, true);
    e.up(2);
    e.m.start_dispatcher_with(2, &["--stay-out"]);
    e.start_bird(2);
    std::thread::sleep(Duration::from_secs(3));
    e.wait_next_hops(&[0, 1], Duration::from_secs(1));
    let st = e.m.status(2);
    assert_eq!(st.announced, Some(false), "a staged dispatcher announces nothing");
    assert!(!st.steering.unwrap().joined);
    for i in 0..2 {
        e.wait_table(i, &["d0", "d1"], Duration::from_secs(1));
    }
    assert!(e.m.log(2).contains("staying out of the group (started with --stay-out)"), "{}", e.m.log(2));
    let out = e.m.cmd(2, &["join"]);
    assert!(out.status.success(), "join: {}", String::from_utf8_lossy(&out.stderr));
    e.wait_next_hops(&[0, 1, 2], Duration::from_secs(20));
    for i in 0..3 {
        e.wait_table(i, &["d0", "d1", "d2"], Duration::from_secs(10));
    }

    // d1 leaves, and its agent restarts: it stays out until it is told to join.
    let out = e.m.cmd(1, &["leave"]);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() && said.contains("stays out across a restart"), "leave: {said}");
    e.wait_next_hops(&[0, 2], Duration::from_secs(5));
    e.m.stop_dispatcher(1);
    e.m.start_dispatcher(1);
    std::thread::sleep(Duration::from_secs(3));
    e.wait_next_hops(&[0, 2], Duration::from_secs(1));
    assert_eq!(e.m.status(1).announced, Some(false), "restarted after a leave: still out");
    for i in [0, 2] {
        e.wait_table(i, &["d0", "d2"], Duration::from_secs(1));
    }
    assert!(e.m.log(1).contains("staying out of the group (an operator's `dispatcher leave`"), "{}", e.m.log(1));
    let out = e.m.cmd(1, &["join"]);
    assert!(out.status.success(), "join: {}", String::from_utf8_lossy(&out.stderr));
    e.wait_next_hops(&[0, 1, 2], Duration::from_secs(20));
    for i in 0..3 {
        e.wait_table(i, &["d0", "d1", "d2"], Duration::from_secs(10));
    }
    // Joined, the mark is gone: the next restart joins by itself.
    e.m.stop_dispatcher(1);
    e.m.start_dispatcher(1);
    e.wait_next_hops(&[0, 1, 2], Duration::from_secs(20));
}

/// Keep-alive clients whose requests take 0.8 s (`/slow/800`, within the testbed's 1 s
/// server timeout): busy most of the time, so busy when a host dies.
struct SlowClients {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    broken: std::sync::Arc<std::sync::Mutex<Vec<(Instant, String)>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SlowClients {
    fn start(e: &Ecmp, n: usize) -> SlowClients {
        use std::sync::{atomic::AtomicBool, Arc, Mutex};
        let stop = Arc::new(AtomicBool::new(false));
        let broken = Arc::new(Mutex::new(Vec::new()));
        let vip: std::net::SocketAddr = format!("{}:80", dispatcher_testbed::cluster::VIP).parse().unwrap();
        let threads = (0..n)
            .map(|i| {
                let (stop, broken, ns) = (stop.clone(), broken.clone(), e.clients.clone());
                std::thread::spawn(move || {
                    let src = dispatcher_testbed::ecmp::CLIENT_IPS[i % 3].parse().unwrap();
                    let mut c = dispatcher_testbed::websphere::Client::new(&ns, vip).bound_to(src);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Err(err) = c.get("/slow/800") {
                            broken.lock().unwrap().push((Instant::now(), err.to_string()));
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
            })
            .collect();
        SlowClients { stop, broken, threads }
    }

    /// Stops them (each finishes its request); what broke, and when.
    fn stop(mut self) -> Vec<(Instant, String)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        std::mem::take(&mut *self.broken.lock().unwrap())
    }
}

/// Slow clients beside the 300 (`SlowClients`).
const SLOW: usize = 12;

/// A busy connection of a dead dispatcher is reset within this of the death: the router's
/// BFD (0.5 s), the survivors' tables (about as long), the probes (then, and 0.3, 1 and
/// 2 s later) and their answers.
const RESET_WITHIN: Duration = Duration::from_secs(3);

/// A connection counts as quiet at the batch after its request ended: up to two batch
/// intervals (10 ms each), and a little for the datagram.
const JUST_SERVED: Duration = Duration::from_millis(30);

/// Issue 31 part 1: a dispatcher's host dies under 300 keep-alive clients with sessions.
/// The connections it held that were idle at the death go on, on the dispatcher that
/// takes their slots: their records (handshake options) had gone there over the peer
/// channel, the XDP program there reports the client's next segment, the agent rebuilds
/// the socket with `TCP_REPAIR` and serves the request (target: at least 95% of them).
#[test]
fn idle_connections_of_a_dead_dispatcher_go_on_on_its_successor() {
    const CLIENTS: usize = 300;
    let mut e = Ecmp::new(3, 4, true);
    e.up(3);
    // Each client asks every 700 ms: nearly all of them are idle at any moment.
    let load = Load::start(&e.clients, CLIENTS, 0, Duration::from_millis(700));
    // And a few whose requests take 0.8 s: busy at the death, wherever they are.
    let slow = SlowClients::start(&e, SLOW);
    let warm = load.during(Duration::from_secs(4));
    assert!(warm.requests > CLIENTS as u64 && warm.failed == 0, "warm-up: {warm:?} {:?}", load.take_errors());
    let held = e.held(2);
    assert!(held > CLIENTS as u64 / 6, "d2 holds a share of the clients: {held}");
    // d2's connections are registered there and their records are with d0 and d1.
    let takeover =
        |e: &Ecmp, i: usize| e.m.status(i).steering.and_then(|s| s.takeover).expect("takeover on by default");
    let sent = takeover(&e, 2);
    let with_others = takeover(&e, 0).held + takeover(&e, 1).held;
    eprintln!("before the death: d2 holds {held}, registered {}, records sent {} ({} bytes); d0+d1 hold {with_others} of its records", sent.tracked, sent.records_sent, sent.bytes_sent);
    assert!(sent.tracked >= held && with_others >= held, "d2's records went to d0 and d1: {sent:?}, {with_others}");

    let before = load.snapshot();
    // Clients answered just before the death: their connections count as busy until the
    // batch after next (their next request may have been on its way) and are reset, a
    // limit docs/cluster.md states; they are not counted against the idle ones below.
    let just_served = load.served_within(JUST_SERVED);
    let died = Instant::now();
    e.cut_host(2);
    // Requests in progress at the death, on any dispatcher (as the clients see it).
    let in_flight = load.counts.in_flight.load(std::sync::atomic::Ordering::Relaxed);
    e.wait_next_hops(&[0, 1], Duration::from_secs(5));
    for i in [0, 1] {
        e.wait_table(i, &["d0", "d1"], Duration::from_secs(10));
    }
    eprintln!("host died: the tables dropped d2 after {} ms; {in_flight} requests were in progress", ms(died));
    // Every client served again since the death (each asks every 700 ms; a segment the
    // dead host would have taken is retransmitted until the survivors' tables change).
    let t = Instant::now();
    let served_all = loop {
        std::thread::sleep(Duration::from_millis(200));
        if t.elapsed() > Duration::from_secs(2) && load.idle_clients(died.elapsed()) == 0 {
            break true;
        }
        if t.elapsed() > Duration::from_secs(15) {
            break false;
        }
    };
    eprintln!("every client served again {} ms after the death", ms(died));
    let death = load.snapshot() - before;
    let (t0, t1) = (takeover(&e, 0), takeover(&e, 1));
    let rebuilt = t0.rebuilt + t1.rebuilt;
    let errors = load.take_errors();
    eprintln!(
        "host died ({held} client connections on it): {death:?}; taken over: {rebuilt} rebuilt, {} reset ({} probed), {} failed, {} segments reported, {} waited, {} implausible, {} reports refused; errors {errors:?}",
        t0.reset + t1.reset,
        t0.probed + t1.probed,
        t0.failed + t1.failed,
        t0.segments_reported + t1.segments_reported,
        t0.waited + t1.waited,
        t0.implausible + t1.implausible,
        t0.reports_refused + t1.reports_refused,
    );
    // Nothing on the survivors panicked while taking over.
    for i in [0, 1] {
        let log = e.m.log(i);
        let panics: Vec<&str> = log.lines().filter(|l| l.contains("panicked")).collect();
        assert!(panics.is_empty(), "d{i}: {panics:?}");
    }
    // A connection with a request in progress at the death is reset at once (its client
    // made to speak), not left to its 10 s read timeout.
    assert!(
        errors.iter().all(|e| e.contains("reset by peer")),
        "every broken connection was reset, none timed out: {errors:?}"
    );
    let broken_at: Vec<u128> = load.broken_after(died).iter().map(|d| d.as_millis()).collect();
    eprintln!("host died: connections broken {broken_at:?} ms after the death");
    assert!(
        broken_at.iter().all(|ms| *ms < RESET_WITHIN.as_millis()),
        "the busy connections were reset within {RESET_WITHIN:?} of the death: {broken_at:?} ms"
    );
    assert!(served_all, "every client is served again after the host died: {death:?}");
    // Of the connections idle at the death (all but those with a request in progress,
    // wherever they were, and the slow clients'), at least 95% go on.
    let idle = held.saturating_sub(in_flight + SLOW as u64);
    let client_of =
        |e: &String| e.strip_prefix("client ").and_then(|r| r.split(':').next()).and_then(|n| n.parse().ok());
    let after_a_late_answer =
        errors.iter().filter(|e| client_of(e).is_some_and(|n: usize| just_served.contains(&n))).count();
    eprintln!(
        "{} clients answered within {JUST_SERVED:?} before the death; {after_a_late_answer} of the broken among them",
        just_served.len()
    );
    assert!(
        death.broken.saturating_sub(in_flight + after_a_late_answer as u64) * 20 <= idle,
        "at least 95% of the dead host's {idle} idle connections go on: {} broke ({in_flight} requests in progress at the death, {after_a_late_answer} answered within {JUST_SERVED:?} of it)",
        death.broken
    );
    assert!(rebuilt * 20 >= idle * 19, "the survivors rebuilt the dead host's idle connections: {rebuilt} of {idle}");
    let why: Vec<String> = [0, 1]
        .iter()
        .flat_map(|&i| e.m.log(i).lines().filter(|l| l.contains("rebuilding")).map(String::from).collect::<Vec<_>>())
        .collect();
    assert_eq!(t0.failed + t1.failed, 0, "no rebuild failed: {why:?}");
    // Their next requests came with the XDP program's reports and were given to the
    // rebuilt sockets: no retransmission timeout (all but a few, whose report found the
    // ring full or whose segment was retransmitted before the report was read).
    let given = t0.given + t1.given;
    eprintln!("rebuilt with the client's segment: {given} of {rebuilt}");
    assert!(given * 20 >= rebuilt * 19, "the rebuilt sockets were given the client's segment: {given} of {rebuilt}");
    let after = load.during(Duration::from_secs(2));
    assert!(after.failed == 0 && after.requests > CLIENTS as u64, "after the death, all served: {after:?}");
    // The slow requests in progress on the dead host: reset within RESET_WITHIN (their
    // clients were made to speak), not left to the 10 s read timeout.
    let slow_broken = slow.stop();
    let late: Vec<_> = slow_broken.iter().filter(|(at, _)| *at > died && *at - died >= RESET_WITHIN).collect();
    eprintln!(
        "slow requests broken: {:?}",
        slow_broken
            .iter()
            .map(|(at, e)| (at.saturating_duration_since(died).as_millis(), e.as_str()))
            .collect::<Vec<_>>()
    );
    assert!(!slow_broken.is_empty(), "some slow requests were on the dead host");
    // All but one at most: in two CI runs (machine loaded by the whole suite) one busy
    // connection of eight was probed four times and never answered within reach of its
    // successor, and waited for its read timeout; the cause is not found (docs/cluster.md,
    // issue 31's note).
    let timed_out = slow_broken.iter().filter(|(_, e)| !e.contains("reset by peer")).count();
    assert!(
        late.len() <= 1 && timed_out <= 1 && slow_broken.len() > timed_out,
        "busy connections reset within {RESET_WITHIN:?} of the death: {slow_broken:?}"
    );

    // A graceful stop is not a death: d1 tells d0 to forget its records before its lease
    // goes, and d0 takes none of its connections over (they drain on d1).
    let held_by_d0 = takeover(&e, 0).held;
    assert!(held_by_d0 > 0, "d0 holds d1's records before the stop");
    e.m.stop_dispatcher(1);
    e.wait_table(0, &["d0"], Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(1));
    let t0_after = takeover(&e, 0);
    eprintln!("d1 stopped: d0 held {held_by_d0} of its records, now {}; armed {}", t0_after.held, t0_after.armed);
    assert_eq!(
        (t0_after.held, t0_after.armed),
        (0, t0.armed),
        "a stopping dispatcher's records are forgotten, not armed"
    );
    assert_eq!(t0_after.reset, t0.reset, "nothing of d1 reset by d0");
    load.stop();
    no_misroutes_or_lost_sessions(&e);
}
