//! `[cluster]`: the shared store, the peers, and how the link to the store is secured.

use std::collections::HashSet;

use super::*;
use crate::mac::parse_mac;

impl Ctx<'_> {
    /// `[cluster]`.
    pub(super) fn cluster(&self, c: &RawCluster) -> ClusterSettings {
        if let Err(e) = check_name(c.name.get_ref()) {
            self.report(c.name.span(), "cluster.name", e);
        }
        let (endpoints, plaintext) = self.endpoints(c);
        let security = self.store_security(c, plaintext);
        let (peers, peer_macs) = self.peers(c);
        let key_prefix = self.key_prefix(c);
        let dur = |v: &Option<Spanned<String>>, field: &str, min: Duration, default: Duration| {
            v.as_ref().map_or(default, |v| self.duration(v, field, min).unwrap_or(default))
        };
        let lease_ttl =
            dur(&c.lease_ttl, "cluster.lease_ttl", Duration::from_secs(2), ClusterSettings::DEFAULT_LEASE_TTL);
        let request_timeout = dur(
            &c.request_timeout,
            "cluster.request_timeout",
            Duration::from_millis(100),
            ClusterSettings::DEFAULT_REQUEST_TIMEOUT,
        );
        let startup_wait = dur(
            &c.startup_wait,
            "cluster.startup_wait",
            Duration::from_millis(100),
            ClusterSettings::DEFAULT_STARTUP_WAIT,
        );
        if lease_ttl.as_secs() * 1000 != lease_ttl.as_millis() as u64 {
            if let Some(v) = &c.lease_ttl {
                self.report(v.span(), "cluster.lease_ttl", "etcd leases are in whole seconds");
            }
        }
        if request_timeout * 2 > lease_ttl {
            let span = c.request_timeout.as_ref().or(c.lease_ttl.as_ref()).map(|v| v.span()).unwrap_or(c.name.span());
            self.report(
                span,
                "cluster.request_timeout",
                "must be at most half of cluster.lease_ttl (a renewal must fit in the lease)",
            );
        }
        let second_chance = dur(
            &c.second_chance,
            "cluster.second_chance",
            Duration::from_secs(1),
            ClusterSettings::DEFAULT_SECOND_CHANCE,
        );
        let learn_wait = self.learn_wait(c);
        let (heartbeat_interval, heartbeat_misses, heartbeat_port) = self.heartbeats(c);
        if let (Some(t), Some(s)) = (&c.takeover, &c.steering) {
            if *t.get_ref() && !*s.get_ref() {
                self.report(
                    t.span(),
                    "cluster.takeover",
                    "needs steering (a dispatcher's connections are taken over by the one that takes its slots)",
                );
            }
        }
        ClusterSettings {
            learn_wait,
            heartbeat_interval,
            heartbeat_misses,
            heartbeat_port,
            name: c.name.get_ref().clone(),
            endpoints,
            peers,
            peer_macs,
            security,
            key_prefix,
            lease_ttl,
            request_timeout,
            startup_wait,
            steering: c.steering.as_ref().is_none_or(|v| *v.get_ref()),
            takeover: c.takeover.as_ref().is_none_or(|v| *v.get_ref()),
            second_chance,
        }
    }

    /// `endpoints`: etcd client URLs, all of one scheme; and whether it is http://.
    fn endpoints(&self, c: &RawCluster) -> (Vec<String>, bool) {
        let mut endpoints = Vec::new();
        let mut schemes = HashSet::new();
        if c.endpoints.get_ref().is_empty() {
            self.report(c.endpoints.span(), "cluster.endpoints", "name at least one etcd member (https://host:port)");
        }
        for e in c.endpoints.get_ref() {
            match check_endpoint(e.get_ref()) {
                Ok(_) if endpoints.contains(e.get_ref()) => self.report(e.span(), "cluster.endpoints", "listed twice"),
                Ok(tls) => {
                    schemes.insert(tls);
                    endpoints.push(e.get_ref().clone());
                }
                Err(why) => self.report(e.span(), "cluster.endpoints", why),
            }
        }
        if schemes.len() > 1 {
            self.report(c.endpoints.span(), "cluster.endpoints", "all https:// or all http://, not both");
        }
        (endpoints, schemes.contains(&false))
    }

    /// `peers`: every dispatcher of the cluster by name, some as `name@MAC`.
    fn peers(&self, c: &RawCluster) -> (Vec<String>, std::collections::BTreeMap<String, [u8; 6]>) {
        let mut peers: Vec<String> = Vec::new();
        let mut peer_macs = std::collections::BTreeMap::new();
        match &c.peers {
            None => self.report(
                c.name.span(),
                "cluster.peers",
                "list every dispatcher of this cluster by name (this one too): a member key of any other name is not counted",
            ),
            Some(list) => {
                for p in list.get_ref() {
                    let (name, mac) = match p.get_ref().split_once('@') {
                        Some((n, m)) => (n, Some(m)),
                        None => (p.get_ref().as_str(), None),
                    };
                    if let Err(e) = check_name(name) {
                        self.report(p.span(), "cluster.peers", e);
                    } else if peers.iter().any(|x| x == name) {
                        self.report(p.span(), "cluster.peers", format!("`{name}` is listed twice"));
                    } else {
                        peers.push(name.to_string());
                    }
                    if let Some(m) = mac {
                        match parse_mac(m) {
                            Ok(mac) if crate::mac::is_unicast(&mac) => {
                                peer_macs.insert(name.to_string(), mac);
                            }
                            _ => self.report(
                                p.span(),
                                "cluster.peers",
                                format!("`{}`: write name or name@MAC with a unicast, non-zero MAC", p.get_ref()),
                            ),
                        }
                    }
                }
                if !peers.contains(c.name.get_ref()) {
                    self.report(
                        list.span(),
                        "cluster.peers",
                        format!("does not list this dispatcher (`{}`, cluster.name)", c.name.get_ref()),
                    );
                }
                if peers.len() > MAX_PEERS {
                    self.report(list.span(), "cluster.peers", format!("at most {MAX_PEERS} dispatchers"));
                }
            }
        }
        (peers, peer_macs)
    }

    /// `key_prefix`.
    fn key_prefix(&self, c: &RawCluster) -> String {
        match &c.key_prefix {
            None => ClusterSettings::DEFAULT_KEY_PREFIX.to_string(),
            Some(p) => {
                let v = p.get_ref();
                let ok = v.starts_with('/')
                    && v.len() > 1
                    && v.len() <= 128
                    && !v.ends_with('/')
                    && v.bytes().all(|b| b.is_ascii_graphic());
                if !ok {
                    self.report(
                        p.span(),
                        "cluster.key_prefix",
                        "must start with '/', not end with '/', and be 2 to 128 printable characters without spaces",
                    );
                }
                v.clone()
            }
        }
    }

    /// `learn_wait`: "0s" is off.
    fn learn_wait(&self, c: &RawCluster) -> Duration {
        match &c.learn_wait {
            None => ClusterSettings::DEFAULT_LEARN_WAIT,
            // "0s": off.
            Some(v) if parse_duration(v.get_ref()).is_ok_and(|d| d.is_zero()) => Duration::ZERO,
            Some(v) => {
                let d = self
                    .duration(v, "cluster.learn_wait", Duration::from_millis(1))
                    .unwrap_or(ClusterSettings::DEFAULT_LEARN_WAIT);
                if d > Duration::from_secs(5) {
                    self.report(
                        v.span(),
                        "cluster.learn_wait",
                        "must be at most 5s (each request with an unknown clone ID may wait this long)",
                    );
                }
                d
            }
        }
    }

    /// `heartbeat_interval`, `heartbeat_misses`, `heartbeat_port`: peer liveness
    /// (`peers`), bounded so that a dead peer is noticed within seconds at most and the
    /// heartbeats cost a fixed, small rate.
    fn heartbeats(&self, c: &RawCluster) -> (Duration, u32, u16) {
        let interval = match &c.heartbeat_interval {
            None => ClusterSettings::DEFAULT_HEARTBEAT_INTERVAL,
            Some(v) => {
                let d = self
                    .duration(v, "cluster.heartbeat_interval", ClusterSettings::MIN_HEARTBEAT_INTERVAL)
                    .unwrap_or(ClusterSettings::DEFAULT_HEARTBEAT_INTERVAL);
                if d > ClusterSettings::MAX_HEARTBEAT_INTERVAL {
                    self.report(
                        v.span(),
                        "cluster.heartbeat_interval",
                        "must be at most 1s (a dead peer is noticed after heartbeat_misses of them)",
                    );
                }
                d
            }
        };
        let misses = match &c.heartbeat_misses {
            None => ClusterSettings::DEFAULT_HEARTBEAT_MISSES,
            Some(v) => match u32::try_from(*v.get_ref()) {
                Ok(n) if (1..=ClusterSettings::MAX_HEARTBEAT_MISSES).contains(&n) => n,
                _ => {
                    self.report(
                        v.span(),
                        "cluster.heartbeat_misses",
                        format!("must be from 1 to {}", ClusterSettings::MAX_HEARTBEAT_MISSES),
                    );
                    ClusterSettings::DEFAULT_HEARTBEAT_MISSES
                }
            },
        };
        if let (Some(v), Some(_)) = (&c.heartbeat_interval, &c.heartbeat_misses) {
            if interval * misses > Duration::from_secs(10) {
                self.report(
                    v.span(),
                    "cluster.heartbeat_interval",
                    "heartbeat_interval x heartbeat_misses must be at most 10s (the time a dead peer keeps its slots)",
                );
            }
        }
        let port = match &c.heartbeat_port {
            None => ClusterSettings::DEFAULT_HEARTBEAT_PORT,
            Some(v) => match u16::try_from(*v.get_ref()) {
                Ok(p) if p != 0 => p,
                _ => {
                    self.report(v.span(), "cluster.heartbeat_port", "must be a UDP port from 1 to 65535");
                    ClusterSettings::DEFAULT_HEARTBEAT_PORT
                }
            },
        };
        (interval, misses, port)
    }

    /// `[cluster]`'s TLS files and credentials; `plaintext`: the endpoints are `http://`.
    fn store_security(&self, c: &RawCluster, plaintext: bool) -> StoreSecurity {
        let insecure = c.insecure_plaintext.as_ref().is_some_and(|v| *v.get_ref());
        let tls_fields = [
            (c.ca_file.as_ref(), "cluster.ca_file"),
            (c.cert.as_ref(), "cluster.cert"),
            (c.key.as_ref(), "cluster.key"),
            (c.username.as_ref(), "cluster.username"),
            (c.password_file.as_ref(), "cluster.password_file"),
        ];
        if plaintext {
            if !insecure {
                self.report(
                    c.endpoints.span(),
                    "cluster.endpoints",
                    "http:// is plaintext without authentication: anyone who can reach etcd could join this cluster and \
                     take its traffic; use https:// with ca_file, cert/key or username/password_file (or, knowing that, \
                     set insecure_plaintext = true)",
                );
            }
            for (v, field) in tls_fields {
                if let Some(v) = v {
                    self.report(v.span(), field, "needs https:// endpoints (credentials never go over plaintext)");
                }
            }
            return StoreSecurity::Plaintext;
        }
        if let Some(v) = c.insecure_plaintext.as_ref().filter(|v| *v.get_ref()) {
            self.report(v.span(), "cluster.insecure_plaintext", "the endpoints are https://: remove it");
        }
        let client_cert = self
            .pair((&c.cert, "cluster.cert"), (&c.key, "cluster.key"), CERT_AND_KEY)
            .map(|(cert, key)| (self.path(cert, "cluster.cert"), self.path(key, "cluster.key")));
        let user = self
            .pair(
                (&c.username, "cluster.username"),
                (&c.password_file, "cluster.password_file"),
                ("an etcd user needs its password file", "a password file needs its etcd user"),
            )
            .map(|(u, p)| {
                let name = u.get_ref();
                if name.is_empty() || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_graphic()) {
                    self.report(u.span(), "cluster.username", "1 to 128 printable characters without spaces");
                }
                (name.clone(), self.path(p, "cluster.password_file"))
            });
        StoreSecurity::Tls { ca_file: c.ca_file.as_ref().map(|f| self.path(f, "cluster.ca_file")), client_cert, user }
    }
}
