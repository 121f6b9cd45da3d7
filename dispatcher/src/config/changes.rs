//! What a reload changes, in words: backends, VIPs, farms and routes added, removed or
//! changed (with what changed), and the sections that changed. Entries are matched by
//! name (ids are by name across reloads); retired ones are gone.

use std::fmt::Debug;

use super::{Backend, Config, Farm, Route, Vip};

impl Config {
    /// What `self` (the new configuration) changes from `old`, one line each; empty
    /// when nothing does.
    pub fn changes_from(&self, old: &Config) -> Vec<String> {
        let mut out = Vec::new();
        let backends = |c: &Config| -> Vec<(String, Backend)> {
            c.backends.iter().filter(|b| !b.retired).map(|b| (b.name.clone(), b.clone())).collect()
        };
        entries(&mut out, "backend", &backends(old), &backends(self), |o, n| backend_changes(old, o, self, n));
        let vips = |c: &Config| -> Vec<(String, Vip)> {
            c.vips.iter().filter(|v| !v.retired).map(|v| (v.name.clone(), v.clone())).collect()
        };
        entries(&mut out, "VIP", &vips(old), &vips(self), |o, n| vip_changes(old, o, self, n));
        let farms = |c: &Config| -> Vec<(String, Farm)> {
            c.farms.iter().filter(|f| !f.implicit).map(|f| (f.name.clone(), f.clone())).collect()
        };
        entries(&mut out, "farm", &farms(old), &farms(self), |o, n| farm_changes(old, o, self, n));
        let routes = |c: &Config| -> Vec<(String, (Route, String))> {
            c.routes
                .iter()
                .filter(|r| c.farms.get(r.farm).is_some_and(|f| !f.implicit))
                .map(|r| (r.name.clone(), (r.clone(), c.farms[r.farm].name.clone())))
                .collect()
        };
        entries(&mut out, "route", &routes(old), &routes(self), |(o, of), (n, nf)| {
            let mut c = Vec::new();
            field(&mut c, "farm", of, nf);
            field(&mut c, "hosts", &o.hosts, &n.hosts);
            field(&mut c, "uris", &o.uris, &n.uris);
            field(&mut c, "cookie", &o.cookie, &n.cookie);
            field(&mut c, "url_parameter", &o.url_parameter, &n.url_parameter);
            let names = |cfg: &Config, r: &Route| -> Vec<String> {
                r.vips.iter().filter_map(|&v| cfg.vips.get(v)).map(|v| v.name.clone()).collect()
            };
            field(&mut c, "vips", &names(old, o), &names(self, n));
            c
        });
        for (section, changed) in [
            ("[http]", self.http != old.http),
            ("[health]", self.health != old.health),
            ("[cluster]", self.cluster != old.cluster),
            ("[announce]", self.announce != old.announce),
            ("[access_log]", self.access_log != old.access_log),
            ("[[partition]]", self.partitions != old.partitions),
        ] {
            if changed {
                out.push(format!("{section} changed"));
            }
        }
        if self.log_level != old.log_level {
            out.push(format!("log_level {} -> {}", old.log_level, self.log_level));
        }
        out
    }
}

/// Added, removed, and changed (what `diff` says) entries of one kind, by name.
fn entries<T>(
    out: &mut Vec<String>,
    kind: &str,
    old: &[(String, T)],
    new: &[(String, T)],
    diff: impl Fn(&T, &T) -> Vec<String>,
) {
    let find = |list: &'_ [(String, T)], name: &str| list.iter().position(|(n, _)| n == name);
    for (name, n) in new {
        match find(old, name) {
            None => out.push(format!("{kind} {name} added")),
            Some(i) => {
                let c = diff(&old[i].1, n);
                if !c.is_empty() {
                    out.push(format!("{kind} {name}: {}", c.join(", ")));
                }
            }
        }
    }
    for (name, _) in old {
        if find(new, name).is_none() {
            out.push(format!("{kind} {name} removed"));
        }
    }
}

/// `name a -> b` when they differ.
fn field<T: PartialEq + Debug>(out: &mut Vec<String>, name: &str, old: &T, new: &T) {
    if old != new {
        out.push(format!("{name} {} -> {}", shown(old), shown(new)));
    }
}

/// A value as the file writes it: without `Some(..)` and the quotes of a string.
fn shown<T: Debug>(v: &T) -> String {
    let s = format!("{v:?}");
    let s = match s.strip_prefix("Some(").and_then(|x| x.strip_suffix(')')) {
        Some(inner) => inner.to_string(),
        None if s == "None" => "none".into(),
        None => s,
    };
    s.replace('"', "")
}

fn names(cfg: &Config, ids: impl IntoIterator<Item = usize>) -> Vec<String> {
    ids.into_iter().filter_map(|b| cfg.backends.get(b)).map(|b| b.name.clone()).collect()
}

fn backend_changes(old_cfg: &Config, o: &Backend, new_cfg: &Config, n: &Backend) -> Vec<String> {
    let mut c = Vec::new();
    field(&mut c, "address", &o.address, &n.address);
    field(&mut c, "address6", &o.address6, &n.address6);
    field(&mut c, "mac", &o.mac.map(|m| crate::mac::format_mac(&m)), &n.mac.map(|m| crate::mac::format_mac(&m)));
    field(&mut c, "weight", &o.weight, &n.weight);
    field(&mut c, "port", &o.port, &n.port);
    field(&mut c, "replica", &names(old_cfg, o.replica), &names(new_cfg, n.replica));
    field(&mut c, "clone_ids", &o.clone_ids, &n.clone_ids);
    field(&mut c, "logical_names", &o.logical_names, &n.logical_names);
    field(&mut c, "maxconn", &o.maxconn, &n.maxconn);
    field(&mut c, "maxqueue", &o.maxqueue, &n.maxqueue);
    field(&mut c, "slow_start", &o.slow_start, &n.slow_start);
    c
}

fn vip_changes(old_cfg: &Config, o: &Vip, new_cfg: &Config, n: &Vip) -> Vec<String> {
    let mut c = Vec::new();
    field(&mut c, "address", &o.address, &n.address);
    field(&mut c, "port", &o.port, &n.port);
    field(&mut c, "protocol", &o.protocol, &n.protocol);
    field(&mut c, "mode", &o.mode(), &n.mode());
    field(&mut c, "backends", &names(old_cfg, o.backends.iter().copied()), &names(new_cfg, n.backends.iter().copied()));
    field(&mut c, "slow_start", &o.slow_start, &n.slow_start);
    if o.mode() == n.mode() && o.kind != n.kind {
        let before = c.len();
        if let (Some(a), Some(b)) = (o.http(), n.http()) {
            field(&mut c, "backend_port", &a.backend_port, &b.backend_port);
            field(&mut c, "balance", &a.balance, &b.balance);
            field(&mut c, "max_connections", &a.max_connections, &b.max_connections);
            field(&mut c, "fail_back", &a.fail_back, &b.fail_back);
            field(&mut c, "session_format", &a.session_format, &b.session_format);
            field(&mut c, "insert_cookie", &a.insert_cookie, &b.insert_cookie);
            field(&mut c, "http2", &a.http2, &b.http2);
            field(&mut c, "h2c", &a.h2c, &b.h2c);
            field(
                &mut c,
                "redirect_to",
                &a.redirect_to.as_ref().map(|r| &r.vip),
                &b.redirect_to.as_ref().map(|r| &r.vip),
            );
            if a.tls != b.tls {
                c.push("tls changed".into());
            }
            if a.backend_tls != b.backend_tls {
                c.push("backend_tls changed".into());
            }
        }
        if let (Some(a), Some(b)) = (o.l4(), n.l4()) {
            field(&mut c, "forwarding", &a.forwarding, &b.forwarding);
            field(&mut c, "encap_source", &a.encap_source, &b.encap_source);
            field(&mut c, "ring_size", &a.ring_size, &b.ring_size);
            field(&mut c, "sticky_time", &a.sticky_time, &b.sticky_time);
        }
        if c.len() == before {
            c.push("settings changed".into());
        }
    }
    c
}

fn farm_changes(old_cfg: &Config, o: &Farm, new_cfg: &Config, n: &Farm) -> Vec<String> {
    let mut c = Vec::new();
    field(&mut c, "servers", &names(old_cfg, o.servers.iter().copied()), &names(new_cfg, n.servers.iter().copied()));
    field(
        &mut c,
        "backup_servers",
        &names(old_cfg, o.backup_servers.iter().copied()),
        &names(new_cfg, n.backup_servers.iter().copied()),
    );
    field(&mut c, "balance", &o.balance, &n.balance);
    field(&mut c, "port", &o.port, &n.port);
    let rest = |f: &Farm| (f.fail_back, f.session_format, f.slow_start, f.connect_timeout, f.io_timeout);
    if rest(o) != rest(n) {
        c.push("settings changed".into());
    }
    c
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    const OLD: &str = r#"
[dispatcher]
interface = "eth0"

[[backend]]
name = "b0"
address = "10.0.0.10"

[[backend]]
name = "b1"
address = "10.0.0.11"

[[farm]]
name = "shop"
servers = ["b0", "b1"]

[[route]]
name = "all"
hosts = ["*"]
uris = ["/*"]
farm = "shop"

[[vip]]
name = "web"
address = "10.0.100.1"
port = 80
mode = "http"
"#;

    fn changes(old: &str, new: &str) -> Vec<String> {
        let old = Config::parse(old, "x.toml").unwrap();
        let new = old.merged_for_reload(Config::parse(new, "x.toml").unwrap()).unwrap();
        new.changes_from(&old)
    }

    #[test]
    fn no_changes() {
        assert!(changes(OLD, OLD).is_empty());
        // Moving entries in the file is no change.
        let moved = OLD.replace("[[backend]]\nname = \"b0\"\naddress = \"10.0.0.10\"\n\n", "")
            + "\n[[backend]]\nname = \"b0\"\naddress = \"10.0.0.10\"\n";
        assert_eq!(changes(OLD, &moved), Vec::<String>::new());
    }

    #[test]
    fn each_kind_of_change_is_listed() {
        let new = OLD
            .replace("address = \"10.0.0.11\"", "address = \"10.0.0.21\"\nweight = 200")
            .replace("servers = [\"b0\", \"b1\"]", "servers = [\"b0\", \"b1\", \"b2\"]")
            .replace("port = 80\n", "port = 8080\n")
            + "\n[[backend]]\nname = \"b2\"\naddress = \"10.0.0.12\"\n\n[[vip]]\nname = \"api\"\naddress = \"10.0.100.2\"\nport = 80\nmode = \"http\"\n";
        assert_eq!(
            changes(OLD, &new),
            [
                "backend b1: address 10.0.0.11 -> 10.0.0.21, weight 100 -> 200",
                "backend b2 added",
                "VIP web: port 80 -> 8080, backends [b0, b1] -> [b0, b1, b2], backend_port 80 -> 8080",
                "VIP api added",
                "farm shop: servers [b0, b1] -> [b0, b1, b2]",
                "route all: vips [web] -> [web, api]",
            ]
        );
        let gone = OLD.replace("[[backend]]\nname = \"b1\"\naddress = \"10.0.0.11\"\n", "").replace(", \"b1\"", "")
            + "\n[http]\nretries = 2\n";
        assert_eq!(
            changes(OLD, &gone),
            [
                "backend b1 removed",
                "VIP web: backends [b0, b1] -> [b0]",
                "farm shop: servers [b0, b1] -> [b0]",
                "[http] changed"
            ]
        );
        let routes =
            OLD.replace("name = \"all\"", "name = \"everything\"").replace("uris = [\"/*\"]", "uris = [\"/app/*\"]");
        assert_eq!(changes(OLD, &routes), ["route everything added", "route all removed"]);
        let uris = OLD.replace("uris = [\"/*\"]", "uris = [\"/app/*\"]");
        assert_eq!(changes(OLD, &uris), ["route all: uris [/*] -> [/app/*]"]);
    }
}
