//! HTTPS VIPs end to end, with real TLS clients (curl, `openssl s_client`) in the client
//! namespace, the agent terminating TLS, and WebSphere-like clones (or `openssl s_server`
//! for TLS to backends) behind.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::{rss_kib, Testbed},
    tls::{certificate_entry, https_testbed, run, s_client, shop_only, HttpsBed as Bed, Pki, HTTPS_BACKEND_PORT},
};

const VIP: &str = dispatcher_testbed::tls::HTTPS_VIP;
const BACKEND_PORT: u16 = HTTPS_BACKEND_PORT;

fn curl_args<'a>(pki: &'a Pki, jar: &'a str, ca: &'a str) -> Vec<String> {
    let _ = pki;
    vec![
        "-sS".into(),
        "--max-time".into(),
        "20".into(),
        "--cacert".into(),
        ca.into(),
        "--resolve".into(),
        format!("shop.example:443:{VIP}"),
        "-b".into(),
        jar.into(),
        "-c".into(),
        jar.into(),
    ]
}

/// `count` requests for the session in `jar` over one keep-alive TLS connection: the
/// counters the clone reported, in order.
fn counter_batch(bed: &Bed, jar: &str, count: usize) -> Vec<String> {
    let ca = bed.pki.path("ca.pem").display().to_string();
    let mut args = curl_args(&bed.pki, jar, &ca);
    for _ in 0..count {
        args.push("https://shop.example/app/counter".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let r = run(&bed.tb.client, "curl", &args, None);
    assert!(r.ok, "curl failed: {}\n{}", r.stderr, bed.tb.log("dispatcher"));
    r.stdout
        .split_whitespace()
        .filter(|f| f.starts_with("count=") || f.starts_with("forwarded=") || f.starts_with("websphere="))
        .map(String::from)
        .collect()
}

fn status(tb: &Testbed) -> serde_json::Value {
    let (code, body) = tb.admin("GET", "/status").expect("admin answers");
    assert_eq!(code, 200);
    serde_json::from_str(&body).unwrap()
}

fn tls_status(tb: &Testbed, vip: &str) -> serde_json::Value {
    let s = status(tb);
    s["vips"].as_array().unwrap().iter().find(|v| v["name"] == vip).expect("the VIP in status")["tls"].clone()
}

#[test]
fn sessions_stay_with_their_clone_over_https_and_fail_over_to_the_replica() {
    let mut bed = https_testbed(4, shop_only, "");
    let jar = bed.tb.workdir.join("jar").display().to_string();
    let mut seen = counter_batch(&bed, &jar, 20);
    let owner = bed.cluster.hits()[0].backend;
    for h in bed.cluster.hits() {
        assert_eq!(h.backend, owner, "one session, one clone");
    }
    // The owner dies: its session goes on at its replica, with the replicated state.
    bed.tb.kill_servers_of(owner);
    bed.cluster.kill(owner);
    seen.extend(counter_batch(&bed, &jar, 20));
    seen.extend(counter_batch(&bed, &jar, 20));
    let counts: Vec<&String> = seen.iter().filter(|f| f.starts_with("count=")).collect();
    let expected: Vec<String> = (1..=60).map(|i| format!("count={i}")).collect();
    assert_eq!(counts, expected.iter().collect::<Vec<_>>(), "the session's counter went on across the failure");
    assert!(seen.iter().filter(|f| f.starts_with("forwarded=")).all(|f| f == "forwarded=https:443"), "{seen:?}");
    // The application sees what it sees behind the WebSphere plug-in: https, isSecure(),
    // the client's address.
    let ws: Vec<&String> = seen.iter().filter(|f| f.starts_with("websphere=")).collect();
    assert_eq!(ws.len(), 60, "{seen:?}");
    let expected = format!("websphere=https:true:{}", dispatcher_testbed::netns::CLIENT_IP);
    assert!(ws.iter().all(|f| **f == expected), "{ws:?}");
    let replica = owner ^ 1;
    let hits = bed.cluster.hits();
    assert!(hits.iter().skip(20).all(|h| h.backend == replica), "after the failure: the replica only");
    assert!(hits.iter().all(|h| !h.lost));
    assert_eq!(bed.cluster.misroutes(), Vec::<String>::new());
    let t = tls_status(&bed.tb, "shop");
    assert_eq!(t["handshakes_full"], 3, "one handshake per curl connection: {t}");
    assert_eq!(t["certificates"][0]["names"][0], "shop.example");
}

#[test]
fn sni_chooses_the_certificate_and_strict_sni_refuses_unknown_names() {
    let bed = https_testbed(
        2,
        |pki| {
            let (shop, shop_key) = pki.leaf("ca", "shop", "shop.example", &["shop.example"], 20);
            let (api, api_key) = pki.leaf("ca", "api", "api.example", &["api.example"], 20);
            let (wild, wild_key) = pki.leaf("ca", "wild", "wildcard", &["*.static.example"], 20);
            let tls = format!(
                "{}{}{}",
                certificate_entry(&shop, &shop_key, &[]),
                certificate_entry(&api, &api_key, &[]),
                certificate_entry(&wild, &wild_key, &[])
            );
            let strict = format!(
                "[[vip]]\nname = \"strict\"\naddress = \"{VIP}\"\nport = 8443\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\nhttp2 = false\n[vip.tls]\nstrict_sni = true\n{}",
                certificate_entry(&shop, &shop_key, &[])
            );
            (tls, strict)
        },
        "",
    );
    let ca = bed.pki.path("ca.pem").display().to_string();
    let addr = format!("{VIP}:443");
    let subject = |extra: &[&str]| {
        let mut args = vec!["-CAfile", ca.as_str(), "-verify_return_error"];
        args.extend_from_slice(extra);
        let out = s_client(&bed.tb.client, &addr, &args, b"");
        out.lines()
            .find_map(|l| l.strip_prefix("subject=").map(|s| s.trim().to_string()))
            .unwrap_or_else(|| out.clone())
    };
    assert!(subject(&["-servername", "api.example"]).contains("api.example"));
    assert!(subject(&["-servername", "shop.example"]).contains("shop.example"));
    assert!(subject(&["-servername", "img.static.example"]).contains("wildcard"), "a *. name");
    assert!(subject(&["-servername", "API.Example"]).contains("api.example"), "names are case-insensitive");
    assert!(subject(&["-noservername"]).contains("shop.example"), "no SNI: the first certificate");
    assert!(subject(&["-servername", "other.example"]).contains("shop.example"), "unknown: the default");
    // ALPN: h2 is chosen whatever the client's order, http/1.1 for a client without h2.
    for offer in ["h2,http/1.1", "http/1.1,h2", "h2"] {
        let alpn = s_client(&bed.tb.client, &addr, &["-alpn", offer], b"");
        assert!(alpn.contains("ALPN protocol: h2"), "{offer}: {alpn}");
    }
    let alpn = s_client(&bed.tb.client, &addr, &["-alpn", "http/1.1"], b"");
    assert!(alpn.contains("ALPN protocol: http/1.1"), "{alpn}");
    // With http2 = false (the strict VIP): http/1.1 only, a client that speaks only h2
    // is refused.
    let strict = format!("{VIP}:8443");
    let sni = ["-servername", "shop.example", "-alpn"];
    let alpn = s_client(&bed.tb.client, &strict, &[&sni[..], &["h2,http/1.1"]].concat(), b"");
    assert!(alpn.contains("ALPN protocol: http/1.1"), "{alpn}");
    let h2_only = s_client(&bed.tb.client, &strict, &[&sni[..], &["h2"]].concat(), b"");
    assert!(h2_only.contains("alert") && !h2_only.contains("ALPN protocol: h2"), "{h2_only}");
    // The strict VIP has no default: an unknown name gets an alert, a known one works.
    let refused = s_client(&bed.tb.client, &strict, &["-servername", "other.example"], b"");
    assert!(refused.contains("alert"), "{refused}");
    assert!(!refused.contains("subject="), "no certificate was sent: {refused}");
    let none = s_client(&bed.tb.client, &strict, &["-noservername"], b"");
    assert!(!none.contains("subject="), "no SNI, no default: {none}");
    let known = s_client(&bed.tb.client, &strict, &["-servername", "shop.example"], b"");
    assert!(known.contains("subject=") && known.contains("shop.example"), "{known}");
    let t = tls_status(&bed.tb, "strict");
    assert_eq!(t["failures"]["unknown_sni"], 2, "{t}");
    assert_eq!(t["handshakes_full"], 2, "{t}");
    assert_eq!(t["failures"]["protocol"], 1, "the h2-only client: {t}");
    // Metrics carry the same, and parse.
    let (_, metrics) = bed.tb.admin("GET", "/metrics").unwrap();
    assert!(
        metrics.contains("dispatcher_tls_handshake_failures_total{vip=\"strict\",reason=\"unknown_sni\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("dispatcher_tls_certificate_not_after_seconds{vip=\"shop\""));
    dispatcher_testbed::promtool_check(&metrics).unwrap();
}

#[test]
fn sessions_resume_by_ticket_and_by_session_id() {
    let bed = https_testbed(2, shop_only, "");
    let addr = format!("{VIP}:443");
    let request = b"GET /app/counter HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n";
    for (version, extra) in [("TLSv1.3", vec!["-tls1_3"]), ("TLSv1.2", vec!["-tls1_2", "-no_ticket"])] {
        let sess = bed.tb.workdir.join(format!("{version}.sess")).display().to_string();
        let mut first = vec!["-ign_eof", "-servername", "shop.example", "-sess_out", sess.as_str()];
        first.extend(extra.iter().copied());
        let out = s_client(&bed.tb.client, &addr, &first, request);
        assert!(out.contains("New, ") && out.contains(version), "{out}");
        assert!(out.contains("HTTP/1.1 200 OK"), "{out}");
        let mut again = vec!["-ign_eof", "-servername", "shop.example", "-sess_in", sess.as_str()];
        again.extend(extra.iter().copied());
        let out = s_client(&bed.tb.client, &addr, &again, request);
        assert!(out.contains("Reused, ") && out.contains(version), "{version} not resumed:\n{out}");
        assert!(out.contains("HTTP/1.1 200 OK"), "{out}");
    }
    let t = tls_status(&bed.tb, "shop");
    assert_eq!((t["handshakes_full"].as_u64(), t["handshakes_resumed"].as_u64()), (Some(2), Some(2)), "{t}");
    let text = bed.tb.dispatcher_cmd(&["status", "--config", &bed.cfg]);
    assert!(text.contains("tls shop: handshakes 4 (resumed 2, 50%)"), "{text}");
}

#[test]
fn certificates_are_reloaded_under_load_without_a_failed_request() {
    let bed = https_testbed(2, shop_only, "");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let ca = bed.pki.path("ca.pem").display().to_string();
    let mut loaders = Vec::new();
    for i in 0..3 {
        let (stop, ok, failed, ca) = (stop.clone(), ok.clone(), failed.clone(), ca.clone());
        let jar = bed.tb.workdir.join(format!("jar{i}")).display().to_string();
        let client = bed.tb.client.command("curl");
        drop(client);
        let ns_run = bed.tb.client.spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(40);
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let mut args: Vec<String> = vec![
                    "-sS".into(),
                    "--max-time".into(),
                    "10".into(),
                    "--cacert".into(),
                    ca.clone(),
                    "--resolve".into(),
                    format!("shop.example:443:{VIP}"),
                    "-b".into(),
                    jar.clone(),
                    "-c".into(),
                    jar.clone(),
                    "-o".into(),
                    "/dev/null".into(),
                    "-w".into(),
                    "%{http_code}\\n".into(),
                ];
                for _ in 0..10 {
                    args.push("https://shop.example/app/counter".into());
                }
                let out = std::process::Command::new("curl").args(&args).output().unwrap();
                let codes = String::from_utf8_lossy(&out.stdout).into_owned();
                let good = codes.lines().filter(|c| *c == "200").count() as u64;
                ok.fetch_add(good, Ordering::SeqCst);
                failed.fetch_add(10 - good, Ordering::SeqCst);
            }
        });
        loaders.push(ns_run);
    }
    std::thread::sleep(Duration::from_millis(700));
    let cert = bed.pki.path("shop.pem");
    let key = bed.pki.path("shop.key");
    for round in 1..=2 {
        // A new certificate (and key) in place of the configured files, then reload.
        let (c, k) =
            bed.pki.leaf("ca", &format!("shop{round}"), &format!("shop.example v{round}"), &["shop.example"], 20);
        std::fs::copy(&c, &cert).unwrap();
        std::fs::copy(&k, &key).unwrap();
        let said = bed.tb.dispatcher_cmd(&["reload", "--config", &bed.cfg]);
        assert!(said.contains("reloaded"), "{said}");
        std::thread::sleep(Duration::from_millis(700));
        let out = s_client(&bed.tb.client, &format!("{VIP}:443"), &["-servername", "shop.example"], b"");
        assert!(out.contains(&format!("shop.example v{round}")), "new connections get the new certificate: {out}");
    }
    stop.store(true, Ordering::SeqCst);
    for l in loaders {
        l.join().unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert!(ok >= 100, "{ok} requests");
    assert_eq!(failed, 0, "{failed} of {} requests failed across the reloads", ok + failed);
    // A certificate that does not load fails the reload, and the VIP goes on serving.
    std::fs::write(&key, "not a key").unwrap();
    let out = bed
        .tb
        .lb
        .command(dispatcher_testbed::netns::dispatcher_bin())
        .args(["reload", "--config", &bed.cfg])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("no usable PEM private key") && said.contains("shop.key"), "{said}");
    let out = s_client(&bed.tb.client, &format!("{VIP}:443"), &["-servername", "shop.example"], b"");
    assert!(out.contains("shop.example v2"), "{out}");
}

#[test]
fn tls_to_backends_verifies_their_certificates() {
    // b0 presents a certificate of our CA for backend.example; b1 one of another CA; b2
    // one of our CA and asks for a client certificate of our CA.
    let mut tb = Testbed::new(3, &[VIP]);
    tb.add_local_vip(VIP);
    let pki = Pki::new(&tb.workdir);
    pki.ca("rogue");
    let (good, good_key) = pki.leaf("ca", "backend", "backend.example", &["backend.example"], 20);
    let (bad, bad_key) = pki.leaf("rogue", "impostor", "backend.example", &["backend.example"], 20);
    let www = tb.workdir.join("www");
    std::fs::create_dir_all(&www).unwrap();
    std::fs::write(www.join("hello.txt"), "hello over TLS\n").unwrap();
    std::fs::write(www.join("health"), "ok\n").unwrap();
    let (client, client_key) = pki.leaf("ca", "client", "dispatcher", &["dispatcher.example"], 20);
    let ca = pki.path("ca.pem");
    for (i, (c, k)) in [(&good, &good_key), (&bad, &bad_key), (&good, &good_key)].into_iter().enumerate() {
        let mut cmd = tb.backends[i].command("openssl");
        cmd.args(["s_server", "-quiet", "-accept", "8443", "-WWW", "-cert"]).arg(c).arg("-key").arg(k);
        if i == 2 {
            // Only a client with a certificate of our CA gets an answer.
            cmd.args(["-Verify", "1", "-verify_return_error", "-CAfile"]).arg(&ca);
        }
        cmd.current_dir(&www);
        tb.start(&format!("s_server{i}"), cmd);
    }
    let vip = |name: &str, port: u16, backend: &str, client_cert: bool| {
        let cert = if client_cert {
            format!("cert = \"{}\"\nkey = \"{}\"\n", client.display(), client_key.display())
        } else {
            String::new()
        };
        format!(
            "[[vip]]\nname = \"{name}\"\naddress = \"{VIP}\"\nport = {port}\nmode = \"http\"\nbackend_port = 8443\nbackends = [\"{backend}\"]\n[vip.backend_tls]\nca_file = \"{}\"\nserver_name = \"backend.example\"\n{cert}",
            ca.display()
        )
    };
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n[http]\nretries = 0\n[health]\nkind = \"tcp\"\nport = 8443\ninterval = \"200ms\"\n\n{}\n{}\n{}\n{}\n{}",
        tb.instance(),
        tb.backend_config(&[]),
        vip("good", 80, "b0", false),
        vip("bad", 81, "b1", false),
        vip("mutual", 82, "b2", true),
        vip("anonymous", 83, "b2", false)
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let get = |port: u16| {
        let url = format!("http://{VIP}:{port}/hello.txt");
        let r = run(&tb.client, "curl", &["-sS", "--max-time", "10", "-w", "\n%{http_code}", &url], None);
        r.stdout
    };
    let good_answer = get(80);
    assert!(good_answer.contains("hello over TLS") && good_answer.ends_with("200"), "{good_answer}");
    let bad_answer = get(81);
    assert!(bad_answer.ends_with("502"), "a backend with a certificate we do not trust: {bad_answer}");
    assert!(!tb.log("s_server1").contains("GET /hello.txt"), "nothing was sent to the impostor");
    let s = status(&tb);
    let b1 = s["backends"].as_array().unwrap().iter().find(|b| b["name"] == "b1").unwrap().clone();
    assert!(b1["errors"].as_u64().unwrap() >= 1, "the backend is counted as failing: {b1}");
    // A backend that asks for a client certificate: the VIP with one is served.
    let mutual = get(82);
    assert!(mutual.contains("hello over TLS") && mutual.ends_with("200"), "{mutual}");
    let anonymous = get(83);
    assert!(anonymous.ends_with("502"), "without a client certificate: {anonymous}");
    // HTTP health checks go over the same TLS: b0 passes them, the impostor fails them.
    std::fs::write(&path, text.replace("kind = \"tcp\"\nport = 8443", "kind = \"http\"\npath = \"/health\"")).unwrap();
    let said = tb.dispatcher_cmd(&["reload", "--config", &path.display().to_string()]);
    assert!(said.contains("reloaded"), "{said}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status(&tb);
        let health = |name: &str| {
            s["backends"].as_array().unwrap().iter().find(|b| b["name"] == name).unwrap()["health"]
                .as_str()
                .unwrap()
                .to_string()
        };
        if health("b0") == "up" && health("b1") == "down" && health("b2") == "up" {
            break;
        }
        assert!(Instant::now() < deadline, "b0 {} b1 {}", health("b0"), health("b1"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // Long enough for several failed checks (200 ms apart) to take b0 down, were they
    // not passing.
    std::thread::sleep(Duration::from_millis(1500));
    let s = status(&tb);
    let b0 = s["backends"].as_array().unwrap().iter().find(|b| b["name"] == "b0").unwrap().clone();
    assert_eq!(b0["health"], "up", "{b0}");
    assert!(get(80).ends_with("200"));
}

/// Opens a TCP connection from the client namespace and runs `f` on it.
fn raw<T: Send + 'static>(tb: &Testbed, f: impl FnOnce(TcpStream) -> T + Send + 'static) -> T {
    let addr: SocketAddr = format!("{VIP}:443").parse().unwrap();
    tb.client.run(move || {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        f(s)
    })
}

/// Reads until the server closes (or the read timeout): what it sent, and how long.
fn until_closed(mut s: TcpStream) -> (Vec<u8>, Duration) {
    let t = Instant::now();
    let mut got = Vec::new();
    let _ = s.read_to_end(&mut got);
    (got, t.elapsed())
}

#[test]
fn hostile_handshakes_are_refused_and_nothing_is_forwarded() {
    let bed = https_testbed(2, shop_only, "max_tls_handshakes = 8\n");
    let tb = &bed.tb;
    let pid = tb.pid_of("dispatcher").unwrap();
    // Warm up: real handshakes and requests.
    let jar = tb.workdir.join("jar").display().to_string();
    counter_batch(&bed, &jar, 5);
    let hits_before = bed.cluster.hits().len();
    let rss_before = rss_kib(pid);

    // Plain HTTP to the TLS port: a plain 400 that says so.
    let (answer, _) = raw(tb, |mut s| {
        s.write_all(b"GET /app/counter HTTP/1.1\r\nHost: shop.example\r\n\r\n").unwrap();
        until_closed(s)
    });
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("plain HTTP"), "{answer}");
    // Garbage: closed at once.
    let (got, took) = raw(tb, |mut s| {
        s.write_all(&[0u8, 1, 2, 3, 0xff, 0xfe, 7, 9]).unwrap();
        until_closed(s)
    });
    assert!(got.is_empty() && took < Duration::from_secs(1), "{got:?} after {took:?}");
    // A ClientHello cut short, then silence: the handshake deadline (500 ms) closes it.
    let (_, took) = raw(tb, |mut s| {
        s.write_all(&[22, 3, 1, 2, 0, 1, 0, 1, 252, 3, 3]).unwrap();
        until_closed(s)
    });
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "closed after {took:?}");
    // A client that connects and says nothing: the same deadline.
    let (_, took) = raw(tb, until_closed);
    assert!(took >= Duration::from_millis(400) && took < Duration::from_secs(3), "closed after {took:?}");
    // An oversized ClientHello: a handshake message claiming 16 MiB, sent as full records.
    let (got, took) = raw(tb, |mut s| {
        let mut sent = 0;
        let mut first = true;
        while sent < 200_000 {
            let mut record = vec![22u8, 3, 1, 0x40, 0x00];
            let mut body = vec![0x41u8; 0x4000];
            if first {
                body[..4].copy_from_slice(&[1, 0xff, 0xff, 0xff]);
                first = false;
            }
            record.extend_from_slice(&body);
            if s.write_all(&record).is_err() {
                break;
            }
            sent += record.len();
        }
        until_closed(s)
    });
    assert!(took < Duration::from_secs(3), "{got:?} after {took:?}");
    // A record longer than TLS allows.
    let (_, took) = raw(tb, |mut s| {
        let _ = s.write_all(&[22, 3, 1, 0xff, 0xff, 1, 0, 0, 10]);
        until_closed(s)
    });
    assert!(took < Duration::from_secs(3), "closed after {took:?}");
    // Truncated ClientHello: the client closes mid-record. Counted as a failure once the
    // agent has read it; until then it holds a handshake slot, so the cap below waits for it.
    let failed = |tb: &Testbed| -> u64 {
        tls_status(tb, "shop")["failures"].as_object().unwrap().values().filter_map(|v| v.as_u64()).sum()
    };
    let failed_before = failed(tb);
    raw(tb, |mut s| {
        s.write_all(&[22, 3, 1, 0, 200, 1, 0, 0, 196, 3, 3, 0, 0]).unwrap();
    });
    let t = Instant::now();
    while failed(tb) == failed_before {
        assert!(t.elapsed() < Duration::from_secs(3), "the truncated ClientHello is not counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The cap: 9 handshakes stalled after their first bytes, 8 slots: 8 wait for the
    // deadline, one is closed at once (whichever came last). The 20 connections that
    // have sent nothing (opened first) hold no slot: else all 9 would be refused.
    let addr: SocketAddr = format!("{VIP}:443").parse().unwrap();
    let mut times = tb.client.run(move || {
        let silent: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let waits: Vec<std::thread::JoinHandle<Duration>> = (0..9)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                s.write_all(&[22, 3, 1, 0, 200, 1, 0, 0]).unwrap();
                std::thread::spawn(move || until_closed(s).1)
            })
            .collect();
        let times: Vec<Duration> = waits.into_iter().map(|w| w.join().unwrap()).collect();
        drop(silent);
        times
    });
    times.sort();
    assert!(times[0] < Duration::from_millis(300), "over the cap: closed at once: {times:?}");
    assert!(times[1] >= Duration::from_millis(400), "the 8 others wait for the deadline: {times:?}");
    // Many hostile connections: memory goes back to where it was.
    for _ in 0..3 {
        tb.client.run(move || {
            let conns: Vec<TcpStream> = (0..100)
                .filter_map(|_| {
                    let mut s = TcpStream::connect(addr).ok()?;
                    let _ = s.write_all(&[22, 3, 3, 0x40, 0x00, 1, 0, 0x3f, 0xfc]);
                    let _ = s.write_all(&[0x42; 8000]);
                    Some(s)
                })
                .collect();
            std::thread::sleep(Duration::from_millis(200));
            drop(conns);
        });
    }
    std::thread::sleep(Duration::from_millis(800));
    let rss_after = rss_kib(pid);
    assert!(
        rss_after <= rss_before + 8 * 1024,
        "memory after the hostile handshakes: {rss_after} KiB, before {rss_before} KiB"
    );
    // Nothing of all this was forwarded; the agent is alive and serving.
    assert_eq!(bed.cluster.hits().len(), hits_before, "nothing forwarded");
    assert!(counter_batch(&bed, &jar, 2).contains(&"count=7".to_string()));
    let t = tls_status(tb, "shop");
    for (reason, at_least) in [("plain_http", 1), ("not_tls", 1), ("timeout", 2), ("protocol", 2), ("cap", 1)] {
        assert!(t["failures"][reason].as_u64().unwrap() >= at_least, "{reason}: {t}");
    }
    assert!(tb.log("dispatcher").lines().all(|l| !l.contains("panicked")), "{}", tb.log("dispatcher"));
}

#[test]
fn a_plain_vip_redirects_to_the_https_one() {
    let bed = https_testbed(
        2,
        |pki| {
            let (tls, _) = shop_only(pki);
            let plain = format!(
                "[[vip]]\nname = \"plain\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nredirect_to = \"shop\"\n"
            );
            (tls, plain)
        },
        "",
    );
    let r = run(
        &bed.tb.client,
        "curl",
        &[
            "-sS",
            "-i",
            "--max-time",
            "5",
            "--resolve",
            &format!("shop.example:80:{VIP}"),
            "http://shop.example/app/cart?item=1",
        ],
        None,
    );
    assert!(r.stdout.starts_with("HTTP/1.1 308"), "{}", r.stdout);
    assert!(r.stdout.contains("Location: https://shop.example/app/cart?item=1\r\n"), "{}", r.stdout);
    // A POST is redirected too (308 keeps the method), and nothing is forwarded.
    let r = run(
        &bed.tb.client,
        "curl",
        &["-sS", "-i", "--max-time", "5", "-d", "a=1", "-H", "Host: shop.example:80", &format!("http://{VIP}/buy")],
        None,
    );
    assert!(r.stdout.contains("Location: https://shop.example/buy\r\n"), "{}", r.stdout);
    assert!(bed.cluster.hits().is_empty());
    // Following the redirect reaches the application over HTTPS.
    let ca = bed.pki.path("ca.pem").display().to_string();
    let r = run(
        &bed.tb.client,
        "curl",
        &[
            "-sS",
            "-L",
            "--max-time",
            "10",
            "--cacert",
            &ca,
            "--resolve",
            &format!("shop.example:80:{VIP}"),
            "--resolve",
            &format!("shop.example:443:{VIP}"),
            "http://shop.example/app/counter",
        ],
        None,
    );
    assert!(r.stdout.contains("count=1") && r.stdout.contains("forwarded=https:443"), "{}{}", r.stdout, r.stderr);
}

/// With `redirect_host`, the Location names the configured host whatever the request's
/// Host says (no open redirect to a host of the client's choice).
#[test]
fn a_redirect_host_is_used_whatever_the_host_says() {
    let bed = https_testbed(
        1,
        |pki| {
            let (tls, _) = shop_only(pki);
            let plain = format!(
                "[[vip]]\nname = \"plain\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nredirect_to = \"shop\"\nredirect_host = \"shop.example.com\"\n"
            );
            (tls, plain)
        },
        "",
    );
    for host in ["evil.example", "evil.example:80", "shop.example.com"] {
        let r = run(
            &bed.tb.client,
            "curl",
            &["-sS", "-i", "--max-time", "5", "-H", &format!("Host: {host}"), &format!("http://{VIP}/app/cart?item=1")],
            None,
        );
        assert!(r.stdout.starts_with("HTTP/1.1 308"), "{host}: {}", r.stdout);
        assert!(r.stdout.contains("Location: https://shop.example.com/app/cart?item=1\r\n"), "{host}: {}", r.stdout);
        assert!(!r.stdout.contains("evil"), "{host}: {}", r.stdout);
    }
    // An absolute-form target's authority does not win either.
    let r = run(
        &bed.tb.client,
        "curl",
        &["-sS", "-i", "--max-time", "5", "--proxy", &format!("http://{VIP}:80"), "http://evil.example/x"],
        None,
    );
    assert!(r.stdout.contains("Location: https://shop.example.com/x\r\n"), "{}", r.stdout);
    assert!(bed.cluster.hits().is_empty());
}

/// Python's ssl module as the client: keep-alive requests over one connection, then a
/// second connection that resumes the first one's session (TLS 1.3 ticket).
const PYTHON_CLIENT: &str = r#"
import socket, ssl, sys
vip, ca = sys.argv[1], sys.argv[2]
ctx = ssl.create_default_context(cafile=ca)
ctx.set_alpn_protocols(["http/1.1"])
def conn(session=None):
    s = ctx.wrap_socket(socket.create_connection((vip, 443), timeout=10), server_hostname="shop.example", session=session)
    return s
def get(s, cookie):
    req = "GET /app/counter HTTP/1.1\r\nHost: shop.example\r\n" + (("Cookie: JSESSIONID=" + cookie + "\r\n") if cookie else "") + "\r\n"
    s.sendall(req.encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(4096)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < length:
        body += s.recv(4096)
    cookie_lines = [l for l in head.split(b"\r\n") if l.lower().startswith(b"set-cookie: jsessionid=")]
    new = cookie_lines[0].split(b"=", 1)[1].split(b";")[0].decode() if cookie_lines else cookie
    return head.split(b"\r\n")[0].decode(), body.decode(), new
s = conn()
cookie = None
for i in range(5):
    status, body, cookie = get(s, cookie)
    print(status, " ".join(f for f in body.split() if f.startswith("count=")), s.version(), s.selected_alpn_protocol())
session = s.session
s.close()
s = conn(session)
status, body, cookie = get(s, cookie)
print(status, " ".join(f for f in body.split() if f.startswith("count=")), "reused" if s.session_reused else "new")
s.close()
"#;

#[test]
fn python_ssl_clients_keep_their_session_and_resume() {
    let bed = https_testbed(2, shop_only, "");
    let ca = bed.pki.path("ca.pem").display().to_string();
    let r = run(&bed.tb.client, "python3", &["-c", PYTHON_CLIENT, VIP, &ca], None);
    assert!(r.ok, "{}\n{}", r.stdout, r.stderr);
    let lines: Vec<&str> = r.stdout.lines().collect();
    for (i, line) in lines.iter().take(5).enumerate() {
        assert_eq!(*line, format!("HTTP/1.1 200 OK count={} TLSv1.3 http/1.1", i + 1));
    }
    assert_eq!(lines[5], "HTTP/1.1 200 OK count=6 reused", "{}", r.stdout);
    let t = tls_status(&bed.tb, "shop");
    assert_eq!((t["handshakes_full"].as_u64(), t["handshakes_resumed"].as_u64()), (Some(1), Some(1)), "{t}");
}

/// A response larger than the socket buffers, to a client that reads slowly, arrives
/// whole on a keep-alive HTTPS connection, and the next request on it is answered (the
/// TLS layer's last bytes are flushed, not left until the next write).
#[test]
fn large_responses_over_https_arrive_whole_on_keep_alive() {
    let mut tb = Testbed::new(2, &[VIP]);
    tb.add_local_vip(VIP);
    let record = Arc::new(dispatcher_testbed::scripted::Record::default());
    tb.start_scripted(&record, BACKEND_PORT);
    let pki = Pki::new(&tb.workdir);
    let (cert, key) = pki.leaf("ca", "shop", "shop.example", &["shop.example"], 20);
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n[health]\npath = \"/health\"\n\n{}\n[[vip]]\nname = \"shop\"\naddress = \"{VIP}\"\nport = 443\nmode = \"http\"\nbackend_port = {BACKEND_PORT}\n[vip.tls]\n{}",
        tb.instance(),
        tb.backend_config(&[]),
        certificate_entry(&cert, &key, &[])
    );
    let path = tb.write_config(&text);
    tb.start_dispatcher(&path);
    let ca = pki.path("ca.pem").display().to_string();
    let r = run(
        &tb.client,
        "curl",
        &[
            "-sS",
            "--max-time",
            "30",
            "--limit-rate",
            "8M",
            "--cacert",
            &ca,
            "--resolve",
            &format!("shop.example:443:{VIP}"),
            "-o",
            "/dev/null",
            "-w",
            "%{size_download} %{num_connects}\n",
            "https://shop.example/big",
            "-o",
            "/dev/null",
            "https://shop.example/medium",
        ],
        None,
    );
    assert!(r.ok, "{}", r.stderr);
    assert_eq!(r.stdout, "16777216 1\n8000 0\n", "both whole, over one connection");
}
