//! Shell completions, generated from the command line's definition so that they never
//! disagree with it (`cargo xtask package` ships them; the manual pages are written by
//! hand: man/).

use std::{path::Path, process::ExitCode};

use anyhow::Context;
use clap::CommandFactory;

use super::args::Cli;

pub fn generate(out: &Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "dispatcher", out)?;
    }
    Ok(ExitCode::SUCCESS)
}
