//! `dispatcher run`: the agent (`dispatcher::agent`), until a signal or `dispatcher stop`.

use std::{path::Path, process::ExitCode};

pub fn run(path: &Path, keep_dataplane: bool, stay_out: bool) -> anyhow::Result<ExitCode> {
    dispatcher::agent::run(path, keep_dataplane, stay_out)?;
    Ok(ExitCode::SUCCESS)
}
