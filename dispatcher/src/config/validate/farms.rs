//! `[[farm]]` and `[[route]]`, and the HTTP VIPs routes apply to.
//!
//! A VIP a route applies to takes its servers from its farms: its `backends` (its pools
//! and health checks) are the members of the farms its routes name, primaries first, and
//! the VIP-level settings that belong to a farm (`backends`, `balance`, `fail_back`,
//! `session_format`, `slow_start`) are refused on it, with the farm's field to use.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    net::IpAddr,
};

use super::{http::is_token, *};
use crate::routes;

/// Which VIPs routes apply to, known from the raw routes before the VIPs are read: the
/// names the routes list, or every HTTP VIP when one lists none (as the plugin-cfg.xml's
/// routes do).
#[derive(Default)]
pub(super) struct Routed {
    names: HashSet<String>,
    all: bool,
}

impl Routed {
    /// `plugin`: a plugin-cfg.xml is configured, with the VIPs its routes apply to
    /// (`None`: every HTTP VIP that forwards). They are routed even when the file has no
    /// route (then every request is answered 404, never balanced over whatever backends
    /// there are).
    pub(super) fn new(raw: &[Spanned<RawRoute>], plugin: Option<Option<&[Spanned<String>]>>) -> Routed {
        let mut r = Routed { names: HashSet::new(), all: matches!(plugin, Some(None)) };
        if let Some(Some(list)) = plugin {
            r.names.extend(list.iter().map(|n| n.get_ref().clone()));
        }
        for route in raw {
            match &route.get_ref().vips {
                None => r.all = true,
                Some(list) => r.names.extend(list.get_ref().iter().map(|n| n.get_ref().clone())),
            }
        }
        r
    }

    /// Routes apply to the VIP of this name if it is an HTTP VIP that forwards.
    pub(super) fn applies(&self, name: &str) -> bool {
        self.all || self.names.contains(name)
    }
}

/// What the farms read so far took: their names, and each backend's farm.
#[derive(Default)]
pub(super) struct Taken {
    pub(super) names: HashSet<String>,
    pub(super) member_of: HashMap<usize, String>,
}

/// Where a route was written, for the warnings about it.
pub(super) struct RouteLabel {
    pub(super) file: String,
    pub(super) line: usize,
    /// `route[3]`, or the plugin-cfg.xml's `Route` and its cookie.
    pub(super) name: String,
}

impl RouteLabel {
    /// `file:line`
    fn at(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// A forwarding HTTP VIP (not a redirecting one).
fn forwards(v: &Vip) -> bool {
    v.served_http().is_some_and(|h| h.redirect_to.is_none())
}

/// Backend name -> the farm the files put it in (for the messages about clone IDs).
pub(super) fn farm_of(raw: &[Spanned<RawFarm>], file: Option<&plugin_cfg::PluginConfig>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for f in raw {
        let f = f.get_ref();
        let backups = f.backup_servers.iter().flat_map(|l| l.get_ref());
        for s in f.servers.get_ref().iter().chain(backups) {
            out.entry(s.get_ref().clone()).or_insert_with(|| f.name.get_ref().clone());
        }
    }
    for c in file.iter().flat_map(|p| &p.server_clusters) {
        for s in &c.servers {
            out.entry(s.name.clone()).or_insert_with(|| c.name.clone());
        }
    }
    out
}

type Names<'a> = &'a Spanned<Vec<Spanned<String>>>;

impl Ctx<'_> {
    /// `[[farm]]`.
    pub(super) fn farms(
        &self,
        raw: &[Spanned<RawFarm>],
        backends: &[Backend],
        by_name: &HashMap<String, usize>,
        taken: &mut Taken,
    ) -> Vec<Farm> {
        raw.iter().enumerate().map(|(i, f)| self.farm(i, f.get_ref(), backends, by_name, taken)).collect()
    }

    /// A farm's `servers` or `backup_servers`: backends of no other farm.
    fn farm_members(
        &self,
        list: Names,
        field: &str,
        farm: &str,
        by_name: &HashMap<String, usize>,
        taken: &mut Taken,
    ) -> Vec<usize> {
        let mut out = Vec::new();
        for n in list.get_ref() {
            let Some(&b) = by_name.get(n.get_ref()) else {
                self.report(n.span(), field, format!("names no backend: `{}`", n.get_ref()));
                continue;
            };
            match taken.member_of.get(&b) {
                Some(other) if other == farm => {
                    self.report(n.span(), field, format!("`{}` is listed twice in the farm", n.get_ref()))
                }
                Some(other) => self.report(
                    n.span(),
                    field,
                    format!("backend `{}` is already in farm `{other}`: a backend belongs to one farm", n.get_ref()),
                ),
                None => {
                    taken.member_of.insert(b, farm.to_string());
                    out.push(b);
                }
            }
        }
        out
    }

    fn farm(
        &self,
        i: usize,
        f: &RawFarm,
        backends: &[Backend],
        by_name: &HashMap<String, usize>,
        taken: &mut Taken,
    ) -> Farm {
        let field = |x: &str| format!("farm[{i}].{x}");
        let name = f.name.get_ref().clone();
        if let Err(e) = check_name(&name) {
            self.report(f.name.span(), &field("name"), e);
        } else if !taken.names.insert(name.clone()) {
            self.report(f.name.span(), &field("name"), format!("`{name}` is defined twice"));
        }
        let servers = self.farm_members(&f.servers, &field("servers"), &name, by_name, taken);
        let backup_servers = match &f.backup_servers {
            Some(l) => self.farm_members(l, &field("backup_servers"), &name, by_name, taken),
            None => Vec::new(),
        };
        if f.servers.get_ref().is_empty() {
            self.report(
                f.servers.span(),
                &field("servers"),
                "a farm needs at least one server (backup_servers serve only while no server is up)",
            );
        }
        let session_format = self.choice(
            &f.session_format,
            &field("session_format"),
            SessionFormat::WebSphere,
            &[("websphere", SessionFormat::WebSphere), ("jvmroute", SessionFormat::JvmRoute)],
        );
        if let (SessionFormat::JvmRoute, Some(s)) = (session_format, &f.session_format) {
            for b in servers.iter().chain(&backup_servers).map(|&b| &backends[b]) {
                for c in b.clone_ids.iter().filter(|c| c.contains('.')) {
                    self.report(
                        s.span(),
                        &field("session_format"),
                        format!(
                            "clone ID `{c}` of backend `{}` cannot be a jvmRoute: the route is what follows the last '.'",
                            b.name
                        ),
                    );
                }
            }
        }
        let ms = Duration::from_millis;
        let dur = |v: &Option<Spanned<String>>, x: &str, min| v.as_ref().and_then(|v| self.duration(v, &field(x), min));
        Farm {
            servers,
            backup_servers,
            balance: self.choice(&f.balance, &field("balance"), Balance::RoundRobin, super::http::BALANCES),
            port: f.port.as_ref().and_then(|p| match *p.get_ref() {
                0 => {
                    self.report(p.span(), &field("port"), "must be 1..=65535");
                    None
                }
                port => Some(port),
            }),
            fail_back: f.fail_back.as_ref().is_none_or(|b| *b.get_ref()),
            session_format,
            slow_start: dur(&f.slow_start, "slow_start", ms(100)),
            connect_timeout: dur(&f.connect_timeout, "connect_timeout", ms(10)),
            io_timeout: dur(&f.io_timeout, "io_timeout", ms(100)),
            implicit: false,
            name,
        }
    }

    /// `[[route]]`, with where each was written.
    pub(super) fn routes(
        &self,
        raw: &[Spanned<RawRoute>],
        vips: &[Vip],
        farms: &[Farm],
        http: &HttpSettings,
    ) -> (Vec<Route>, Vec<RouteLabel>) {
        let mut routes = Vec::new();
        let mut labels = Vec::new();
        for (i, r) in raw.iter().enumerate() {
            let span = r.span();
            if let Some(route) = self.route(i, r.get_ref(), span.clone(), vips, farms, http) {
                routes.push(route);
                let (file, line) = (self.file.to_string(), self.line(span.start));
                labels.push(RouteLabel { file, line, name: format!("route[{i}]") });
            }
        }
        (routes, labels)
    }

    /// `vips` of route `i`: the HTTP VIPs it names, or every forwarding one.
    fn route_vips(&self, i: usize, r: &RawRoute, span: Range<usize>, vips: &[Vip]) -> Option<Vec<usize>> {
        let field = format!("route[{i}].vips");
        let Some(list) = &r.vips else {
            let all: Vec<usize> = (0..vips.len()).filter(|&v| forwards(&vips[v])).collect();
            if all.is_empty() {
                self.report(
                    span,
                    &field,
                    "applies to every HTTP VIP, and there is none that forwards: add a [[vip]] with mode = \"http\"",
                );
                return None;
            }
            return Some(all);
        };
        let mut ok = true;
        if list.get_ref().is_empty() {
            ok = false;
            self.report(list.span(), &field, "is empty: leave it out for every HTTP VIP");
        }
        let mut on = Vec::new();
        for n in list.get_ref() {
            let why = match vips.iter().position(|v| v.name == *n.get_ref()) {
                None => "names no VIP",
                Some(v) if vips[v].http().is_none() => "is not an HTTP VIP (mode = \"http\")",
                Some(v) if !forwards(&vips[v]) => "is a redirecting VIP: it forwards nothing",
                Some(v) if on.contains(&v) => "is listed twice",
                Some(v) => {
                    on.push(v);
                    continue;
                }
            };
            ok = false;
            self.report(n.span(), &field, format!("`{}` {why}", n.get_ref()));
        }
        ok.then_some(on)
    }

    /// A route's `hosts` or `uris`: patterns the matcher takes.
    fn patterns(&self, list: Names, field: &str, parse: fn(&str) -> Result<(), &'static str>) -> bool {
        let mut ok = true;
        if list.get_ref().is_empty() {
            ok = false;
            self.report(list.span(), field, "is empty: a route needs at least one");
        }
        for p in list.get_ref() {
            if let Err(why) = parse(p.get_ref()) {
                ok = false;
                self.report(p.span(), field, format!("`{}`: {why}", p.get_ref().escape_debug()));
            }
        }
        ok
    }

    /// A route's cookie or URL parameter name.
    fn session_name(&self, v: &Option<Spanned<String>>, field: &str, default: &str) -> Option<String> {
        let Some(t) = v else { return Some(default.to_string()) };
        let name = t.get_ref();
        if name.is_empty() || name.len() > 64 || !is_token(name) {
            self.report(
                t.span(),
                field,
                format!("`{}` is not a cookie or parameter name (1 to 64 token characters)", name.escape_debug()),
            );
            return None;
        }
        Some(name.clone())
    }

    fn route(
        &self,
        i: usize,
        r: &RawRoute,
        span: Range<usize>,
        vips: &[Vip],
        farms: &[Farm],
        http: &HttpSettings,
    ) -> Option<Route> {
        let field = |x: &str| format!("route[{i}].{x}");
        let on = self.route_vips(i, r, span, vips);
        let hosts = self.patterns(&r.hosts, &field("hosts"), |s| routes::HostPattern::parse(s).map(|_| ()));
        let uris = self.patterns(&r.uris, &field("uris"), |s| routes::UriPattern::parse(s).map(|_| ()));
        let farm = farms.iter().position(|f| f.name == *r.farm.get_ref());
        if farm.is_none() {
            self.report(r.farm.span(), &field("farm"), format!("names no farm: `{}`", r.farm.get_ref()));
        }
        let cookie = self.session_name(&r.cookie, &field("cookie"), &http.cookie_name);
        let url_parameter = self.session_name(&r.url_parameter, &field("url_parameter"), &http.url_parameter);
        let strings = |l: Names| l.get_ref().iter().map(|s| s.get_ref().clone()).collect();
        let name = match &r.name {
            Some(n) => {
                if let Err(e) = check_name(n.get_ref()) {
                    self.report(n.span(), &field("name"), format!("a route name {e}"));
                }
                n.get_ref().clone()
            }
            None => format!("route{i}"),
        };
        (hosts && uris).then_some(())?;
        Some(Route {
            name,
            vips: on?,
            hosts: strings(&r.hosts),
            uris: strings(&r.uris),
            farm: farm?,
            cookie: cookie?,
            url_parameter: url_parameter?,
        })
    }

    /// The VIPs routes apply to: their `backends` are their farms' members, primaries
    /// first; the farm's settings are refused on them.
    pub(super) fn routed_vips(
        &self,
        raw: &[Spanned<RawVip>],
        vips: &mut [Vip],
        routed: &Routed,
        farms: &[Farm],
        routes: &[Route],
    ) {
        for (i, v) in vips.iter_mut().enumerate() {
            if !forwards(v) || !routed.applies(&v.name) {
                continue;
            }
            let r = raw[i].get_ref();
            for (set, x, instead) in [
                (r.backends.as_ref().map(|s| s.span()), "backends", "the farms' servers and backup_servers"),
                (r.balance.as_ref().map(|s| s.span()), "balance", "the farm's balance"),
                (r.fail_back.as_ref().map(|s| s.span()), "fail_back", "the farm's fail_back"),
                (r.session_format.as_ref().map(|s| s.span()), "session_format", "the farm's session_format"),
                (r.slow_start.as_ref().map(|s| s.span()), "slow_start", "the farm's or the backend's slow_start"),
            ] {
                if let Some(span) = set {
                    self.report(
                        span,
                        &format!("vip[{i}].{x}"),
                        format!(
                            "routes apply to VIP `{}`: its requests go to the farms they name (set {instead})",
                            v.name
                        ),
                    );
                }
            }
            let mut members: Vec<usize> = Vec::new();
            for r in routes.iter().filter(|r| r.vips.contains(&i)) {
                let f = &farms[r.farm];
                for &b in f.servers.iter().chain(&f.backup_servers) {
                    if !members.contains(&b) {
                        members.push(b);
                    }
                }
            }
            v.backends = members;
        }
    }

    /// A farm member that is one of the HTTP VIPs (at the port the farm's requests go
    /// to) would send the VIP's requests back to the dispatcher: as `vips::no_loops` for
    /// a VIP's own backends.
    pub(super) fn routed_loops(
        &self,
        raw: &[Spanned<RawVip>],
        vips: &[Vip],
        backends: &[Backend],
        farms: &[Farm],
        routes: &[Route],
    ) {
        let listening: Vec<(IpAddr, u16, &str)> =
            vips.iter().filter(|v| v.serves_http()).map(|v| (v.address, v.port, v.name.as_str())).collect();
        for (i, v) in vips.iter().enumerate() {
            let Some(h) = v.served_http() else { continue };
            let mut seen = HashSet::new();
            for r in routes.iter().filter(|r| r.vips.contains(&i)) {
                let f = &farms[r.farm];
                for &b in f.servers.iter().chain(&f.backup_servers) {
                    let (addr, port) = (IpAddr::V4(backends[b].address), f.port_of(&backends[b], h.backend_port));
                    let hit = listening.iter().find(|(a, p, _)| {
                        *p == port
                            && (*a == addr || (a.is_unspecified() && (addr.is_loopback() || addr.is_unspecified())))
                    });
                    if let Some((a, p, name)) = hit.filter(|_| seen.insert(b)) {
                        self.report(
                            raw[i].span(),
                            &format!("vip[{i}]"),
                            format!(
                                "backend `{}` ({addr}:{port}) of farm `{}` is HTTP VIP `{name}` ({}): its requests would come back to this dispatcher (a loop)",
                                backends[b].name,
                                f.name,
                                std::net::SocketAddr::new(*a, *p)
                            ),
                        );
                    }
                }
            }
        }
    }

    /// A farm member's replica is in its farm: a session fails over only to its owner's
    /// replica and never out of its route's farm, so a replica elsewhere would leave the
    /// session nowhere to go (503 whenever its owner is out). A replica in another farm is
    /// refused; one in no farm is a warning (a server WebSphere removed from a
    /// regenerated plugin-cfg.xml while the TOML still pairs it: the new file must apply).
    pub(super) fn replicas_in_farm(&self, raw: &[Spanned<RawBackend>], backends: &[Backend], farms: &[Farm]) {
        for f in farms.iter().filter(|f| !f.implicit) {
            for b in f.members() {
                let (Some(r), Some(raw_b)) = (backends[b].replica, raw.get(b)) else { continue };
                if f.members().any(|m| m == r) {
                    continue;
                }
                let Some(span) = raw_b.get_ref().replica.as_ref().map(|r| r.span()) else { continue };
                let Some(g) = farms.iter().find(|g| !g.implicit && g.members().any(|m| m == r)) else {
                    self.warn(format!(
                        "{}:{}: backend[{b}].replica: `{}` is in no farm: `{}`'s sessions have no replica in farm `{}` (503 while it is out)",
                        self.file,
                        self.line(span.start),
                        backends[r].name,
                        backends[b].name,
                        f.name
                    ));
                    continue;
                };
                let elsewhere = format!("in farm `{}`", g.name);
                self.report(
                    span,
                    &format!("backend[{b}].replica"),
                    format!(
                        "`{}` is {elsewhere}, not in `{}`'s farm `{}`: a session fails over only within its farm",
                        backends[r].name, backends[b].name, f.name
                    ),
                );
            }
        }
    }

    /// Route names unique: the TOML's `name`s are refused when used twice; a file's route
    /// whose name is taken gets `-2`, `-3`... (the file's names are not the operator's).
    pub(super) fn route_names(&self, routes: &mut [Route], labels: &[RouteLabel], toml: usize) {
        let mut seen = HashSet::new();
        // The next suffix to try per name (10,000 Routes of one name cost one pass).
        let mut next: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
        for (i, r) in routes.iter_mut().enumerate() {
            if i < toml {
                if !seen.insert(r.name.clone()) {
                    self.label_error(
                        &labels[i],
                        format!("{}: the route name `{}` is used twice", labels[i].name, r.name),
                    );
                }
                continue;
            }
            let base = r.name.clone();
            let n = next.entry(base.clone()).or_insert(1);
            while !seen.insert(r.name.clone()) {
                *n += 1;
                r.name = format!("{base}-{n}");
            }
        }
    }

    /// An error at a route's `file:line`.
    fn label_error(&self, label: &RouteLabel, message: String) {
        let (file, line) = (label.file.clone(), label.line);
        self.errors.borrow_mut().push(ConfigError::Invalid { file, line, message });
    }

    /// An implicit farm is named after its VIP: no `[[farm]]` may have that name.
    pub(super) fn implicit_names(&self, raw: &[Spanned<RawFarm>], farms: &[Farm]) {
        for (i, f) in raw.iter().enumerate() {
            let name = f.get_ref().name.get_ref();
            if farms.iter().any(|g| g.implicit && g.name == *name) {
                self.report(
                    f.get_ref().name.span(),
                    &format!("farm[{i}].name"),
                    format!(
                        "`{name}` is HTTP VIP `{name}`'s own farm (no route applies to it): name the farm otherwise"
                    ),
                );
            }
        }
    }

    /// Routes that can never win on a VIP (`routes::Table::shadowed`), and farms no route
    /// names: warnings.
    pub(super) fn routing_warnings(&self, vips: &[Vip], farms: &[Farm], routes: &[Route], labels: &[RouteLabel]) {
        let mut shadowed: BTreeMap<(usize, usize), Vec<&str>> = BTreeMap::new();
        for (i, v) in vips.iter().enumerate() {
            let on: Vec<usize> = (0..labels.len()).filter(|&j| routes[j].vips.contains(&i)).collect();
            let table: Vec<routes::Route> = (on.iter())
                .map(|&j| routes::Route {
                    hosts: routes[j].hosts.clone(),
                    uris: routes[j].uris.clone(),
                    target: routes[j].farm,
                })
                .collect();
            if on.is_empty() && v.backends.is_empty() && forwards(v) {
                self.warn(format!("VIP `{}`: no route applies to it, every request is answered 404", v.name));
            }
            let table = match routes::Table::new(&table) {
                Ok(t) => t,
                Err(routes::PatternError::TooLarge { route }) => {
                    let label = &labels[on[route]];
                    let message = format!(
                        "VIP `{}`: {}: with the routes before it, more than {} (virtual host, URI pattern) pairs",
                        v.name,
                        label.name,
                        routes::MAX_PAIRS
                    );
                    self.label_error(label, message);
                    continue;
                }
                // Each pattern was checked where it was written.
                Err(_) => continue,
            };
            for s in table.shadowed() {
                shadowed.entry((on[s.route], on[s.by])).or_default().push(&v.name);
            }
        }
        for ((j, by), on) in shadowed {
            let (l, b) = (&labels[j], &labels[by]);
            self.warn(format!(
                "{}: {}: can never win (VIP {}): each of its virtual hosts and URIs is matched first by {} ({})",
                l.at(),
                l.name,
                on.join(", "),
                b.name,
                b.at()
            ));
        }
        for (k, f) in farms.iter().enumerate().filter(|(_, f)| !f.implicit) {
            if !routes.iter().any(|r| r.farm == k) {
                self.warn(format!("farm `{}`: no route names it, it serves nothing", f.name));
            }
        }
    }
}

#[cfg(test)]
mod tests;
