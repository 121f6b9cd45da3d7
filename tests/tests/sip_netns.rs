//! SIP VIPs end to end (needs root): SIPp calls through the XDP program to WebSphere-like
//! SIP containers in replica pairs; a container fails mid-call. The verdict is SIPp's
//! own statistics and the containers' logs: no failed call, no 481, no message to a
//! container that neither created the dialog nor holds its replica.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use dispatcher_tests::{
    netns::{Testbed, CLIENT_IP},
    sipcontainer::SipCluster,
};

const VIP: &str = "10.0.150.1";

fn config(tb: &Testbed) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[health]\ninterval = \"200ms\"\ntimeout = \"200ms\"\nrise = 2\nfall = 2\n\n{}\n[[vip]]\nname = \"sip\"\naddress = \"{VIP}\"\nport = 5060\nmode = \"sip\"\nring_size = 1009\n",
        tb.instance(),
        tb.backend_config(&[])
    )
}

/// SIPp's cumulative counters from its statistics file (the last line).
fn sipp_counters(stf: &Path) -> std::collections::HashMap<String, u64> {
    let text = std::fs::read_to_string(stf).unwrap_or_else(|e| panic!("SIPp statistics {}: {e}", stf.display()));
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let head: Vec<&str> = lines.next().expect("header").split(';').collect();
    let last: Vec<&str> = lines.next_back().expect("a statistics line").split(';').collect();
    head.iter()
        .zip(last)
        .filter(|(h, _)| h.ends_with("(C)"))
        .filter_map(|(h, v)| Some((h.trim_end_matches("(C)").to_string(), v.trim().parse().ok()?)))
        .collect()
}

/// Starts SIPp's built-in UAC scenario (INVITE, 200, ACK, pause, BYE, 200) in the
/// client's namespace, as testbed process `tag` (stopped with the testbed if the test
/// fails); its statistics go to `<workdir>/<tag>.csv`.
fn sipp(tb: &mut Testbed, calls: u32, rate: u32, pause_ms: u32, tag: &str) {
    let stf = tb.workdir.join(format!("{tag}.csv"));
    let mut cmd = tb.client.command("sipp");
    cmd.args(["-sn", "uac", &format!("{VIP}:5060"), "-i", CLIENT_IP, "-p", "5061"])
        .args(["-m", &calls.to_string(), "-r", &rate.to_string(), "-d", &pause_ms.to_string()])
        .args(["-nostdin", "-timeout", "90s", "-timeout_error", "-trace_stat", "-fd", "1"])
        .arg("-stf")
        .arg(&stf)
        .current_dir(&tb.workdir);
    tb.start(tag, cmd);
}

/// Waits (bounded) for SIPp to finish; its exit status and counters.
fn finish(tb: &mut Testbed, tag: &str) -> (std::process::ExitStatus, std::collections::HashMap<String, u64>) {
    let deadline = Instant::now() + Duration::from_secs(100);
    let status = loop {
        if let Some(st) = tb.child_exited(tag) {
            break st;
        }
        assert!(Instant::now() < deadline, "SIPp did not finish: {}", tb.log(tag));
        std::thread::sleep(Duration::from_millis(100));
    };
    (status, sipp_counters(&tb.workdir.join(format!("{tag}.csv"))))
}

/// The agent learned every container's logical name from its health checks' answers.
fn wait_for_learned(tb: &Testbed, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let learned = tb
            .admin("GET", "/status")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|st| st["clones"].as_u64())
            .unwrap_or(0);
        if learned >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "logical names learned from OPTIONS answers: {learned} of {n}\n{:?}\n{}",
            tb.admin("GET", "/status"),
            tb.log("dispatcher")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn dialogs_survive_their_containers_death_and_never_reach_a_stranger() {
    let mut tb = Testbed::new(4, &[VIP]);
    let sip = SipCluster::new(4);
    tb.start_sip(&sip, VIP, 5060);
    let path = tb.write_config(&config(&tb));
    tb.start_dispatcher(&path);
    wait_for_learned(&tb, 4);

    // 150 calls of 3 s at 25 calls/s; container 0 dies while about 75 are up.
    sipp(&mut tb, 150, 25, 3000, "sipp-kill");
    std::thread::sleep(Duration::from_millis(3500));
    let on_b0 = sip.seen().iter().filter(|s| s.container == 0 && s.method == "INVITE").count();
    tb.kill_servers_of(0);
    let (status, c) = finish(&mut tb, "sipp-kill");
    eprintln!("SIPp: {c:?}; container 0 had taken {on_b0} INVITEs");

    assert!(on_b0 > 5, "container 0 owned dialogs when it died: {on_b0}");
    assert_eq!(c.get("SuccessfulCall"), Some(&150), "every call completed: {c:?}");
    assert_eq!(c.get("FailedCall"), Some(&0), "{c:?}");
    assert!(status.success(), "SIPp's exit status: {status}");
    assert_eq!(sip.not_found.load(std::sync::atomic::Ordering::SeqCst), 0, "no 481");
    let misroutes = sip.misroutes();
    assert!(misroutes.is_empty(), "from the containers' logs: {misroutes:?}");
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
    dispatcher_tests::promtool_check(&metrics).expect("the metrics pass promtool");
}

#[test]
fn a_frozen_container_is_waited_for_then_its_replica_serves() {
    let mut tb = Testbed::new(2, &[VIP]);
    let sip = SipCluster::new(2);
    tb.start_sip(&sip, VIP, 5060);
    let path = tb.write_config(&config(&tb));
    tb.start_dispatcher(&path);
    wait_for_learned(&tb, 2);

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
    assert_eq!(c.get("SuccessfulCall"), Some(&60), "{c:?}");
    assert!(status.success(), "SIPp's exit status: {status}");
    assert_eq!(sip.not_found.load(std::sync::atomic::Ordering::SeqCst), 0, "no 481");
    let misroutes = sip.misroutes();
    assert!(misroutes.is_empty(), "{misroutes:?}");
    let (_, body) = tb.admin("GET", "/metrics").expect("metrics");
    let held: f64 = body
        .lines()
        .filter(|l| l.starts_with("dispatcher_xdp_events_total{") && l.contains("drop_sip_held"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(held > 0.0, "messages were held while the owner was suspect:\n{body}");
}
