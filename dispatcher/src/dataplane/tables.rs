//! Typed handles on the shared maps, and the translation of the configuration into their
//! entries: `VIPS`, `BACKENDS` and the Maglev `RINGS`.

use std::net::IpAddr;

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray},
    Ebpf,
};
use dispatcher_common::{
    addr_words, stats, BackendInfo, Counter, FlowKey, FlowValue, SteerConf, SteerSlot, VipInfo, VipKey, AF_INET,
    AF_INET6, FWD_IPIP, FWD_MAC, IPPROTO_TCP, IPPROTO_UDP, MAX_RING_SIZE, MODE_ADDR_MARKER, MODE_HTTP, MODE_L4,
    MODE_SIP, NO_BACKEND, STATE_UP, STEER_SIZE, VIP_F_AFFINITY,
};

use super::DataplaneError;
use crate::{
    config::{Backend, Config, Forwarding, Protocol, Vip, VipMode},
    maglev,
};

pub struct Tables {
    pub vips: HashMap<MapData, VipKey, VipInfo>,
    pub backends: Array<MapData, BackendInfo>,
    pub rings: Array<MapData, u32>,
    pub flows: HashMap<MapData, FlowKey, FlowValue>,
    /// Our own descriptor of FLOWS: another handle on it for long walks off the control
    /// loop (`flows_handle`).
    flows_fd: Option<std::os::fd::OwnedFd>,
    pub stats: PerCpuArray<MapData, Counter>,
    /// Dispatcher-ownership tables for HTTP VIPs (`steering`).
    pub steer: Array<MapData, SteerSlot>,
    pub steer_conf: Array<MapData, SteerConf>,
    /// What the ring of each VIP holds now, so a rebuild writes only changed slots.
    ring_cache: Vec<Vec<u32>>,
}

/// A typed map from a source of untyped ones (a loaded object or the pins).
fn typed<T>(
    open: &mut impl FnMut(&'static str) -> Result<aya::maps::Map, DataplaneError>,
    name: &'static str,
) -> Result<T, DataplaneError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    T::try_from(open(name)?).map_err(|source| DataplaneError::Map { name, source })
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> DataplaneError {
    move |source| DataplaneError::Map { name, source }
}

/// An IP address as the maps store it (`dispatcher_common::addr_words`), and its family.
pub fn addr_key(a: IpAddr) -> ([u32; 4], u8) {
    match a {
        IpAddr::V4(v4) => ([u32::from_ne_bytes(v4.octets()), 0, 0, 0], AF_INET),
        IpAddr::V6(v6) => (addr_words(&v6.octets()), AF_INET6),
    }
}

pub fn vip_key(v: &Vip) -> VipKey {
    let (addr, family) = addr_key(v.address);
    let proto = match v.protocol {
        Protocol::Tcp => IPPROTO_TCP,
        Protocol::Udp => IPPROTO_UDP,
    };
    VipKey { addr, port: v.port.to_be(), proto, family }
}

pub fn vip_info(id: u32, v: &Vip) -> VipInfo {
    // XDP reads no more than the mode of an HTTP VIP. A SIP VIP over TCP or TLS is the
    // agent's as an HTTP VIP is: passed to the host stack (or steered to its owner).
    let l4 = v.l4().copied().unwrap_or_default();
    VipInfo {
        id,
        mode: match v.mode() {
            VipMode::L4 => MODE_L4,
            VipMode::Http => MODE_HTTP,
            VipMode::Sip if v.sip_stream().is_some() => MODE_HTTP,
            VipMode::Sip => MODE_SIP,
        },
        forward: match l4.forwarding {
            Forwarding::Mac => FWD_MAC,
            Forwarding::Ipip => FWD_IPIP,
        },
        flags: if l4.sticky_time.is_some() { VIP_F_AFFINITY } else { 0 },
        ring_size: l4.ring_size,
        sticky_secs: l4.sticky_time.map(|d| d.as_secs() as u32).unwrap_or(0),
        port_group: l4.port_group,
        _pad: 0,
        encap_src: l4.encap_source.map(|a| addr_key(a).0).unwrap_or([0; 4]),
    }
}

/// A backend's `BACKENDS` entry: `state` is what XDP obeys, `admin` the operator's state.
pub fn backend_info(b: &Backend, state: u8, admin: u8) -> BackendInfo {
    BackendInfo {
        addr4: u32::from_ne_bytes(b.address.octets()),
        addr6: b.address6.map(|a| addr_words(&a.octets())).unwrap_or([0; 4]),
        mac: b.mac.unwrap_or([0; 6]),
        state,
        admin,
        replica: b.replica.map(|r| r as u32).unwrap_or(NO_BACKEND),
        weight: b.weight,
    }
}

/// The per-VIP SIP counters by name (`Tables::sip_counters`): forwarded by where the
/// affinity came from, dropped by why, then (`by_*`, `SIP_ROUTED_BY`) forwarded by how the
/// container was chosen — each forwarded message counts once in each of the two groups.
pub const SIP_COUNTERS: [(&str, u32); 11] = [
    ("route", stats::VIP_SIP_ROUTE),
    ("via", stats::VIP_SIP_VIA),
    ("to_tag", stats::VIP_SIP_TO_TAG),
    ("from_tag", stats::VIP_SIP_FROM_TAG),
    ("call_id", stats::VIP_SIP_CALL_ID),
    ("held", stats::VIP_SIP_HELD),
    ("unknown_ln", stats::VIP_SIP_UNKNOWN_LN),
    ("invalid", stats::VIP_SIP_INVALID),
    ("by_ln", stats::VIP_SIP_BY_LN),
    ("by_pin", stats::VIP_SIP_BY_PIN),
    ("by_ring", stats::VIP_SIP_BY_RING),
];

/// The prefix of the `SIP_COUNTERS` that say how the container was chosen.
pub const SIP_ROUTED_BY: &str = "by_";

/// The per-VIP counts of UDP datagrams in IP fragments by name (`Tables::fragment_counters`):
/// first fragments recorded, later fragments that followed them, later fragments dropped
/// with no first, first fragments dropped over the budget.
pub const FRAG_COUNTERS: [(&str, u32); 4] = [
    ("first", stats::VIP_FRAG_FIRST),
    ("followed", stats::VIP_FRAG_FOLLOWED),
    ("no_first", stats::VIP_FRAG_NO_FIRST),
    ("over_budget", stats::VIP_FRAG_BUDGET),
];

/// What XDP counted for one VIP (summed over CPUs).
#[derive(Clone, Copy, Debug, Default)]
pub struct VipFigures {
    /// Packets and bytes forwarded, on new flows and pinned ones.
    pub forwarded: Counter,
    pub new_flows: u64,
    pub flow_hits: u64,
    pub drops: u64,
}

impl Tables {
    fn open(
        mut open: impl FnMut(&'static str) -> Result<aya::maps::Map, DataplaneError>,
    ) -> Result<Tables, DataplaneError> {
        let flows = open("FLOWS")?;
        // A descriptor of our own for `flows_handle`: reopening the map by id would take
        // CAP_SYS_ADMIN, which the service runs without.
        let flows_fd = match &flows {
            aya::maps::Map::LruHashMap(d) | aya::maps::Map::HashMap(d) => {
                use std::os::fd::AsFd;
                d.fd().as_fd().try_clone_to_owned().ok()
            }
            _ => None,
        };
        Ok(Tables {
            vips: typed(&mut open, "VIPS")?,
            backends: typed(&mut open, "BACKENDS")?,
            rings: typed(&mut open, "RINGS")?,
            flows: HashMap::try_from(flows).map_err(map_err("FLOWS"))?,
            flows_fd,
            stats: typed(&mut open, "STATS")?,
            steer: typed(&mut open, "STEER")?,
            steer_conf: typed(&mut open, "STEER_CONF")?,
            ring_cache: Vec::new(),
        })
    }

    /// Takes the maps out of a just-loaded program object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Tables, DataplaneError> {
        Tables::open(|name| ebpf.take_map(name).ok_or(DataplaneError::MissingMap(name)))
    }

    /// Opens the maps a running (or exited, `--keep-dataplane`) agent pinned under `dir`.
    pub fn from_pinned(dir: &std::path::Path) -> Result<Tables, DataplaneError> {
        Tables::open(|name| {
            let data = MapData::from_pin(dir.join(name)).map_err(|source| DataplaneError::Map { name, source })?;
            aya::maps::Map::from_map_data(data).map_err(|source| DataplaneError::Map { name, source })
        })
    }

    /// Writes ownership table `index` (of `STEER_TABLES`); only changed slots.
    pub fn write_steer_table(&mut self, index: u32, slots: &[SteerSlot]) -> Result<(), DataplaneError> {
        let base = index * STEER_SIZE;
        for (i, s) in slots.iter().enumerate().take(STEER_SIZE as usize) {
            let at = base + i as u32;
            if self.steer.get(&at, 0).ok().as_ref() != Some(s) {
                self.steer.set(at, s, 0).map_err(map_err("STEER"))?;
            }
        }
        Ok(())
    }

    pub fn steer_conf(&self) -> SteerConf {
        self.steer_conf.get(&0, 0).unwrap_or_default()
    }

    pub fn set_steer_conf(&mut self, conf: &SteerConf) -> Result<(), DataplaneError> {
        self.steer_conf.set(0, conf, 0).map_err(map_err("STEER_CONF"))
    }

    pub fn set_backend(&mut self, id: u32, info: &BackendInfo) -> Result<(), DataplaneError> {
        self.backends.set(id, info, 0).map_err(map_err("BACKENDS"))
    }

    pub fn backend(&self, id: u32) -> Result<BackendInfo, DataplaneError> {
        self.backends.get(&id, 0).map_err(map_err("BACKENDS"))
    }

    /// Writes a VIP's ring, touching only the slots that change: every slot holds the old
    /// or the new backend at any moment, never nothing.
    pub fn write_ring(&mut self, vip_id: u32, table: &[u32]) -> Result<usize, DataplaneError> {
        let idx = vip_id as usize;
        if self.ring_cache.len() <= idx {
            self.ring_cache.resize(idx + 1, Vec::new());
        }
        let base = vip_id * MAX_RING_SIZE;
        let mut written = 0;
        for (slot, &b) in table.iter().enumerate() {
            if self.ring_cache[idx].get(slot) != Some(&b) {
                self.rings.set(base + slot as u32, b, 0).map_err(map_err("RINGS"))?;
                written += 1;
            }
        }
        self.ring_cache[idx] = table.to_vec();
        Ok(written)
    }

    /// The table last written for a VIP.
    pub fn ring(&self, vip_id: u32) -> Option<&[u32]> {
        self.ring_cache.get(vip_id as usize).map(|v| v.as_slice()).filter(|v| !v.is_empty())
    }

    /// Loads the ring currently in the map (e.g. adopted from a previous run) into the
    /// cache, so the next rebuild writes only differences.
    pub fn adopt_ring(&mut self, vip_id: u32, size: u32) -> Result<(), DataplaneError> {
        let base = vip_id * MAX_RING_SIZE;
        let mut cur = Vec::with_capacity(size as usize);
        for slot in 0..size {
            cur.push(self.rings.get(&(base + slot), 0).map_err(map_err("RINGS"))?);
        }
        let idx = vip_id as usize;
        if self.ring_cache.len() <= idx {
            self.ring_cache.resize(idx + 1, Vec::new());
        }
        self.ring_cache[idx] = cur;
        Ok(())
    }

    /// Rebuilds a VIP's Maglev table from the backends that take new flows.
    pub fn rebuild_ring(
        &mut self,
        vip_id: u32,
        vip: &Vip,
        cfg: &Config,
        states: &[u8],
    ) -> Result<usize, DataplaneError> {
        self.rebuild_ring_weighted(vip_id, vip, cfg, states, |b| cfg.backends[b].weight)
    }

    /// As `rebuild_ring`, with each backend's weight given (`slow_start`: a share of it).
    pub fn rebuild_ring_weighted(
        &mut self,
        vip_id: u32,
        vip: &Vip,
        cfg: &Config,
        states: &[u8],
        weight: impl Fn(usize) -> u32,
    ) -> Result<usize, DataplaneError> {
        let table = ring_table_weighted(vip, cfg, states, weight);
        self.write_ring(vip_id, &table)
    }

    /// Writes the whole configuration: backends with the given (effective) states and
    /// operator states, VIPs with their address markers, and every ring.
    pub fn apply(&mut self, cfg: &Config, states: &[u8], admins: &[u8]) -> Result<(), DataplaneError> {
        for (i, b) in cfg.backends.iter().enumerate() {
            self.set_backend(i as u32, &backend_info(b, states[i], admins.get(i).copied().unwrap_or(0)))?;
        }
        for (i, v) in cfg.vips.iter().enumerate() {
            let id = i as u32;
            let key = vip_key(v);
            if v.retired {
                // Removed by a reload: no longer served (the address marker stays while
                // another VIP lives on the same address and protocol).
                let _ = self.vips.remove(&key);
                let shared = cfg.vips.iter().any(|o| !o.retired && o.address == v.address && o.protocol == v.protocol);
                if !shared {
                    let _ = self.vips.remove(&VipKey { port: 0, ..key });
                }
                continue;
            }
            // Ring before VIP: a VIP never becomes visible with an unfilled table.
            self.rebuild_ring(id, v, cfg, states)?;
            let marker = VipKey { port: 0, ..key };
            let marker_info = VipInfo { id, mode: MODE_ADDR_MARKER, ..Default::default() };
            self.vips.insert(marker, marker_info, 0).map_err(map_err("VIPS"))?;
            self.vips.insert(key, vip_info(id, v), 0).map_err(map_err("VIPS"))?;
        }
        Ok(())
    }

    /// Removes `VIPS` entries no VIP of `cfg` has (VIPs removed from the file while the
    /// maps were pinned): a removed VIP must not go on being served from its old ring.
    pub fn remove_stale_vips(&mut self, cfg: &Config) -> usize {
        let mut wanted = std::collections::HashSet::new();
        for v in cfg.vips.iter().filter(|v| !v.retired) {
            let key = vip_key(v);
            wanted.insert(key);
            wanted.insert(VipKey { port: 0, ..key });
        }
        let stale: Vec<VipKey> = self.vips.keys().filter_map(|k| k.ok()).filter(|k| !wanted.contains(k)).collect();
        stale.iter().filter(|k| self.vips.remove(k).is_ok()).count()
    }

    /// Zeroes every XDP counter (`dispatcher clear-counters --all`); what XDP counts on
    /// another CPU meanwhile may be lost with it.
    pub fn clear_counters(&mut self) -> Result<(), DataplaneError> {
        let cpus = aya::util::nr_cpus()
            .map_err(|(what, source)| DataplaneError::Io { what: format!("counting the CPUs ({what})"), source })?;
        for slot in 0..stats::TOTAL_SLOTS {
            let zeros = aya::maps::PerCpuValues::try_from(vec![Counter::default(); cpus])
                .map_err(|source| DataplaneError::Io { what: "zeroing STATS".into(), source })?;
            self.stats.set(slot, zeros, 0).map_err(map_err("STATS"))?;
        }
        Ok(())
    }

    /// One counter summed over all CPUs.
    pub fn counter(&self, slot: u32) -> Result<Counter, DataplaneError> {
        let per_cpu = self.stats.get(&slot, 0).map_err(map_err("STATS"))?;
        Ok(per_cpu.iter().fold(Counter::default(), |acc, c| Counter {
            packets: acc.packets + c.packets,
            bytes: acc.bytes + c.bytes,
        }))
    }

    /// Packets and bytes XDP forwarded for a VIP: on a pinned flow (`VIP_FLOW_HITS`) and
    /// otherwise (`VIP_PACKETS`); each packet is counted under one of them.
    pub fn vip_forwarded(&self, vip: u32) -> Result<Counter, DataplaneError> {
        let (a, b) = (
            self.counter(stats::vip_slot(vip, stats::VIP_PACKETS))?,
            self.counter(stats::vip_slot(vip, stats::VIP_FLOW_HITS))?,
        );
        Ok(Counter { packets: a.packets + b.packets, bytes: a.bytes + b.bytes })
    }

    /// A VIP's XDP figures, as `status` and the status page show them.
    pub fn vip_figures(&self, vip: u32) -> Result<VipFigures, DataplaneError> {
        let c = |what| self.counter(stats::vip_slot(vip, what)).map(|c| c.packets);
        Ok(VipFigures {
            forwarded: self.vip_forwarded(vip)?,
            new_flows: c(stats::VIP_NEW_FLOWS)?,
            flow_hits: c(stats::VIP_FLOW_HITS)?,
            drops: c(stats::VIP_DROPS)?,
        })
    }

    /// A SIP VIP's message counts: forwarded by affinity source, then held (owner
    /// suspect), unknown logical name, invalid.
    pub fn sip_counters(&self, vip: u32) -> Result<Vec<(&'static str, u64)>, DataplaneError> {
        SIP_COUNTERS.iter().map(|&(n, slot)| Ok((n, self.counter(stats::vip_slot(vip, slot))?.packets))).collect()
    }

    /// A UDP VIP's fragment counts (`FRAG_COUNTERS`).
    pub fn fragment_counters(&self, vip: u32) -> Result<Vec<(&'static str, u64)>, DataplaneError> {
        FRAG_COUNTERS.iter().map(|&(n, slot)| Ok((n, self.counter(stats::vip_slot(vip, slot))?.packets))).collect()
    }

    pub fn global_counters(&self) -> Result<Vec<(&'static str, Counter)>, DataplaneError> {
        stats::GLOBAL_NAMES.iter().enumerate().map(|(i, n)| Ok((*n, self.counter(i as u32)?))).collect()
    }

    /// A handle of its own on FLOWS, for a walk that must not hold these tables (and the
    /// control loop) for its whole length.
    pub fn flows_handle(&self) -> Result<HashMap<MapData, FlowKey, FlowValue>, DataplaneError> {
        let fd = self.flows_fd.as_ref().ok_or(DataplaneError::MissingMap("FLOWS"))?;
        let fd = fd.try_clone().map_err(|e| DataplaneError::Io { what: "duplicating FLOWS".into(), source: e })?;
        let data = MapData::from_fd(fd).map_err(map_err("FLOWS"))?;
        HashMap::try_from(aya::maps::Map::from_map_data(data).map_err(map_err("FLOWS"))?).map_err(map_err("FLOWS"))
    }

    /// Number of entries in the flow table (walks it; for status, not for hot paths).
    pub fn flow_count(&self) -> usize {
        self.flows.keys().filter(|k| k.is_ok()).count()
    }
}

/// A VIP's Maglev table: its backends that take new flows, keyed by name.
pub fn ring_table(vip: &Vip, cfg: &Config, states: &[u8]) -> Vec<u32> {
    ring_table_weighted(vip, cfg, states, |b| cfg.backends[b].weight)
}

/// As `ring_table`, with each backend's weight given.
pub fn ring_table_weighted(vip: &Vip, cfg: &Config, states: &[u8], weight: impl Fn(usize) -> u32) -> Vec<u32> {
    let members: Vec<maglev::Member> = vip
        .backends
        .iter()
        .filter(|&&b| states.get(b).copied() == Some(STATE_UP))
        .map(|&b| maglev::Member { id: b as u32, key: &cfg.backends[b].name, weight: weight(b) })
        .collect();
    maglev::build(&members, vip.ring_size())
}

/// The initial state of every backend: up until health checks say otherwise.
pub fn initial_states(cfg: &Config) -> Vec<u8> {
    vec![STATE_UP; cfg.backends.len()]
}
