//! `dispatcher reload` under load: backends and VIP members added and removed, weights
//! changed — no refused connection, no failed request, sessions kept; a bad file is
//! refused and the running configuration stays.

use std::{
    collections::HashMap,
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use dispatcher_testbed::{
    netns::{backend_ip, backend_mac, Testbed},
    websphere::{self, Client},
};

const VIP: &str = "10.99.100.50";
const PORT: u16 = 8080;

/// Backend blocks for the given (index, replica) pairs, and the HTTP VIP over `members`.
fn config(tb: &Testbed, backends: &[(usize, Option<usize>, u32)], members: &[usize]) -> String {
    // The per-source limits off: the client namespace plays every client, and two of its
    // threads open connections as fast as they can.
    let mut s = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nmax_connections_per_source = 0\nmax_connection_rate_per_source = 0\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n",
        tb.instance()
    );
    for &(i, replica, weight) in backends {
        s += &format!(
            "[[backend]]\nname = \"b{i}\"\naddress = \"{}\"\nmac = \"{}\"\nweight = {weight}\n",
            backend_ip(i),
            backend_mac(i)
        );
        if let Some(r) = replica {
            s += &format!("replica = \"b{r}\"\n");
        }
        s += "\n";
    }
    let names: Vec<String> = members.iter().map(|i| format!("\"b{i}\"")).collect();
    s += &format!(
        "[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\nbackend_port = {PORT}\nring_size = 1009\nbackends = [{}]\n",
        names.join(", ")
    );
    s
}

#[test]
fn reload_under_load_refuses_nothing_and_keeps_sessions() {
    let mut tb = Testbed::new(4, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(4);
    tb.start_websphere(&cluster, PORT);
    let path = tb.write_config(&config(&tb, &[(0, Some(1), 100), (1, Some(0), 100)], &[0, 1]));
    let cfg = path.to_str().unwrap().to_string();
    tb.start_dispatcher(&path);
    let addr: SocketAddr = format!("{VIP}:80").parse().unwrap();

    // Cookie-jar clients, and a client that opens a new connection for every request.
    let stop = Arc::new(AtomicBool::new(false));
    let failures = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for _ in 0..6 {
        let (stop, failures, done, ns) = (stop.clone(), failures.clone(), done.clone(), tb.client.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(&ns, addr);
            let mut last = 0u64;
            while !stop.load(Ordering::SeqCst) {
                match c.get("/app") {
                    Ok(r)
                        if r.status == 200
                            && r.field("count").and_then(|v| v.parse::<u64>().ok()) == Some(last + 1) =>
                    {
                        last += 1
                    }
                    other => {
                        failures.fetch_add(1, Ordering::SeqCst);
                        eprintln!("failed: {other:?}");
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(5));
            }
        }));
    }
    for _ in 0..2 {
        let (stop, failures, done, ns) = (stop.clone(), failures.clone(), done.clone(), tb.client.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let r = ns.run(move || TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map(|_| ()));
                if let Err(e) = r {
                    failures.fetch_add(1, Ordering::SeqCst);
                    eprintln!("connecting: {e}");
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(500));

    // The four backends in two replica pairs, b1 weighing 300.
    let reload_all_four = |tb: &Testbed| {
        let all = [(0, Some(1), 100), (1, Some(0), 300), (2, Some(3), 100), (3, Some(2), 100)];
        tb.write_config(&config(tb, &all, &[0, 1, 2, 3]));
        tb.dispatcher_cmd(&["reload", "--config", &cfg])
    };
    // 1: two backends added (new ids), members widened, a weight changed.
    let out = reload_all_four(&tb);
    assert!(out.contains("4 backends (0 retired)"), "{out}");
    std::thread::sleep(Duration::from_millis(600));
    let mut fresh_on: HashMap<String, usize> = HashMap::new();
    for _ in 0..12 {
        let mut f = Client::new(&tb.client, addr);
        *fresh_on.entry(f.get("/").unwrap().field("clone").unwrap().to_string()).or_default() += 1;
    }
    assert!(
        fresh_on.contains_key("clone2x") || fresh_on.contains_key("clone3x"),
        "new backends take new sessions: {fresh_on:?}"
    );

    // Reloads in a row with clients that reconnect for every request: the learned clone
    // table (there are no configured clone IDs here) is carried over before the new
    // listeners take a connection, so no session is ever balanced to a stranger.
    for _ in 0..4 {
        let (stop, failures, done, ns) = (stop.clone(), failures.clone(), done.clone(), tb.client.clone());
        threads.push(std::thread::spawn(move || {
            let mut c = Client::new(&ns, addr);
            let mut last = 0u64;
            while !stop.load(Ordering::SeqCst) {
                c.reconnect();
                match c.get("/app") {
                    Ok(r) if r.status == 200 && r.field("count").and_then(|v| v.parse().ok()) == Some(last + 1) => {
                        last += 1
                    }
                    other => {
                        failures.fetch_add(1, Ordering::SeqCst);
                        eprintln!("reconnecting client: {other:?}");
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(200));
    // A storm of reloads: every listener swap is a chance for a SYN or a queued
    // connection to meet a closed socket.
    for _ in 0..30 {
        let out = tb.dispatcher_cmd(&["reload", "--config", &cfg]);
        assert!(out.contains("reloaded"), "{out}");
        std::thread::sleep(Duration::from_millis(30));
    }

    // 2: b3 removed altogether (b2 loses its replica): retired, no new sessions.
    tb.write_config(&config(&tb, &[(0, Some(1), 100), (1, Some(0), 300), (2, None, 100)], &[0, 1, 2]));
    let out = tb.dispatcher_cmd(&["reload", "--config", &cfg]);
    assert!(out.contains("4 backends (1 retired)"), "{out}");
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..12 {
        let mut f = Client::new(&tb.client, addr);
        assert_ne!(f.get("/").unwrap().field("clone"), Some("clone3x"), "a removed backend takes no new session");
    }

    // 2b: b3 configured again: back in service, not left disabled by its retirement.
    let out = reload_all_four(&tb);
    assert!(out.contains("4 backends (0 retired)"), "{out}");
    std::thread::sleep(Duration::from_millis(600));
    let back =
        (0..12).filter(|_| Client::new(&tb.client, addr).get("/").unwrap().field("clone") == Some("clone3x")).count();
    assert!(back > 0, "the backend configured again takes new sessions");

    // 3: a broken file is refused; the agent keeps serving the last good configuration.
    tb.write_config("[dispatcher]\ninterface = \"eth0\"\n[[vip]]\nname = 3\n");
    let out =
        tb.lb.command(dispatcher_testbed::netns::dispatcher_bin()).args(["reload", "--config", &cfg]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reload refused"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::thread::sleep(Duration::from_millis(300));

    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert!(done.load(Ordering::SeqCst) > 200, "load ran");
    assert_eq!(
        failures.load(Ordering::SeqCst),
        0,
        "no refused connection, no failed request, no session lost across reloads"
    );
    let misroutes = cluster.misroutes();
    assert!(misroutes.is_empty(), "from the clones' logs: {misroutes:?}");
    // (The file is the broken one now: ask the agent itself.)
    let (_, body) = tb.admin("GET", "/status").expect("the agent answers");
    let st: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(st["counters"]["misroutes"], 0, "{st}");
}

/// A plugin-cfg.xml with the servers `servers` (one ServerCluster, one catch-all Route).
fn plugin_cfg(servers: &[usize]) -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\" encoding=\"ISO-8859-1\"?>\n<Config RefreshInterval=\"60\">\n\
         <VirtualHostGroup Name=\"default_host\"><VirtualHost Name=\"*:*\"/></VirtualHostGroup>\n\
         <ServerCluster LoadBalance=\"Round Robin\" Name=\"app_cluster\" RetryInterval=\"60\">\n",
    );
    for &i in servers {
        s += &format!(
            "<Server Name=\"b{i}\"><Transport Hostname=\"{}\" Port=\"{PORT}\" Protocol=\"http\"/></Server>\n",
            backend_ip(i)
        );
    }
    s += "</ServerCluster>\n<UriGroup Name=\"all\"><Uri Name=\"/*\"/></UriGroup>\n\
          <Route ServerCluster=\"app_cluster\" UriGroup=\"all\" VirtualHostGroup=\"default_host\"/>\n</Config>\n";
    s
}

/// `[http] plugin_config` is watched: a file replaced by rename (as deployment tools do)
/// is read again by itself, within `plugin_refresh`; a broken one is refused and the
/// running configuration stays (the reload contract); the file is re-read on `reload`.
#[test]
fn a_replaced_plugin_config_is_reloaded_and_a_broken_one_is_refused() {
    let mut tb = Testbed::new(2, &[VIP]);
    tb.add_local_vip(VIP);
    let cluster = websphere::Clones::new(2);
    tb.start_websphere(&cluster, PORT);
    let toml = format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nplugin_config = \"plugin-cfg.xml\"\nplugin_refresh = \"1s\"\n\n[health]\npath = \"/health\"\ninterval = \"200ms\"\n\n[[vip]]\nname = \"app\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\n",
        tb.instance()
    );
    let path = tb.write_config(&toml);
    let xml = path.with_file_name("plugin-cfg.xml");
    let replace = |text: &str| {
        let new = path.with_file_name("plugin-cfg.xml.new");
        std::fs::write(&new, text).unwrap();
        std::fs::rename(&new, &xml).unwrap();
    };
    replace(&plugin_cfg(&[0]));
    tb.start_dispatcher(&path);
    let served = |tb: &Testbed| -> Vec<String> {
        let (_, body) = tb.admin("GET", "/status").expect("the agent answers");
        let st: serde_json::Value = serde_json::from_str(&body).unwrap();
        let list = st["backends"].as_array().cloned().unwrap_or_default();
        list.iter().filter(|b| b["state"] != "retired").filter_map(|b| b["name"].as_str().map(String::from)).collect()
    };
    assert_eq!(served(&tb), ["b0"]);

    // Replaced by rename with a server more: read again by itself.
    replace(&plugin_cfg(&[0, 1]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while served(&tb) != ["b0", "b1"] && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(served(&tb), ["b0", "b1"], "{}", tb.log("dispatcher"));
    assert!(tb.log("dispatcher").contains("plugin_config changed: reloading"), "{}", tb.log("dispatcher"));

    // Broken: refused, with the file's line; the running configuration stays.
    replace("<Config>\n<Route ServerCluster=\"nope\" UriGroup=\"all\" VirtualHostGroup=\"x\"/>\n</Config>\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !tb.log("dispatcher").contains("reload refused") && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = tb.log("dispatcher");
    assert!(log.contains("reload refused") && log.contains("plugin-cfg.xml:2: Route names ServerCluster"), "{log}");
    assert_eq!(served(&tb), ["b0", "b1"], "the last good configuration stays");
    // `dispatcher reload` reads it too, and says why it refuses.
    let out = tb
        .lb
        .command(dispatcher_testbed::netns::dispatcher_bin())
        .args(["reload", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("plugin-cfg.xml:2:"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Fixed: read again by itself.
    let reloads = |tb: &Testbed| tb.log("dispatcher").matches("configuration reloaded").count();
    let before = reloads(&tb);
    replace(&plugin_cfg(&[1, 0]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while reloads(&tb) == before && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(reloads(&tb), before + 1, "{}", tb.log("dispatcher"));
}
