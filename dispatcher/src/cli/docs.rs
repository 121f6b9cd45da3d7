//! Manual pages and shell completions, generated from the command line's definition so
//! that they never disagree with it (`cargo xtask package` ships them).

use std::{path::Path, process::ExitCode};

use anyhow::Context;
use clap::CommandFactory;

use super::args::Cli;

pub fn generate(out: &Path) -> anyhow::Result<ExitCode> {
    let man = out.join("man8");
    std::fs::create_dir_all(&man).with_context(|| format!("creating {}", man.display()))?;
    let cmd = Cli::command();
    let mut pages = vec![("dispatcher".to_string(), cmd.clone())];
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        // clap names are &'static str: leaked, in this one-shot command.
        let name: &'static str = Box::leak(format!("dispatcher-{}", sub.get_name()).into_boxed_str());
        pages.push((name.to_string(), sub.clone().name(name).version(env!("CARGO_PKG_VERSION"))));
    }
    for (name, page) in pages {
        let mut text = Vec::new();
        clap_mangen::Man::new(page).section("8").manual("dispatcher").render(&mut text)?;
        let file = man.join(format!("{name}.8"));
        std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))?;
    }
    let completions = out.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
        clap_complete::generate_to(shell, &mut Cli::command(), "dispatcher", &completions)?;
    }
    Ok(ExitCode::SUCCESS)
}
