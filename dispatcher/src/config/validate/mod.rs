//! Validation: from the raw file to the model, every error with its line and field, all
//! of them in one run (`Ctx` collects them and goes on with fallback values).

//!
//! One file per section: `dispatcher` (with `[announce]` and `[access_log]`), `cluster`,
//! `backends` (with `[[partition]]`), `vips` (every kind's common part and the L4/SIP
//! settings), `http` (`[http]` and the HTTP VIPs' own settings), `farms` (`[[farm]]`,
//! `[[route]]` and the VIPs routes apply to), `plugin` (`[http] plugin_config`: the
//! plugin-cfg.xml's servers, clusters and routes), `health`; `checks` holds the checks of
//! single values that the CLI and the agent use as well.

mod backends;
mod checks;
mod cluster;
mod dispatcher;
mod farms;
mod health;
mod http;
mod plugin;
mod vips;

use std::{cell::RefCell, ops::Range, path::PathBuf, str::FromStr, time::Duration};

use toml::Spanned;

pub use checks::*;

use super::{raw::*, *};
use crate::routes::plugin_cfg;

/// What a client certificate without its key, and a key without its certificate, lack.
const CERT_AND_KEY: (&str, &str) = ("a client certificate needs its key", "a client key needs its certificate");

pub(super) struct Ctx<'a> {
    pub(super) text: &'a str,
    pub(super) file: &'a str,
    /// Every error found so far: validation goes on after one, so that a single
    /// `dispatcher check` lists all of them.
    pub(super) errors: RefCell<Vec<ConfigError>>,
    /// What `dispatcher check` prints as warnings (`Config::warnings`).
    pub(super) warnings: RefCell<Vec<String>>,
}

impl Ctx<'_> {
    pub(super) fn line(&self, offset: usize) -> usize {
        self.text[..offset.min(self.text.len())].bytes().filter(|&b| b == b'\n').count() + 1
    }

    fn err(&self, span: Range<usize>, field: &str, message: impl std::fmt::Display) -> ConfigError {
        ConfigError::Invalid {
            file: self.file.to_string(),
            line: self.line(span.start),
            message: format!("{field}: {message}"),
        }
    }

    /// Records an error and goes on.
    fn report(&self, span: Range<usize>, field: &str, message: impl std::fmt::Display) {
        let e = self.err(span, field, message);
        self.errors.borrow_mut().push(e);
    }

    /// Records a warning (`file:line: message`).
    fn warn(&self, message: String) {
        self.warnings.borrow_mut().push(message);
    }

    /// The value, or `fallback` after recording the error.
    fn or<T>(&self, r: Result<T, ConfigError>, fallback: T) -> T {
        r.unwrap_or_else(|e| {
            self.errors.borrow_mut().push(e);
            fallback
        })
    }

    fn parsed<T: FromStr>(&self, v: &Spanned<String>, field: &str, what: &str) -> Result<T, ConfigError> {
        v.get_ref().parse().map_err(|_| self.err(v.span(), field, format!("`{}` is not {what}", v.get_ref())))
    }

    fn choice<T: Copy>(&self, v: &Option<Spanned<String>>, field: &str, default: T, options: &[(&str, T)]) -> T {
        let Some(v) = v else { return default };
        match options.iter().find(|(name, _)| *name == v.get_ref()) {
            Some((_, t)) => *t,
            None => {
                let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
                self.report(v.span(), field, format!("`{}` is not one of {}", v.get_ref(), names.join(", ")));
                default
            }
        }
    }

    /// A duration that is more than zero and at least `min`.
    fn duration(&self, v: &Spanned<String>, field: &str, min: Duration) -> Option<Duration> {
        match parse_duration(v.get_ref()) {
            Err(e) => self.report(v.span(), field, e),
            Ok(d) if d.is_zero() => self.report(v.span(), field, "must be more than zero"),
            Ok(d) if d < min => self.report(v.span(), field, format!("must be at least {min:?}")),
            Ok(d) if d > MAX_DURATION => self.report(v.span(), field, "must be at most 1 day (86400s)"),
            Ok(d) => return Some(d),
        }
        None
    }

    /// Reports an address no single host can hold.
    fn host_address(&self, ip: IpAddr, v: &Spanned<String>, field: &str) {
        if let Err(e) = check_host_address(ip) {
            self.report(v.span(), field, e);
        }
    }

    pub(super) fn build(&self, raw: RawConfig) -> Config {
        let d = self.dispatcher(raw.dispatcher.get_ref(), raw.dispatcher.span());
        let mut http = match &raw.http {
            Some(h) => self.http(h.get_ref()),
            None => HttpSettings::default(),
        };
        let plugin = self.plugin_file(raw.http.as_ref().map(|h| h.get_ref()), &mut http);
        let farm_of = farms::farm_of(&raw.farms, plugin.as_ref().map(|p| &p.cfg));
        let later = plugin::file_only_servers(plugin.as_ref(), &raw.backends);
        let (mut backends, mut by_name, mut clone_owner) = self.backends(&raw.backends, &farm_of, &later);
        let routed = farms::Routed::new(&raw.routes, plugin.as_ref().map(|p| p.vips.as_deref()));
        let members = vips::Members { raw: &raw.backends, backends: &backends, by_name: &by_name, routed: &routed };
        let mut vips = self.vips(&raw.vips, &members);
        if let Some(p) = &plugin {
            self.plugin_backends(p, &raw.backends, &mut backends, &mut by_name, &mut clone_owner, &farm_of);
        }
        let partitions = self.partitions(&raw.partitions, &backends, &by_name, &clone_owner);
        let health = match &raw.health {
            Some(h) => self.health(h.get_ref()),
            None => HealthSettings::default(),
        };
        self.insert_cookies(&raw.vips, &http);
        let cluster = raw.cluster.as_ref().map(|c| self.cluster(c.get_ref()));
        http.learn_wait = cluster.as_ref().map(|c| c.learn_wait).unwrap_or_default();
        let announce = raw.announce.as_ref().map(|a| self.announce(a.get_ref()));
        if let Some(a) = &announce {
            self.shared_address_warnings(a, &vips);
        }
        let access_log = raw.access_log.as_ref().map(|a| self.access_log(a.get_ref(), a.span()));
        // Farms and routes: the TOML's, then the plugin-cfg.xml's, then one of each for
        // every HTTP VIP no route applies to.
        let mut taken = farms::Taken::default();
        let mut farms = self.farms(&raw.farms, &backends, &by_name, &mut taken);
        if let Some(p) = &plugin {
            farms.extend(self.plugin_farms(p, &by_name, &mut taken));
        }
        self.replicas_in_farm(&raw.backends, &backends, &farms);
        let (mut routes, mut labels) = self.routes(&raw.routes, &vips, &farms, &http);
        let toml_routes = routes.len();
        if let Some(p) = &plugin {
            let (r, l) = self.plugin_routes(p, &vips, &farms);
            routes.extend(r);
            labels.extend(l);
        }
        self.route_names(&mut routes, &labels, toml_routes);
        self.routed_vips(&raw.vips, &mut vips, &routed, &farms, &routes);
        self.routed_loops(&raw.vips, &vips, &backends, &farms, &routes);
        self.routing_warnings(&vips, &farms, &routes, &labels);
        let (implicit, catch_all) = implicit_farms(&vips, &backends, &routed, farms.len(), &http);
        farms.extend(implicit);
        routes.extend(catch_all);
        self.implicit_names(&raw.farms, &farms);
        Config {
            interface: d.interface,
            instance: d.instance,
            bpffs: d.bpffs,
            xdp_mode: d.xdp_mode,
            flow_table_size: d.flow_table_size,
            affinity_table_size: d.affinity_table_size,
            log_level: d.log_level,
            admin_socket: d.admin_socket,
            admin_address: d.admin_address,
            backends,
            vips,
            farms,
            routes,
            partitions,
            http,
            health,
            cluster,
            announce,
            access_log,
            warnings: self.warnings.take(),
        }
    }

    /// Two settings that go together (a certificate and its key, a user and its
    /// password file): both, or neither; one alone is reported at the missing one's field
    /// (`why`: what the first needs, what the second needs).
    fn pair<'a>(
        &self,
        (a, a_field): (&'a Option<Spanned<String>>, &str),
        (b, b_field): (&'a Option<Spanned<String>>, &str),
        (a_needs, b_needs): (&str, &str),
    ) -> Option<(&'a Spanned<String>, &'a Spanned<String>)> {
        match (a, b) {
            (Some(a), Some(b)) => Some((a, b)),
            (Some(a), None) => {
                self.report(a.span(), b_field, a_needs);
                None
            }
            (None, Some(b)) => {
                self.report(b.span(), a_field, b_needs);
                None
            }
            (None, None) => None,
        }
    }

    /// A path in the file, relative to the file's folder.
    fn path(&self, v: &Spanned<String>, field: &str) -> PathBuf {
        if v.get_ref().is_empty() {
            self.report(v.span(), field, "is empty");
        }
        let p = PathBuf::from(v.get_ref());
        match std::path::Path::new(self.file).parent() {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p,
        }
    }
}

/// A farm and a catch-all route for each HTTP VIP that forwards (not a redirecting one)
/// and that no route applies to: its own `backends` and settings, as before routes
/// existed (the farms numbered from `first`; the session names `[http]`'s).
fn implicit_farms(
    vips: &[Vip],
    backends: &[Backend],
    routed: &farms::Routed,
    first: usize,
    http: &HttpSettings,
) -> (Vec<Farm>, Vec<Route>) {
    let mut farms = Vec::new();
    let mut routes = Vec::new();
    for (i, v) in vips.iter().enumerate() {
        let Some(h) = v.http() else { continue };
        if h.redirect_to.is_some() || v.backends.is_empty() || routed.applies(&v.name) {
            continue;
        }
        routes.push(Route {
            name: v.name.clone(),
            vips: vec![i],
            hosts: vec!["*:*".into()],
            uris: vec!["/*".into()],
            farm: first + farms.len(),
            cookie: http.cookie_name.clone(),
            url_parameter: http.url_parameter.clone(),
        });
        farms.push(Farm {
            name: v.name.clone(),
            servers: v.backends.iter().copied().filter(|&b| b < backends.len()).collect(),
            backup_servers: Vec::new(),
            balance: h.balance,
            port: Some(h.backend_port),
            fail_back: h.fail_back,
            session_format: h.session_format,
            slow_start: v.slow_start,
            connect_timeout: None,
            io_timeout: None,
            implicit: true,
        });
    }
    (farms, routes)
}
