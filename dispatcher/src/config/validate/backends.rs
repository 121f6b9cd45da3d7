//! `[[backend]]` and `[[partition]]`.

use std::{
    collections::{HashMap, HashSet},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use dispatcher_common::MAX_BACKENDS;

use super::*;
use crate::mac::{check_unicast_mac, parse_mac};

impl Ctx<'_> {
    /// `[[backend]]`: the backends, their ids by name, and which backend each configured
    /// clone ID belongs to. `later`: the plugin-cfg.xml's servers that come after them
    /// (a replica may name one).
    #[allow(clippy::type_complexity)]
    pub(super) fn backends(
        &self,
        raw: &[Spanned<RawBackend>],
        farm_of: &HashMap<String, String>,
        later: &[String],
    ) -> (Vec<Backend>, HashMap<String, usize>, HashMap<String, usize>) {
        if raw.len() > MAX_BACKENDS as usize {
            self.report(raw[MAX_BACKENDS as usize].span(), "backend", format!("at most {MAX_BACKENDS} backends"));
        }
        let by_name = self.backend_names(raw);
        let mut replicas = by_name.clone();
        replicas.extend(later.iter().enumerate().map(|(k, n)| (n.clone(), raw.len() + k)));
        let mut clone_owner: HashMap<String, usize> = HashMap::new();
        let backends = (0..raw.len()).map(|i| self.backend(i, raw, &replicas, &mut clone_owner, farm_of)).collect();
        (backends, by_name, clone_owner)
    }

    /// Each backend's id by its name.
    fn backend_names(&self, raw: &[Spanned<RawBackend>]) -> HashMap<String, usize> {
        let mut by_name: HashMap<String, usize> = HashMap::new();
        for (i, b) in raw.iter().enumerate() {
            let name = b.get_ref().name.get_ref();
            if let Err(e) = check_name(name) {
                self.report(b.get_ref().name.span(), &format!("backend[{i}].name"), e);
            } else if let Some(&first) = by_name.get(name) {
                let line = self.line(raw[first].get_ref().name.span().start);
                self.report(
                    b.get_ref().name.span(),
                    &format!("backend[{i}].name"),
                    format!("`{name}` is defined twice (first at line {line}, backend[{first}])"),
                );
            } else {
                by_name.insert(name.clone(), i);
            }
        }
        by_name
    }

    /// `backend[i]`; its clone IDs and logical names go into `clone_owner`.
    fn backend(
        &self,
        i: usize,
        raw: &[Spanned<RawBackend>],
        by_name: &HashMap<String, usize>,
        clone_owner: &mut HashMap<String, usize>,
        farm_of: &HashMap<String, String>,
    ) -> Backend {
        let b = raw[i].get_ref();
        let f = |field: &str| format!("backend[{i}].{field}");
        let (address, address6, mac) = self.backend_addresses(i, b);
        let weight = match &b.weight {
            Some(w) if *w.get_ref() == 0 || *w.get_ref() > 10_000 => {
                self.report(w.span(), &f("weight"), "must be 1..=10000 (drain a backend instead of weight 0)");
                100
            }
            Some(w) => *w.get_ref(),
            None => 100,
        };
        let (maxconn, maxqueue) = self.backend_limits(i, b);
        let replica = b.replica.as_ref().and_then(|r| match by_name.get(r.get_ref()) {
            None => {
                self.report(r.span(), &f("replica"), format!("names no backend: `{}`", r.get_ref()));
                None
            }
            Some(&ri) if ri == i => {
                self.report(r.span(), &f("replica"), "a backend cannot be its own replica");
                None
            }
            Some(&ri) => Some(ri),
        });
        self.backend_ids(i, raw, clone_owner, farm_of);
        Backend {
            name: b.name.get_ref().clone(),
            address,
            address6,
            mac,
            weight,
            port: b.port.as_ref().and_then(|p| match *p.get_ref() {
                0 => {
                    self.report(p.span(), &f("port"), "must be 1..=65535");
                    None
                }
                port => Some(port),
            }),
            replica,
            clone_ids: b.clone_ids.iter().map(|c| c.get_ref().clone()).collect(),
            logical_names: b.logical_names.iter().map(|c| c.get_ref().clone()).collect(),
            maxconn,
            maxqueue,
            slow_start: b
                .slow_start
                .as_ref()
                .and_then(|s| self.duration(s, &f("slow_start"), Duration::from_millis(100))),
            retired: false,
        }
    }

    /// `address`, `address6` and `mac`.
    fn backend_addresses(&self, i: usize, b: &RawBackend) -> (Ipv4Addr, Option<Ipv6Addr>, Option<[u8; 6]>) {
        let f = |field: &str| format!("backend[{i}].{field}");
        // `dispatcher import` prints a plugin-cfg.xml's host names as they are.
        let what = if b.address.get_ref().bytes().any(|c| c.is_ascii_alphabetic()) {
            "an IPv4 address (a host name is not resolved: write its address)"
        } else {
            "an IPv4 address"
        };
        let address: Ipv4Addr = match self.parsed::<Ipv4Addr>(&b.address, &f("address"), what) {
            Ok(a) => {
                self.host_address(IpAddr::V4(a), &b.address, &f("address"));
                a
            }
            Err(e) => self.or(Err(e), Ipv4Addr::UNSPECIFIED),
        };
        let address6 =
            b.address6.as_ref().map(|a| match self.parsed::<Ipv6Addr>(a, &f("address6"), "an IPv6 address") {
                Ok(ip) => {
                    self.host_address(IpAddr::V6(ip), a, &f("address6"));
                    ip
                }
                Err(e) => self.or(Err(e), Ipv6Addr::UNSPECIFIED),
            });
        // A bad MAC is reported here; the VIP checks then treat it as given.
        let mac = b.mac.as_ref().map(|m| {
            let mac = parse_mac(m.get_ref()).and_then(|mac| check_unicast_mac(&mac).map(|()| mac));
            self.or(mac.map_err(|e| self.err(m.span(), &f("mac"), e)), [2, 0, 0, 0, 0, 0])
        });
        (address, address6, mac)
    }

    /// `maxconn` and `maxqueue`.
    fn backend_limits(&self, i: usize, b: &RawBackend) -> (Option<u32>, u32) {
        let f = |field: &str| format!("backend[{i}].{field}");
        let maxconn = b.maxconn.as_ref().and_then(|m| {
            if !(1..=1_000_000).contains(m.get_ref()) {
                self.report(m.span(), &f("maxconn"), "must be 1..=1000000 (requests in flight at once)");
                return None;
            }
            Some(*m.get_ref())
        });
        let maxqueue = match &b.maxqueue {
            Some(q) if maxconn.is_none() && b.maxconn.is_none() => {
                self.report(q.span(), &f("maxqueue"), "applies with maxconn only (no limit, no queue)");
                Backend::DEFAULT_MAXQUEUE
            }
            Some(q) if *q.get_ref() > 1_000_000 => {
                self.report(q.span(), &f("maxqueue"), "must be 0..=1000000");
                Backend::DEFAULT_MAXQUEUE
            }
            Some(q) => *q.get_ref(),
            None => Backend::DEFAULT_MAXQUEUE,
        };
        (maxconn, maxqueue)
    }

    /// `clone_ids` and `logical_names`: tokens, each of one backend only.
    fn backend_ids(
        &self,
        i: usize,
        raw: &[Spanned<RawBackend>],
        clone_owner: &mut HashMap<String, usize>,
        farm_of: &HashMap<String, String>,
    ) {
        let b = raw[i].get_ref();
        let f = |field: &str| format!("backend[{i}].{field}");
        let ids = b
            .clone_ids
            .iter()
            .map(|c| (c, "clone_ids", "clone ID"))
            .chain(b.logical_names.iter().map(|c| (c, "logical_names", "logical name")));
        for (c, field, what) in ids {
            let id = c.get_ref();
            let token = id.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
            if id.is_empty() || id.len() > 64 || !token {
                let shown = id.escape_debug();
                self.report(
                    c.span(),
                    &f(field),
                    format!("`{shown}`: 1 to 64 token characters (no ':', spaces, quotes or separators)"),
                );
            } else if field == "logical_names" && dispatcher_common::sip::logical_name(id.as_bytes()).is_some() {
                self.report(
                    c.span(),
                    &f(field),
                    format!("`{id}` looks like a whole session ID: give the logical name before its `.<digits>`"),
                );
            } else if let Some(&prev) = clone_owner.get(id) {
                let owner = raw[prev].get_ref().name.get_ref();
                self.report(
                    c.span(),
                    &f(field),
                    super::plugin::clone_clash(id, what, owner, b.name.get_ref(), farm_of),
                );
            } else {
                clone_owner.insert(id.clone(), i);
            }
        }
    }

    /// `[[partition]]`.
    pub(super) fn partitions(
        &self,
        raw: &[Spanned<RawPartition>],
        backends: &[Backend],
        by_name: &HashMap<String, usize>,
        clone_owner: &HashMap<String, usize>,
    ) -> Vec<Partition> {
        let mut partitions = Vec::new();
        let mut partition_ids = HashSet::new();
        for (i, p) in raw.iter().enumerate() {
            let p = p.get_ref();
            let f = |field: &str| format!("partition[{i}].{field}");
            let id = p.id.get_ref();
            if !is_partition(id.as_bytes()) {
                self.report(p.id.span(), &f("id"), format!("`{id}` is not a partition ID (a decimal number)"));
            } else if !partition_ids.insert(id.clone()) || clone_owner.contains_key(id) {
                self.report(p.id.span(), &f("id"), format!("`{id}` is defined twice"));
            }
            let lookup = |s: &Spanned<String>, field: &str| {
                let found = by_name.get(s.get_ref()).copied();
                if found.is_none() {
                    self.report(s.span(), &f(field), format!("names no backend: `{}`", s.get_ref()));
                }
                found
            };
            let primary = lookup(&p.primary, "primary");
            let replica = match &p.replica {
                Some(r) => {
                    let ri = lookup(r, "replica");
                    if ri.is_some() && ri == primary {
                        self.report(r.span(), &f("replica"), "the replica must differ from the primary");
                    }
                    ri
                }
                None => primary.and_then(|p| backends[p].replica),
            };
            if let Some(primary) = primary {
                partitions.push(Partition { id: id.clone(), primary, replica });
            }
        }
        partitions
    }
}
