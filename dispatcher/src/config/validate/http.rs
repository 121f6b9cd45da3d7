//! `[http]`, and the settings only HTTP VIPs have (`HttpVip`: `[vip.tls]`,
//! `[vip.backend_tls]`, redirects, session format, the inserted cookie...).

use super::*;

/// A cookie name or URL parameter name (an HTTP token).
pub(super) fn is_token(t: &str) -> bool {
    t.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// `balance` of a VIP or a farm.
pub(super) const BALANCES: &[(&str, Balance)] = &[
    ("round_robin", Balance::RoundRobin),
    ("least_outstanding", Balance::LeastOutstanding),
    ("random", Balance::Random),
];

impl Ctx<'_> {
    /// `[http]`.
    pub(super) fn http(&self, h: &RawHttp) -> HttpSettings {
        let mut s = HttpSettings::default();
        // Each with a floor below which it cannot do its job: a client, a backend or a
        // network round trip needs milliseconds at the least.
        let dur = |v: &Option<Spanned<String>>, field: &str, min: Duration, into: &mut Duration| {
            if let Some(d) = v.as_ref().and_then(|v| self.duration(v, &format!("http.{field}"), min)) {
                *into = d;
            }
        };
        let ms = Duration::from_millis;
        dur(&h.header_timeout, "header_timeout", ms(100), &mut s.header_timeout);
        dur(&h.client_idle_timeout, "client_idle_timeout", ms(100), &mut s.client_idle_timeout);
        dur(&h.connect_timeout, "connect_timeout", ms(10), &mut s.connect_timeout);
        dur(&h.server_timeout, "server_timeout", ms(100), &mut s.server_timeout);
        dur(&h.pool_idle_timeout, "pool_idle_timeout", ms(100), &mut s.pool_idle_timeout);
        dur(&h.drain_timeout, "drain_timeout", ms(100), &mut s.drain_timeout);
        dur(&h.hold_time, "hold_time", ms(10), &mut s.hold_time);
        dur(&h.client_timeout, "client_timeout", ms(100), &mut s.client_timeout);
        dur(&h.body_timeout, "body_timeout", ms(100), &mut s.body_timeout);
        dur(&h.queue_timeout, "queue_timeout", ms(10), &mut s.queue_timeout);
        dur(&h.tunnel_timeout, "tunnel_timeout", ms(100), &mut s.tunnel_timeout);
        self.http_limits(h, &mut s);
        self.h2_limits(h, &mut s.h2);
        let token = |v: &Option<Spanned<String>>, field: &str, into: &mut String| {
            if let Some(v) = v {
                let t = v.get_ref();
                if t.is_empty() || !is_token(t) {
                    self.report(v.span(), &format!("http.{field}"), format!("`{t}` is not a cookie or parameter name"));
                } else {
                    *into = t.clone();
                }
            }
        };
        token(&h.cookie_name, "cookie_name", &mut s.cookie_name);
        token(&h.url_parameter, "url_parameter", &mut s.url_parameter);
        s.plugin_config = h.plugin_config.as_ref().map(|p| self.path(p, "http.plugin_config"));
        if let (Some(r), None) = (&h.plugin_refresh, &h.plugin_config) {
            self.report(r.span(), "http.plugin_refresh", "applies with plugin_config only");
        }
        s
    }

    /// `[http]`'s counts and sizes.
    fn http_limits(&self, h: &RawHttp, s: &mut HttpSettings) {
        self.http_num(&h.workers, "workers", 1, 256, &mut s.workers);
        self.http_num(&h.max_header_bytes, "max_header_bytes", 1024, 1 << 20, &mut s.max_header_bytes);
        self.http_num(&h.max_headers, "max_headers", 8, MAX_HEADERS, &mut s.max_headers);
        self.http_num(&h.pool_max_idle, "pool_max_idle", 0, 100_000, &mut s.pool_max_idle);
        self.http_num(
            &h.max_connections_per_backend,
            "max_connections_per_backend",
            1,
            1_000_000,
            &mut s.max_connections_per_backend,
        );
        self.http_num(&h.max_held, "max_held", 0, 1_000_000, &mut s.max_held);
        self.http_num(&h.retry_buffer, "retry_buffer", 0, 16 << 20, &mut s.retry_buffer);
        let mut rate = s.body_min_rate as usize;
        self.http_num(&h.body_min_rate, "body_min_rate", 1, 1 << 30, &mut rate);
        s.body_min_rate = rate as u64;
        let mut cap = 0;
        self.http_num(&h.max_client_connections, "max_client_connections", 1, MAX_CLIENT_CONNECTIONS, &mut cap);
        s.max_client_connections = (cap > 0).then_some(cap);
        if let Some(v) = &h.max_connections_per_source {
            let mut n = 0;
            self.http_num(
                &h.max_connections_per_source,
                "max_connections_per_source",
                0,
                MAX_CLIENT_CONNECTIONS,
                &mut n,
            );
            if let (Some(global), true) = (s.max_client_connections, n > 0) {
                if n > global {
                    self.report(
                        v.span(),
                        "http.max_connections_per_source",
                        format!("{n} is more than max_client_connections ({global}): one source could take every slot"),
                    );
                }
            }
            s.max_connections_per_source = Some(n);
        }
        self.http_num(
            &h.max_connection_rate_per_source,
            "max_connection_rate_per_source",
            0,
            1_000_000,
            &mut s.max_connection_rate_per_source,
        );
        self.http_num(&h.max_tls_handshakes, "max_tls_handshakes", 1, 1_000_000, &mut s.max_tls_handshakes);
        self.http_num(&h.tls_session_cache, "tls_session_cache", 0, 10_000_000, &mut s.tls_session_cache);
        let (mut retries, mut pct, mut min) =
            (s.retries as usize, s.retry_budget_percent as usize, s.retry_budget_min as usize);
        self.http_num(&h.retries, "retries", 0, 10, &mut retries);
        self.http_num(&h.retry_budget_percent, "retry_budget_percent", 0, 100, &mut pct);
        self.http_num(&h.retry_budget_min, "retry_budget_min", 0, 1_000_000, &mut min);
        (s.retries, s.retry_budget_percent, s.retry_budget_min) = (retries as u32, pct as u64, min as u64);
    }

    /// `[http] h2_*`.
    fn h2_limits(&self, h: &RawHttp, s: &mut H2Settings) {
        let num = |v: &Option<Spanned<usize>>, field: &str, lo: usize, hi: usize, into: &mut u32| {
            let mut n = *into as usize;
            self.http_num(v, field, lo, hi, &mut n);
            *into = n as u32;
        };
        num(&h.h2_max_concurrent_streams, "h2_max_concurrent_streams", 1, 10_000, &mut s.max_concurrent_streams);
        // RFC 9113 6.5.2: at most 2^31-1; below the default 65,535 uploads crawl.
        num(&h.h2_initial_window_size, "h2_initial_window_size", 65_535, (1 << 31) - 1, &mut s.initial_window_size);
        num(&h.h2_max_resets_per_second, "h2_max_resets_per_second", 1, 1_000_000, &mut s.max_resets_per_second);
        num(
            &h.h2_max_control_frames_per_second,
            "h2_max_control_frames_per_second",
            1,
            1_000_000,
            &mut s.max_control_frames_per_second,
        );
    }

    /// `http.<field>`: a number within `lo..=hi`, into `into` when it is.
    fn http_num(&self, v: &Option<Spanned<usize>>, field: &str, lo: usize, hi: usize, into: &mut usize) {
        if let Some(v) = v {
            let n = *v.get_ref();
            if n < lo || n > hi {
                self.report(v.span(), &format!("http.{field}"), format!("must be {lo}..={hi}"));
            } else {
                *into = n;
            }
        }
    }

    /// `[vip.tls]`. The files are read when the VIP starts (and by `dispatcher check`).
    fn vip_tls(&self, t: &Spanned<RawTls>, field: &str) -> VipTls {
        let raw = t.get_ref();
        if raw.certificates.is_empty() {
            self.report(t.span(), field, "needs at least one [[...tls.certificate]] (cert and key files)");
        }
        let certificates = raw
            .certificates
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let c = c.get_ref();
                let f = |x: &str| format!("{field}.certificate[{j}].{x}");
                let names = c
                    .names
                    .iter()
                    .flat_map(|n| n.get_ref())
                    .filter_map(|n| {
                        let name = n.get_ref().to_ascii_lowercase();
                        let bare = name.strip_prefix("*.").unwrap_or(&name);
                        let ok = !bare.is_empty()
                            && bare.len() <= 253
                            && bare
                                .split('.')
                                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                        if !ok {
                            self.report(
                                n.span(),
                                &f("names"),
                                format!("`{}` is not a DNS name or *.wildcard", n.get_ref()),
                            );
                        }
                        ok.then_some(name)
                    })
                    .collect();
                CertFiles {
                    cert: self.path(&c.cert, &f("cert")),
                    key: self.path(&c.key, &f("key")),
                    names,
                    lines: [self.line(c.cert.span().start), self.line(c.key.span().start)],
                }
            })
            .collect();
        let handshake_timeout = raw
            .handshake_timeout
            .as_ref()
            .and_then(|d| self.duration(d, &format!("{field}.handshake_timeout"), Duration::from_millis(100)))
            .unwrap_or(Duration::from_secs(5));
        let min_version = self.choice(
            &raw.min_version,
            &format!("{field}.min_version"),
            TlsVersion::Tls12,
            &[("1.2", TlsVersion::Tls12), ("1.3", TlsVersion::Tls13)],
        );
        VipTls {
            certificates,
            strict_sni: raw.strict_sni.as_ref().is_some_and(|b| *b.get_ref()),
            handshake_timeout,
            min_version,
        }
    }

    /// `[vip.backend_tls]`.
    fn backend_tls(&self, t: &RawBackendTls, field: &str) -> BackendTlsFiles {
        let f = |x: &str| format!("{field}.{x}");
        let client_cert = self
            .pair((&t.cert, &f("cert")), (&t.key, &f("key")), CERT_AND_KEY)
            .map(|(c, k)| (self.path(c, &f("cert")), self.path(k, &f("key"))));
        let server_name =
            t.server_name.as_ref().and_then(|n| match rustls::pki_types::ServerName::try_from(n.get_ref().as_str()) {
                Ok(_) => Some(n.get_ref().clone()),
                Err(_) => {
                    self.report(
                        n.span(),
                        &f("server_name"),
                        format!("`{}` is not a DNS name or IP address", n.get_ref()),
                    );
                    None
                }
            });
        BackendTlsFiles { ca_file: t.ca_file.as_ref().map(|c| self.path(c, &f("ca_file"))), server_name, client_cert }
    }

    /// `vip[i]`'s HTTP settings, checked whatever its mode (`applies to HTTP VIPs only`
    /// when it is not one). A redirecting VIP forwards nothing: `members` are cleared.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn http_vip(
        &self,
        i: usize,
        v: &RawVip,
        port: u16,
        mode: VipMode,
        sip_stream: bool,
        members: &mut Vec<usize>,
        raw_backends: &[Spanned<RawBackend>],
    ) -> HttpVip {
        let f = |field: &str| format!("vip[{i}].{field}");
        let balance = self.choice(&v.balance, &f("balance"), Balance::RoundRobin, BALANCES);
        let session_format = self.session_format(i, v, members, raw_backends);
        let max_connections = v.max_connections.as_ref().and_then(|m| {
            if !(1..=MAX_CLIENT_CONNECTIONS).contains(m.get_ref()) {
                self.report(m.span(), &f("max_connections"), format!("must be 1..={MAX_CLIENT_CONNECTIONS}"));
                return None;
            }
            if mode != VipMode::Http && !sip_stream {
                self.report(m.span(), &f("max_connections"), "applies to HTTP VIPs and SIP VIPs over TCP or TLS only");
            }
            Some(*m.get_ref())
        });
        let backend_port = match &v.backend_port {
            Some(p) if *p.get_ref() == 0 => {
                self.report(p.span(), &f("backend_port"), "must be 1..=65535");
                port
            }
            Some(p) => *p.get_ref(),
            None => port,
        };
        let tls = v.tls.as_ref().map(|t| self.vip_tls(t, &f("tls")));
        let backend_tls = v.backend_tls.as_ref().map(|t| self.backend_tls(t.get_ref(), &f("backend_tls")));
        if mode != VipMode::Http {
            self.http_only(i, v, sip_stream);
        }
        self.redirect(i, v, members);
        HttpVip {
            balance,
            backend_port,
            max_connections,
            tls,
            backend_tls,
            redirect_to: None,
            fail_back: v.fail_back.as_ref().is_none_or(|b| *b.get_ref()),
            session_format,
            insert_cookie: self.insert_cookie(i, v),
            http2: mode == VipMode::Http && self.http2(i, v),
            h2c: v.h2c.as_ref().is_some_and(|b| *b.get_ref()),
        }
    }

    /// `http2` (HTTPS VIPs, on by default) and `h2c` (plain HTTP VIPs, off by default).
    fn http2(&self, i: usize, v: &RawVip) -> bool {
        let f = |field: &str| format!("vip[{i}].{field}");
        if let (Some(h), None) = (&v.http2, &v.tls) {
            let why = "offers HTTP/2 by ALPN on an HTTPS VIP (with [vip.tls]); for HTTP/2 without TLS, set h2c = true";
            self.report(h.span(), &f("http2"), why);
        }
        if let (Some(h), Some(_)) = (&v.h2c, &v.tls) {
            let why = "is HTTP/2 without TLS (prior knowledge); an HTTPS VIP offers HTTP/2 by ALPN (http2)";
            self.report(h.span(), &f("h2c"), why);
        }
        if let (Some(h), Some(_)) = (&v.h2c, &v.redirect_to) {
            self.report(h.span(), &f("h2c"), "a redirecting VIP answers HTTP/1.1 only");
        }
        v.http2.as_ref().is_none_or(|b| *b.get_ref())
    }

    /// `session_format`; a jvmRoute is what follows the last `.`: a member's clone ID
    /// with a `.` never matches.
    fn session_format(
        &self,
        i: usize,
        v: &RawVip,
        members: &[usize],
        raw_backends: &[Spanned<RawBackend>],
    ) -> SessionFormat {
        let session_format = self.choice(
            &v.session_format,
            &format!("vip[{i}].session_format"),
            SessionFormat::WebSphere,
            &[("websphere", SessionFormat::WebSphere), ("jvmroute", SessionFormat::JvmRoute)],
        );
        if session_format == SessionFormat::JvmRoute {
            for &bi in members {
                for c in raw_backends[bi].get_ref().clone_ids.iter().filter(|c| c.get_ref().contains('.')) {
                    self.report(
                        c.span(),
                        &format!("backend[{bi}].clone_ids"),
                        format!(
                            "`{}` cannot be a jvmRoute of VIP `{}` (session_format = \"jvmroute\"): the route is what follows the last '.'",
                            c.get_ref(),
                            v.name.get_ref()
                        ),
                    );
                }
            }
        }
        session_format
    }

    /// The settings an L4 or SIP VIP was given that only HTTP VIPs have.
    /// (`tls` also applies to a SIP VIP over a stream transport.)
    fn http_only(&self, i: usize, v: &RawVip, sip_stream: bool) {
        for (set, field) in [
            (v.tls.as_ref().map(|t| t.span()).filter(|_| !sip_stream), "tls"),
            (v.backend_tls.as_ref().map(|t| t.span()), "backend_tls"),
            (v.redirect_to.as_ref().map(|t| t.span()), "redirect_to"),
            (v.fail_back.as_ref().map(|t| t.span()), "fail_back"),
            (v.session_format.as_ref().map(|t| t.span()), "session_format"),
            (v.insert_cookie.as_ref().map(|t| t.span()), "insert_cookie"),
            (v.http2.as_ref().map(|t| t.span()), "http2"),
            (v.h2c.as_ref().map(|t| t.span()), "h2c"),
        ] {
            if let Some(span) = set {
                self.report(span, &format!("vip[{i}].{field}"), "applies to HTTP VIPs only");
            }
        }
    }

    /// `redirect_to` and `redirect_host`: a plain HTTP VIP that forwards nothing (its
    /// target is resolved by `redirects`, once every VIP is known).
    fn redirect(&self, i: usize, v: &RawVip, members: &mut Vec<usize>) {
        let f = |field: &str| format!("vip[{i}].{field}");
        if let (Some(r), Some(_)) = (&v.redirect_to, &v.tls) {
            self.report(r.span(), &f("redirect_to"), "a redirecting VIP is plain HTTP (no [vip.tls])");
        }
        if let (Some(h), None) = (&v.redirect_host, &v.redirect_to) {
            self.report(h.span(), &f("redirect_host"), "applies to a redirecting VIP only (with redirect_to)");
        }
        if let Some(h) = &v.redirect_host {
            if let Err(e) = check_authority(h.get_ref()) {
                self.report(h.span(), &f("redirect_host"), e);
            }
        }
        if v.redirect_to.is_some() {
            // It forwards nothing: no members (no pools, no health checks for it).
            for (set, field) in [
                (v.backends.as_ref().map(|b| b.span()), "backends"),
                (v.backend_port.as_ref().map(|b| b.span()), "backend_port"),
                (v.backend_tls.as_ref().map(|b| b.span()), "backend_tls"),
                (v.balance.as_ref().map(|b| b.span()), "balance"),
            ] {
                if let Some(span) = set {
                    self.report(span, &f(field), "a redirecting VIP forwards nothing (remove it or redirect_to)");
                }
            }
            members.clear();
        }
    }

    /// `insert_cookie`: a cookie name.
    fn insert_cookie(&self, i: usize, v: &RawVip) -> Option<String> {
        let c = v.insert_cookie.as_ref()?;
        let t = c.get_ref();
        if t.is_empty() || t.len() > 64 || !is_token(t) {
            self.report(
                c.span(),
                &format!("vip[{i}].insert_cookie"),
                format!("`{t}` is not a cookie name (1 to 64 token characters)"),
            );
            return None;
        }
        Some(t.clone())
    }

    /// Every `redirect_to` names an HTTPS VIP (one with `[vip.tls]`): the redirecting
    /// VIP's target, by the first VIP of that name.
    pub(super) fn redirects(&self, raw: &[Spanned<RawVip>], vips: &mut [Vip]) {
        for (i, v) in raw.iter().enumerate() {
            let Some(name) = &v.get_ref().redirect_to else { continue };
            let field = format!("vip[{i}].redirect_to");
            let Some(j) = vips.iter().position(|t| &t.name == name.get_ref()) else {
                self.report(name.span(), &field, format!("names no VIP: `{}`", name.get_ref()));
                continue;
            };
            if raw[j].get_ref().tls.is_none() {
                let why = format!("`{}` is not an HTTPS VIP (it has no [vip.tls])", name.get_ref());
                self.report(name.span(), &field, why);
                continue;
            }
            let host = v.get_ref().redirect_host.as_ref().map(|h| h.get_ref().clone());
            let to = Redirect { vip: vips[j].name.clone(), address: vips[j].address, port: vips[j].port, host };
            if let VipKind::Http(h) = &mut vips[i].kind {
                h.redirect_to = Some(to);
            }
        }
    }

    /// An `insert_cookie` must not be the session cookie (`[http] cookie_name`).
    pub(super) fn insert_cookies(&self, raw: &[Spanned<RawVip>], http: &HttpSettings) {
        for (i, v) in raw.iter().enumerate() {
            if let Some(c) = v.get_ref().insert_cookie.as_ref().filter(|c| *c.get_ref() == http.cookie_name) {
                let why =
                    format!("`{}` is the session cookie (http.cookie_name): name the dispatcher's own", c.get_ref());
                self.report(c.span(), &format!("vip[{i}].insert_cookie"), why);
            }
        }
    }
}
