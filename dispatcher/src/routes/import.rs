//! `dispatcher import plugin-cfg.xml`: the file as this project's TOML, for an operator to
//! review or take over. Names, clone IDs, URI patterns, cookie names, hosts and ports are
//! kept as they are. What is printed (the `[[farm]]`/`[[route]]` schema `config` reads;
//! with a `[[vip]]` added, and any host name replaced by its address, `dispatcher check`
//! takes it):
//!
//! ```toml
//! [[backend]]                    # one per Server (port: from its farm)
//! name = "shop_node1_server1"
//! address = "10.0.1.11"          # the http Transport's Hostname (a name must be resolved)
//! clone_ids = ["1a2b3c"]         # CloneID
//! weight = 2                     # LoadBalanceWeight
//! maxconn = 100                  # MaxConnections, when > 0
//! # replica = "..."              # plugin-cfg.xml cannot say
//!
//! [[farm]]                       # one per ServerCluster
//! name = "shop_cluster"
//! servers = ["shop_node1_server1"]   # PrimaryServers, or every Server without it
//! backup_servers = ["..."]           # BackupServers
//! balance = "round_robin"            # or "random" (LoadBalance)
//! # RetryInterval="60": not implemented (a comment: health checks decide)
//! port = 9080                        # the http Transport's port (https only: a comment)
//! connect_timeout = "5s"             # ConnectTimeout, when set
//! io_timeout = "900s"                # ServerIOTimeout, when set
//!
//! [[route]]                      # one per Route and distinct (cookie, url_parameter) of its UriGroup
//! name = "shop_host_shop_cluster_URIs"  # its UriGroup (see route_name): as the agent names it
//! hosts = ["*:80"]               # the VirtualHostGroup's VirtualHost names
//! uris = ["/shop/*", "*.jsp"]
//! farm = "shop_cluster"
//! cookie = "JSESSIONID"          # AffinityCookie
//! url_parameter = "jsessionid"   # AffinityURLIdentifier
//! ```
//!
//! A server whose http port differs from its farm's (servers of one cluster on one host)
//! gets a `port` of its own. The VIP addresses are not in plugin-cfg.xml: the header says
//! so and prints a commented `[[vip]]` per distinct port of the virtual hosts.

use std::{collections::BTreeSet, fmt::Write};

use super::{
    plugin_cfg::{LoadBalance, PluginConfig, Protocol, Resolved, Server, ServerCluster, Uri, UriGroup},
    HostPattern,
};

fn q(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

fn list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let v: Vec<String> = items.into_iter().map(q).collect();
    format!("[{}]", v.join(", "))
}

/// The http transport (else the https one) of a server: host, port, whether https.
pub fn transport(s: &Server) -> (&str, u16, bool) {
    let t = s.transports.iter().find(|t| t.protocol == Protocol::Http).unwrap_or(&s.transports[0]);
    (&t.hostname, t.port, t.protocol == Protocol::Https)
}

/// The farm's port: the most common among its servers (the first at a tie), and whether
/// it is an https one.
pub fn farm_port(c: &ServerCluster) -> (u16, bool) {
    // Counted in one pass (a hostile file may hold many servers).
    let mut counts: std::collections::HashMap<u16, usize> = std::collections::HashMap::new();
    for s in &c.servers {
        *counts.entry(transport(s).1).or_default() += 1;
    }
    let mut best = (0, false, 0);
    for s in &c.servers {
        let (_, port, tls) = transport(s);
        let n = counts[&port];
        if n > best.2 {
            best = (port, tls, n);
        }
    }
    (best.0, best.1)
}

/// A UriGroup's URIs by their (AffinityCookie, AffinityURLIdentifier), in the order the
/// pairs first appear: one route each.
pub fn by_affinity(group: &UriGroup) -> Vec<((&str, &str), Vec<&Uri>)> {
    let mut out: Vec<((&str, &str), Vec<&Uri>)> = Vec::new();
    // Where each pair is in `out` (a hostile file may give every URI its own pair).
    let mut at: std::collections::HashMap<(&str, &str), usize> = std::collections::HashMap::new();
    for u in &group.uris {
        let a = (u.affinity_cookie.as_str(), u.affinity_url_identifier.as_str());
        match at.get(&a) {
            Some(&i) => out[i].1.push(u),
            None => {
                at.insert(a, out.len());
                out.push((a, vec![u]));
            }
        }
    }
    out
}

/// The name of a Route's route (of its `cookie`'s URIs when its UriGroup has several
/// cookie names): the UriGroup's name, with `.<VirtualHostGroup>` when another Route
/// uses the group, and `.<cookie>`; characters a name may not have become `_` (so the
/// printed TOML's names pass `check` as they are).
pub fn route_name(r: &Resolved, cookie: Option<&str>) -> String {
    let safe = |n: &str| -> String {
        n.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect()
    };
    let mut name = safe(&r.route.uri_group);
    if r.group_shared {
        name = format!("{name}.{}", safe(&r.route.virtual_host_group));
    }
    if let Some(c) = cookie {
        name = format!("{name}.{}", safe(c));
    }
    name
}

/// The primary servers: `PrimaryServers`, or every server not in `BackupServers`.
pub fn primaries(c: &ServerCluster) -> Vec<&str> {
    match &c.primary {
        Some(p) => p.iter().map(String::as_str).collect(),
        None => c.servers.iter().map(|s| s.name.as_str()).filter(|n| !c.backup.iter().any(|b| b == n)).collect(),
    }
}

/// The first server's value, and the servers whose value differs from it.
fn server_value(c: &ServerCluster, get: impl Fn(&Server) -> Option<u64>) -> Option<(u64, Vec<String>)> {
    let first = c.servers.iter().find_map(&get)?;
    let others = c
        .servers
        .iter()
        .filter(|s| get(s) != Some(first))
        .map(|s| format!("{} ({})", s.name, get(s).map_or("unset".into(), |v| format!("{v}s"))))
        .collect();
    Some((first, others))
}

pub fn to_toml(cfg: &PluginConfig, source: &str) -> String {
    let mut out = String::new();
    header(&mut out, cfg, source);
    backends(&mut out, cfg);
    farms(&mut out, cfg);
    routes(&mut out, cfg);
    out
}

/// Where the text comes from, and what the file cannot say (the VIPs, with a commented
/// example per port of the virtual hosts).
fn header(w: &mut String, cfg: &PluginConfig, source: &str) {
    let _ = writeln!(w, "# Imported from {source} by `dispatcher import`: names, clone IDs, URI patterns,");
    let _ = writeln!(w, "# cookie names, hosts and ports as the file has them.");
    let _ = writeln!(w, "#");
    let _ = writeln!(w, "# plugin-cfg.xml does not know the addresses clients connect to: add one [[vip]]");
    let _ = writeln!(w, "# with mode = \"http\" per address and port the web server listened on, e.g.:");
    // The distinct ports of the virtual hosts (`*` says nothing; no port is 80).
    let ports: BTreeSet<u16> = cfg
        .virtual_host_groups
        .iter()
        .flat_map(|g| &g.hosts)
        .filter_map(|h| match HostPattern::parse(h) {
            Ok(p) => p.port,
            Err(_) => None,
        })
        .collect();
    for p in &ports {
        let _ = writeln!(w, "#");
        let _ = writeln!(w, "# [[vip]]");
        let _ = writeln!(w, "# name = \"web_{p}\"");
        let _ = writeln!(w, "# address = \"192.0.2.10\"    # the address clients use");
        let _ = writeln!(w, "# port = {p}");
        let _ = writeln!(w, "# mode = \"http\"");
    }
    let _ = writeln!(w, "#");
    let _ = writeln!(w, "# Replica pairs and health checks are not in plugin-cfg.xml either.");
    let _ = writeln!(w, "# The file is re-read every {} s (RefreshInterval).", cfg.refresh_interval);
}

/// One `[[backend]]` per Server (a Server in two clusters once).
fn backends(w: &mut String, cfg: &PluginConfig) {
    let mut printed = BTreeSet::new();
    for c in &cfg.server_clusters {
        let (port, _) = farm_port(c);
        for s in &c.servers {
            let (host, sport, _) = transport(s);
            if !printed.insert(s.name.as_str()) {
                let _ = writeln!(
                    w,
                    "\n# Server {:?} of farm {:?}: also in an earlier farm, printed once above.",
                    s.name, c.name
                );
                continue;
            }
            let _ = writeln!(w, "\n[[backend]]");
            let _ = writeln!(w, "name = {}", q(&s.name));
            if host.parse::<std::net::Ipv4Addr>().is_err() {
                let _ = writeln!(
                    w,
                    "# {host:?} is a host name, printed as the file has it: resolve it, an IPv4 address is needed."
                );
            }
            let _ = writeln!(w, "address = {}", q(host));
            if sport != port {
                let _ = writeln!(w, "port = {sport}    # not the farm's port ({port})");
            }
            if let Some(id) = &s.clone_id {
                let _ = writeln!(w, "clone_ids = {}", list([id.as_str()]));
            }
            // As the agent reads the file itself (`plugin_config`): an unset weight is the
            // plug-in's 2 (not the TOML default), 0 is taken as 1, and `MaxConnections`
            // is capped at 1,000,000.
            match s.weight {
                None => {
                    let _ = writeln!(w, "weight = 2    # LoadBalanceWeight unset: the plug-in's default");
                }
                Some(0) => {
                    let _ = writeln!(w, "weight = 1    # LoadBalanceWeight=\"0\": taken as 1");
                }
                Some(weight) => {
                    let _ = writeln!(w, "weight = {weight}");
                }
            }
            if let Some(m) = s.max_connections {
                let _ = writeln!(w, "maxconn = {}", m.min(1_000_000));
            }
            let _ =
                writeln!(w, "# replica = \"...\"    # the server holding this one's sessions: not in plugin-cfg.xml");
        }
    }
}

/// One `[[farm]]` per ServerCluster.
fn farms(w: &mut String, cfg: &PluginConfig) {
    for c in &cfg.server_clusters {
        let (port, tls) = farm_port(c);
        let servers = primaries(c);
        let _ = writeln!(w, "\n[[farm]]");
        let _ = writeln!(w, "name = {}", q(&c.name));
        let _ = writeln!(w, "servers = {}", list(servers));
        if !c.backup.is_empty() {
            let _ = writeln!(w, "backup_servers = {}", list(c.backup.iter().map(String::as_str)));
        }
        let balance = match c.load_balance {
            LoadBalance::RoundRobin => "round_robin",
            LoadBalance::Random => "random",
        };
        let _ = writeln!(w, "balance = {}", q(balance));
        let _ = writeln!(
            w,
            "# RetryInterval=\"{}\": not implemented, health checks decide when a failed server is tried again",
            c.retry_interval
        );
        let _ = writeln!(w, "port = {port}");
        if tls {
            let _ = writeln!(w, "# the servers have only an https Transport: set [vip.backend_tls] on the VIPs");
        }
        // One value per farm: the first server's that has one; servers that differ are named.
        for (key, value) in [
            ("connect_timeout", server_value(c, |s| s.connect_timeout)),
            ("io_timeout", server_value(c, |s| s.server_io_timeout)),
        ] {
            let Some((t, others)) = value else { continue };
            let _ = writeln!(w, "{key} = \"{t}s\"");
            if !others.is_empty() {
                let _ = writeln!(w, "# not the value of {}", others.join(", "));
            }
        }
    }
}

/// One `[[route]]` per Route and distinct (cookie, URL parameter) of its UriGroup.
fn routes(w: &mut String, cfg: &PluginConfig) {
    for resolved in cfg.resolved_routes() {
        let (r, hosts, group) = (resolved.route, resolved.hosts, resolved.uris);
        let pairs = by_affinity(group);
        let several = pairs.len() > 1;
        for ((cookie, param), uris) in pairs {
            let uris = uris.into_iter().map(|u| u.name.as_str());
            let _ = writeln!(
                w,
                "\n[[route]]    # line {}: UriGroup {:?}, VirtualHostGroup {:?}",
                r.line, group.name, hosts.name
            );
            let _ = writeln!(w, "name = {}", q(&route_name(&resolved, several.then_some(cookie))));
            let _ = writeln!(w, "hosts = {}", list(hosts.hosts.iter().map(String::as_str)));
            let _ = writeln!(w, "uris = {}", list(uris));
            let _ = writeln!(w, "farm = {}", q(&r.server_cluster));
            let _ = writeln!(w, "cookie = {}", q(cookie));
            let _ = writeln!(w, "url_parameter = {}", q(param));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn imported() -> toml::Table {
        let cfg = super::super::plugin_cfg::parse(include_bytes!("testdata/plugin-cfg.xml")).unwrap();
        let text = to_toml(&cfg, "plugin-cfg.xml");
        text.parse::<toml::Table>().unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    fn strings(v: &toml::Value) -> Vec<&str> {
        v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
    }

    fn by_name<'a>(t: &'a toml::Table, section: &str, name: &str) -> &'a toml::Table {
        t[section]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_table().unwrap())
            .find(|b| b["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no {section} {name}"))
    }

    #[test]
    fn the_realistic_file_imports_as_toml_that_keeps_its_names() {
        let t = imported();
        assert_eq!(t["backend"].as_array().unwrap().len(), 8);
        let b = by_name(&t, "backend", "shopNode1_shop1");
        assert_eq!(b["address"].as_str(), Some("10.0.1.11"));
        assert_eq!(strings(&b["clone_ids"]), ["1a2b3c4d"]);
        assert_eq!(b["weight"].as_integer(), Some(2));
        assert_eq!(b["maxconn"].as_integer(), Some(100));
        assert!(b.get("port").is_none());
        let b = by_name(&t, "backend", "shopNode1_shop2");
        assert_eq!(b["port"].as_integer(), Some(9081), "a second server on the node, another port");
        assert!(by_name(&t, "backend", "adminNode_admin1").get("maxconn").is_none(), "MaxConnections -1: none");
        assert_eq!(by_name(&t, "backend", "portalNode_portal1")["address"].as_str(), Some("portal1.cell.example"));

        assert_eq!(t["farm"].as_array().unwrap().len(), 3);
        let f = by_name(&t, "farm", "shop_cluster");
        assert_eq!(strings(&f["servers"]), ["shopNode1_shop1", "shopNode1_shop2", "shopNode2_shop3"]);
        assert_eq!(strings(&f["backup_servers"]), ["shopBackup_shop9"]);
        assert_eq!(f["balance"].as_str(), Some("round_robin"));
        assert!(f.get("retry_interval").is_none(), "not a setting: a comment");
        assert_eq!(f["port"].as_integer(), Some(9080));
        assert_eq!(f["connect_timeout"].as_str(), Some("5s"));
        assert_eq!(f["io_timeout"].as_str(), Some("900s"));
        let f = by_name(&t, "farm", "admin_cluster");
        assert_eq!(f["balance"].as_str(), Some("random"));

        assert!(f.get("backup_servers").is_none());
        assert_eq!(strings(&f["servers"]), ["adminNode_admin1", "adminNode2_admin2"], "no PrimaryServers: all");
        let f = by_name(&t, "farm", "portal_cluster");
        assert_eq!(f["port"].as_integer(), Some(9443));
        assert!(f.get("tls").is_none(), "not a setting: a comment");

        let routes: Vec<&toml::Table> = t["route"].as_array().unwrap().iter().map(|r| r.as_table().unwrap()).collect();
        assert_eq!(routes.len(), 4, "the shop route is split by its two cookie names");
        assert_eq!(strings(&routes[0]["hosts"]), ["shop.example:*", "*:443"]);
        assert_eq!(strings(&routes[0]["uris"]), ["/shop/*", "*.jsp", "/shop/cart"]);
        assert_eq!(routes[0]["farm"].as_str(), Some("shop_cluster"));
        assert_eq!(routes[0]["cookie"].as_str(), Some("JSESSIONID"));
        assert_eq!(routes[0]["url_parameter"].as_str(), Some("jsessionid"));
        assert_eq!(strings(&routes[1]["uris"]), ["/checkout/*"]);
        assert_eq!(routes[1]["cookie"].as_str(), Some("SHOPSESSION"));
        assert_eq!(routes[1]["url_parameter"].as_str(), Some("shopsession"));
        assert_eq!(strings(&routes[2]["uris"]), ["/admin/*", "/admin/*.do"]);
        assert_eq!(strings(&routes[3]["uris"]), ["/*"]);
        assert_eq!(routes[3]["farm"].as_str(), Some("portal_cluster"));
        // The names the agent gives the file's routes, so a takeover keeps its metrics.
        let names: Vec<&str> = routes.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "shop_host_shop_cluster_URIs.JSESSIONID",
                "shop_host_shop_cluster_URIs.SHOPSESSION",
                "admin_host_admin_cluster_URIs",
                "default_host_portal_cluster_URIs"
            ]
        );
    }

    #[test]
    fn the_header_says_how_to_add_the_vips() {
        let cfg = super::super::plugin_cfg::parse(include_bytes!("testdata/plugin-cfg.xml")).unwrap();
        let text = to_toml(&cfg, "plugin-cfg.xml");
        for p in ["80", "443", "9080"] {
            assert!(text.contains(&format!("# port = {p}\n")), "no commented VIP for {p}:\n{text}");
        }
        assert!(text.contains("# mode = \"http\""));
        assert!(text.contains("\"portal1.cell.example\" is a host name"));
    }
}
