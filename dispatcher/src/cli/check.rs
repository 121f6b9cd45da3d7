use std::{path::Path, process::ExitCode};

use dispatcher::config::Config;

pub fn check(file: &Path) -> anyhow::Result<ExitCode> {
    match Config::load(file) {
        Ok(cfg) => {
            println!("{}: ok ({} VIPs, {} backends)", file.display(), cfg.vips.len(), cfg.backends.len());
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
    }
}
