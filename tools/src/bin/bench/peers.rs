//! The peers' configurations (HAProxy, nginx, Kamailio, the TLS clients' OpenSSL) and the
//! wrk scripts are files under `tools/bench/`, compiled in; `{{NAME}}` placeholders are
//! filled when a bench writes them into its testbed's directory.

use std::{
    fmt::Display,
    path::{Path, PathBuf},
};

use dispatcher_testbed::netns::backend_ip;

macro_rules! file {
    ($path:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/bench/", $path))
    };
}

pub const NGINX_BACKEND: &str = file!("peers/nginx-backend.conf.in");
pub const NGINX_L4_BACKEND: &str = file!("peers/nginx-l4-backend.conf.in");
pub const NGINX_PROXY: &str = file!("peers/nginx-proxy.conf.in");
pub const HAPROXY_HTTP: &str = file!("peers/haproxy-http.cfg.in");
pub const HAPROXY_FAILOVER: &str = file!("peers/haproxy-failover.cfg.in");
pub const HAPROXY_L4: &str = file!("peers/haproxy-l4.cfg.in");
/// A route table as ACLs and `use_backend` rules (the routes bench).
pub const HAPROXY_ROUTES: &str = file!("peers/haproxy-routes.cfg.in");
pub const KAMAILIO: &str = file!("peers/kamailio.cfg.in");
pub const OPENSSL_CLIENT: &str = file!("peers/openssl-client.cnf.in");
/// Keep-alive requests naming the four clones in turn.
pub const COOKIES_LUA: &str = file!("wrk/cookies.lua");
/// The same with `Connection: close`.
pub const CLOSE_LUA: &str = file!("wrk/close.lua");
/// Keep-alive requests to many virtual hosts and paths in turn, one per route.
pub const ROUTES_LUA: &str = file!("wrk/routes.lua");

/// `template` with each `{{NAME}}` replaced by its value. Panics on a name the template
/// lacks or a placeholder left unfilled: a template and its caller disagree.
pub fn fill(template: &str, values: &[(&str, &dyn Display)]) -> String {
    let mut s = template.to_string();
    for (name, value) in values {
        let key = format!("{{{{{name}}}}}");
        assert!(s.contains(&key), "no {key} in the template:\n{template}");
        s = s.replace(&key, &value.to_string());
    }
    if let Some(at) = s.find("{{") {
        let rest = &s[at..];
        panic!("unfilled placeholder {} in:\n{s}", &rest[..rest.find("}}").map_or(rest.len(), |e| e + 2)]);
    }
    s
}

/// Writes `template`, filled with `values`, to `dir/name`; its path.
pub fn write(dir: &Path, name: &str, template: &str, values: &[(&str, &dyn Display)]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, fill(template, values)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

/// HAProxy's lines routing by the clone ID in JSESSIONID to the four backends (`clone0x`
/// ... on `port`), each server line ending in `server_options`.
pub fn haproxy_clone_servers(port: u16, server_options: &str) -> (String, String) {
    let use_servers = (0..4)
        .map(|i| format!(" use-server clone{i}x if {{ req.cook(JSESSIONID),field(2,:) -m str clone{i}x }}\n"))
        .collect();
    let servers = (0..4).map(|i| format!(" server clone{i}x {}:{port}{server_options}\n", backend_ip(i))).collect();
    (use_servers, servers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_placeholder_is_filled() {
        assert_eq!(fill("a {{X}} b {{X}} {{Y}}", &[("X", &1), ("Y", &"y")]), "a 1 b 1 y");
    }

    #[test]
    #[should_panic(expected = "unfilled placeholder {{Y}}")]
    fn an_unfilled_placeholder_is_refused() {
        fill("a {{X}} {{Y}} c", &[("X", &1)]);
    }

    #[test]
    #[should_panic(expected = "no {{Z}}")]
    fn a_value_for_no_placeholder_is_refused() {
        fill("a {{X}}", &[("X", &1), ("Z", &2)]);
    }

    #[test]
    fn the_kamailio_template_keeps_its_first_line() {
        let listen = "udp:10.0.0.1:5060";
        let s = fill(KAMAILIO, &[("LB_IP", &"10.0.0.1"), ("LIST", &"/tmp/list"), ("LISTEN", &listen), ("TLS", &"")]);
        assert!(s.starts_with("#!KAMAILIO\n"));
        assert!(s.contains("sip:kamailio@10.0.0.1"));
    }
}
