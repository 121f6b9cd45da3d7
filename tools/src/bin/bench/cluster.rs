//! Several dispatchers (`--cluster`): three dispatchers sharing a real 3-member etcd
//! cluster. How long a learning, an operator's drain and a clone's failure take to reach
//! every dispatcher's maps; how many etcd writes the dispatchers make under HTTP load;
//! and one dispatcher's requests/s with and without `[cluster]`, alternated in one run.

use std::time::{Duration, Instant};

use crate::wrk;
use dispatcher_common::{STATE_DOWN, STATE_DRAIN};
use dispatcher_testbed::cluster::{Multi, VIP};

fn wait(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

fn ms(d: Option<Duration>) -> f64 {
    d.map(|d| d.as_secs_f64() * 1000.0).unwrap_or(f64::NAN)
}

fn median_max(v: &[f64]) -> (f64, f64) {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    (s[s.len() / 2], s[s.len() - 1])
}

/// wrk from dispatcher 0's client namespace: (requests/s, errors).
fn wrk(m: &Multi, secs: u64) -> (f64, u64) {
    let r = wrk::run(m.dispatchers[0].client.command("wrk"), &format!("http://{VIP}/app"), 32, secs, None);
    (r.rps, r.errors)
}

/// Writes all dispatchers sent to etcd so far, and dispatcher 0's view of the revision.
fn writes(m: &Multi) -> (u64, u64, i64) {
    let mut w = 0;
    let mut r = 0;
    let mut rev = 0;
    for i in 0..m.dispatchers.len() {
        let c = m.status(i).cluster.expect("cluster status");
        w += c.writes;
        r += c.renewals;
        if i == 0 {
            rev = c.revision;
        }
    }
    (w, r, rev)
}

pub fn run(quick: bool) -> (String, String) {
    eprintln!("==> cluster: 3 etcd members, 3 dispatchers, 4 clones");
    let mut m = Multi::new(3, 4);
    for i in 0..3 {
        m.start_dispatcher(i);
    }
    m.wait_for("three members", Duration::from_secs(10), || m.status(0).cluster.is_some_and(|c| c.members.len() == 3));

    // Learning: new sessions through d0 until every clone's ID is known; each time d0's
    // table grows, how long until d1 and d2 hold as many entries.
    let mut learn = Vec::new();
    for _ in 0..200 {
        if learn.len() == m.clones.clone_ids.len() {
            break;
        }
        let before = m.decision_maps(0).clones.len();
        let mut c = m.client(0);
        c.get("/app/new").expect("a new session");
        let after = m.decision_maps(0).clones.len();
        if after > before {
            let d = wait(Duration::from_secs(5), || (1..3).all(|i| m.decision_maps(i).clones.len() >= after));
            learn.push(ms(d));
        }
    }
    let (learn_med, learn_max) = median_max(&learn);
    eprintln!("    learning: {} samples, median {learn_med:.1} ms, max {learn_max:.1} ms", learn.len());

    // Drain on d1, seen in d0's and d2's BACKENDS; then enable.
    let rounds = if quick { 2 } else { 6 };
    let mut drain = Vec::new();
    for r in 0..rounds {
        let b = 2 + r % 2;
        let name = format!("b{b}");
        let t = Instant::now();
        let out = m.cmd(1, &["drain", &name]);
        assert!(out.status.success());
        let d = wait(Duration::from_secs(5), || {
            [0, 2].iter().all(|&i| m.backend_bytes(i).get(b).is_some_and(|x| x.1 == STATE_DRAIN))
        });
        drain.push(ms(d.map(|_| t.elapsed())));
        let _ = m.cmd(2, &["enable", &name]);
        wait(Duration::from_secs(5), || (0..3).all(|i| m.backend_bytes(i).get(b).is_some_and(|x| x.1 == 0)));
    }
    let (drain_med, drain_max) = median_max(&drain);
    eprintln!("    drain: median {drain_med:.1} ms, max {drain_max:.1} ms ({rounds} rounds, from the command's start)");

    // etcd writes at steady state under HTTP load (every session's clone ID is known).
    let secs = if quick { 3 } else { 10 };
    let (w0, r0, rev0) = writes(&m);
    let t = Instant::now();
    let (load_rps, load_err) = wrk(&m, secs);
    let el = t.elapsed().as_secs_f64();
    let (w1, r1, rev1) = writes(&m);
    let writes_per_s = (w1 - w0) as f64 / el;
    let renewals_per_s = (r1 - r0) as f64 / el;
    let revisions_per_s = (rev1 - rev0) as f64 / el;
    eprintln!("    under load ({load_rps:.0} req/s through d0, {load_err} errors): {writes_per_s:.2} etcd writes/s, {revisions_per_s:.2} revisions/s, {renewals_per_s:.2} lease renewals/s (3 dispatchers)");

    // Failover: a clone killed; how long until all three have it down in BACKENDS.
    let t = Instant::now();
    m.tb.kill_servers_of(1);
    m.clones.kill(1);
    let fail =
        wait(Duration::from_secs(10), || (0..3).all(|i| m.backend_bytes(i).get(1).is_some_and(|x| x.0 == STATE_DOWN)));
    let failover_ms = ms(fail.map(|_| t.elapsed()));
    eprintln!(
        "    failover: clone 1 killed -> down on all three after {failover_ms:.0} ms (checks every 200 ms, fall 2)"
    );
    let status_text = String::from_utf8_lossy(&m.cmd(0, &["status"]).stdout).into_owned();

    // One dispatcher with and without [cluster], alternated.
    let mut with = Vec::new();
    let mut without = Vec::new();
    let reps = if quick { 1 } else { 2 };
    let secs = if quick { 3 } else { 8 };
    for _ in 0..reps {
        for clustered in [true, false] {
            m.stop_dispatcher(0);
            m.set_clustered(0, clustered);
            m.start_dispatcher(0);
            std::thread::sleep(Duration::from_millis(500));
            let (rps, _) = wrk(&m, secs);
            eprintln!("    d0 {}: {rps:.0} req/s", if clustered { "with [cluster]" } else { "standalone" });
            if clustered {
                with.push(rps)
            } else {
                without.push(rps)
            }
        }
    }
    let avg = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let ratio = avg(&with) / avg(&without);
    let json = format!(
        r#"{{"learn_ms_median":{learn_med:.1},"learn_ms_max":{learn_max:.1},"learn_samples":{},"drain_ms_median":{drain_med:.1},"drain_ms_max":{drain_max:.1},"failover_ms":{failover_ms:.0},"etcd_writes_per_s":{writes_per_s:.3},"etcd_revisions_per_s":{revisions_per_s:.3},"lease_renewals_per_s":{renewals_per_s:.3},"load_rps":{load_rps:.0},"rps_with_cluster":{:.0},"rps_standalone":{:.0},"ratio":{ratio:.3}}}"#,
        learn.len(),
        avg(&with),
        avg(&without)
    );
    let mut md = String::new();
    md += "| measure (3 dispatchers, 3 etcd members) | value |\n| --- | --- |\n";
    md += &format!("| clone ID learned on d0 -> in d1's and d2's `CLONES` (median / max of {}) | {learn_med:.1} ms / {learn_max:.1} ms |\n", learn.len());
    md += &format!("| `dispatcher drain` on d1 -> in d0's and d2's `BACKENDS` (median / max of {rounds}) | {drain_med:.1} ms / {drain_max:.1} ms |\n");
    md += &format!("| clone killed -> down in all three `BACKENDS` (checks 200 ms, fall 2) | {failover_ms:.0} ms |\n");
    md += &format!("| etcd writes/s at steady state under {load_rps:.0} req/s (all 3 dispatchers) | {writes_per_s:.2} (store revisions/s {revisions_per_s:.2}; lease renewals/s {renewals_per_s:.2}) |\n");
    md += &format!(
        "| one dispatcher, req/s with `[cluster]` / standalone (wrk -c32, alternated) | {:.0} / {:.0} = {ratio:.3} |\n",
        avg(&with),
        avg(&without)
    );
    md += &format!(
        "\n`dispatcher status` of d0 at the end of the run:\n\n```\n{}```\n",
        status_text
            .lines()
            .filter(|l| l.starts_with("cluster") || l.starts_with("  "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    );
    (json, md)
}
