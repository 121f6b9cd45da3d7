//! The store is not a back door. The testbed's etcd requires TLS client certificates and
//! authentication (`cluster::Multi`); these tests check that a client without them writes
//! nothing, and that what a writer with the store's keys puts there is still judged as
//! untrusted input by every dispatcher: members without a lease, of unknown names or with
//! a broadcast MAC are not counted, keys for unknown backends are refused, and a flood of
//! oversized clone IDs is refused at the cost of each key, with the watch keeping up.

use std::time::{Duration, Instant};

use dispatcher_testbed::cluster::{etcd_ip, Multi};

fn refused(m: &Multi, i: usize, reason: &str) -> u64 {
    m.status(i).cluster.unwrap().refused_keys.iter().find(|(r, _)| r == reason).map(|(_, n)| *n).unwrap_or(0)
}

fn members(m: &Multi, i: usize) -> Vec<String> {
    m.status(i).cluster.unwrap().members.into_iter().map(|m| m.name).collect()
}

fn member_json(name: &str, down: &[&str], mac: &str) -> String {
    let down: Vec<String> = down.iter().map(|d| format!("\"{d}\"")).collect();
    format!(
        r#"{{"name":"{name}","started":1,"pid":1,"version":"x","down":[{}],"mac":"{mac}","joined":true}}"#,
        down.join(",")
    )
}

#[test]
fn writes_without_credentials_fail_and_forged_members_change_nothing() {
    let mut m = Multi::new(2, 2);
    // d1 proves who it is by its client certificate alone: etcd takes its common name
    // (`dispatcher`) as the user.
    let text = std::fs::read_to_string(&m.dispatchers[1].config).unwrap();
    let cert_only: String = text
        .lines()
        .filter(|l| !l.starts_with("username") && !l.starts_with("password_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(text, cert_only);
    std::fs::write(&m.dispatchers[1].config, cert_only).unwrap();
    for i in 0..2 {
        m.start_dispatcher(i);
    }
    m.wait_for("two members", Duration::from_secs(5), || members(&m, 0).len() == 2 && members(&m, 1).len() == 2);
    let st = m.status(0).cluster.unwrap();
    assert!(!st.insecure && st.security.starts_with("TLS, client certificate, etcd user"), "{}", st.security);
    let st = m.status(1).cluster.unwrap();
    assert!(!st.insecure && st.security.contains("its common name is the etcd user"), "{}", st.security);
    let key = |what: &str| format!("{}/{what}", m.key_prefix);

    // No client certificate: the handshake is refused. A certificate the CA signed for a
    // name that is no etcd user: authenticated as nobody, refused.
    let ca = m.pki.path("ca.pem").display().to_string();
    let ep = format!("https://{}:2379", etcd_ip(0));
    let evil = member_json("evil", &[], "02:66:66:66:66:66");
    let anon = dispatcher_testbed::tls::run(
        &m.etcd[0],
        "etcdctl",
        &["--endpoints", &ep, "--cacert", &ca, "--dial-timeout", "2s", "put", &key("members/evil"), &evil],
        None,
    );
    assert!(!anon.ok, "a write without a client certificate: {}{}", anon.stdout, anon.stderr);
    let stranger = m.etcdctl_as(Some(("client-stranger", None)), &["put", &key("members/evil"), &evil]);
    assert!(!stranger.ok, "a write by a certificate of no etcd user: {}{}", stranger.stdout, stranger.stderr);
    assert!(
        stranger.stderr.contains("permission denied") || stranger.stderr.contains("user name not found"),
        "{}",
        stranger.stderr
    );
    // The dispatchers' user may write its prefix only.
    let pw = std::fs::read_to_string(&m.password_file).unwrap().trim().to_string();
    let user = format!("{}:{pw}", dispatcher_testbed::cluster::ETCD_USER);
    let outside = m.etcdctl_as(Some(("client-dispatcher", Some(&user))), &["put", "/elsewhere/x", "1"]);
    assert!(!outside.ok && outside.stderr.contains("permission denied"), "{}{}", outside.stdout, outside.stderr);

    // A writer that has the keys (the administrator here) forges members all the same.
    let lease = m.etcdctl(&["lease", "grant", "120"]).stdout;
    let lease = lease.split_whitespace().nth(1).expect("lease id").to_string();
    // Three member keys without a lease, of names the configuration lists, seeing b1 down:
    // with the two real dispatchers that would be three of five.
    for name in ["d5", "d6", "d7"] {
        m.etcdctl(&["put", &key(&format!("members/{name}")), &member_json(name, &["b1"], "02:00:00:00:00:55")]);
    }
    // One of a name no configuration lists, with a lease, joined.
    m.etcdctl(&["put", "--lease", &lease, &key("members/evil"), &evil]);
    // One of a listed name with a lease and a broadcast MAC; one with a unicast MAC that
    // is not the one its peers entry pins.
    m.etcdctl(&["put", "--lease", &lease, &key("members/d4"), &member_json("d4", &["b1"], "ff:ff:ff:ff:ff:ff")]);
    m.etcdctl(&["put", "--lease", &lease, &key("members/d3"), &member_json("d3", &["b1"], "02:66:66:66:66:03")]);
    // An operator state for a backend that does not exist.
    m.etcdctl(&["put", &key("operator/nope"), "disabled"]);
    // The keys written last reached both dispatchers: so did the ones before them.
    for i in 0..2 {
        m.wait_for(&format!("d{i} has read the forged keys"), Duration::from_secs(3), || {
            refused(&m, i, "unknown_backend") >= 1
        });
    }
    std::thread::sleep(Duration::from_millis(300));
    for i in 0..2 {
        assert_eq!(members(&m, i), ["d0", "d1"], "only the live, leased, known dispatchers count (d{i})");
        let b1 = m.status(i).backends.into_iter().find(|b| b.name == "b1").unwrap();
        assert_eq!(b1.state, "up", "b1 stays in on d{i}");
        let c = m.status(i).cluster.unwrap();
        assert!(c.operators.is_empty(), "{:?}", c.operators);
        for (reason, n) in [("no_lease", 3), ("unknown_member", 1), ("bad_mac", 2)] {
            assert!(refused(&m, i, reason) >= n, "d{i} counts {reason}: {:?}", c.refused_keys);
        }
    }
    // Every request is served (b1 included).
    for n in 0..20 {
        let mut c = m.client(n % 2);
        let r = c.get(&format!("/app/forged{n}")).expect("a request");
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Someone overwrites d1's own member key without a lease: d1 writes it again, with its
    // lease, and stays counted.
    m.etcdctl(&["put", &key("members/d1"), &member_json("d1", &["b0", "b1"], "02:00:00:00:00:01")]);
    m.wait_for("d1's member key is d1's again (with a lease)", Duration::from_secs(3), || {
        m.etcdctl(&["get", &key("members/d1"), "-w", "json"]).stdout.contains("\"lease\":")
    });
    m.wait_for("d1 counted again with its own verdicts", Duration::from_secs(3), || {
        let out = m.etcdctl(&["get", &key("members/d1"), "--print-value-only"]).stdout;
        out.contains("\"down\":[]") && members(&m, 0) == ["d0", "d1"]
    });
    let b1 = m.status(0).backends.into_iter().find(|b| b.name == "b1").unwrap();
    assert_eq!(b1.state, "up");
    // Deleted, it is written again too.
    m.etcdctl(&["del", &key("members/d1")]);
    m.wait_for("d1's member key is back after a delete", Duration::from_secs(3), || {
        m.etcdctl(&["get", &key("members/d1"), "-w", "json"]).stdout.contains("\"lease\":")
    });
    // Overwritten under d1's own lease (any writer of the prefix sees the lease and may
    // attach a key to it): d1 notices all the same, and writes its own verdicts again.
    let json = m.etcdctl(&["get", &key("members/d1"), "-w", "json"]).stdout;
    let d1_lease: u64 = json
        .split("\"lease\":")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty()))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("d1's lease in {json}"));
    let forged = m.etcdctl(&[
        "put",
        "--lease",
        &format!("{d1_lease:x}"),
        &key("members/d1"),
        &member_json("d1", &["b0", "b1"], "02:00:00:00:00:01"),
    ]);
    assert!(forged.ok, "{}{}", forged.stdout, forged.stderr);
    m.wait_for("d1 writes its own verdicts over the forged ones under its lease", Duration::from_secs(3), || {
        m.etcdctl(&["get", &key("members/d1"), "--print-value-only"]).stdout.contains("\"down\":[]")
    });
    let b1 = m.status(0).backends.into_iter().find(|b| b.name == "b1").unwrap();
    assert_eq!(b1.state, "up", "b1 stays in");

    // A reload that takes d1 out of d0's peers: d0 stops counting it at once (no store
    // write needed), and counts it again when it is listed again.
    let config = m.dispatchers[0].config.clone();
    let listed = std::fs::read_to_string(&config).unwrap();
    let pin = format!("\"d1@{}\", ", dispatcher_testbed::cluster::dispatcher_mac(1));
    assert!(listed.contains(&pin), "{listed}");
    std::fs::write(&config, listed.replace(&pin, "")).unwrap();
    let out = m.cmd(0, &["reload"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    m.wait_for("d0 no longer counts d1", Duration::from_secs(3), || members(&m, 0) == ["d0"]);
    assert_eq!(m.status(0).cluster.unwrap().peers.len(), dispatcher_testbed::cluster::PEER_NAMES - 1);
    std::fs::write(&config, &listed).unwrap();
    let out = m.cmd(0, &["reload"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    m.wait_for("d0 counts d1 again", Duration::from_secs(3), || members(&m, 0) == ["d0", "d1"]);
    std::fs::write(&config, &listed).unwrap();
}

/// `n` clone keys (`id(k)` -> `backend`) in transactions of 128 puts (etcd's limit per
/// transaction).
fn put_clones(m: &Multi, n: usize, id: impl Fn(usize) -> String, backend: &str) {
    let mut k = 0;
    while k < n {
        let mut ops = String::from("\n");
        for j in k..(k + 128).min(n) {
            ops += &format!("put {}/clones/{} {backend}\n", m.key_prefix, id(j));
        }
        ops += "\n\n";
        let root = format!("root:{}", m.root_password);
        let ca = m.pki.path("ca.pem").display().to_string();
        let cert = m.pki.path("client-root.pem").display().to_string();
        let key = m.pki.path("client-root.key").display().to_string();
        let ep = format!("https://{}:2379", etcd_ip(0));
        let r = dispatcher_testbed::tls::run(
            &m.etcd[0],
            "etcdctl",
            &["--endpoints", &ep, "--cacert", &ca, "--cert", &cert, "--key", &key, &format!("--user={root}"), "txn"],
            Some(ops.as_bytes()),
        );
        assert!(r.ok && r.stdout.contains("SUCCESS"), "etcdctl txn: {}{}", r.stdout, r.stderr);
        k += 128;
    }
}

#[test]
fn a_clone_key_flood_is_refused_key_by_key_and_the_watch_keeps_up() {
    let mut m = Multi::new(1, 2);
    m.start_dispatcher(0);
    m.wait_for("one member", Duration::from_secs(5), || members(&m, 0).len() == 1);
    let before = m.status(0).cluster.unwrap().shared_clones;
    let t = Instant::now();
    // 4,000 IDs of 2 KiB, 500 for a backend that does not exist, 2,000 good ones.
    put_clones(&m, 4000, |k| format!("{k:05}{}", "x".repeat(2043)), "b0");
    put_clones(&m, 500, |k| format!("nope{k}"), "nope");
    put_clones(&m, 2000, |k| format!("good{k}"), "b0");
    let written = t.elapsed();
    let took = m.wait_for_or(
        "the dispatcher has taken every key",
        Duration::from_secs(20),
        || {
            let c = m.status(0).cluster.unwrap();
            c.shared_clones == before + 2000
                && refused(&m, 0, "too_large") >= 4000
                && refused(&m, 0, "unknown_backend") >= 500
        },
        || format!("{:?}", m.status(0).cluster),
    );
    eprintln!("6,500 keys written in {written:?}; taken {took:?} after the last write");
    let c = m.status(0).cluster.unwrap();
    assert_eq!(refused(&m, 0, "too_large"), 4000, "each oversized key refused once");
    assert_eq!(c.shared_clones, before + 2000);
    let agent = m.status(0);
    assert!(agent.clones >= 2000, "the good IDs route: {} in the clone table", agent.clones);
    // A session naming a good ID goes to its owner, b0.
    for n in [7, 1999] {
        let mut cl = m.client(0);
        cl.jar = Some(format!("0000A:good{n}"));
        let r = cl.get("/app/flood").expect("a request");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.field("clone"), Some(m.clones.clone_ids[0].as_str()), "good{n} is b0's: {r:?}");
    }
    // Deleted from the store, the IDs are no longer routed by (the way out of a table
    // filled with junk).
    m.etcdctl(&["del", "--prefix", &format!("{}/clones/good", m.key_prefix)]);
    m.wait_for_or(
        "the deleted IDs leave the tables",
        Duration::from_secs(10),
        // What is left: the clones' own IDs learned from the answers above.
        || m.status(0).cluster.unwrap().shared_clones <= before + 2 && m.status(0).clones + 1998 <= agent.clones,
        || {
            format!(
                "before {before}, clones {} then {}: {:?}\n{}",
                agent.clones,
                m.status(0).clones,
                m.status(0).cluster,
                m.log(0)
            )
        },
    );
}
