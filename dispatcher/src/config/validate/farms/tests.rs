//! `[[farm]]`, `[[route]]` and `[http] plugin_config`: what they become, and every error
//! with its line and field.

use super::super::super::*;

const BASE: &str = r#"[dispatcher]
interface = "eth0"

[[backend]]
name = "s1"
address = "10.0.1.1"
clone_ids = ["c1"]

[[backend]]
name = "s2"
address = "10.0.1.2"
clone_ids = ["c2"]

[[backend]]
name = "s3"
address = "10.0.1.3"
clone_ids = ["c3"]

[[backend]]
name = "a1"
address = "10.0.2.1"
clone_ids = ["c4"]

[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"

[[farm]]
name = "shop"
servers = ["s1", "s2"]
backup_servers = ["s3"]
balance = "random"
port = 9080
connect_timeout = "5s"
io_timeout = "60s"

[[farm]]
name = "admin"
servers = ["a1"]
session_format = "jvmroute"
fail_back = false
slow_start = "10s"

[[route]]
hosts = ["*:80"]
uris = ["/shop/*", "*.jsp"]
farm = "shop"

[[route]]
vips = ["web"]
hosts = ["admin.example:*"]
uris = ["/admin/*"]
farm = "admin"
cookie = "ADMINSESSION"
url_parameter = "adminsession"
"#;

/// The realistic plugin-cfg.xml of the route matcher's tests.
const PLUGIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/routes/testdata/plugin-cfg.xml");

fn err_of(text: &str) -> String {
    Config::parse(text, "x.toml").expect_err("must be rejected").to_string()
}

/// The line of the first `needle` after the first `after` in `text`.
fn line_of(text: &str, after: &str, needle: &str) -> usize {
    let start = text.find(after).unwrap_or_else(|| panic!("no {after:?}"));
    let at = start + text[start..].find(needle).unwrap_or_else(|| panic!("no {needle:?} after {after:?}"));
    text[..at].matches('\n').count() + 1
}

fn has(e: &str, want: &str) {
    assert!(e.lines().any(|l| l == want), "no line {want:?} in:\n{e}");
}

#[test]
fn farms_and_routes_become_the_model_and_the_vip_takes_their_servers() {
    let c = Config::parse(BASE, "x.toml").unwrap();
    assert_eq!(c.farms.len(), 2, "no implicit farm for a VIP routes apply to");
    let shop = &c.farms[0];
    assert_eq!((shop.name.as_str(), shop.servers.clone(), shop.backup_servers.clone()), ("shop", vec![0, 1], vec![2]));
    assert_eq!((shop.balance, shop.port, shop.fail_back, shop.implicit), (Balance::Random, Some(9080), true, false));
    assert_eq!((shop.connect_timeout, shop.io_timeout), (Some(Duration::from_secs(5)), Some(Duration::from_secs(60))));
    let admin = &c.farms[1];
    assert_eq!((admin.session_format, admin.fail_back), (SessionFormat::JvmRoute, false));
    assert_eq!(
        (admin.slow_start, admin.port, admin.balance),
        (Some(Duration::from_secs(10)), None, Balance::RoundRobin)
    );
    assert_eq!(c.routes.len(), 2);
    let r = &c.routes[0];
    assert_eq!(
        (r.vips.clone(), r.farm, r.cookie.as_str(), r.url_parameter.as_str()),
        (vec![0], 0, "JSESSIONID", "jsessionid")
    );
    assert_eq!(r.uris, ["/shop/*", "*.jsp"]);
    let r = &c.routes[1];
    assert_eq!((r.farm, r.cookie.as_str(), r.url_parameter.as_str()), (1, "ADMINSESSION", "adminsession"));
    assert_eq!(c.vips[0].backends, vec![0, 1, 2, 3], "the farms' members, primaries before backups");
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // The port a member's HTTP is at (pools, health checks): the farm's, else the VIP's.
    assert_eq!((c.farms[0].port_of(&c.backends[0], 80), c.farms[1].port_of(&c.backends[3], 80)), (9080, 80));

    // Another HTTP VIP the routes do not name (they all name web): its own farm, as before.
    let two = BASE.replace("[[route]]\nhosts", "[[route]]\nvips = [\"web\"]\nhosts").replace(
        "[[farm]]\nname = \"shop\"",
        "[[vip]]\nname = \"old\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\nbackends = [\"s1\"]\n\n[[farm]]\nname = \"shop\"",
    );
    let c = Config::parse(&two, "x.toml").unwrap();
    assert_eq!(c.farms.len(), 3);
    assert!(c.farms[2].implicit && c.farms[2].name == "old" && c.farms[2].servers == [0]);
    assert_eq!((c.routes[2].vips.clone(), c.routes[2].farm), (vec![1], 2));
}

#[test]
fn every_farm_error_names_its_line_and_field_in_one_run() {
    let text = format!(
        "{BASE}\n[[farm]]\nname = \"bad name\"\nservers = [\"nope\", \"s1\"]\nbalance = \"fastest\"\nport = 0\nslow_start = \"1 parsec\"\n\
         \n[[farm]]\nname = \"shop\"\nservers = []\nio_timeout = \"0s\"\nsession_format = \"tomcat\"\n"
    );
    let e = err_of(&text);
    let at = |needle: &str| line_of(&text, "name = \"bad name\"", needle);
    has(&e, &format!("x.toml:{}: farm[2].name: `bad name`: use letters, digits, '.', '_' and '-' only", at("name =")));
    has(&e, &format!("x.toml:{}: farm[2].servers: names no backend: `nope`", at("servers")));
    has(
        &e,
        &format!(
            "x.toml:{}: farm[2].servers: backend `s1` is already in farm `shop`: a backend belongs to one farm",
            at("servers")
        ),
    );
    has(
        &e,
        &format!(
            "x.toml:{}: farm[2].balance: `fastest` is not one of round_robin, least_outstanding, random",
            at("balance")
        ),
    );
    has(&e, &format!("x.toml:{}: farm[2].port: must be 1..=65535", at("port")));
    assert!(
        e.contains(&format!("x.toml:{}: farm[2].slow_start: `1 parsec` is not a duration", at("slow_start"))),
        "{e}"
    );
    let at = |needle: &str| line_of(&text, "name = \"shop\"\nservers = []", needle);
    has(&e, &format!("x.toml:{}: farm[3].name: `shop` is defined twice", at("name")));
    has(
        &e,
        &format!(
            "x.toml:{}: farm[3].servers: a farm needs at least one server (backup_servers serve only while no server is up)",
            at("servers")
        ),
    );
    has(&e, &format!("x.toml:{}: farm[3].io_timeout: must be more than zero", at("io_timeout")));
    has(
        &e,
        &format!("x.toml:{}: farm[3].session_format: `tomcat` is not one of websphere, jvmroute", at("session_format")),
    );
    // A jvmRoute is what follows the last '.'.
    let e = err_of(&BASE.replace("clone_ids = [\"c4\"]", "clone_ids = [\"node.4\"]"));
    assert!(e.contains("farm[1].session_format: clone ID `node.4` of backend `a1` cannot be a jvmRoute"), "{e}");
}

#[test]
fn every_route_error_names_its_line_and_field_in_one_run() {
    let text = format!(
        "{BASE}\n[[vip]]\nname = \"l4\"\naddress = \"10.0.100.9\"\nport = 80\nbackends = [\"s1\"]\n\
         \n[[route]]\nvips = [\"l4\", \"ghost\"]\nhosts = [\"shop*.example\"]\nuris = [\"/app*\"]\nfarm = \"nofarm\"\ncookie = \"BAD COOKIE\"\nurl_parameter = \"\"\n\
         \n[[route]]\nvips = []\nhosts = []\nuris = [\"/a/../b\"]\nfarm = \"shop\"\n"
    );
    let e = err_of(&text);
    let at = |needle: &str| line_of(&text, "vips = [\"l4\"", needle);
    has(&e, &format!("x.toml:{}: route[2].vips: `l4` is not an HTTP VIP (mode = \"http\")", at("vips")));
    has(&e, &format!("x.toml:{}: route[2].vips: `ghost` names no VIP", at("vips")));
    has(&e, &format!("x.toml:{}: route[2].hosts: `shop*.example`: a wildcard host is * or *.domain", at("hosts")));
    has(
        &e,
        &format!(
            "x.toml:{}: route[2].uris: `/app*`: the forms are /exact/path, /prefix/*, /prefix/*.ext, *.ext and /*",
            at("uris")
        ),
    );
    has(&e, &format!("x.toml:{}: route[2].farm: names no farm: `nofarm`", at("farm")));
    has(
        &e,
        &format!(
            "x.toml:{}: route[2].cookie: `BAD COOKIE` is not a cookie or parameter name (1 to 64 token characters)",
            at("cookie")
        ),
    );
    has(
        &e,
        &format!(
            "x.toml:{}: route[2].url_parameter: `` is not a cookie or parameter name (1 to 64 token characters)",
            at("url_parameter")
        ),
    );
    let at = |needle: &str| line_of(&text, "vips = []", needle);
    has(&e, &format!("x.toml:{}: route[3].vips: is empty: leave it out for every HTTP VIP", at("vips")));
    has(&e, &format!("x.toml:{}: route[3].hosts: is empty: a route needs at least one", at("hosts")));
    assert!(
        e.contains(&format!("x.toml:{}: route[3].uris: `/a/../b`: the path is not in normal form", at("uris"))),
        "{e}"
    );
}

#[test]
fn a_routed_vip_refuses_the_farm_settings_and_a_vip_with_neither_keeps_its_error() {
    let text = BASE.replace(
        "port = 80\nmode = \"http\"\n",
        "port = 80\nmode = \"http\"\nbackends = [\"s1\"]\nbalance = \"least_outstanding\"\nfail_back = false\nsession_format = \"jvmroute\"\nslow_start = \"5s\"\n",
    );
    let e = err_of(&text);
    for field in ["backends", "balance", "fail_back", "session_format", "slow_start"] {
        let want = format!(
            "x.toml:{}: vip[0].{field}: routes apply to VIP `web`: its requests go to the farms they name",
            line_of(&text, "[[vip]]", &format!("{field} ="))
        );
        assert!(e.lines().any(|l| l.starts_with(&want)), "no {want:?} in:\n{e}");
    }
    // No route applies to it and it has no backend: refused as before routes existed.
    let none = BASE.replace("[[route]]\nhosts", "[[route]]\nvips = [\"web\"]\nhosts").replace(
        "[[farm]]\nname = \"shop\"",
        "[[vip]]\nname = \"empty\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\nbackends = []\n\n[[farm]]\nname = \"shop\"",
    );
    assert!(err_of(&none).contains("vip[1].backends: a VIP needs at least one backend"), "{}", err_of(&none));
    // Routes for every HTTP VIP, and there is none.
    let no_vip = BASE.replace("[[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n", "");
    let no_vip = no_vip.replace("vips = [\"web\"]\n", "");
    let e = err_of(&no_vip);
    assert!(e.contains("route[0].vips: applies to every HTTP VIP, and there is none that forwards"), "{e}");
    // A farm member that is the VIP itself, at the farm's port: a loop.
    let e = err_of(&BASE.replace("address = \"10.0.2.1\"", "address = \"10.0.100.1\"\nport = 80"));
    assert!(
        e.contains("vip[0]: backend `a1` (10.0.100.1:80) of farm `admin` is HTTP VIP `web` (10.0.100.1:80): its requests would come back to this dispatcher (a loop)"),
        "{e}"
    );
    // A farm named like an HTTP VIP that keeps its own farm.
    let clash = none.replace("backends = []", "backends = [\"s1\"]").replace("name = \"admin\"", "name = \"empty\"");
    let clash = clash.replace("farm = \"admin\"", "farm = \"empty\"");
    assert!(err_of(&clash).contains("farm[1].name: `empty` is HTTP VIP `empty`'s own farm"), "{}", err_of(&clash));
}

#[test]
fn a_clone_id_in_two_farms_is_refused_saying_so() {
    let e = err_of(&BASE.replace("clone_ids = [\"c4\"]", "clone_ids = [\"c1\"]"));
    assert!(
        e.contains("backend[3].clone_ids: clone ID `c1` is already a clone ID or logical name of backend `s1` (farm `shop`; this one is in farm `admin`): a clone ID names one server across all farms"),
        "{e}"
    );
}

#[test]
fn check_warns_about_routes_that_can_never_win_and_farms_no_route_names() {
    let text = format!(
        "{BASE}\n[[route]]\nhosts = [\"*:80\"]\nuris = [\"*.jsp\"]\nfarm = \"admin\"\n\n[[farm]]\nname = \"idle\"\nservers = []\n"
    )
    .replace("servers = []", "servers = [\"s9\"]")
    .replace("[[backend]]\nname = \"a1\"", "[[backend]]\nname = \"s9\"\naddress = \"10.0.1.9\"\n\n[[backend]]\nname = \"a1\"");
    let c = Config::parse(&text, "x.toml").unwrap();
    let shadowed = format!(
        "x.toml:{}: route[2]: can never win (VIP web): each of its virtual hosts and URIs is matched first by route[0] (x.toml:{})",
        line_of(&text, "hosts = [\"*:80\"]\nuris = [\"*.jsp\"]", "hosts") - 1,
        line_of(&text, "[[route]]", "[[route]]")
    );
    assert_eq!(c.warnings, [shadowed, "farm `idle`: no route names it, it serves nothing".to_string()]);
}

/// A temporary folder for a TOML file and its plugin-cfg.xml.
struct Dir(std::path::PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("dispatcher-farms-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn write(&self, name: &str, bytes: &[u8]) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.display().to_string()
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The realistic file beside a TOML with one HTTP VIP, the address of the server the file
/// names by host name, and a replica pair.
const WITH_PLUGIN: &str = r#"[dispatcher]
interface = "eth0"

[http]
plugin_config = "plugin-cfg.xml"

[[backend]]
name = "portalNode_portal1"
address = "10.0.3.31"
replica = "portalNode_portal2"

[[backend]]
name = "shopNode1_shop1"
address = "10.0.1.11"
replica = "shopNode1_shop2"
weight = 50

[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"
"#;

#[test]
fn plugin_config_becomes_backends_farms_and_routes() {
    let dir = Dir::new("good");
    dir.write("plugin-cfg.xml", &std::fs::read(PLUGIN).unwrap());
    let toml = dir.write("dispatcher.toml", WITH_PLUGIN.as_bytes());
    let c = Config::load(std::path::Path::new(&toml)).unwrap();
    let names: Vec<&str> = c.backends.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "portalNode_portal1",
            "shopNode1_shop1",
            "shopNode1_shop2",
            "shopNode2_shop3",
            "shopBackup_shop9",
            "adminNode_admin1",
            "adminNode2_admin2",
            "portalNode_portal2"
        ],
        "the TOML's first, then the file's in its order"
    );
    let b = |n: &str| c.backends.iter().find(|b| b.name == n).unwrap();
    let id = |n: &str| c.backends.iter().position(|b| b.name == n).unwrap();
    // The TOML's backend comes first, the file fills in what it leaves out.
    let s1 = b("shopNode1_shop1");
    assert_eq!((s1.address.to_string(), s1.weight, s1.maxconn, s1.port), ("10.0.1.11".into(), 50, Some(100), None));
    assert_eq!((s1.clone_ids.clone(), s1.replica), (vec!["1a2b3c4d".to_string()], Some(id("shopNode1_shop2"))));
    assert_eq!(b("portalNode_portal1").address.to_string(), "10.0.3.31");
    assert_eq!(b("portalNode_portal1").replica, Some(id("portalNode_portal2")), "a replica among the file's servers");
    let s2 = b("shopNode1_shop2");
    assert_eq!((s2.port, s2.weight, s2.clone_ids.clone()), (Some(9081), 2, vec!["5e6f7a8b".to_string()]));
    assert_eq!(b("adminNode_admin1").maxconn, None, "MaxConnections -1: no limit");

    let names: Vec<&str> = c.farms.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["shop_cluster", "admin_cluster", "portal_cluster"], "no implicit farm: routes apply to web");
    let shop = &c.farms[0];
    assert_eq!(shop.servers, [id("shopNode1_shop1"), id("shopNode1_shop2"), id("shopNode2_shop3")]);
    assert_eq!(shop.backup_servers, [id("shopBackup_shop9")]);
    assert_eq!((shop.balance, shop.port), (Balance::RoundRobin, Some(9080)));
    assert_eq!((shop.connect_timeout, shop.io_timeout), (Some(Duration::from_secs(5)), Some(Duration::from_secs(900))));
    assert_eq!((c.farms[1].balance, c.farms[2].port), (Balance::Random, Some(9443)));

    assert_eq!(c.routes.len(), 4, "the shop route split by its two cookie names");
    let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "shop_host_shop_cluster_URIs.JSESSIONID",
            "shop_host_shop_cluster_URIs.SHOPSESSION",
            "admin_host_admin_cluster_URIs",
            "default_host_portal_cluster_URIs"
        ],
        "the UriGroup's name, with the cookie where the group has several"
    );
    let r = &c.routes[1];
    assert_eq!(
        (r.uris.clone(), r.cookie.as_str(), r.url_parameter.as_str()),
        (vec!["/checkout/*".to_string()], "SHOPSESSION", "shopsession")
    );
    assert_eq!(
        (r.hosts.clone(), r.vips.clone(), r.farm),
        (vec!["shop.example:*".to_string(), "*:443".to_string()], vec![0], 0)
    );
    assert_eq!((c.routes[3].uris.clone(), c.routes[3].farm), (vec!["/*".to_string()], 2));
    assert_eq!(c.vips[0].backends.len(), 8, "every server, by its farms");
    assert_eq!(c.http.plugin_refresh, Duration::from_secs(60), "the file's RefreshInterval");
    assert!(c.http.plugin_config.as_ref().is_some_and(|p| p.ends_with("plugin-cfg.xml")));
    let w = c.warnings.join("\n");
    assert!(w.contains("plugin-cfg.xml:20: <ServerCluster> \"shop_cluster\" RetryInterval=\"60\" is not implemented: health checks decide"), "{w}");
    assert!(w.contains("server \"portalNode_portal2\" has an https Transport only"), "{w}");
    assert!(w.contains("ServerCluster \"shop_cluster\": ConnectTimeout=\"5\" is taken for the whole farm, not the value of shopBackup_shop9"), "{w}");

    // plugin_refresh: set, and bounded.
    let c = Config::parse(&WITH_PLUGIN.replace(".xml\"\n", ".xml\"\nplugin_refresh = \"5s\"\n"), &toml).unwrap();
    assert_eq!(c.http.plugin_refresh, Duration::from_secs(5));
    let e = Config::parse(&WITH_PLUGIN.replace(".xml\"\n", ".xml\"\nplugin_refresh = \"2h\"\n"), &toml).unwrap_err();
    assert!(e.to_string().contains(":6: http.plugin_refresh: must be at most 1h"), "{e}");
}

/// WebSphere regenerates the file with no application mapped to the web server: no
/// `Route`. The VIP stays routed (every request 404), not balanced over every server of
/// every cluster as a VIP without routes would be.
#[test]
fn a_plugin_config_without_routes_routes_nothing_rather_than_everything() {
    let dir = Dir::new("noroutes");
    let xml = String::from_utf8_lossy(&std::fs::read(PLUGIN).unwrap()).into_owned();
    let stripped: String =
        xml.lines().filter(|l| !l.trim_start().starts_with("<Route ")).collect::<Vec<_>>().join("\n");
    assert!(!stripped.contains("<Route "));
    dir.write("plugin-cfg.xml", stripped.as_bytes());
    let toml = dir.write("dispatcher.toml", WITH_PLUGIN.as_bytes());
    let c = Config::load(std::path::Path::new(&toml)).unwrap();
    assert!(c.routes.is_empty(), "{:?}", c.routes);
    assert!(c.farms.iter().all(|f| !f.implicit), "no implicit catch-all farm over every backend: {:?}", c.farms);
    assert!(c.vips[0].backends.is_empty(), "{:?}", c.vips[0].backends);
    let w = c.warnings.join("\n");
    assert!(w.contains("VIP `web`: no route applies to it, every request is answered 404"), "{w}");
}

#[test]
fn plugin_config_errors_name_the_file_and_its_line() {
    let dir = Dir::new("bad");
    let xml = std::fs::read(PLUGIN).unwrap();
    let xml_path = dir.write("plugin-cfg.xml", &xml);
    // A server the file names by host name, with no [[backend]] giving its address.
    let toml = dir.write("dispatcher.toml", WITH_PLUGIN.replacen("[[backend]]\nname = \"portalNode_portal1\"\naddress = \"10.0.3.31\"\nreplica = \"portalNode_portal2\"\n", "", 1).as_bytes());
    let e = Config::load(std::path::Path::new(&toml)).unwrap_err().to_string();
    let line = String::from_utf8_lossy(&xml)
        .lines()
        .position(|l| l.contains("Name=\"portalNode_portal1\" ServerIOTimeout"))
        .unwrap()
        + 1;
    has(&e, &format!("{xml_path}:{line}: server \"portalNode_portal1\": Transport Hostname \"portal1.cell.example\" is not an IPv4 address: add a [[backend]] named \"portalNode_portal1\" with its address to the TOML file"));
    // A file that does not parse: its error, at its line; the TOML's own errors too.
    dir.write("plugin-cfg.xml", b"<Config>\n<ServerCluster Name=\"x\">\n</Config>\n");
    let toml = dir.write("dispatcher.toml", WITH_PLUGIN.replace("weight = 50", "weight = 0").as_bytes());
    let e = Config::load(std::path::Path::new(&toml)).unwrap_err().to_string();
    assert!(e.contains(&format!("{xml_path}:3: not well-formed XML")), "{e}");
    assert!(e.contains("dispatcher.toml:16: backend[1].weight"), "{e}");
    // No file there.
    std::fs::remove_file(&xml_path).unwrap();
    let e = Config::load(std::path::Path::new(&toml)).unwrap_err().to_string();
    assert!(e.contains(&format!("dispatcher.toml:5: http.plugin_config: cannot read {xml_path}")), "{e}");
    // A TOML farm of a cluster's name.
    dir.write("plugin-cfg.xml", &xml);
    let text = format!("{WITH_PLUGIN}\n[[farm]]\nname = \"admin_cluster\"\nservers = [\"shopNode1_shop1\"]\n");
    let e = Config::parse(&text, &toml).unwrap_err().to_string();
    let admin = String::from_utf8_lossy(&xml).lines().position(|l| l.contains("Name=\"admin_cluster\"")).unwrap() + 1;
    assert!(
        e.contains(&format!(
            "{xml_path}:{admin}: ServerCluster \"admin_cluster\": a [[farm]] of the TOML file has this name"
        )),
        "{e}"
    );
    assert!(e.contains(&format!("{xml_path}:20: ServerCluster \"shop_cluster\": server \"shopNode1_shop1\" is already in farm `admin_cluster`")), "{e}");
}

/// `dispatcher import`'s output, with a `[[vip]]` added and the one server the file names
/// by host name given its address (as the output says), is a configuration `check` takes.
#[test]
fn the_imported_toml_with_a_vip_is_a_valid_configuration() {
    let cfg = crate::routes::plugin_cfg::parse(&std::fs::read(PLUGIN).unwrap()).unwrap();
    let vip = "\n[[vip]]\nname = \"web_80\"\naddress = \"192.0.2.10\"\nport = 80\nmode = \"http\"\n";
    let as_is = format!("[dispatcher]\ninterface = \"eth0\"\n{}{vip}", crate::routes::import::to_toml(&cfg, "x"));
    let e = err_of(&as_is);
    assert!(
        e.contains("`portal1.cell.example` is not an IPv4 address (a host name is not resolved: write its address)"),
        "{e}"
    );
    let imported =
        crate::routes::import::to_toml(&cfg, "plugin-cfg.xml").replace("\"portal1.cell.example\"", "\"10.0.3.31\"");
    let text = format!(
        "[dispatcher]\ninterface = \"eth0\"\n{imported}\n[[vip]]\nname = \"web_80\"\naddress = \"192.0.2.10\"\nport = 80\nmode = \"http\"\n"
    );
    let c = Config::parse(&text, "imported.toml").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!((c.backends.len(), c.farms.len(), c.routes.len()), (8, 3, 4));
    assert_eq!(c.vips[0].backends.len(), 8);
    assert!(c.farms.iter().all(|f| !f.implicit));
}

/// Routes whose virtual hosts times URIs exceed what one route table holds are refused at
/// the route that crosses the bound (the agent would refuse to build the table).
#[test]
fn routes_that_pair_too_many_hosts_with_uris_are_refused() {
    let list = |f: &dyn Fn(usize) -> String| (0..400).map(|i| format!("\"{}\"", f(i))).collect::<Vec<_>>().join(", ");
    let big = format!(
        "{BASE}\n[[route]]\nhosts = [{}]\nuris = [{}]\nfarm = \"shop\"\n",
        list(&|i| format!("h{i}.example")),
        list(&|i| format!("/u{i}/*"))
    );
    let e = err_of(&big);
    let line = big.lines().count() - 3;
    has(&e, &format!("x.toml:{line}: VIP `web`: route[2]: with the routes before it, more than 100000 (virtual host, URI pattern) pairs"));
}

/// A replica in another farm than its server's is refused, at the replica, naming both
/// farms; one in no farm is a warning (WebSphere removed it from the file); one inside
/// (a backup too) is fine.
#[test]
fn a_replica_is_in_its_servers_farm() {
    let inside = BASE.replace("clone_ids = [\"c1\"]", "clone_ids = [\"c1\"]\nreplica = \"s3\"");
    assert!(Config::parse(&inside, "x.toml").is_ok());
    let outside = BASE.replace("clone_ids = [\"c1\"]", "clone_ids = [\"c1\"]\nreplica = \"a1\"");
    let e = err_of(&outside);
    let line = outside.lines().position(|l| l == "replica = \"a1\"").unwrap() + 1;
    has(
        &e,
        &format!("x.toml:{line}: backend[0].replica: `a1` is in farm `admin`, not in `s1`'s farm `shop`: a session fails over only within its farm"),
    );
    let nowhere = format!(
        "{BASE}
[[backend]]
name = \"gone\"
address = \"10.0.1.9\"
"
    )
    .replace("clone_ids = [\"c1\"]", "clone_ids = [\"c1\"]\nreplica = \"gone\"");
    let c = Config::parse(&nowhere, "x.toml").unwrap_or_else(|e| panic!("{e}"));
    let line = nowhere.lines().position(|l| l == "replica = \"gone\"").unwrap() + 1;
    let w = c.warnings.join("\n");
    assert!(
        w.contains(&format!("x.toml:{line}: backend[0].replica: `gone` is in no farm: `s1`'s sessions have no replica in farm `shop` (503 while it is out)")),
        "{w}"
    );
}

/// `plugin_vips`: the file's routes apply to the VIPs named (another HTTP VIP keeps its
/// own backends and settings); a name that is not a forwarding HTTP VIP, or the setting
/// without a plugin_config, is refused at its line.
#[test]
fn plugin_vips_names_the_vips_the_files_routes_apply_to() {
    let dir = Dir::new("pluginvips");
    dir.write("plugin-cfg.xml", &std::fs::read(PLUGIN).unwrap());
    let other = "\n[[vip]]\nname = \"old\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\nbackends = [\"shopNode1_shop1\"]\nbalance = \"least_outstanding\"\n";
    let text = WITH_PLUGIN.replace(".xml\"\n", ".xml\"\nplugin_vips = [\"web\"]\n") + other;
    let toml = dir.write("dispatcher.toml", text.as_bytes());
    let c = Config::load(std::path::Path::new(&toml)).unwrap_or_else(|e| panic!("{e}"));
    assert!(c.routes.iter().filter(|r| !c.farms[r.farm].implicit).all(|r| r.vips == [0]), "{:?}", c.routes);
    let own = c.farms.iter().find(|f| f.implicit).expect("old's own farm");
    assert_eq!((own.name.as_str(), own.balance), ("old", Balance::LeastOutstanding));
    assert_eq!(c.vips[1].backends.len(), 1);
    // Without plugin_vips, old is routed too, and its own settings are refused.
    let e = Config::parse(&(WITH_PLUGIN.to_string() + other), &toml).unwrap_err().to_string();
    assert!(e.contains("vip[1].backends: routes apply to VIP `old`"), "{e}");
    // Not a forwarding HTTP VIP; no plugin_config.
    let bad = WITH_PLUGIN.replace(".xml\"\n", ".xml\"\nplugin_vips = [\"web\", \"nope\"]\n");
    let e = Config::parse(&bad, &toml).unwrap_err().to_string();
    assert!(e.contains(":6: http.plugin_vips[1]: `nope` is not an HTTP VIP that forwards"), "{e}");
    let alone = WITH_PLUGIN.replace("plugin_config = \"plugin-cfg.xml\"\n", "plugin_vips = [\"web\"]\n");
    let e = Config::parse(&alone, &toml).unwrap_err().to_string();
    assert!(e.contains(":5: http.plugin_vips: the VIPs of a plugin_config's routes: set plugin_config too"), "{e}");
}

/// Route names: `name`, else `route<i>`; a bad or repeated TOML name is refused at its
/// route (the counters follow the name: `capacity`'s tests).
#[test]
fn routes_are_named_once() {
    let c = Config::parse(BASE, "x.toml").unwrap();
    let names: Vec<&str> = c.routes.iter().filter(|r| !c.farms[r.farm].implicit).map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["route0", "route1"]);
    let named = BASE.replacen("[[route]]\nhosts", "[[route]]\nname = \"shop\"\nhosts", 1);
    let c = Config::parse(&named, "x.toml").unwrap();
    assert_eq!((c.routes[0].name.as_str(), c.routes[1].name.as_str()), ("shop", "route1"));
    let twice = named.replacen("[[route]]\nvips", "[[route]]\nname = \"shop\"\nvips", 1);
    let e = err_of(&twice);
    let line = line_of(&twice, "[[route]]\nname = \"shop\"\nvips", "[[route]]");
    has(&e, &format!("x.toml:{line}: route[1]: the route name `shop` is used twice"));
    let bad = BASE.replacen("[[route]]\nhosts", "[[route]]\nname = \"a b\"\nhosts", 1);
    assert!(err_of(&bad).contains("route[0].name: a route name `a b`: use letters, digits"), "{}", err_of(&bad));
}

/// A file's route names: a UriGroup two Routes use says each one's VirtualHostGroup; a
/// name the TOML already took gets `-2`; characters outside a name's become `_`.
#[test]
fn a_files_route_names_are_made_unique() {
    let dir = Dir::new("routenames");
    let xml = r#"<?xml version="1.0"?>
<Config>
<VirtualHostGroup Name="v one"><VirtualHost Name="*:80"/></VirtualHostGroup>
<VirtualHostGroup Name="v2"><VirtualHost Name="b.example:80"/></VirtualHostGroup>
<ServerCluster Name="c1"><Server Name="x1" CloneID="x1"><Transport Hostname="10.0.5.1" Port="9080" Protocol="http"/></Server></ServerCluster>
<UriGroup Name="app URIs"><Uri Name="/app/*"/></UriGroup>
<UriGroup Name="solo"><Uri Name="/solo/*"/></UriGroup>
<Route ServerCluster="c1" UriGroup="app URIs" VirtualHostGroup="v one"/>
<Route ServerCluster="c1" UriGroup="app URIs" VirtualHostGroup="v2"/>
<Route ServerCluster="c1" UriGroup="solo" VirtualHostGroup="v2"/>
</Config>
"#;
    dir.write("plugin-cfg.xml", xml.as_bytes());
    let text = "[dispatcher]\ninterface = \"eth0\"\n\n[http]\nplugin_config = \"plugin-cfg.xml\"\n\n\
                [[vip]]\nname = \"web\"\naddress = \"10.0.100.1\"\nport = 80\nmode = \"http\"\n\n\
                [[backend]]\nname = \"x1\"\naddress = \"10.0.5.1\"\n\n\
                [[route]]\nname = \"solo\"\nhosts = [\"*\"]\nuris = [\"/own/*\"]\nfarm = \"c1\"\n";
    let toml = dir.write("dispatcher.toml", text.as_bytes());
    let c = Config::load(std::path::Path::new(&toml)).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = c.routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["solo", "app_URIs.v_one", "app_URIs.v2", "solo-2"]);
    assert!(names.iter().all(|n| super::super::checks::check_name(n).is_ok()), "as a TOML name would be");
}
