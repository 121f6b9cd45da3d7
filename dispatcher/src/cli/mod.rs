//! The command line: one module per subcommand.

pub mod args;
mod check;
mod decap;
mod docs;
mod endpoint;
mod import;
mod operator;
mod run;
mod status;

use std::process::ExitCode;

use args::{Cli, Command};
pub use dispatcher::logging::init_logging;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config, keep_dataplane } => run::run(&config, keep_dataplane),
        Command::Check { file } => check::check(&file),
        Command::Import { file } => import::import(&file),
        Command::Decap { iface, generic } => decap::decap(&iface, generic),
        Command::Status { config, json, watch, count } => status::status(&config, json, watch, count),
        Command::Drain { config, backend } => operator::control(&config, &backend, operator::Action::Drain),
        Command::Disable { config, backend } => operator::control(&config, &backend, operator::Action::Disable),
        Command::Enable { config, backend } => operator::control(&config, &backend, operator::Action::Enable),
        Command::Stop { config, detach } => endpoint::stop(&config, detach),
        Command::Metrics { config } => endpoint::metrics(&config),
        Command::Reload { config } => endpoint::reload(&config),
        Command::GenerateDocs { out } => docs::generate(&out),
        Command::Leave { config, wait } => endpoint::membership(&config, false, wait),
        Command::Join { config } => endpoint::membership(&config, true, None),
        Command::BirdConfig { config } => {
            print!("{}", dispatcher::announce::bird_config(&dispatcher::config::Config::load(&config)?)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
