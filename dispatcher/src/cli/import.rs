use std::{io::Read, path::Path, process::ExitCode};

use anyhow::Context;
use dispatcher::routes::{import, plugin_cfg};

/// `dispatcher import FILE`: the TOML on standard output; warnings and errors on standard
/// error, each with the file's name and line.
pub fn import(file: &Path) -> anyhow::Result<ExitCode> {
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(plugin_cfg::MAX_FILE_BYTES as u64 + 1).read_to_end(&mut bytes))
        .with_context(|| format!("reading {}", file.display()))?;
    let cfg = match plugin_cfg::parse(&bytes) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{}: {e}", file.display());
            return Ok(ExitCode::from(1));
        }
    };
    for w in &cfg.warnings {
        eprintln!("warning: {}: {w}", file.display());
    }
    let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
    print!("{}", import::to_toml(&cfg, &name));
    Ok(ExitCode::SUCCESS)
}
