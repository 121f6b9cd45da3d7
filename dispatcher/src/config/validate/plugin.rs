//! `[http] plugin_config`: WebSphere's plugin-cfg.xml read as backends, farms and routes.
//!
//! One backend per `Server` (its name; the address of its http `Transport`, which must be
//! an IPv4 literal; `CloneID`; `LoadBalanceWeight`; `MaxConnections` when above 0; its
//! port when it differs from its farm's), one farm per `ServerCluster` (`PrimaryServers`,
//! or every `Server` not in `BackupServers`; `BackupServers`; `LoadBalance`; the port of
//! its servers' transports; the first server's `ConnectTimeout` and `ServerIOTimeout`),
//! one route per `Route` and distinct `AffinityCookie`/`AffinityURLIdentifier` of its
//! `UriGroup` (the `VirtualHostGroup`'s names as they are), on every HTTP VIP.
//!
//! A `[[backend]]` of the TOML file with a `Server`'s name is that server: what it says
//! comes first (its address, replica, MAC, limits...), the file fills in what it leaves
//! out (clone IDs, weight, maxconn, port). `[[farm]]` and `[[route]]` of the TOML file may
//! stand beside the file's: their names are one namespace, and the TOML's routes come
//! first (at equal specificity the first route wins). Errors name the plugin-cfg.xml and
//! its line.

use std::{collections::HashMap, io::Read, net::Ipv4Addr};

use super::{farms::RouteLabel, farms::Taken, http::is_token, *};
use crate::routes::{
    import::{by_affinity, farm_port, primaries, route_name, transport},
    plugin_cfg::{self, LoadBalance, PluginConfig, Server},
};

/// The file as read, and how its errors and warnings name it.
pub(super) struct PluginFile {
    pub(super) shown: String,
    pub(super) cfg: PluginConfig,
    /// `[http] plugin_config` in the TOML file.
    pub(super) span: Range<usize>,
    /// `[http] plugin_vips`: the HTTP VIPs its routes apply to (`None`: every one that
    /// forwards), as written.
    pub(super) vips: Option<Vec<Spanned<String>>>,
}

/// The shortest and longest `plugin_refresh`.
const REFRESH: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));

/// The file's servers no `[[backend]]` names, in the order they become backends (after
/// the TOML's).
pub(super) fn file_only_servers(p: Option<&PluginFile>, raw: &[Spanned<RawBackend>]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in p.iter().flat_map(|p| &p.cfg.server_clusters).flat_map(|c| &c.servers) {
        if !raw.iter().any(|b| *b.get_ref().name.get_ref() == s.name) && !out.contains(&s.name) {
            out.push(s.name.clone());
        }
    }
    out
}

impl Ctx<'_> {
    /// An error in the plugin-cfg.xml, at its line.
    fn file_report(&self, file: &str, line: u32, message: impl std::fmt::Display) {
        self.errors.borrow_mut().push(ConfigError::Invalid {
            file: file.to_string(),
            line: line as usize,
            message: message.to_string(),
        });
    }

    /// Reads `[http] plugin_config` (its path is in `http`) and sets `plugin_refresh`.
    pub(super) fn plugin_file(&self, raw: Option<&RawHttp>, http: &mut HttpSettings) -> Option<PluginFile> {
        let raw = raw?;
        if let (None, Some(v)) = (&raw.plugin_config, &raw.plugin_vips) {
            self.report(v.span(), "http.plugin_vips", "the VIPs of a plugin_config's routes: set plugin_config too");
        }
        let (spanned, path) = (raw.plugin_config.as_ref()?, http.plugin_config.clone()?);
        let shown = path.display().to_string();
        let mut bytes = Vec::new();
        let read = std::fs::File::open(&path)
            .and_then(|f| f.take(plugin_cfg::MAX_FILE_BYTES as u64 + 1).read_to_end(&mut bytes));
        if let Err(e) = read {
            self.report(spanned.span(), "http.plugin_config", format!("cannot read {shown}: {e}"));
            return None;
        }
        let cfg = match plugin_cfg::parse(&bytes) {
            Ok(cfg) => cfg,
            Err(e) => {
                self.file_report(&shown, e.line, e.message);
                return None;
            }
        };
        http.plugin_refresh = match &raw.plugin_refresh {
            Some(r) => match self.duration(r, "http.plugin_refresh", REFRESH.0) {
                Some(d) if d > REFRESH.1 => {
                    self.report(r.span(), "http.plugin_refresh", "must be at most 1h");
                    REFRESH.1
                }
                Some(d) => d,
                None => REFRESH.1,
            },
            None => Duration::from_secs(cfg.refresh_interval).clamp(REFRESH.0, REFRESH.1),
        };
        for w in &cfg.warnings {
            self.warn(format!("{shown}:{}: {}", w.line, w.message));
        }
        for c in &cfg.server_clusters {
            self.warn(format!(
                "{shown}:{}: <ServerCluster> {:?} RetryInterval=\"{}\" is not implemented: health checks decide when a failed server is tried again ([health] interval, rise)",
                c.line, c.name, c.retry_interval
            ));
        }
        let vips = raw.plugin_vips.as_ref().map(|l| l.get_ref().clone());
        Some(PluginFile { shown, cfg, span: spanned.span(), vips })
    }

    /// The file's servers as backends: added, or filling in what the TOML backend of
    /// that name leaves out.
    pub(super) fn plugin_backends(
        &self,
        p: &PluginFile,
        raw: &[Spanned<RawBackend>],
        backends: &mut Vec<Backend>,
        by_name: &mut HashMap<String, usize>,
        clone_owner: &mut HashMap<String, usize>,
        farm_of: &HashMap<String, String>,
    ) {
        let mut cluster_of: HashMap<&str, (&str, u32)> = HashMap::new();
        for c in &p.cfg.server_clusters {
            let port = farm_port(c).0;
            for s in &c.servers {
                if let Some((other, line)) = cluster_of.insert(&s.name, (&c.name, c.line)) {
                    self.file_report(
                        &p.shown,
                        s.line,
                        format!("server {:?} is also in ServerCluster {other:?} (line {line}): a backend belongs to one farm", s.name),
                    );
                    continue;
                }
                self.plugin_server(p, s, port, raw, backends, by_name, clone_owner, farm_of);
            }
        }
        if backends.len() > dispatcher_common::MAX_BACKENDS as usize {
            let max = dispatcher_common::MAX_BACKENDS;
            self.report(
                p.span.clone(),
                "http.plugin_config",
                format!("at most {max} backends, with the file's servers"),
            );
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn plugin_server(
        &self,
        p: &PluginFile,
        s: &Server,
        farm_port: u16,
        raw: &[Spanned<RawBackend>],
        backends: &mut Vec<Backend>,
        by_name: &mut HashMap<String, usize>,
        clone_owner: &mut HashMap<String, usize>,
        farm_of: &HashMap<String, String>,
    ) {
        let (host, port, tls) = transport(s);
        let err = |message: String| self.file_report(&p.shown, s.line, message);
        if tls {
            self.warn(format!(
                "{}:{}: server {:?} has an https Transport only: the dispatcher speaks TLS to it only with [vip.backend_tls] on the VIPs",
                p.shown, s.line, s.name
            ));
        }
        let weight = self.plugin_weight(p, s);
        let maxconn = s.max_connections.map(|m| m.min(1_000_000));
        let own_port = (port != farm_port).then_some(port);
        let i = match by_name.get(&s.name) {
            Some(&i) => {
                // The TOML's backend of that name: the file fills in what it leaves out.
                let r = raw[i].get_ref();
                let b = &mut backends[i];
                if r.weight.is_none() {
                    b.weight = weight;
                }
                if r.maxconn.is_none() {
                    b.maxconn = maxconn;
                }
                if r.port.is_none() {
                    b.port = own_port;
                }
                if !r.clone_ids.is_empty() {
                    return;
                }
                i
            }
            None => {
                backends.push(self.plugin_backend(p, s, host, (weight, maxconn, own_port)));
                by_name.insert(s.name.clone(), backends.len() - 1);
                backends.len() - 1
            }
        };
        let Some(id) = &s.clone_id else { return };
        if id.len() > 64 || !is_token(id) {
            err(format!("server {:?} CloneID {id:?}: 1 to 64 token characters (no ':', spaces or separators)", s.name));
        } else if let Some(&prev) = clone_owner.get(id) {
            let owner = &backends[prev].name;
            err(format!("server {:?}: {}", s.name, clone_clash(id, "clone ID", owner, &s.name, farm_of)));
        } else {
            clone_owner.insert(id.clone(), i);
            backends[i].clone_ids.push(id.clone());
        }
    }

    /// A Server's LoadBalanceWeight (2 when unset, as the plug-in takes it).
    fn plugin_weight(&self, p: &PluginFile, s: &Server) -> u32 {
        let err = |message: String| self.file_report(&p.shown, s.line, message);
        match s.weight {
            None => 2,
            Some(0) => {
                self.warn(format!("{}:{}: server {:?} LoadBalanceWeight=\"0\": taken as 1", p.shown, s.line, s.name));
                1
            }
            Some(w) if w > 10_000 => {
                err(format!("server {:?} LoadBalanceWeight=\"{w}\": at most 10000", s.name));
                1
            }
            Some(w) => w,
        }
    }

    /// The backend of a Server no TOML `[[backend]]` names: its address from the Transport.
    fn plugin_backend(
        &self,
        p: &PluginFile,
        s: &Server,
        host: &str,
        (weight, maxconn, port): (u32, Option<u32>, Option<u16>),
    ) -> Backend {
        let err = |message: String| self.file_report(&p.shown, s.line, message);
        if let Err(e) = check_name(&s.name) {
            err(format!("server {:?}: a backend name {e}", s.name));
        }
        let address = match host.parse::<Ipv4Addr>() {
            Ok(a) => {
                if let Err(e) = check_host_address(IpAddr::V4(a)) {
                    err(format!("server {:?}: Transport Hostname {e}", s.name));
                }
                a
            }
            Err(_) => {
                err(format!(
                    "server {:?}: Transport Hostname {host:?} is not an IPv4 address: add a [[backend]] named {:?} with its address to the TOML file",
                    s.name, s.name
                ));
                Ipv4Addr::UNSPECIFIED
            }
        };
        Backend {
            name: s.name.clone(),
            address,
            address6: None,
            mac: None,
            weight,
            port,
            replica: None,
            clone_ids: Vec::new(),
            logical_names: Vec::new(),
            maxconn,
            maxqueue: Backend::DEFAULT_MAXQUEUE,
            slow_start: None,
            retired: false,
        }
    }

    /// The file's clusters as farms (after the TOML's).
    pub(super) fn plugin_farms(
        &self,
        p: &PluginFile,
        by_name: &HashMap<String, usize>,
        taken: &mut Taken,
    ) -> Vec<Farm> {
        let mut farms = Vec::new();
        for c in &p.cfg.server_clusters {
            let err = |message: String| self.file_report(&p.shown, c.line, message);
            if let Err(e) = check_name(&c.name) {
                err(format!("ServerCluster {:?}: a farm name {e}", c.name));
            } else if !taken.names.insert(c.name.clone()) {
                err(format!("ServerCluster {:?}: a [[farm]] of the TOML file has this name", c.name));
            }
            let mut members = |names: Vec<&str>| -> Vec<usize> {
                let mut out = Vec::new();
                for n in names {
                    let Some(&b) = by_name.get(n) else { continue };
                    match taken.member_of.get(&b) {
                        Some(other) if *other != c.name => err(format!(
                            "ServerCluster {:?}: server {n:?} is already in farm `{other}`: a backend belongs to one farm",
                            c.name
                        )),
                        Some(_) => {}
                        None => {
                            taken.member_of.insert(b, c.name.clone());
                            out.push(b);
                        }
                    }
                }
                out
            };
            let servers = members(primaries(c));
            let backup_servers = members(c.backup.iter().map(String::as_str).collect());
            if servers.is_empty() {
                err(format!("ServerCluster {:?} has no primary server (all are BackupServers)", c.name));
            }
            let timeout = |what: &str, get: fn(&Server) -> Option<u64>, min: Duration| {
                let first = c.servers.iter().find_map(get)?;
                let others: Vec<&str> =
                    c.servers.iter().filter(|s| get(s) != Some(first)).map(|s| s.name.as_str()).collect();
                if !others.is_empty() {
                    self.warn(format!(
                        "{}:{}: ServerCluster {:?}: {what}=\"{first}\" is taken for the whole farm, not the value of {}",
                        p.shown,
                        c.line,
                        c.name,
                        others.join(", ")
                    ));
                }
                Some(Duration::from_secs(first).clamp(min, MAX_DURATION))
            };
            farms.push(Farm {
                name: c.name.clone(),
                servers,
                backup_servers,
                balance: match c.load_balance {
                    LoadBalance::RoundRobin => Balance::RoundRobin,
                    LoadBalance::Random => Balance::Random,
                },
                port: Some(farm_port(c).0),
                fail_back: true,
                session_format: SessionFormat::WebSphere,
                slow_start: None,
                connect_timeout: timeout("ConnectTimeout", |s| s.connect_timeout, Duration::from_millis(10)),
                io_timeout: timeout("ServerIOTimeout", |s| s.server_io_timeout, Duration::from_millis(100)),
                implicit: false,
            });
        }
        farms
    }

    /// The file's routes (after the TOML's), on every forwarding HTTP VIP.
    pub(super) fn plugin_routes(&self, p: &PluginFile, vips: &[Vip], farms: &[Farm]) -> (Vec<Route>, Vec<RouteLabel>) {
        let forwards = |v: &Vip| v.served_http().is_some_and(|h| h.redirect_to.is_none());
        let on: Vec<usize> = match &p.vips {
            None => (0..vips.len()).filter(|&v| forwards(&vips[v])).collect(),
            Some(names) => {
                let mut on = Vec::new();
                for (k, n) in names.iter().enumerate() {
                    match vips.iter().position(|v| v.name == *n.get_ref()) {
                        Some(v) if forwards(&vips[v]) && !on.contains(&v) => on.push(v),
                        Some(v) if on.contains(&v) => self.report(
                            n.span(),
                            &format!("http.plugin_vips[{k}]"),
                            format!("`{}` listed twice", n.get_ref()),
                        ),
                        _ => self.report(
                            n.span(),
                            &format!("http.plugin_vips[{k}]"),
                            format!("`{}` is not an HTTP VIP that forwards", n.get_ref()),
                        ),
                    }
                }
                on
            }
        };
        let (mut routes, mut labels) = (Vec::new(), Vec::new());
        let mut farm_named = HashMap::new();
        for (i, f) in farms.iter().enumerate() {
            farm_named.entry(f.name.as_str()).or_insert(i);
        }
        for resolved in p.cfg.resolved_routes() {
            let (r, hosts, uris) = (resolved.route, resolved.hosts, resolved.uris);
            let Some(&farm) = farm_named.get(r.server_cluster.as_str()) else { continue };
            if on.is_empty() {
                self.report(
                    p.span.clone(),
                    "http.plugin_config",
                    "its routes apply to no HTTP VIP that forwards: add a [[vip]] with mode = \"http\" (and name it in plugin_vips, if set)",
                );
                return (routes, labels);
            }
            // Matching nothing (an empty group): the file's reader warned about it.
            if uris.uris.is_empty() || hosts.hosts.is_empty() {
                continue;
            }
            for u in &uris.uris {
                for (name, what) in
                    [(&u.affinity_cookie, "AffinityCookie"), (&u.affinity_url_identifier, "AffinityURLIdentifier")]
                {
                    if name.is_empty() || name.len() > 64 || !is_token(name) {
                        self.file_report(&p.shown, u.line, format!("Uri {what}={name:?}: 1 to 64 token characters"));
                    }
                }
            }
            let pairs = by_affinity(uris);
            let several = pairs.len() > 1;
            for ((cookie, param), list) in pairs {
                let name = route_name(&resolved, several.then_some(cookie));
                let uris = list.into_iter().map(|u| u.name.clone()).collect();
                routes.push(Route {
                    name,
                    vips: on.clone(),
                    hosts: hosts.hosts.clone(),
                    uris,
                    farm,
                    cookie: cookie.to_string(),
                    url_parameter: param.to_string(),
                });
                labels.push(RouteLabel {
                    file: p.shown.clone(),
                    line: r.line as usize,
                    name: format!("Route (UriGroup {:?}, cookie {cookie})", r.uri_group),
                });
            }
        }
        (routes, labels)
    }
}

/// A clone ID already owned by another backend: said with the farms when they differ.
pub(super) fn clone_clash(id: &str, what: &str, owner: &str, this: &str, farm_of: &HashMap<String, String>) -> String {
    let mut m = format!("{what} `{id}` is already a clone ID or logical name of backend `{owner}`");
    if let (Some(a), Some(b)) = (farm_of.get(owner), farm_of.get(this)) {
        if a != b {
            m.push_str(&format!(
                " (farm `{a}`; this one is in farm `{b}`): a clone ID names one server across all farms, the session cookie and the learned table know it alone"
            ));
        }
    }
    m
}
