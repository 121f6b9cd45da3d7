//! Routes: what a large cell's route table costs. The dispatcher and HAProxy in front of
//! the same four nginx backends, each with one route (a catch-all to one farm over the
//! four) and with 500 routes over 50 farms (`large_cell`: each farm an application with
//! ten routes of every form the plug-in has: exact paths, path prefixes, a prefix with an
//! extension, an extension, a virtual host's catch-all); HAProxy has the same rules as
//! ACLs and `use_backend`, the most specific first. Both tables get the same requests
//! (wrk, `routes.lua`: one request per route of the large cell, in turn), so what differs
//! is the table. Requests/s, p99 and CPU per request (user + system of the proxy's
//! process, from its own accounting), the tables and systems taking turns over rounds.

use std::{cmp::Reverse, fmt::Write as _};

use dispatcher_testbed::netns::{backend_ip, backend_mac, Testbed};

use crate::{
    http::{
        agent_config_with, bench_bed, haproxy_maxconn, raise_nofile, wait_serving, wrk, BACKEND_PORT, VIP, WORKERS,
    },
    p99::counters,
    peers,
    report::{self, Row},
    wrk::{self, Wrk},
};

const CONNECTIONS: usize = 50;
/// The large cell: farms, routes per farm, servers per farm.
pub const FARMS: usize = 50;
pub const ROUTES_PER_FARM: usize = 10;
const SERVERS_PER_FARM: usize = 2;
/// The testbed's backends (nginx processes) that every farm's servers are on.
const BACKENDS: usize = 4;
/// The requests' order: route `i * STRIDE % n` (coprime with the large cell's 500
/// routes), so that consecutive requests go to different farms and forms.
const STRIDE: usize = 263;
/// The Host of requests to routes of any virtual host.
const ANY_HOST: &str = "www.example";
/// (name, port on the VIP, process log).
const SYSTEMS: [(&str, u16, &str); 2] = [("dispatcher", 80, "dispatcher"), ("haproxy", 81, "haproxy")];

/// A URI pattern, in the plug-in's forms (routes/mod.rs).
#[derive(Clone, Debug, PartialEq)]
pub enum Uri {
    /// `/a/b`
    Exact(String),
    /// `/a/*`: `/a` and everything under `/a/`.
    Prefix(String),
    /// `/a/*.ext`: under `/a/`, the last segment ending in `.ext`.
    PrefixExt(String, String),
    /// `*.ext`: the last segment ends in `.ext`.
    Ext(String),
    /// `/*`
    Any,
}

impl Uri {
    /// As written in `[[route]] uris`.
    pub fn pattern(&self) -> String {
        match self {
            Uri::Exact(p) => p.clone(),
            Uri::Prefix(p) => format!("{p}/*"),
            Uri::PrefixExt(p, ext) => format!("{p}/*{ext}"),
            Uri::Ext(ext) => format!("*{ext}"),
            Uri::Any => "/*".into(),
        }
    }

    /// Its place in the dispatcher's rule (most specific first): exact paths; prefixes,
    /// the longest first, one with an extension before a plain one of the same length;
    /// extensions, the longest first; the catch-all.
    fn rank(&self) -> (u8, Reverse<usize>, u8) {
        match self {
            Uri::Exact(_) => (0, Reverse(0), 0),
            Uri::PrefixExt(p, _) => (1, Reverse(p.len()), 0),
            Uri::Prefix(p) => (1, Reverse(p.len()), 1),
            Uri::Ext(ext) => (2, Reverse(ext.len()), 0),
            Uri::Any => (3, Reverse(0), 0),
        }
    }

    /// HAProxy's `acl` lines for it, named `{name}_path` (and `{name}_ext`), and the
    /// names a rule requires (all of them).
    fn acls(&self, name: &str) -> (String, Vec<String>) {
        let (path, ext) = (format!("{name}_path"), format!("{name}_ext"));
        match self {
            Uri::Exact(p) => (format!(" acl {path} path {p}\n"), vec![path]),
            Uri::Prefix(p) => (format!(" acl {path} path {p}\n acl {path} path_beg {p}/\n"), vec![path]),
            Uri::PrefixExt(p, e) => (format!(" acl {path} path_beg {p}/\n acl {ext} path_end {e}\n"), vec![path, ext]),
            Uri::Ext(e) => (format!(" acl {path} path_end {e}\n"), vec![path]),
            Uri::Any => (String::new(), Vec::new()),
        }
    }

    /// Whether HAProxy's ACLs for it (`acls`) match `path` (without its query).
    #[cfg(test)]
    fn acls_match(&self, path: &str) -> bool {
        match self {
            Uri::Exact(p) => path == p,
            Uri::Prefix(p) => path == p || path.starts_with(&format!("{p}/")),
            Uri::PrefixExt(p, e) => path.starts_with(&format!("{p}/")) && path.ends_with(e.as_str()),
            Uri::Ext(e) => path.ends_with(e.as_str()),
            Uri::Any => true,
        }
    }
}

/// A route: one virtual host (`None`: any host and port; `Some(host)`: that host on port
/// 80, the VIP's) and one URI pattern, to a farm (its index).
#[derive(Clone, Debug)]
pub struct Route {
    pub host: Option<String>,
    pub uri: Uri,
    pub farm: usize,
}

impl Route {
    /// As written in `[[route]] hosts`.
    pub fn host_pattern(&self) -> String {
        self.host.clone().unwrap_or_else(|| "*:*".into())
    }
}

/// A farm: its name and its servers (indexes of the testbed's backends).
#[derive(Clone, Debug)]
pub struct Farm {
    pub name: String,
    pub servers: Vec<usize>,
}

impl Farm {
    /// Its `i`th server's name (`[[backend]] name`, and HAProxy's `server`): a backend
    /// belongs to one farm, so each farm has backends of its own, on shared addresses.
    fn server_name(&self, i: usize) -> String {
        format!("{}_s{i}", self.name)
    }
}

/// A request the large cell routes to `route`.
#[derive(Clone, Debug)]
pub struct Request {
    pub host: String,
    pub path: String,
    pub route: usize,
}

/// A route table: its farms and routes, written for the dispatcher and for HAProxy.
pub struct Table {
    pub farms: Vec<Farm>,
    pub routes: Vec<Route>,
}

impl Table {
    /// One farm over the four backends, one route: any host, `/*`.
    pub fn one_route() -> Table {
        Table {
            farms: vec![Farm { name: "app".into(), servers: (0..BACKENDS).collect() }],
            routes: vec![Route { host: None, uri: Uri::Any, farm: 0 }],
        }
    }

    /// 50 farms (`app0`...) of 2 servers each, 10 routes each (500), and one request per
    /// route, in an order that moves from farm to farm.
    pub fn large_cell() -> (Table, Vec<Request>) {
        let (mut farms, mut routes, mut requests) = (Vec::new(), Vec::new(), Vec::new());
        for f in 0..FARMS {
            let app = format!("/app{f}");
            let vhost = format!("app{f}.example");
            farms.push(Farm {
                name: format!("app{f}"),
                servers: (0..SERVERS_PER_FARM).map(|s| (f * SERVERS_PER_FARM + s) % BACKENDS).collect(),
            });
            // (virtual host, URI pattern, a request's host and path it takes)
            let forms: [(Option<&str>, Uri, &str, String); ROUTES_PER_FARM] = [
                (None, Uri::Prefix(app.clone()), ANY_HOST, format!("{app}/index.html")),
                (None, Uri::Prefix(format!("{app}/api")), ANY_HOST, format!("{app}/api/orders/42")),
                (None, Uri::Prefix(format!("{app}/static")), ANY_HOST, format!("{app}/static/css/site.css")),
                (None, Uri::Exact(format!("{app}/login")), ANY_HOST, format!("{app}/login")),
                (None, Uri::Exact(format!("{app}/logout")), ANY_HOST, format!("{app}/logout")),
                (None, Uri::Prefix(format!("{app}/servlet")), ANY_HOST, format!("{app}/servlet/Report?id=7")),
                (None, Uri::PrefixExt(app.clone(), ".jsp".into()), ANY_HOST, format!("{app}/cart.jsp")),
                (Some(&vhost), Uri::Any, &vhost, "/about/team.html".into()),
                (Some(&vhost), Uri::Ext(".do".into()), &vhost, "/orders/list.do".into()),
                (Some(&vhost), Uri::Exact("/".into()), &vhost, "/".into()),
            ];
            for (host, uri, req_host, path) in forms {
                requests.push(Request { host: req_host.into(), path, route: routes.len() });
                routes.push(Route { host: host.map(String::from), uri, farm: f });
            }
        }
        let n = requests.len();
        let order = (0..n).map(|i| requests[i * STRIDE % n].clone()).collect();
        (Table { farms, routes }, order)
    }

    /// The `[[backend]]`, `[[farm]]` and `[[route]]` sections for the dispatcher.
    pub fn dispatcher_toml(&self) -> String {
        let mut s = String::new();
        for farm in &self.farms {
            for (i, &b) in farm.servers.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "[[backend]]\nname = \"{}\"\naddress = \"{}\"\nmac = \"{}\"\n",
                    farm.server_name(i),
                    backend_ip(b),
                    backend_mac(b)
                );
            }
        }
        for farm in &self.farms {
            let servers: Vec<String> =
                (0..farm.servers.len()).map(|i| format!("\"{}\"", farm.server_name(i))).collect();
            let _ = writeln!(
                s,
                "[[farm]]\nname = \"{}\"\nservers = [{}]\nbalance = \"round_robin\"\n",
                farm.name,
                servers.join(", ")
            );
        }
        for r in &self.routes {
            let _ = writeln!(
                s,
                "[[route]]\nhosts = [\"{}\"]\nuris = [\"{}\"]\nfarm = \"{}\"\n",
                r.host_pattern(),
                r.uri.pattern(),
                self.farms[r.farm].name
            );
        }
        s
    }

    /// The routes in the order HAProxy must try them (it takes the first rule that
    /// matches): the dispatcher's order of specificity, URI first, then host (a named
    /// host before any host), then the file's order.
    pub fn haproxy_order(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.routes.len()).collect();
        order.sort_by_key(|&i| (self.routes[i].uri.rank(), self.routes[i].host.is_none(), i));
        order
    }

    /// HAProxy's frontend lines: per route its ACLs (`hdr(host)`; `path`, `path_beg`,
    /// `path_end`) and one `use_backend`, in `haproxy_order`.
    pub fn haproxy_rules(&self) -> String {
        let mut s = String::new();
        for i in self.haproxy_order() {
            let r = &self.routes[i];
            let name = format!("r{i}");
            let mut required = Vec::new();
            if let Some(host) = &r.host {
                let _ = writeln!(s, " acl {name}_host hdr(host) -i {host} {host}:80");
                required.push(format!("{name}_host"));
            }
            let (acls, names) = r.uri.acls(&name);
            s += &acls;
            required.extend(names);
            let condition = if required.is_empty() { "TRUE".to_string() } else { required.join(" ") };
            let _ = writeln!(s, " use_backend {} if {condition}", self.farms[r.farm].name);
        }
        s
    }

    /// HAProxy's backend sections, one per farm, its servers on the backends' port.
    pub fn haproxy_backends(&self) -> String {
        let mut s = String::new();
        for farm in &self.farms {
            let _ = writeln!(s, "backend {}\n balance roundrobin\n http-reuse safe", farm.name);
            for (i, &b) in farm.servers.iter().enumerate() {
                let _ = writeln!(s, " server {} {}:{BACKEND_PORT}", farm.server_name(i), backend_ip(b));
            }
        }
        s
    }

    /// The route HAProxy's rules give a request: the first rule whose ACLs all match.
    #[cfg(test)]
    fn haproxy_route(&self, host: &str, target: &str) -> Option<usize> {
        let path = target.split('?').next().unwrap_or(target);
        self.haproxy_order().into_iter().find(|&i| {
            let r = &self.routes[i];
            let host_ok = r
                .host
                .as_ref()
                .is_none_or(|h| host.eq_ignore_ascii_case(h) || host.eq_ignore_ascii_case(&format!("{h}:80")));
            host_ok && r.uri.acls_match(path)
        })
    }
}

/// The requests as the Lua table `routes.lua` sends in turn.
pub fn lua_requests(requests: &[Request]) -> String {
    requests.iter().map(|r| format!("  {{\"{}\", \"{}\"}},\n", r.host, r.path)).collect()
}

/// HAProxy with `table`'s rules on the VIP's port 81 (`haproxy-routes.cfg`).
fn start_haproxy(tb: &mut Testbed, table: &Table, maxconn: u64) -> u32 {
    let dir = tb.workdir.clone();
    let conf = peers::write(
        &dir,
        "haproxy-routes.cfg",
        peers::HAPROXY_ROUTES,
        &[
            ("WORKERS", &WORKERS),
            ("MAXCONN", &maxconn),
            ("DIR", &dir.display()),
            ("BIND", &format!("{VIP}:{}", SYSTEMS[1].1)),
            ("RULES", &table.haproxy_rules()),
            ("BACKENDS", &table.haproxy_backends()),
        ],
    );
    let mut cmd = tb.lb.command("haproxy");
    cmd.arg("-db").arg("-f").arg(&conf);
    tb.start("haproxy", cmd)
}

/// `dispatcher_no_route_total` summed over its series; `None` when the agent has no such
/// metric.
fn no_route_total(tb: &Testbed, config: &str) -> Option<u64> {
    let metrics = tb.dispatcher_cmd(&["metrics", "--config", config]);
    let values: Vec<u64> = metrics
        .lines()
        .filter(|l| l.starts_with("dispatcher_no_route_total"))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// One system with one table over the rounds: each round's wrk figures, and the CPU
/// ticks it used and the requests it answered while measured.
#[derive(Default)]
struct Measured {
    runs: Vec<Wrk>,
    ticks: u64,
    requests: f64,
}

impl Measured {
    /// Microseconds of CPU (user + system, all threads) per request.
    fn cpu_us(&self) -> f64 {
        self.ticks as f64 * 10_000.0 / self.requests.max(1.0)
    }
}

pub fn run(quick: bool) -> (String, String) {
    let (rounds, secs) = if quick { (1, 4) } else { (3, 10) };
    let maxconn = haproxy_maxconn(raise_nofile());
    let (large, requests) = Table::large_cell();
    let tables = [Table::one_route(), large];
    // The load spreads over every route of the large cell.
    let covered: std::collections::HashSet<usize> = requests.iter().map(|r| r.route).collect();
    assert_eq!(covered.len(), tables[1].routes.len(), "a route no request takes");
    eprintln!(
        "==> routes: 1 route and {} routes over {FARMS} farms, the dispatcher and HAProxy, {rounds} round(s) of {secs}s, taking turns",
        tables[1].routes.len()
    );
    let mut tb = bench_bed();
    let script =
        peers::write(&tb.workdir.clone(), "routes.lua", peers::ROUTES_LUA, &[("REQUESTS", &lua_requests(&requests))]);
    let probe = &requests[0];
    // [table][system]
    let mut measured: [[Measured; 2]; 2] = Default::default();
    let mut no_route: [Option<u64>; 2] = [None; 2];
    for _ in 0..rounds {
        for (t, table) in tables.iter().enumerate() {
            tb.stop("dispatcher");
            tb.stop("haproxy");
            let config = tb.write_config(&agent_config_with(tb.instance(), "", &table.dispatcher_toml()));
            tb.start_dispatcher(&config);
            let dispatcher = tb.pid_of("dispatcher").expect("agent pid");
            let haproxy = start_haproxy(&mut tb, table, maxconn);
            for (s, (name, port, log)) in SYSTEMS.iter().enumerate() {
                wait_serving(&tb, *port, log, &probe.host, &probe.path);
                let _ = wrk(&tb, *port, 2, &script, CONNECTIONS); // warm-up: every farm's upstream connections
                let pid = [dispatcher, haproxy][s];
                let before = counters(pid).ticks;
                let r = wrk(&tb, *port, secs, &script, CONNECTIONS);
                let ticks = counters(pid).ticks - before;
                let m = &mut measured[t][s];
                m.runs.push(r);
                m.ticks += ticks;
                m.requests += r.rps * secs as f64;
                eprintln!(
                    "    {:>3} route(s) {name:<10} {:>8.0} req/s  p99 {:.3} ms  errors {}  CPU {:.1} µs/request",
                    table.routes.len(),
                    r.rps,
                    r.p99_ms,
                    r.errors,
                    ticks as f64 * 10_000.0 / (r.rps * secs as f64).max(1.0)
                );
            }
            if let Some(n) = no_route_total(&tb, config.to_str().unwrap()) {
                *no_route[t].get_or_insert(0) += n;
            }
        }
    }
    tb.stop("dispatcher");
    tb.stop("haproxy");
    let median = |t: usize, s: usize| wrk::median(&measured[t][s].runs);
    // The large table's cost: the share of requests/s it loses against one route.
    let cost = |s: usize| (1.0 - median(1, s).rps / median(0, s).rps) * 100.0;
    let (d_cost, h_cost) = (cost(0), cost(1));
    let vs_haproxy = |t: usize| median(t, 0).rps / median(t, 1).rps;
    let mut rows = Vec::new();
    for (t, table) in tables.iter().enumerate() {
        for (s, (name, _, _)) in SYSTEMS.iter().enumerate() {
            let m = &measured[t][s];
            let w = median(t, s);
            let (lo, hi) = wrk::spread(&m.runs);
            let errors: u64 = m.runs.iter().map(|r| r.errors).sum();
            rows.push(
                Row::new()
                    .int("routes", "routes", table.routes.len())
                    .int("farms", "farms", table.farms.len())
                    .text("system", "system", name)
                    .num("requests/s (median)", "rps", w.rps, 0, 1)
                    .md("range", format!("{lo:.0}–{hi:.0}"))
                    .num("p99 ms", "p99_ms", w.p99_ms, 3, 3)
                    .num("CPU µs per request", "cpu_us_per_request", m.cpu_us(), 1, 2)
                    .int("errors", "errors", errors)
                    .md("req/s vs 1 route", format!("{:.3}", w.rps / median(0, s).rps))
                    .md("req/s vs HAProxy", format!("{:.2}", vs_haproxy(t))),
            );
        }
    }
    let no_route_text = |n: Option<u64>| n.map_or("-".to_string(), |n| n.to_string());
    let mut table = report::markdown(&rows);
    let _ = write!(
        table,
        "\nThe {}-route table costs the dispatcher {d_cost:.1}% of its requests/s (target: under 3%) and HAProxy {h_cost:.1}%; with it the dispatcher serves {:.2} times HAProxy's requests/s (target: at or above 1), {:.2} with one route. CPU per request with 500 routes against 1: dispatcher {:.2}, HAProxy {:.2}.\n\n\
         The large cell: {FARMS} farms of {SERVERS_PER_FARM} servers (backends of their own on the 4 nginx backends' addresses), {ROUTES_PER_FARM} routes each: under any host `/appN/*`, `/appN/api/*`, `/appN/static/*`, `/appN/servlet/*`, `/appN/*.jsp`, exact `/appN/login` and `/appN/logout`; on the host `appN.example`, `/*`, `*.do` and exact `/`. HAProxy has each route as ACLs (`hdr(host)`, `path`, `path_beg`, `path_end`) and one `use_backend`, the most specific first (HAProxy takes the first rule that matches, the dispatcher the most specific route); the one-route table is a catch-all to one farm over the 4 backends. The same wrk load for both tables: 1 thread, {CONNECTIONS} keep-alive connections, {secs} s, one request per route of the large cell in turn (`routes.lua`), no session cookie; requests/s: the median of {rounds} round(s), the tables and systems taking turns, each restarted with its table. workers: {WORKERS} each; CPU: user + system of the proxy's process over the measured runs. Requests no route matched (`dispatcher_no_route_total`): {} with 1 route, {} with 500.\n",
        tables[1].routes.len(),
        vs_haproxy(1),
        vs_haproxy(0),
        measured[1][0].cpu_us() / measured[0][0].cpu_us(),
        measured[1][1].cpu_us() / measured[0][1].cpu_us(),
        no_route_text(no_route[0]),
        no_route_text(no_route[1]),
    );
    println!("\n{table}");
    let json_opt = |n: Option<u64>| n.map_or("null".to_string(), |n| n.to_string());
    let json = format!(
        r#"{{"rounds":{rounds},"seconds":{secs},"connections":{CONNECTIONS},"workers":{WORKERS},"farms":{FARMS},"routes":{},"systems":{},"dispatcher_cost_percent":{d_cost:.2},"haproxy_cost_percent":{h_cost:.2},"vs_haproxy_500_routes":{:.3},"vs_haproxy_1_route":{:.3},"no_route_1_route":{},"no_route_500_routes":{}}}"#,
        tables[1].routes.len(),
        report::json(&rows),
        vs_haproxy(1),
        vs_haproxy(0),
        json_opt(no_route[0]),
        json_opt(no_route[1]),
    );
    (json, table)
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;

    fn parsed(table: &Table) -> toml::Table {
        table.dispatcher_toml().parse::<toml::Table>().expect("the generated TOML parses")
    }

    fn array<'a>(doc: &'a toml::Table, key: &str) -> &'a Vec<toml::Value> {
        doc.get(key).and_then(|v| v.as_array()).unwrap_or_else(|| panic!("no [[{key}]]"))
    }

    #[test]
    fn the_large_cell_is_500_routes_over_50_farms_in_the_schema() {
        let (table, _) = Table::large_cell();
        let doc = parsed(&table);
        let (backends, farms, routes) = (array(&doc, "backend"), array(&doc, "farm"), array(&doc, "route"));
        assert_eq!((backends.len(), farms.len(), routes.len()), (100, 50, 500));
        let str_of = |v: &toml::Value, k: &str| v.get(k).and_then(|x| x.as_str()).unwrap().to_string();
        let backend_names: HashSet<String> = backends.iter().map(|b| str_of(b, "name")).collect();
        assert_eq!(backend_names.len(), 100, "backend names are unique");
        // Each backend is a server of exactly one farm.
        let mut owner: HashMap<String, String> = HashMap::new();
        for f in farms {
            assert_eq!(str_of(f, "balance"), "round_robin");
            for s in f.get("servers").and_then(|s| s.as_array()).unwrap() {
                let s = s.as_str().unwrap().to_string();
                assert!(backend_names.contains(&s), "{s} is a backend");
                assert!(owner.insert(s.clone(), str_of(f, "name")).is_none(), "{s} in two farms");
            }
        }
        assert_eq!(owner.len(), 100);
        let farm_names: HashSet<String> = farms.iter().map(|f| str_of(f, "name")).collect();
        let mut per_farm: HashMap<String, usize> = HashMap::new();
        for r in routes {
            let farm = str_of(r, "farm");
            assert!(farm_names.contains(&farm), "route to an unknown farm {farm}");
            *per_farm.entry(farm).or_default() += 1;
            for key in ["hosts", "uris"] {
                assert_eq!(r.get(key).and_then(|v| v.as_array()).map(|a| a.len()), Some(1), "{key}");
            }
        }
        assert!(per_farm.values().all(|&n| n == ROUTES_PER_FARM), "{per_farm:?}");
        // The farms' servers spread evenly over the four addresses.
        let mut per_address: HashMap<String, usize> = HashMap::new();
        for b in backends {
            *per_address.entry(str_of(b, "address")).or_default() += 1;
        }
        assert_eq!(per_address.len(), BACKENDS);
        assert!(per_address.values().all(|&n| n == 25), "{per_address:?}");
    }

    #[test]
    fn the_agent_takes_both_tables() {
        for table in [Table::one_route(), Table::large_cell().0] {
            let text = crate::http::agent_config_with("bench", "", &table.dispatcher_toml());
            let cfg = dispatcher::config::Config::parse(&text, "routes.toml").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cfg.routes.len(), table.routes.len());
            assert_eq!(cfg.farms.iter().filter(|f| !f.implicit).count(), table.farms.len());
            assert_eq!(cfg.backends.len(), table.farms.len() * table.farms[0].servers.len());
        }
    }

    #[test]
    fn one_route_is_a_catch_all_to_one_farm_of_the_four_backends() {
        let table = Table::one_route();
        let doc = parsed(&table);
        assert_eq!((array(&doc, "backend").len(), array(&doc, "farm").len(), array(&doc, "route").len()), (4, 1, 1));
        let route = &array(&doc, "route")[0];
        assert_eq!(route.get("hosts").unwrap().as_array().unwrap()[0].as_str(), Some("*:*"));
        assert_eq!(route.get("uris").unwrap().as_array().unwrap()[0].as_str(), Some("/*"));
        assert_eq!(table.haproxy_rules(), " use_backend app if TRUE\n");
    }

    #[test]
    fn haproxy_has_500_rules_and_50_backends() {
        let (table, _) = Table::large_cell();
        let rules = table.haproxy_rules();
        assert_eq!(rules.lines().filter(|l| l.starts_with(" use_backend ")).count(), 500);
        assert!(rules.lines().all(|l| l.starts_with(" acl ") || l.starts_with(" use_backend ")), "{rules}");
        let backends = table.haproxy_backends();
        assert_eq!(backends.lines().filter(|l| l.starts_with("backend ")).count(), 50);
        assert_eq!(backends.lines().filter(|l| l.starts_with(" server ")).count(), 100);
        // Every ACL a rule requires is defined before it.
        let mut defined = HashSet::new();
        for l in rules.lines() {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words[0] {
                "acl" => {
                    defined.insert(words[1]);
                }
                _ => assert!(words[3..].iter().all(|a| defined.contains(a)), "{l}"),
            }
        }
        // The whole configuration, its template filled.
        let cfg = peers::fill(
            peers::HAPROXY_ROUTES,
            &[
                ("WORKERS", &1),
                ("MAXCONN", &1000),
                ("DIR", &"/tmp/x"),
                ("BIND", &"10.0.0.1:81"),
                ("RULES", &rules),
                ("BACKENDS", &backends),
            ],
        );
        assert!(cfg.contains("frontend fe\n bind 10.0.0.1:81\n acl r"));
        assert!(cfg.contains(" default_backend no_route\nbackend no_route\n"));
    }

    #[test]
    fn every_request_takes_its_route_through_the_dispatchers_matcher_and_haproxys_rules() {
        let (table, requests) = Table::large_cell();
        let routes: Vec<dispatcher::routes::Route> = table
            .routes
            .iter()
            .map(|r| dispatcher::routes::Route {
                hosts: vec![r.host_pattern()],
                uris: vec![r.uri.pattern()],
                target: r.farm,
            })
            .collect();
        let matcher = dispatcher::routes::Table::new(&routes).expect("the patterns are valid");
        assert!(matcher.shadowed().is_empty(), "no route is shadowed");
        // One request per route, each route once.
        let covered: HashSet<usize> = requests.iter().map(|r| r.route).collect();
        assert_eq!((requests.len(), covered.len()), (500, 500));
        for r in &requests {
            let m = matcher.find(Some(&r.host), 80, &r.path).unwrap_or_else(|| panic!("no route for {r:?}"));
            assert_eq!(m.route, r.route, "dispatcher: {r:?} took {:?}", table.routes[m.route]);
            assert_eq!(table.haproxy_route(&r.host, &r.path), Some(r.route), "HAProxy: {r:?}");
        }
        // Consecutive requests go to different farms.
        assert!(requests.windows(2).all(|w| table.routes[w[0].route].farm != table.routes[w[1].route].farm));
        // A request no route matches: none in either.
        assert!(matcher.find(Some("other.example"), 80, "/about").is_none());
        assert_eq!(table.haproxy_route("other.example", "/about"), None);
        // With one route, every request takes it.
        let one = Table::one_route();
        assert!(requests.iter().all(|r| one.haproxy_route(&r.host, &r.path) == Some(0)));
    }

    #[test]
    fn the_wrk_script_holds_every_request() {
        let (_, requests) = Table::large_cell();
        let lua = peers::fill(peers::ROUTES_LUA, &[("REQUESTS", &lua_requests(&requests))]);
        assert_eq!(lua.matches("\"www.example\", \"/app").count(), 350);
        assert_eq!(lua.matches(".example\", \"/").count(), 500);
        assert!(lua.contains("local requests = {\n  {\""));
    }
}
