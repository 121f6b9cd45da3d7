//! SIP VIPs end to end (needs root): SIPp calls through the XDP program to WebSphere-like
//! SIP containers in replica pairs; a container fails mid-call. The verdict is SIPp's
//! own statistics and the containers' logs: no failed call, no 481, no message to a
//! container that neither created the dialog nor holds its replica.

use std::time::{Duration, Instant};

use dispatcher_testbed::{
    netns::{Testbed, CLIENT_IP, CLIENT_IP6},
    sipcontainer::SipCluster,
    sipp,
    websphere::{self, Client},
};

const VIP: &str = "10.0.150.1";

/// `fall`: failed checks that take a container down (the first makes it suspect).
fn config(tb: &Testbed, fall: u32) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = {fall}\n\n{}\n[[vip]]\nname = \"sip\"\naddress = \"{VIP}\"\nport = 5060\nmode = \"sip\"\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    )
}

/// Starts SIPp's built-in UAC scenario in the client's namespace as testbed process
/// `tag`.
fn sipp(tb: &mut Testbed, calls: u32, rate: u32, pause_ms: u32, tag: &str) {
    let client = tb.client.clone();
    let target = format!("{VIP}:5060");
    sipp::start(
        tb,
        &sipp::Run { ns: &client, target: &target, local_ip: CLIENT_IP, calls, rate, pause_ms, scenario: None },
        tag,
    );
}

fn finish(tb: &mut Testbed, tag: &str) -> (std::process::ExitStatus, std::collections::HashMap<String, u64>) {
    sipp::finish(tb, tag, Duration::from_secs(100))
}

/// The agent learned every container's logical name from its health checks' answers.
fn wait_for_learned(tb: &Testbed, n: u64) {
    tb.wait_for_clone_table(n, Duration::from_secs(10));
}

/// `n` containers in replica pairs behind the SIP VIP (`fall`: as `config`), and a
/// dispatcher that has learned their logical names; its configuration file.
fn sip_bed(n: usize, fall: u32) -> (Testbed, std::sync::Arc<SipCluster>, std::path::PathBuf) {
    let mut tb = Testbed::new(n, &[VIP]);
    let sip = SipCluster::new(n);
    tb.start_sip(&sip, VIP, 5060);
    let path = tb.write_config(&config(&tb, fall));
    tb.start_dispatcher(&path);
    wait_for_learned(&tb, n as u64);
    (tb, sip, path)
}

#[test]
fn dialogs_survive_their_containers_death_and_never_reach_a_stranger() {
    let (mut tb, sip, path) = sip_bed(4, 2);

    // 150 calls of 3 s at 25 calls/s; container 0 dies while about 75 are up.
    sipp(&mut tb, 150, 25, 3000, "sipp-kill");
    std::thread::sleep(Duration::from_millis(3500));
    let on_b0 = sip.seen().iter().filter(|s| s.container == 0 && s.method == "INVITE").count();
    tb.kill_servers_of(0);
    let (status, c) = finish(&mut tb, "sipp-kill");
    eprintln!("SIPp: {c:?}; container 0 had taken {on_b0} INVITEs");

    assert!(on_b0 > 5, "container 0 owned dialogs when it died: {on_b0}");
    sip.assert_calls_kept(150, status, &c);
    assert!(sip.served_for_peer(1) > 0, "the replica took over container 0's dialogs");
    let dialogs_of_b0_elsewhere =
        sip.seen().iter().filter(|s| s.dialog_owner == Some(0) && s.container != 0 && s.container != 1).count();
    assert_eq!(dialogs_of_b0_elsewhere, 0);

    // The status says how messages were routed: initial requests by Call-ID, in-dialog
    // ones by the To tag's logical name; nothing invalid, no name unknown.
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", path.to_str().unwrap(), "--json"])).unwrap();
    let sip_counts = &st["vips"][0]["sip"];
    assert!(sip_counts["call_id"].as_u64().unwrap() >= 150, "{sip_counts}");
    assert!(sip_counts["to_tag"].as_u64().unwrap() >= 300, "ACK and BYE of each call: {sip_counts}");
    assert_eq!(sip_counts["invalid"], 0, "{sip_counts}");
    assert_eq!(sip_counts["unknown_ln"], 0, "{sip_counts}");
    let (_, metrics) = tb.admin("GET", "/metrics").expect("metrics");
    assert!(metrics.contains("dispatcher_sip_messages_total{vip=\"sip\",outcome=\"to_tag\"}"), "{metrics}");
    dispatcher_testbed::promtool_check(&metrics).expect("the metrics pass promtool");
}

#[test]
fn a_frozen_container_is_waited_for_then_its_replica_serves() {
    // Suspect for about 600 ms (four checks 200 ms apart): SIPp's retransmissions of the
    // messages the frozen container swallowed arrive in that window and are held.
    let (mut tb, sip, _) = sip_bed(2, 4);

    // Calls of 4 s; container 0 stops answering (as under SIGSTOP) for 3 s mid-call:
    // while it is suspect its messages are held (SIPp retransmits), then its replica
    // serves them.
    sipp(&mut tb, 60, 20, 4000, "sipp-freeze");
    std::thread::sleep(Duration::from_millis(2000));
    sip.freeze(0, true);
    std::thread::sleep(Duration::from_millis(3000));
    sip.freeze(0, false);
    let (status, c) = finish(&mut tb, "sipp-freeze");
    eprintln!("SIPp: {c:?}");
    sip.assert_calls_kept(60, status, &c);
    let (_, body) = tb.admin("GET", "/metrics").expect("metrics");
    let held: f64 = body
        .lines()
        .filter(|l| l.starts_with("dispatcher_xdp_events_total{") && l.contains("drop_sip_held"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(held > 0.0, "messages were held while the owner was suspect:\n{body}");
}

const HTTP_VIP: &str = "10.0.150.2";

/// A converged application: every backend runs a SIP container and an HTTP clone of the
/// same application server; its HTTP requests carry `ibmappid` naming a logical name.
/// When the owner of `ln0` dies, its SIP dialogs and its HTTP requests move to its
/// replica together, and neither reaches a third server.
#[test]
fn a_converged_applications_sip_and_http_fail_over_together() {
    let mut tb = Testbed::new(4, &[VIP, HTTP_VIP]);
    tb.add_local_vip(HTTP_VIP);
    let sip = SipCluster::new(4);
    tb.start_sip(&sip, VIP, 5060);
    let http = websphere::Clones::new(4);
    tb.start_websphere(&http, 8080);
    // Logical names configured (the health checks are HTTP's here).
    let backends = tb.backend_config_with(&[], |i| {
        format!("clone_ids = [\"clone{i}x\"]\nlogical_names = [\"{}\"]\n", SipCluster::logical_name(i))
    });
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nhold_time = \"3s\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 2\n\n{backends}\n[[vip]]\nname = \"sip\"\naddress = \"{VIP}\"\nport = 5060\nmode = \"sip\"\nring_size = 1009\n\n[[vip]]\nname = \"app\"\naddress = \"{HTTP_VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = 8080\n",
        tb.instance()
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);

    // HTTP: two clients of ln0's application sessions and one of ln2's, each request
    // with its ibmappid and no cookie (the ibmappid alone routes it).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let addr: std::net::SocketAddr = format!("{HTTP_VIP}:80").parse().unwrap();
    let clients: Vec<_> = [0usize, 0, 2]
        .into_iter()
        .enumerate()
        .map(|(k, ln)| {
            let (stop, ns) = (stop.clone(), tb.client.clone());
            std::thread::spawn(move || {
                let mut c = Client::new(&ns, addr);
                let mut answers = Vec::new();
                let deadline = Instant::now() + Duration::from_secs(60);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) && Instant::now() < deadline {
                    c.jar = None;
                    let r = c.get(&format!("/app/call;ibmappid=ln{ln}.1153242645968.{k}_2_2"));
                    let r = r.map(|r| (r.status, r.field("clone").unwrap_or("").to_string()));
                    if r.is_err() {
                        c.reconnect();
                    }
                    answers.push(r.map_err(|e| e.to_string()));
                    std::thread::sleep(Duration::from_millis(20));
                }
                (ln, answers)
            })
        })
        .collect();

    sipp(&mut tb, 100, 25, 3000, "sipp-converged");
    std::thread::sleep(Duration::from_millis(3000));
    tb.kill_servers_of(0);
    http.kill(0);
    let (status, c) = finish(&mut tb, "sipp-converged");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let answers: Vec<_> = clients.into_iter().map(|h| h.join().unwrap()).collect();
    eprintln!("SIPp: {c:?}");

    // SIP: every call completed, no 481, no stranger; the replica served ln0's dialogs.
    sip.assert_calls_kept(100, status, &c);
    assert!(sip.served_for_peer(1) > 0, "container 1 took over ln0's dialogs");

    // HTTP: ln0's requests went to b0, then to b1 (never elsewhere), ln2's stayed on b2;
    // a request that failed during the failover got an answer (5xx), none went astray.
    let app_misroutes = http.app_misroutes();
    assert!(app_misroutes.is_empty(), "{app_misroutes:?}");
    for (ln, a) in &answers {
        let served: Vec<&str> =
            a.iter().filter_map(|r| r.as_ref().ok()).filter(|r| r.0 == 200).map(|r| r.1.as_str()).collect();
        let failed: Vec<_> = a.iter().filter(|r| !matches!(r, Ok((200, _)))).collect();
        assert!(served.len() > 20, "ln{ln}: {} requests served: {a:?}", served.len());
        assert!(failed.iter().all(|r| matches!(r, Ok((s, _)) if *s >= 500)), "ln{ln}: {failed:?}");
        if *ln == 0 {
            assert_eq!(served.first(), Some(&"clone0x"), "ln0 starts on its owner");
            assert_eq!(served.last(), Some(&"clone1x"), "ln0 ends on its replica");
            let back = served.iter().skip_while(|c| **c == "clone0x").any(|c| *c != "clone1x");
            assert!(!back, "ln0: {served:?}");
        } else {
            assert!(served.iter().all(|c| *c == "clone2x"), "ln2 stays on b2: {served:?}");
        }
    }
}

#[test]
fn the_learned_logical_names_are_listed_apart_from_the_clone_table() {
    let (tb, _sip, path) = sip_bed(2, 2);
    let cfg = path.to_str().unwrap();
    let list = tb.dispatcher_cmd(&["clones", "--config", cfg, "--sip"]);
    assert!(list.starts_with("SIP logical-name table: 2 entries"), "{list}");
    for (i, replica) in [(0, "b1"), (1, "b0")] {
        let ln = SipCluster::logical_name(i);
        let row = list.lines().find(|l| l.starts_with(&format!("{ln} "))).unwrap_or_else(|| panic!("{ln}: {list}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cols[1..7], [format!("b{i}").as_str(), replica, "learned", "local", "(SIP", "check)"], "{list}");
    }
    let clones = tb.dispatcher_cmd(&["clones", "--config", cfg]);
    assert!(clones.starts_with("clone table: 0 entries"), "logical names are not clone IDs: {clones}");
}

const VIP6: &str = "fd99:150::1";

/// SIP messages larger than the MTU (issue 30): INVITEs with a 3 KB SDP offer, over IPv4
/// and IPv6 at once, leave the caller in IP fragments that XDP forwards, every fragment
/// to the container its first one went to; container 0 dies mid-call. Every call
/// completes, every container got its INVITEs whole, no in-dialog request reaches a
/// stranger.
#[test]
fn large_invites_in_ip_fragments_reach_their_containers_and_survive_a_death() {
    let mut tb = Testbed::new(4, &[VIP]);
    tb.add_ipv6(&[VIP6]);
    let sip = SipCluster::new(4);
    tb.start_sip(&sip, VIP, 5060);
    tb.start_sip_also_on(&sip, VIP6, 5060);
    let text = format!(
        "{}[[vip]]\nname = \"sip6\"\naddress = \"{VIP6}\"\nport = 5060\nmode = \"sip\"\nring_size = 1009\n",
        config(&tb, 2)
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    wait_for_learned(&tb, 4);

    let scenario = tb.workdir.join("uac-large-invite.xml");
    std::fs::write(&scenario, sipp::large_invite_scenario(3000)).unwrap();
    let client = tb.client.clone();
    let target6 = format!("[{VIP6}]:5060");
    let target4 = format!("{VIP}:5060");
    let runs = [("sipp-large4", target4.as_str(), CLIENT_IP), ("sipp-large6", target6.as_str(), CLIENT_IP6)];
    for (tag, target, local_ip) in runs {
        let run = sipp::Run {
            ns: &client,
            target,
            local_ip,
            calls: 100,
            rate: 20,
            pause_ms: 3000,
            scenario: Some(&scenario),
        };
        sipp::start(&mut tb, &run, tag);
    }
    std::thread::sleep(Duration::from_millis(3500));
    let on_b0 = sip.seen().iter().filter(|s| s.container == 0 && s.method == "INVITE").count();
    tb.kill_servers_of(0);
    let mut results = Vec::new();
    for (tag, _, _) in runs {
        let (status, c) = finish(&mut tb, tag);
        eprintln!("{tag}: {c:?}");
        results.push((status, c));
    }
    eprintln!("container 0 had taken {on_b0} INVITEs");
    assert!(on_b0 > 5, "container 0 owned dialogs when it died: {on_b0}");
    for (status, c) in &results {
        sip.assert_calls_kept(100, *status, c);
    }
    assert!(sip.served_for_peer(1) > 0, "the replica took over container 0's dialogs");

    // The containers' logs: every INVITE arrived whole (more than an MTU), 200 calls' worth.
    let invites: Vec<usize> = sip.seen().iter().filter(|s| s.method == "INVITE").map(|s| s.bytes).collect();
    assert!(invites.len() >= 200, "{} INVITEs", invites.len());
    assert!(invites.iter().all(|&b| b > 3000), "every INVITE reached its container whole: {invites:?}");

    // XDP forwarded them as fragments: a first fragment recorded per INVITE, its later
    // fragments followed it (two per INVITE at least, IPv4 and IPv6 alike).
    let st: serde_json::Value =
        serde_json::from_str(&tb.dispatcher_cmd(&["status", "--config", path.to_str().unwrap(), "--json"])).unwrap();
    let xdp = &st["xdp"];
    let (first, followed) = (xdp["frag_first"].as_u64().unwrap(), xdp["frag_followed"].as_u64().unwrap());
    assert!(first >= 200 && followed >= 2 * first, "{xdp}");
    for v in 0..2 {
        let frags = &st["vips"][v]["fragments"];
        assert!(frags["first"].as_u64().unwrap() >= 100, "{}: {frags}", st["vips"][v]["name"]);
    }
    // The records are in the map pinned with the others (what a restarted agent adopts).
    let pinned = aya::maps::MapData::from_pin(tb.pin_dir().join("FRAGS")).expect("FRAGS is pinned");
    let frags: aya::maps::HashMap<_, dispatcher_common::FragKey, dispatcher_common::FragValue> =
        aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(pinned)).expect("FRAGS type");
    assert!(frags.keys().flatten().count() >= 200, "the pinned FRAGS holds the INVITEs' records");
}

/// The sum of a metric family's samples whose line contains `filter` (`""`: all).
fn metric(tb: &Testbed, family: &str, filter: &str) -> f64 {
    let (_, body) = tb.admin("GET", "/metrics").expect("metrics");
    body.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Issue 30 part 3: containers that answer `OPTIONS` without naming their logical name
/// teach nothing through the checks; the dispatcher learns each name from the first
/// in-dialog request of a call (its To tag names it, its Call-ID is pinned to the
/// container that took the INVITE). The learned names then carry the dialogs across a
/// container's death to its replica, and the status says truthfully how each message
/// was routed.
#[test]
fn logical_names_are_learned_from_the_dialogs_when_the_containers_do_not_say_them() {
    let mut tb = Testbed::new(4, &[VIP]);
    let sip = SipCluster::new(4);
    sip.untagged_options.store(true, std::sync::atomic::Ordering::SeqCst);
    tb.start_sip(&sip, VIP, 5060);
    let path = tb.write_config(&config(&tb, 2));
    tb.start_dispatcher(&path);
    let cfg = path.to_str().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let list = tb.dispatcher_cmd(&["clones", "--config", cfg, "--sip"]);
    assert!(list.starts_with("SIP logical-name table: 0 entries"), "the checks name nothing: {list}");

    // A first round of calls: every container that took an INVITE gets its name learned
    // from the ACK and BYE that follow.
    sipp(&mut tb, 40, 20, 500, "sipp-learn");
    let (status, c) = finish(&mut tb, "sipp-learn");
    sip.assert_calls_kept(40, status, &c);
    let took: std::collections::BTreeSet<usize> =
        sip.seen().iter().filter(|s| s.method == "INVITE").map(|s| s.container).collect();
    assert_eq!(took.len(), 4, "the ring spread 40 calls over the 4 containers: {took:?}");
    tb.wait_for_clone_table(4, Duration::from_secs(5));
    let list = tb.dispatcher_cmd(&["clones", "--config", cfg, "--sip"]);
    for i in 0..4 {
        let ln = SipCluster::logical_name(i);
        let row = list.lines().find(|l| l.starts_with(&format!("{ln} "))).unwrap_or_else(|| panic!("{ln}: {list}"));
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols[1..7],
            [format!("b{i}").as_str(), &format!("b{}", i ^ 1), "learned", "local", "(SIP", "dialog)"],
            "{list}"
        );
    }
    let by = |tb: &Testbed, what: &str| metric(tb, "dispatcher_sip_routed_total", &format!("by=\"{what}\""));
    let (ring, pin) = (by(&tb, "ring"), by(&tb, "pin"));
    assert!(ring >= 40.0, "every INVITE placed on the ring: {ring}");
    assert!(pin > 0.0, "the first in-dialog requests went by their pin: {pin}");
    assert!(metric(&tb, "dispatcher_xdp_events_total", "sip_learn_reported") >= 4.0);
    assert_eq!(metric(&tb, "dispatcher_sip_learn_reports_refused_total", ""), 0.0);

    // Calls with the names known: in-dialog requests go by name; container 0 dies
    // mid-call and its dialogs finish on its replica.
    sipp(&mut tb, 100, 25, 3000, "sipp-kill");
    std::thread::sleep(Duration::from_millis(3500));
    tb.kill_servers_of(0);
    let (status, c) = finish(&mut tb, "sipp-kill");
    eprintln!("SIPp: {c:?}");
    sip.assert_calls_kept(100, status, &c);
    assert!(sip.served_for_peer(1) > 0, "the replica took over container 0's dialogs");
    let ln = by(&tb, "ln");
    assert!(ln >= 150.0, "in-dialog requests went by their learned names: {ln}");
    assert_eq!(metric(&tb, "dispatcher_sip_messages_total", "outcome=\"unknown_ln\""), 0.0);
}

/// Issue 30 part 4: a container whose `OPTIONS` answers stop coming in time while it
/// answers calls (callers keep acknowledging its answers) is not made suspect — no
/// message of it dropped, no state change; once the calls stop, the same silence takes it
/// out as before.
#[test]
fn a_container_answering_calls_is_not_suspect_when_its_checks_time_out() {
    let (mut tb, sip, _) = sip_bed(2, 2);
    let transitions = |tb: &Testbed| metric(tb, "dispatcher_state_transitions_total", "");
    let before = transitions(&tb);
    sipp(&mut tb, 120, 40, 500, "sipp-busy");
    std::thread::sleep(Duration::from_millis(700));
    sip.mute_options(0, true);
    std::thread::sleep(Duration::from_millis(2000));
    sip.mute_options(0, false);
    let (status, c) = finish(&mut tb, "sipp-busy");
    sip.assert_calls_kept(120, status, &c);
    let excused = metric(&tb, "dispatcher_sip_check_failures_excused_total", "");
    assert!(excused >= 3.0, "about ten checks timed out while ACKs flowed: {excused} excused");
    assert_eq!(transitions(&tb), before, "no state change while the container answered calls");
    assert_eq!(metric(&tb, "dispatcher_xdp_events_total", "drop_sip_held"), 0.0, "nothing held");

    // No calls: silence is silence.
    sip.mute_options(0, true);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let st: serde_json::Value =
            serde_json::from_str(&tb.admin("GET", "/status").expect("status").1).expect("status JSON");
        if st["backends"][0]["health"] == "down" {
            break;
        }
        assert!(Instant::now() < deadline, "a silent container with no calls goes down: {}", st["backends"][0]);
        std::thread::sleep(Duration::from_millis(100));
    }
}
