//! The command line: one module per subcommand.

mod agent;
pub mod args;
mod check;
mod control;
mod decap;
mod docs;
mod run;
mod status;

use std::process::ExitCode;

use args::{Cli, Command};
pub use dispatcher::logging::init_logging;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, keep_dataplane } => run::run(&config, keep_dataplane),
        Command::Check { file } => check::check(&file),
        Command::Decap { iface, generic } => decap::decap(&iface, generic),
        Command::Status { config, json, watch, count } => status::status(&config, json, watch, count),
        Command::Drain { config, backend } => control::control(&config, &backend, control::Action::Drain),
        Command::Disable { config, backend } => control::control(&config, &backend, control::Action::Disable),
        Command::Enable { config, backend } => control::control(&config, &backend, control::Action::Enable),
        Command::Stop { config, detach } => agent::stop(&config, detach),
        Command::Metrics { config } => agent::metrics(&config),
        Command::Reload { config } => agent::reload(&config),
        Command::GenerateDocs { out } => docs::generate(&out),
        Command::Leave { config, wait } => agent::membership(&config, false, wait),
        Command::Join { config } => agent::membership(&config, true, None),
        Command::BirdConfig { config } => {
            print!("{}", dispatcher::announce::bird_config(&dispatcher::config::Config::load(&config)?)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
