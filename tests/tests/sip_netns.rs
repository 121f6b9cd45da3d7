//! SIP VIPs end to end (needs root): SIPp calls through the XDP program to WebSphere-like
//! SIP containers in replica pairs; a container fails mid-call. The verdict is SIPp's
//! own statistics and the containers' logs: no failed call, no 481, no message to a
//! container that neither created the dialog nor holds its replica.

use std::time::{Duration, Instant};

use dispatcher_testbed::{
    netns::{Testbed, CLIENT_IP},
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
    sipp::start(tb, &sipp::Run { ns: &client, target: &target, local_ip: CLIENT_IP, calls, rate, pause_ms }, tag);
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
