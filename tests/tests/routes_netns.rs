//! Several applications behind one address (issue 28): a cell of three farms routed by
//! virtual host and URI from WebSphere's own plugin-cfg.xml (tests/fixtures/
//! plugin-cfg-cell.xml, filled in with the testbed's addresses), the WebSphere-like clones
//! of each application behind them, each with its own session cookie name.
//!
//! - shop_cluster: shopNode1_shop1 .. shopNode2_shop4 (backends b0..b3, replica pairs
//!   shop1-shop2 and shop3-shop4), `shop.example:*` and `www.shop.example:80`, `/shop/*`,
//!   `*.jsp`, cookie JSESSIONID;
//! - admin_cluster: admin1, admin2 (b4, b5, a replica pair), `admin.example:80|443`,
//!   `/admin/*`, cookie ADMINSESSIONID;
//! - portal_cluster, the catch-all: portal1, portal2 (b6, b7, a replica pair) and the
//!   backup portal3 (b8), `*:80` and more, `/shop/static/*` and `/*`, cookie JSESSIONID.
//!
//! What is checked comes from the clones' own logs and counters (which application and
//! clone served each request, with which session) and from what the clients saw.

use std::{
    collections::HashMap,
    net::SocketAddr,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use dispatcher_testbed::{
    netns::{backend_ip, backend_mac, dispatcher_bin, Testbed},
    websphere::{Client, Clones, Load, Response, Seen},
};

const VIP: &str = "10.99.100.60";
const HOLD: Duration = Duration::from_secs(3);
const SERVER_TIMEOUT: Duration = Duration::from_secs(1);
/// WebSphere's generated file, with `@HOST_<server>@`, `@PORT_<cluster>@` and
/// `@REFRESH@` to fill in.
const FIXTURE: &str = include_str!("../fixtures/plugin-cfg-cell.xml");

const SHOP: usize = 0;
const ADMIN: usize = 1;
const PORTAL: usize = 2;

/// One application of the cell: its farm (ServerCluster), its servers' HTTP port, its
/// session cookie, and its servers (name, clone ID) in clone order (pairs 0-1, 2-3).
struct App {
    name: &'static str,
    farm: &'static str,
    port: u16,
    cookie: &'static str,
    servers: &'static [(&'static str, &'static str)],
}

const APPS: [App; 3] = [
    App {
        name: "shop",
        farm: "shop_cluster",
        port: 9080,
        cookie: "JSESSIONID",
        servers: &[
            ("shopNode1_shop1", "17i4s2l1f"),
            ("shopNode2_shop2", "17i4s2m5g"),
            ("shopNode1_shop3", "17i4s3a0k"),
            ("shopNode2_shop4", "17i4s3b9p"),
        ],
    },
    App {
        name: "admin",
        farm: "admin_cluster",
        port: 9081,
        cookie: "ADMINSESSIONID",
        servers: &[("adminNode1_admin1", "18ad10c2a"), ("adminNode2_admin2", "18ad10d3b")],
    },
    App {
        name: "portal",
        farm: "portal_cluster",
        port: 9082,
        cookie: "JSESSIONID",
        servers: &[
            ("portalNode1_portal1", "19p0r7a11"),
            ("portalNode2_portal2", "19p0r7b22"),
            ("portalDR_portal3", "19p0r7c33"),
        ],
    },
];

/// The testbed backend a server runs on: the applications' servers in order.
fn backend_of(app: usize, me: usize) -> usize {
    APPS[..app].iter().map(|a| a.servers.len()).sum::<usize>() + me
}

fn server_count() -> usize {
    APPS.iter().map(|a| a.servers.len()).sum()
}

/// Replica pairs the TOML adds to what plugin-cfg.xml says (it cannot say them): the
/// clones' pairs, 0-1 and 2-3 of each application.
fn replica_pairs() -> Vec<(&'static str, &'static str)> {
    let mut v = Vec::new();
    for a in &APPS {
        for pair in a.servers.chunks(2) {
            if let [(x, _), (y, _)] = pair {
                v.push((*x, *y));
                v.push((*y, *x));
            }
        }
    }
    v
}

/// The fixture (or a variant of it) with the testbed's addresses and ports, re-read
/// every second.
fn render(template: &str) -> String {
    let mut s = template.replace("@REFRESH@", "1");
    for (a, app) in APPS.iter().enumerate() {
        s = s.replace(&format!("@PORT_{}@", app.farm), &app.port.to_string());
        for (me, (name, _)) in app.servers.iter().enumerate() {
            s = s.replace(&format!("@HOST_{name}@"), &backend_ip(backend_of(a, me)).to_string());
        }
    }
    assert!(!s.contains("=\"@"), "a placeholder left in the fixture");
    s
}

/// The file's bytes: WebSphere writes ISO-8859-1 (every character of the fixture is in it).
fn latin1(text: &str) -> Vec<u8> {
    text.chars().map(|c| u8::try_from(u32::from(c)).expect("a Latin-1 character")).collect()
}

/// The cell: a testbed with one backend per server, each application's clones on their
/// backends, and the agent in front.
struct Cell {
    tb: Testbed,
    apps: Vec<Arc<Clones>>,
    /// The agent's TOML file.
    cfg: String,
    /// plugin-cfg.xml (plugin mode).
    xml: PathBuf,
    addr: SocketAddr,
}

/// The agent's settings common to both forms: fast health checks and a short hold.
fn head(tb: &Testbed, http_extra: &str) -> String {
    format!(
        "[dispatcher]\ninterface = \"eth0\"\ninstance = \"{}\"\n\n[http]\nhold_time = \"{}ms\"\nserver_timeout = \"{}ms\"\nmax_connections_per_source = 0\nmax_connection_rate_per_source = 0\n{http_extra}\n[health]\npath = \"/health\"\ninterval = \"200ms\"\ntimeout = \"300ms\"\nrise = 2\nfall = 2\n\n",
        tb.instance(),
        HOLD.as_millis(),
        SERVER_TIMEOUT.as_millis(),
    )
}

/// The VIP: HTTP on port 80, no backends of its own (the routes say where requests go).
fn vip_section() -> String {
    format!("[[vip]]\nname = \"web\"\naddress = \"{VIP}\"\nport = 80\nmode = \"http\"\n")
}

impl Cell {
    fn start_clones() -> (Testbed, Vec<Arc<Clones>>) {
        let mut tb = Testbed::new(server_count(), &[VIP]);
        tb.add_local_vip(VIP);
        let mut apps = Vec::new();
        for (a, app) in APPS.iter().enumerate() {
            let ids: Vec<&str> = app.servers.iter().map(|(_, id)| *id).collect();
            let clones = Clones::app(app.name, &ids, app.cookie);
            for me in 0..ids.len() {
                tb.start_clone(&clones, me, backend_of(a, me), app.port);
            }
            apps.push(clones);
        }
        (tb, apps)
    }

    /// `[http] plugin_config`: farms, routes and servers from plugin-cfg.xml; the TOML
    /// adds the VIP, the replica pairs and the health checks.
    fn plugin() -> Cell {
        let (tb, apps) = Cell::start_clones();
        let xml = tb.workdir.join("plugin-cfg.xml");
        let mut cell = Cell {
            cfg: tb.workdir.join("dispatcher.toml").to_str().unwrap().to_string(),
            xml,
            tb,
            apps,
            addr: format!("{VIP}:80").parse().unwrap(),
        };
        cell.write_xml(&cell.render(FIXTURE));
        cell.tb.write_config(&cell.plugin_toml());
        let path = PathBuf::from(&cell.cfg);
        cell.tb.start_dispatcher(&path);
        cell.wait_up();
        cell
    }

    /// The same cell in TOML alone: `[[backend]]`, `[[farm]]` and `[[route]]`.
    fn toml_only() -> Cell {
        let (tb, apps) = Cell::start_clones();
        let mut s = head(&tb, "");
        let pairs: HashMap<_, _> = replica_pairs().into_iter().collect();
        for (a, app) in APPS.iter().enumerate() {
            for (me, (name, id)) in app.servers.iter().enumerate() {
                let b = backend_of(a, me);
                s += &format!(
                    "[[backend]]\nname = \"{name}\"\naddress = \"{}\"\nmac = \"{}\"\nclone_ids = [\"{id}\"]\n",
                    backend_ip(b),
                    backend_mac(b)
                );
                if let Some(r) = pairs.get(name) {
                    s += &format!("replica = \"{r}\"\n");
                }
                s += "\n";
            }
        }
        let farm = |a: usize, primaries: &[&str], backups: &[&str], balance: &str| {
            let list = |v: &[&str]| v.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ");
            let mut f = format!(
                "[[farm]]\nname = \"{}\"\nservers = [{}]\nbalance = \"{balance}\"\nport = {}\n",
                APPS[a].farm,
                list(primaries),
                APPS[a].port
            );
            if !backups.is_empty() {
                f += &format!("backup_servers = [{}]\n", list(backups));
            }
            f + "\n"
        };
        let names = |a: usize| APPS[a].servers.iter().map(|(n, _)| *n).collect::<Vec<_>>();
        s += &farm(SHOP, &names(SHOP), &[], "round_robin");
        s += &farm(ADMIN, &names(ADMIN), &[], "random");
        s += &farm(PORTAL, &names(PORTAL)[..2], &names(PORTAL)[2..], "round_robin");
        s += "[[route]]\nhosts = [\"shop.example:*\", \"www.shop.example:80\"]\nuris = [\"/shop/*\", \"*.jsp\", \"*.jsv\", \"*.jsw\", \"/shop/j_security_check\"]\nfarm = \"shop_cluster\"\n\n";
        s += "[[route]]\nhosts = [\"admin.example:80\", \"admin.example:443\"]\nuris = [\"/admin/*\", \"/admin/*.do\"]\nfarm = \"admin_cluster\"\ncookie = \"ADMINSESSIONID\"\nurl_parameter = \"adminsessionid\"\n\n";
        s += "[[route]]\nvips = [\"web\"]\nhosts = [\"*:80\", \"*:443\", \"*:9080\", \"*:9443\"]\nuris = [\"/shop/static/*\", \"/*\"]\nfarm = \"portal_cluster\"\ncookie = \"JSESSIONID\"\n\n";
        s += &vip_section();
        let path = tb.write_config(&s);
        let mut cell = Cell {
            cfg: path.to_str().unwrap().to_string(),
            xml: PathBuf::new(),
            tb,
            apps,
            addr: format!("{VIP}:80").parse().unwrap(),
        };
        cell.tb.start_dispatcher(&path);
        cell.wait_up();
        cell
    }

    /// The TOML of plugin mode: a `[[backend]]` of a Server's name is that server, and
    /// adds what the file cannot say (its replica, its MAC; its address as the file has
    /// it); clone IDs, weights and ports come from the file.
    fn plugin_toml(&self) -> String {
        let mut s = head(&self.tb, &format!("plugin_config = \"{}\"\n", self.xml.display()));
        let pairs: HashMap<_, _> = replica_pairs().into_iter().collect();
        for (a, app) in APPS.iter().enumerate() {
            for (me, (name, _)) in app.servers.iter().enumerate() {
                let b = backend_of(a, me);
                s += &format!(
                    "[[backend]]\nname = \"{name}\"\naddress = \"{}\"\nmac = \"{}\"\n",
                    backend_ip(b),
                    backend_mac(b)
                );
                if let Some(r) = pairs.get(name) {
                    s += &format!("replica = \"{r}\"\n");
                }
                s += "\n";
            }
        }
        s + &vip_section()
    }

    fn render(&self, template: &str) -> String {
        render(template)
    }

    /// Replaces plugin-cfg.xml as deployment tools do: a new file renamed over it.
    fn write_xml(&self, text: &str) {
        let tmp = self.xml.with_extension("xml.new");
        std::fs::write(&tmp, latin1(text)).unwrap();
        std::fs::rename(&tmp, &self.xml).unwrap();
    }

    /// Until every server answers through the agent's health checks (a request to each
    /// farm succeeds).
    fn wait_up(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for (host, path) in [("shop.example", "/shop/up"), ("admin.example", "/admin/up"), ("www.example", "/up")] {
            loop {
                let r = self.get(host, path, "JSESSIONID");
                if r.as_ref().is_ok_and(|r| r.status == 200) {
                    break;
                }
                assert!(Instant::now() < deadline, "{host}{path}: {r:?}\n{}", self.tb.log("dispatcher"));
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        // Those requests are not part of what the tests count.
        for a in &self.apps {
            a.log.lock().unwrap().clear();
        }
    }

    fn client(&self, host: &str, cookie: &str) -> Client {
        Client::new(&self.tb.client, self.addr).with_host(host).with_cookie(cookie)
    }

    /// One request from a new client (no session).
    fn get(&self, host: &str, path: &str, cookie: &str) -> std::io::Result<Response> {
        self.client(host, cookie).get(path)
    }

    /// The server `name` dies (kill -9).
    fn kill(&mut self, app: usize, me: usize) {
        self.tb.kill_servers_of(backend_of(app, me));
        self.apps[app].kill(me);
    }

    /// It starts again and gets its sessions' copies back from its peer.
    fn revive(&mut self, app: usize, me: usize) {
        self.apps[app].revive(me);
        let clones = self.apps[app].clone();
        self.tb.start_clone(&clones, me, backend_of(app, me), APPS[app].port);
    }

    /// The sum of a metric's samples (any labels) in the agent's exposition.
    fn metric(&self, name: &str) -> u64 {
        let text = self.tb.dispatcher_cmd(&["metrics", "--config", &self.cfg]);
        text.lines()
            .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ') || r.starts_with('{')))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// `dispatcher reload`: (exit code, stdout, stderr).
    fn reload(&self) -> (Option<i32>, String, String) {
        let out = self.tb.lb.command(dispatcher_bin()).args(["reload", "--config", &self.cfg]).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn assert_no_misroute(&self) {
        for (a, clones) in self.apps.iter().enumerate() {
            let m = clones.misroutes();
            assert!(m.is_empty(), "{}: {m:?}", APPS[a].name);
        }
    }
}

/// Where each (Host, path) must go: an application, or nowhere (404).
const TABLE: &[(&str, &str, Option<usize>)] = &[
    // shop_host: /shop/* and *.jsp.
    ("shop.example", "/shop/cart", Some(SHOP)),
    ("shop.example:80", "/shop/catalog/item?id=3", Some(SHOP)),
    ("SHOP.Example", "/shop/cart", Some(SHOP)),
    ("www.shop.example", "/index.jsp", Some(SHOP)),
    ("shop.example", "/shop/j_security_check", Some(SHOP)),
    // The most specific URI wins: portal's /shop/static/* over shop's /shop/*, shop's
    // *.jsp over portal's /*.
    ("shop.example", "/shop/static/logo.png", Some(PORTAL)),
    ("shop.example", "/portal/home.jsp", Some(SHOP)),
    ("shop.example", "/about.html", Some(PORTAL)),
    // A host AND a URI: /admin/* on a host of admin_host only; *.jsp on shop_host only.
    ("admin.example", "/admin/users", Some(ADMIN)),
    ("admin.example", "/admin/edit.do", Some(ADMIN)),
    ("admin.example", "/shop/cart", Some(PORTAL)),
    ("admin.example", "/console.jsp", Some(PORTAL)),
    ("www.example", "/", Some(PORTAL)),
    ("www.example", "/admin/users", Some(PORTAL)),
    ("www.example:9080", "/any", Some(PORTAL)),
    // shop.example:* takes any port; nothing else takes 8080 or 8081.
    ("shop.example:8080", "/shop/cart", Some(SHOP)),
    ("shop.example:8080", "/about.html", None),
    ("www.example:8081", "/", None),
    ("admin.example:8443", "/admin/users", None),
];

/// Every request of `TABLE` reaches its application, with its path as sent, and sets
/// that application's cookie; the others get a short 404, each counted.
fn each_request_reaches_its_farm(cell: &Cell) {
    let no_route_before = cell.metric("dispatcher_no_route_total");
    let mut refused = 0;
    for &(host, path, want) in TABLE {
        let r = cell.get(host, path, "JSESSIONID").unwrap_or_else(|e| panic!("{host} {path}: {e}"));
        match want {
            Some(a) => {
                assert_eq!(r.status, 200, "{host} {path}: {r:?}");
                assert_eq!(r.field("app"), Some(APPS[a].name), "{host} {path} went to the wrong farm: {r:?}");
                assert_eq!(r.field("path"), Some(path), "{host} {path}: the path as sent");
                let set = r.header("set-cookie").unwrap_or("");
                assert!(set.starts_with(&format!("{}=", APPS[a].cookie)), "{host} {path}: {set}");
            }
            None => {
                refused += 1;
                assert_eq!(r.status, 404, "{host} {path}: no route is a 404: {r:?}");
                assert!(!r.body.is_empty() && r.body.len() < 256, "a short body: {:?}", r.body);
                assert!(r.field("app").is_none(), "no application saw it: {r:?}");
            }
        }
    }
    let counted = cell.metric("dispatcher_no_route_total") - no_route_before;
    assert_eq!(counted, refused, "dispatcher_no_route_total counts every 404 for want of a route");

    // Sessions under each application's own cookie name stick to their clone.
    for (host, path, a) in [("shop.example", "/shop/cart", SHOP), ("admin.example", "/admin/x", ADMIN)] {
        let mut c = cell.client(host, APPS[a].cookie);
        let first = c.get(path).unwrap();
        assert!(c.jar.is_some(), "{} sets {}: {first:?}", APPS[a].name, APPS[a].cookie);
        for n in 2..=6 {
            let r = c.get(path).unwrap();
            assert_eq!((r.field("clone"), r.field("count")), (first.field("clone"), Some(n.to_string().as_str())));
        }
    }

    cell.assert_no_misroute();

    // A cookie naming a clone of another farm is not followed out of the route's farm:
    // the request is balanced within it, where no clone knows the session (the
    // application starts a new one).
    let shop_hits = cell.apps[SHOP].hits().len();
    let shop_clone = APPS[SHOP].servers[0].1;
    let mut foreign = cell.client("www.example", "JSESSIONID");
    foreign.jar = Some(format!("0000Sforeign0000ABCDEFGHIJ:{shop_clone}"));
    let r = foreign.get("/portal/page").unwrap();
    assert_eq!((r.status, r.field("app"), r.field("lost")), (200, Some("portal"), Some("1")), "{r:?}");
    let mut foreign = cell.client("admin.example", "ADMINSESSIONID");
    foreign.jar = Some(format!("0000Sforeign0001ABCDEFGHIJ:{shop_clone}"));
    let r = foreign.get("/admin/page").unwrap();
    assert_eq!((r.status, r.field("app"), r.field("lost")), (200, Some("admin"), Some("1")), "{r:?}");
    assert_eq!(cell.apps[SHOP].hits().len(), shop_hits, "nothing reached the shop's clones");
}

#[test]
fn each_request_reaches_its_farm_by_host_and_uri_from_plugin_cfg() {
    let cell = Cell::plugin();
    each_request_reaches_its_farm(&cell);
}

/// The TOML-only form ([[farm]] and [[route]], no plugin_config) routes alike.
#[test]
fn toml_farms_and_routes_without_plugin_config_route_alike() {
    let cell = Cell::toml_only();
    each_request_reaches_its_farm(&cell);
}

/// Load on the three applications: `per_app[a]` clients with cookie jars on application
/// `a`. Each client's application, with the load.
fn start_load(cell: &Cell, per_app: [usize; 3]) -> (Vec<usize>, Load) {
    let mut apps = Vec::new();
    let mut clients = Vec::new();
    for (a, &n) in per_app.iter().enumerate() {
        for k in 0..n {
            let (host, path) = match a {
                SHOP => ("shop.example", format!("/shop/cart/{k}")),
                ADMIN => ("admin.example", format!("/admin/page{k}.do")),
                _ => ("www.example", format!("/portal/{k}")),
            };
            apps.push(a);
            clients.push((cell.client(host, APPS[a].cookie), path));
        }
    }
    (apps, Load::start(clients))
}

/// What each client saw, with its application.
fn finish(load: (Vec<usize>, Load)) -> Vec<(usize, Vec<Seen>)> {
    let (apps, load) = load;
    apps.into_iter().zip(load.finish()).collect()
}

/// Each client's answers came from its own application, and its session counter went on
/// without a loss: never back, and a step of more than one only over failed requests.
fn assert_sessions_kept(seen: &[(usize, Vec<Seen>)]) {
    for (k, (a, s)) in seen.iter().enumerate() {
        let (mut last, mut allowed) = (0u64, 0u64);
        for x in s {
            if x.status != 200 {
                allowed += 1;
                continue;
            }
            assert_eq!(x.app, APPS[*a].name, "client {k} of {} answered by another farm: {x:?}", APPS[*a].name);
            assert!(!x.lost, "client {k} of {}: session lost", APPS[*a].name);
            assert!(x.count > last, "client {k} of {}: counter back from {last} to {}", APPS[*a].name, x.count);
            let extra = x.count - last - 1;
            assert!(extra <= allowed, "client {k}: counter {last} -> {} over {allowed} failures", x.count);
            allowed -= extra;
            last = x.count;
        }
        assert!(last > 5, "client {k} of {} made progress", APPS[*a].name);
    }
}

fn failures(seen: &[(usize, Vec<Seen>)], app: usize) -> Vec<Seen> {
    seen.iter().filter(|(a, _)| *a == app).flat_map(|(_, s)| s.iter().filter(|x| x.status != 200).cloned()).collect()
}

/// Of the clients of `app` served by clone `from` at some point: how many, and how many
/// ended on `to`.
fn moved(seen: &[(usize, Vec<Seen>)], app: usize, from: &str, to: &str) -> (usize, usize) {
    let of_app = seen.iter().filter(|(a, _)| *a == app).map(|(_, s)| s);
    let were: Vec<_> = of_app.filter(|s| s.iter().any(|x| x.clone == from)).collect();
    let ended = were.iter().filter(|s| s.iter().rev().find(|x| x.status == 200).is_some_and(|x| x.clone == to)).count();
    (were.len(), ended)
}

/// Under load on the three applications, a shop server and an admin server die: their
/// sessions go on at their replicas, inside their farms, with their data; no request of
/// any session reaches a clone that is neither its owner nor its replica; the portal,
/// whose servers are all well, sees no failure at all.
#[test]
fn affinity_and_failover_stay_inside_each_farm_under_load() {
    let mut cell = Cell::plugin();
    let load = start_load(&cell, [8, 8, 6]);
    std::thread::sleep(Duration::from_millis(1500));
    cell.kill(SHOP, 0);
    cell.kill(ADMIN, 1);
    std::thread::sleep(Duration::from_millis(3500));
    let seen = finish(load);

    cell.assert_no_misroute();
    assert_sessions_kept(&seen);
    let bound = HOLD + SERVER_TIMEOUT + Duration::from_secs(1);
    for (_, s) in &seen {
        for x in s {
            assert!(x.status == 200 || (500..600).contains(&x.status), "a request ended without a 5xx: {x:?}");
            assert!(x.took < bound, "a request took {:?}", x.took);
        }
    }
    assert!(failures(&seen, PORTAL).is_empty(), "a death in another farm changes nothing in the portal");
    for app in [SHOP, ADMIN] {
        let f = failures(&seen, app).len();
        assert!(f <= 8, "{}: at most the requests in flight on the dead server fail: {f}", APPS[app].name);
    }
    let shop = APPS[SHOP].servers;
    let (were, ended) = moved(&seen, SHOP, shop[0].1, shop[1].1);
    assert!(were >= 1 && ended == were, "{ended} of {were} sessions of shop1 went on at shop2");
    let admin = APPS[ADMIN].servers;
    let (were, ended) = moved(&seen, ADMIN, admin[1].1, admin[0].1);
    assert_eq!(ended, were, "{ended} of {were} sessions of admin2 went on at admin1");
    // The agent's own count agrees.
    let st: serde_json::Value =
        serde_json::from_str(&cell.tb.dispatcher_cmd(&["status", "--config", &cell.cfg, "--json"])).unwrap();
    assert_eq!(st["agent"]["counters"]["misroutes"], 0, "{st}");
}

/// New sessions (fresh clients) to the portal: which clone served each, out of `n`.
fn portal_clones(cell: &Cell, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let r = cell.get("www.example", "/portal/new", "JSESSIONID").unwrap();
            if r.status == 200 {
                r.field("clone").unwrap_or("").to_string()
            } else {
                format!("status {}", r.status)
            }
        })
        .collect()
}

/// portal3 is a backup server: it gets nothing while portal1 or portal2 is up, takes
/// the new sessions once both are down, and gets nothing new once a primary is back.
#[test]
fn backups_serve_only_when_every_primary_is_down() {
    let mut cell = Cell::plugin();
    let backup = APPS[PORTAL].servers[2].1;
    let on_backup = |cell: &Cell| cell.apps[PORTAL].hits().iter().filter(|h| h.backend == 2).count();

    let seen = portal_clones(&cell, 24);
    assert!(seen.iter().all(|c| c == APPS[PORTAL].servers[0].1 || c == APPS[PORTAL].servers[1].1), "{seen:?}");
    assert_eq!(on_backup(&cell), 0, "the backup got requests while both primaries were up");

    // One primary down: the other takes everything, still nothing for the backup.
    cell.kill(PORTAL, 0);
    std::thread::sleep(Duration::from_millis(1200));
    let seen = portal_clones(&cell, 16);
    assert!(seen.iter().all(|c| c == APPS[PORTAL].servers[1].1), "{seen:?}");
    assert_eq!(on_backup(&cell), 0, "the backup got requests while portal2 was up");

    // Both down: the backup takes over.
    cell.kill(PORTAL, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while portal_clones(&cell, 1)[0] != backup {
        assert!(Instant::now() < deadline, "the backup never took over:\n{}", cell.tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = portal_clones(&cell, 12);
    assert!(seen.iter().all(|c| c == backup), "every new session on the backup: {seen:?}");

    // A primary back: new sessions leave the backup.
    cell.revive(PORTAL, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while portal_clones(&cell, 1)[0] != APPS[PORTAL].servers[0].1 {
        assert!(Instant::now() < deadline, "portal1 never came back:\n{}", cell.tb.log("dispatcher"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let before = on_backup(&cell);
    let seen = portal_clones(&cell, 12);
    assert!(seen.iter().all(|c| c == APPS[PORTAL].servers[0].1), "{seen:?}");
    assert_eq!(on_backup(&cell), before, "the backup got new sessions with a primary up again");
    // Another farm never noticed.
    let r = cell.get("shop.example", "/shop/cart", "JSESSIONID").unwrap();
    assert_eq!((r.status, r.field("app")), (200, Some("shop")));
    cell.assert_no_misroute();
}

/// The fixture with one more application route: `/orders/*` on shop_host to the shop.
fn with_orders_route(template: &str) -> String {
    let group = "   <UriGroup Name=\"shop_host_orders_URIs\">\n      <Uri AffinityCookie=\"JSESSIONID\" AffinityURLIdentifier=\"jsessionid\" Name=\"/orders/*\"/>\n   </UriGroup>\n";
    let route = "   <Route ServerCluster=\"shop_cluster\" UriGroup=\"shop_host_orders_URIs\" VirtualHostGroup=\"shop_host\"/>\n";
    let at = template.find("   <Route ").expect("a Route in the fixture");
    let mut s = template.to_string();
    s.insert_str(at, &format!("{group}{route}"));
    s
}

/// The fixture without server `name` (its Server element and its PrimaryServers entry).
fn without_server(template: &str, name: &str) -> String {
    let start = template
        .match_indices("      <Server CloneID=")
        .map(|(i, _)| i)
        .find(|&i| template[i..].lines().next().is_some_and(|l| l.contains(&format!("Name=\"{name}\""))))
        .unwrap_or_else(|| panic!("{name} in the fixture"));
    let end = start + template[start..].find("</Server>\n").unwrap() + "</Server>\n".len();
    let s = format!("{}{}", &template[..start], &template[end..]);
    let entry = format!("         <Server Name=\"{name}\"/>\n");
    assert!(s.contains(&entry));
    s.replace(&entry, "")
}

/// Until `host``path` is answered by application `app` (at most 10 s: the file is
/// re-read every second).
fn wait_routed(cell: &Cell, host: &str, path: &str, app: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = cell.get(host, path, "JSESSIONID").unwrap();
        if r.status == 200 && r.field("app") == Some(APPS[app].name) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{host}{path} never went to {}: {r:?}\n{}",
            APPS[app].name,
            cell.tb.log("dispatcher")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// WebSphere regenerates plugin-cfg.xml under load: a route is added (picked up on its
/// own, the file replaced by rename), then a server is removed (and `dispatcher reload`
/// run; the operator's TOML is left as it was, as it would be when WebSphere regenerates
/// the file). Not one request fails. Every session not on the removed server goes on
/// without a loss or a misroute; the removed server takes no request after the reload,
/// and its sessions go on in the shop farm (kept by its replica, or started anew there:
/// which of the two is reported, not imposed: the file no longer says whose they were).
#[test]
fn the_file_rewritten_under_load_fails_no_request() {
    let cell = Cell::plugin();
    let r = cell.get("shop.example", "/orders/1", "JSESSIONID").unwrap();
    assert_eq!(r.field("app"), Some("portal"), "before: the catch-all: {r:?}");
    let load = start_load(&cell, [8, 4, 4]);
    std::thread::sleep(Duration::from_millis(1000));

    // 1: a route added.
    let added = with_orders_route(FIXTURE);
    cell.write_xml(&cell.render(&added));
    wait_routed(&cell, "shop.example", "/orders/1", SHOP);
    std::thread::sleep(Duration::from_millis(500));

    // 2: shopNode2_shop4 removed from the file.
    let gone = APPS[SHOP].servers[3];
    let on_gone = |cell: &Cell| cell.apps[SHOP].hits().iter().filter(|h| h.backend == 3).count();
    cell.write_xml(&cell.render(&without_server(&added, gone.0)));
    let (code, out, err) = cell.reload();
    assert_eq!(code, Some(0), "reload: {out}{err}");
    std::thread::sleep(Duration::from_millis(1000));
    let settled = on_gone(&cell);
    for _ in 0..16 {
        let r = cell.get("shop.example", "/shop/new", "JSESSIONID").unwrap();
        assert_eq!((r.status, r.field("app")), (200, Some("shop")), "{r:?}");
        assert_ne!(r.field("clone"), Some(gone.1), "a removed server takes no new session");
    }
    std::thread::sleep(Duration::from_millis(1000));
    let seen = finish(load);

    for app in [SHOP, ADMIN, PORTAL] {
        let f = failures(&seen, app);
        assert!(f.is_empty(), "{}: {} failed requests: {:?}", APPS[app].name, f.len(), &f[..f.len().min(5)]);
    }
    assert_eq!(on_gone(&cell), settled, "requests reached the removed server after the reload");
    // The clients whose session was on the removed server, and the others.
    let (were_on_gone, others): (Vec<_>, Vec<_>) =
        seen.into_iter().partition(|(a, s)| *a == SHOP && s.iter().any(|x| x.clone == gone.1));
    assert_sessions_kept(&others);
    for (a, s) in &were_on_gone {
        assert!(s.iter().all(|x| x.app == APPS[*a].name), "a session of the removed server left the shop farm");
    }
    let kept = were_on_gone.iter().filter(|(_, s)| s.iter().all(|x| !x.lost)).count();
    eprintln!("sessions of the removed server: {kept} of {} kept (by its replica)", were_on_gone.len());
    for (a, clones) in cell.apps.iter().enumerate() {
        // Requests whose cookie named the removed server may have found no copy where
        // they were balanced; nothing else may.
        let m: Vec<_> = clones.misroutes().into_iter().filter(|m| !(a == SHOP && m.contains(gone.1))).collect();
        assert!(m.is_empty(), "{}: {m:?}", APPS[a].name);
    }
    // The route added stayed.
    wait_routed(&cell, "shop.example", "/orders/2", SHOP);
}

/// `text` names line `line` of plugin-cfg.xml (`plugin-cfg.xml:<line>`, or `line <line>`).
fn names_line(text: &str, line: usize) -> bool {
    text.contains(&format!("plugin-cfg.xml:{line}")) || text.contains(&format!("line {line}"))
}

/// The line (1-based) of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines().position(|l| l.contains(needle)).expect("the needle") + 1
}

/// A plugin-cfg.xml that fails to validate (a Route naming no ServerCluster) or to parse
/// (cut short, as a file caught half-written) keeps the routes in force; the refresh and
/// `dispatcher reload` say why, with the line; a good file afterwards is taken.
#[test]
fn a_broken_file_keeps_the_old_routes_and_says_why() {
    let cell = Cell::plugin();
    let probe = |cell: &Cell| {
        for &(host, path, want) in TABLE.iter().filter(|t| t.2.is_some()).take(6) {
            let r = cell.get(host, path, "JSESSIONID").unwrap();
            assert_eq!((r.status, r.field("app")), (200, Some(APPS[want.unwrap()].name)), "{host}{path}: {r:?}");
        }
    };
    probe(&cell);

    // A Route to a ServerCluster the file does not define, and the orders route with it.
    let bad = with_orders_route(FIXTURE).replace(
        "<Route ServerCluster=\"shop_cluster\" UriGroup=\"shop_host_orders_URIs\"",
        "<Route ServerCluster=\"orders_cluster\" UriGroup=\"shop_host_orders_URIs\"",
    );
    let bad = cell.render(&bad);
    let line = line_of(&bad, "orders_cluster");
    cell.write_xml(&bad);
    std::thread::sleep(Duration::from_millis(3000));
    probe(&cell);
    let r = cell.get("shop.example", "/orders/1", "JSESSIONID").unwrap();
    assert_eq!(r.field("app"), Some("portal"), "the broken file's route is not in force: {r:?}");
    let log = cell.tb.log("dispatcher");
    assert!(
        log.lines().any(|l| l.contains("plugin-cfg.xml") && names_line(l, line)),
        "the refresh says why, with the file and line {line}:\n{log}"
    );
    let (code, out, err) = cell.reload();
    assert_eq!(code, Some(1), "reload of a broken file: {out}{err}");
    assert!(err.contains("reload refused") && names_line(&err, line), "{err}");
    probe(&cell);

    // Cut short in the middle of a ServerCluster.
    let good = cell.render(&with_orders_route(FIXTURE));
    cell.write_xml(truncated(&good));
    std::thread::sleep(Duration::from_millis(3000));
    probe(&cell);
    let (code, out, err) = cell.reload();
    assert_eq!(code, Some(1), "reload of a truncated file: {out}{err}");
    assert!(err.contains("reload refused") && err.contains("plugin-cfg.xml:"), "{err}");
    probe(&cell);

    // A good file again: taken on its own.
    cell.write_xml(&good);
    wait_routed(&cell, "shop.example", "/orders/1", SHOP);
    probe(&cell);
    cell.assert_no_misroute();
}

/// The truncated variant: cut in the middle of the file (at admin_cluster's start).
fn truncated(rendered: &str) -> &str {
    &rendered[..rendered.find("<ServerCluster CloneSeparatorChange=\"false\" GetDWLMTable=\"false\" IgnoreAffinityRequests=\"true\" LoadBalance=\"Random\"").unwrap()]
}

/// No namespace needed: the fixture and its variants are what the reader expects of a
/// generated file (no warning), and the route table above is what the matcher says of
/// the file's routes; so the namespace tests test the agent, not the fixture.
#[test]
fn the_fixture_reads_cleanly_and_routes_as_the_table_says() {
    use dispatcher::routes::{plugin_cfg, Table};
    let read = |text: &str| plugin_cfg::parse(&latin1(text));
    let file = read(&render(FIXTURE)).expect("the fixture");
    assert!(file.warnings.is_empty(), "{:?}", file.warnings);
    let clusters: Vec<(&str, usize, usize)> = file
        .server_clusters
        .iter()
        .map(|c| (c.name.as_str(), c.primary.as_ref().map_or(c.servers.len(), Vec::len), c.backup.len()))
        .collect();
    assert_eq!(clusters, [("shop_cluster", 4, 0), ("admin_cluster", 2, 0), ("portal_cluster", 2, 1)]);
    for (a, app) in APPS.iter().enumerate() {
        let c = &file.server_clusters[a];
        for (me, (name, id)) in app.servers.iter().enumerate() {
            let s = &c.servers[me];
            assert_eq!((s.name.as_str(), s.clone_id.as_deref()), (*name, Some(*id)));
            let t = &s.transports[0];
            assert_eq!((t.hostname.clone(), t.port), (backend_ip(backend_of(a, me)).to_string(), app.port));
        }
    }
    let routes = file.table_routes();
    let table = Table::new(&routes).unwrap();
    for &(host, path, want) in TABLE {
        assert_eq!(table.find(Some(host), 80, path).map(|m| m.target), want, "{host} {path}");
    }
    // Cookie names per route, as the tests' clients use them.
    let cookies: Vec<&str> = file.uri_groups.iter().map(|g| g.uris[0].affinity_cookie.as_str()).collect();
    assert_eq!(cookies, [APPS[SHOP].cookie, APPS[ADMIN].cookie, APPS[PORTAL].cookie]);

    // The variants: a route added; a server removed; broken (with the line); cut short.
    let added = read(&render(&with_orders_route(FIXTURE))).unwrap();
    assert_eq!(added.routes.len(), 4);
    assert!(added.warnings.is_empty(), "{:?}", added.warnings);
    let gone = read(&render(&without_server(&with_orders_route(FIXTURE), APPS[SHOP].servers[3].0))).unwrap();
    assert_eq!(gone.server_clusters[SHOP].servers.len(), 3);
    assert!(gone.warnings.is_empty(), "{:?}", gone.warnings);
    let bad = render(&with_orders_route(FIXTURE)).replace(
        "<Route ServerCluster=\"shop_cluster\" UriGroup=\"shop_host_orders_URIs\"",
        "<Route ServerCluster=\"orders_cluster\" UriGroup=\"shop_host_orders_URIs\"",
    );
    let e = read(&bad).expect_err("a Route to no ServerCluster");
    assert_eq!(e.line as usize, line_of(&bad, "orders_cluster"), "{e}");
    let good = render(&with_orders_route(FIXTURE));
    assert!(read(truncated(&good)).is_err());
}
