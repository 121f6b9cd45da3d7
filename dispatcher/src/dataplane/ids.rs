//! Which backend and which VIP each id in the pinned maps stands for. `FLOWS`, `AFFINITY`,
//! `CLONES`, `BACKENDS` and `RINGS` hold ids, not names: an agent that adopts the maps
//! must give every backend and VIP the id it had, by name, as a reload does — never by its
//! position in a file that may have been edited meanwhile.
//!
//! bpffs holds only BPF objects, so the table is a file beside the admin socket
//! (`/run/dispatcher/<instance>.ids.json`), tied to the pinned `FLOWS` map by that map's
//! kernel id: a table that outlived its maps (unpinned, rebooted) is never used.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Config;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdTable {
    /// Kernel id of the pinned FLOWS map this table describes.
    pub flows_map_id: u32,
    /// Backend names by id (removed ones keep their slots while the maps live).
    pub backends: Vec<String>,
    /// VIP names by id.
    pub vips: Vec<String>,
}

pub fn path(instance: &str) -> PathBuf {
    PathBuf::from(format!("/run/dispatcher/{instance}.ids.json"))
}

/// The kernel id of the FLOWS map pinned under `pin_dir`.
pub fn flows_map_id(pin_dir: &Path) -> Option<u32> {
    aya::maps::MapInfo::from_pin(pin_dir.join("FLOWS")).ok().map(|i| i.id())
}

/// The table of the maps pinned for `cfg`'s instance, if there is one that describes them.
pub fn load(cfg: &Config) -> Option<IdTable> {
    let text = std::fs::read_to_string(path(&cfg.instance)).ok()?;
    let table: IdTable = match serde_json::from_str(&text) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(file = %path(&cfg.instance).display(), error = %e, "ignoring an unreadable id table");
            return None;
        }
    };
    (Some(table.flows_map_id) == flows_map_id(&cfg.pin_dir())).then_some(table)
}

/// Records which name each id of `cfg` (as placed) stands for; written whole, then renamed.
pub fn save(cfg: &Config) -> std::io::Result<()> {
    let Some(flows_map_id) = flows_map_id(&cfg.pin_dir()) else {
        return Err(std::io::Error::other("no pinned FLOWS map"));
    };
    let table = IdTable {
        flows_map_id,
        backends: cfg.backends.iter().map(|b| b.name.clone()).collect(),
        vips: cfg.vips.iter().map(|v| v.name.clone()).collect(),
    };
    let p = path(&cfg.instance);
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = p.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec(&table).map_err(std::io::Error::other)?)?;
    std::fs::rename(tmp, p)
}

pub fn remove(instance: &str) {
    let _ = std::fs::remove_file(path(instance));
}

/// `cfg` with every backend and VIP at the id the pinned maps give its name (the table
/// of the maps of its instance), new ones in new slots, removed ones as retired
/// placeholders; `cfg` as it is when no table describes the pinned maps.
pub fn placed(cfg: Config) -> Result<Config, String> {
    match load(&cfg) {
        Some(t) => cfg.placed_by_names(&t.backends, &t.vips),
        None => Ok(cfg),
    }
}
