//! The agent's pins under `<bpffs>/dispatcher/<instance>/` are what keeps the data plane
//! alive after the agent exits and what a restart adopts. Somebody may remove them under
//! a running agent (`rm -r`, another tool): the agent checks them and pins again, from the
//! objects it holds, whatever went missing — so `stop` can keep its word that forwarding
//! goes on, and a restart finds the flows.

use std::path::{Path, PathBuf};

use aya::maps::{MapData, MapInfo};

use super::{DataplaneError, MAP_NAMES};

/// The kernel ids of the maps this agent pinned.
pub struct Pins {
    dir: PathBuf,
    maps: Vec<(&'static str, u32)>,
    /// Our own handle of each map, opened from its pin right after loading: what pins it
    /// again (reopening a map by id would take CAP_SYS_ADMIN, which the service lacks).
    handles: Vec<MapData>,
}

impl Pins {
    /// Records the ids of the maps pinned under `dir` now (right after loading).
    pub fn record(dir: &Path) -> Result<Pins, DataplaneError> {
        let mut maps = Vec::new();
        let mut handles = Vec::new();
        for &name in MAP_NAMES.iter() {
            let data = MapData::from_pin(dir.join(name)).map_err(|source| DataplaneError::Map { name, source })?;
            let id = data.info().map_err(|source| DataplaneError::Map { name, source })?.id();
            maps.push((name, id));
            handles.push(data);
        }
        Ok(Pins { dir: dir.to_path_buf(), maps, handles })
    }

    /// Maps whose pin is gone, or names another map than ours. A pin that cannot be
    /// read (out of descriptors, say) is not called missing: only what is known.
    pub fn missing_maps(&self) -> Vec<&'static str> {
        self.maps
            .iter()
            .filter(|(name, id)| {
                let path = self.dir.join(name);
                match std::fs::symlink_metadata(&path) {
                    Err(e) => e.kind() == std::io::ErrorKind::NotFound,
                    Ok(_) => MapInfo::from_pin(&path).is_ok_and(|i| i.id() != *id),
                }
            })
            .map(|(name, _)| *name)
            .collect()
    }

    /// Pins our maps again where they are missing (a foreign pin in the way is replaced).
    pub fn repin_maps(&self, names: &[&'static str]) -> Result<(), DataplaneError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|source| DataplaneError::Io { what: format!("creating {}", self.dir.display()), source })?;
        for (&(name, _), data) in self.maps.iter().zip(&self.handles).filter(|((n, _), _)| names.contains(n)) {
            let path = self.dir.join(name);
            let _ = std::fs::remove_file(&path);
            data.pin(&path).map_err(|e| DataplaneError::Io {
                what: format!("pinning {}", path.display()),
                source: std::io::Error::other(e.to_string()),
            })?;
        }
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
