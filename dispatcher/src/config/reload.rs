//! Placing a configuration at the ids that are already in use: a reload keeps every
//! backend's and VIP's id by name (`merged_for_reload`), and so does a restart that adopts
//! pinned maps (`placed_by_names`).

use std::net::{IpAddr, Ipv4Addr};

use dispatcher_common::{MAX_BACKENDS, MAX_VIPS};

use super::{Backend, ClusterSettings, Config, L4Settings, Partition, Protocol, Vip, VipKind};

impl Config {
    /// `new` re-indexed for a reload of `self`: every backend and VIP keeps the id (the
    /// position) it has now, so that pinned flows, rings and the clone table stay right;
    /// removed ones stay in their slots as `retired`, added ones get new slots.
    pub fn merged_for_reload(&self, new: Config) -> Result<Config, String> {
        self.reloadable_to(&new)?;
        let (backends, backend_slot) = self.backends_placed(&new.backends)?;
        // VIPs by name.
        let remap = |v: &Vip| Vip { backends: v.backends.iter().map(|&j| backend_slot[j]).collect(), ..v.clone() };
        let mut vips: Vec<Vip> = Vec::new();
        let mut vip_slot = vec![0usize; new.vips.len()];
        for old in &self.vips {
            match new.vips.iter().position(|v| v.name == old.name) {
                Some(j) => {
                    vip_slot[j] = vips.len();
                    vips.push(remap(&new.vips[j]));
                }
                None => vips.push(Vip { retired: true, backends: Vec::new(), ..old.clone() }),
            }
        }
        for (j, v) in new.vips.iter().enumerate() {
            if !self.vips.iter().any(|o| o.name == v.name) {
                vip_slot[j] = vips.len();
                vips.push(remap(v));
            }
        }
        if vips.len() > MAX_VIPS as usize {
            return Err(format!("more than {MAX_VIPS} VIP slots (removed VIPs keep theirs until a restart)"));
        }
        let partitions = new
            .partitions
            .iter()
            .map(|p| Partition {
                primary: backend_slot[p.primary],
                replica: p.replica.map(|r| backend_slot[r]),
                ..p.clone()
            })
            .collect();
        // Farms and routes are not ids of the maps: they keep their order, and name the
        // backends and VIPs at their slots.
        let slots = |list: &[usize], slot: &[usize]| list.iter().map(|&j| slot[j]).collect::<Vec<_>>();
        let farms = (new.farms.iter())
            .map(|f| super::Farm {
                servers: slots(&f.servers, &backend_slot),
                backup_servers: slots(&f.backup_servers, &backend_slot),
                ..f.clone()
            })
            .collect();
        let routes =
            (new.routes.iter()).map(|r| super::Route { vips: slots(&r.vips, &vip_slot), ..r.clone() }).collect();
        Ok(Config { backends, vips, farms, routes, partitions, ..new })
    }

    /// What a reload cannot change (the agent's place, its session with the store, the
    /// tables' sizes): the message that asks for a restart.
    fn reloadable_to(&self, new: &Config) -> Result<(), String> {
        let restart = |what: &str| {
            Err(format!("{what} changed: this needs a restart (`dispatcher run` adopts the pinned maps; L4 forwarding goes on meanwhile)"))
        };
        if new.interface != self.interface {
            return restart("dispatcher.interface");
        }
        if new.instance != self.instance
            || new.bpffs != self.bpffs
            || new.admin_socket != self.admin_socket
            || new.admin_address != self.admin_address
        {
            return restart("the instance, bpffs or admin socket/address");
        }
        // `peers` may change (a dispatcher added or removed); the rest of `[cluster]` is
        // the session's, fixed for the agent's life.
        let but_peers = |c: &Option<ClusterSettings>| {
            c.clone().map(|c| ClusterSettings { peers: Vec::new(), peer_macs: Default::default(), ..c })
        };
        if but_peers(&new.cluster) != but_peers(&self.cluster) {
            return restart("[cluster] (all but peers)");
        }
        if new.announce != self.announce {
            return restart("[announce]");
        }
        if new.flow_table_size != self.flow_table_size || new.affinity_table_size != self.affinity_table_size {
            return restart("a table size");
        }
        Ok(())
    }

    /// `new` backends by name at the slots of `self`'s, and the slot of each of `new`'s.
    fn backends_placed(&self, new: &[Backend]) -> Result<(Vec<Backend>, Vec<usize>), String> {
        let mut backend_slot = vec![0usize; new.len()];
        let mut backends: Vec<Backend> = Vec::new();
        for old in &self.backends {
            match new.iter().position(|b| b.name == old.name) {
                Some(j) => {
                    backend_slot[j] = backends.len();
                    backends.push(new[j].clone());
                }
                // Its sessions go to its replica (same slot id as before) until they end.
                None => backends.push(Backend { retired: true, ..old.clone() }),
            }
        }
        for (j, b) in new.iter().enumerate() {
            if !self.backends.iter().any(|o| o.name == b.name) {
                backend_slot[j] = backends.len();
                backends.push(b.clone());
            }
        }
        if backends.len() > MAX_BACKENDS as usize {
            return Err(format!(
                "more than {MAX_BACKENDS} backend slots (removed backends keep theirs until a restart)"
            ));
        }
        // New definitions name replicas by their position in `new`: map them to slots.
        // (Retired ones keep the slot ids they had.)
        for b in backends.iter_mut().filter(|b| !b.retired) {
            b.replica = b.replica.map(|j| backend_slot[j]);
        }
        Ok((backends, backend_slot))
    }

    /// `self` re-indexed so that the backends and VIPs named in `backends` and `vips` (by
    /// id) keep those ids: the placement a restart that adopts pinned maps must use.
    /// Names no longer configured keep their slots as retired placeholders.
    pub fn placed_by_names(self, backends: &[String], vips: &[String]) -> Result<Config, String> {
        let skeleton = Config {
            backends: backends
                .iter()
                .map(|name| Backend {
                    name: name.clone(),
                    address: Ipv4Addr::UNSPECIFIED,
                    address6: None,
                    mac: None,
                    port: None,
                    weight: 1,
                    replica: None,
                    clone_ids: Vec::new(),
                    logical_names: Vec::new(),
                    maxconn: None,
                    maxqueue: Backend::DEFAULT_MAXQUEUE,
                    slow_start: None,
                    retired: false,
                })
                .collect(),
            vips: vips
                .iter()
                .map(|name| Vip {
                    name: name.clone(),
                    address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    port: 0,
                    protocol: Protocol::Tcp,
                    kind: VipKind::L4(L4Settings::default()),
                    backends: Vec::new(),
                    slow_start: None,
                    retired: false,
                })
                .collect(),
            partitions: Vec::new(),
            farms: Vec::new(),
            routes: Vec::new(),
            ..self.clone()
        };
        skeleton.merged_for_reload(self)
    }
}
