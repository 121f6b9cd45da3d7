//! Which configuration file a command reads, one rule for all of them: `-c FILE`; else
//! `-i NAME`, /etc/dispatcher/NAME.toml (what the unit dispatcher@NAME runs); else the
//! default instance's, /etc/dispatcher/default.toml (dispatcher@default's).
//! `DISPATCHER_CONFIG_DIR` stands for /etc/dispatcher (tests, other layouts).

use std::path::{Path, PathBuf};

use dispatcher::config::Config;

use super::args::ConfigFile;

/// Where the unit dispatcher@NAME reads NAME.toml.
pub const CONFIG_DIR: &str = "/etc/dispatcher";
/// The instance of a file that names none (`dispatcher.instance`'s default), and the one
/// a command reads when given neither `-c` nor `-i`.
pub const DEFAULT_INSTANCE: &str = "default";

/// The directory `-i NAME` and the default look in.
pub fn config_dir() -> PathBuf {
    std::env::var_os("DISPATCHER_CONFIG_DIR").filter(|d| !d.is_empty()).map_or_else(|| CONFIG_DIR.into(), PathBuf::from)
}

/// The file `choice` names. `-i NAME` and the default must exist (a missing one is said
/// with the path tried and how to choose another); a `-c FILE` that cannot be read is
/// the configuration loader's error, with its name.
pub fn resolve(choice: &ConfigFile) -> anyhow::Result<PathBuf> {
    if let Some(file) = &choice.config {
        return Ok(file.clone());
    }
    let dir = config_dir();
    let (name, given) = match &choice.instance {
        Some(name) => (name.as_str(), true),
        None => (DEFAULT_INSTANCE, false),
    };
    let path = dir.join(format!("{name}.toml"));
    match path.symlink_metadata() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if given {
                anyhow::bail!(
                    "no configuration for instance {name}: {} does not exist (-i NAME reads {}/NAME.toml; -c FILE reads any file)",
                    path.display(),
                    dir.display()
                )
            }
            anyhow::bail!(
                "no configuration given, and the default one, {} (instance {name}, the unit dispatcher@{name}'s), does not exist: name one with -c FILE, or -i NAME for {}/NAME.toml",
                path.display(),
                dir.display()
            )
        }
        _ => Ok(path),
    }
}

/// `check FILE` (kept from before `-c`) and `check -c FILE`: one file, or a usage error.
pub fn for_check(file: Option<PathBuf>, choice: &ConfigFile) -> anyhow::Result<PathBuf> {
    match (file, &choice.config) {
        (Some(a), Some(b)) if !same_file(&a, b) => {
            use clap::CommandFactory as _;
            let mut cli = super::args::Cli::command();
            cli.build();
            let check = cli.find_subcommand_mut("check").expect("the check command");
            let why =
                format!("FILE {} and --config {} are different files: give one of them", a.display(), b.display());
            check.error(clap::error::ErrorKind::ArgumentConflict, why).exit()
        }
        (Some(a), _) => Ok(a),
        (None, _) => resolve(choice),
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// A file in the units' directory runs, as dispatcher@<its stem>, the instance it names:
/// when that is another name, what the unit runs, said (`check` prints it as a warning).
pub fn instance_mismatch(file: &Path, cfg: &Config) -> Option<String> {
    let dir = config_dir().canonicalize().ok()?;
    let file = file.canonicalize().ok()?;
    if file.parent()? != dir || file.extension()? != "toml" {
        return None;
    }
    let stem = file.file_stem()?.to_str()?;
    if stem == cfg.instance {
        return None;
    }
    Some(format!(
        "{}: the file is {stem}.toml but its instance is \"{}\"{}: the unit dispatcher@{stem} runs it as instance {} (pins under {}, admin socket {}), and -i {} reads {}, not this file; set instance = \"{stem}\" in [dispatcher], or name the file {}.toml",
        file.display(),
        cfg.instance,
        if cfg.instance == DEFAULT_INSTANCE { " (the default)" } else { "" },
        cfg.instance,
        cfg.pin_dir().display(),
        cfg.admin_socket.display(),
        cfg.instance,
        dir.join(format!("{}.toml", cfg.instance)).display(),
        cfg.instance
    ))
}
