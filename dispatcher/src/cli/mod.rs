//! The command line: one module per subcommand.

pub mod args;
mod check;
mod completions;
mod config_file;
mod decap;
mod endpoint;
mod import;
mod operator;
mod run;
mod status;
mod tables;
mod xdp_pass;

use std::process::ExitCode;

use args::{Cli, Command};
pub use dispatcher::logging::init_logging;

pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    use config_file::resolve;
    match cli.command {
        Command::Run { config, keep_dataplane, stay_out } => run::run(&resolve(&config)?, keep_dataplane, stay_out),
        Command::Check { file, config } => check::check(&config_file::for_check(file, &config)?),
        Command::Import { file } => import::import(&file),
        Command::Decap { iface, generic } => decap::decap(&iface, generic),
        Command::XdpPass { iface, netns, detach } => xdp_pass::xdp_pass(&iface, netns.as_deref(), detach),
        Command::Status { config, json, csv, watch, count } => {
            status::status(&resolve(&config)?, status::Format::of(json, csv), watch, count)
        }
        Command::Drain { config, backend } => operator::control(&resolve(&config)?, &backend, operator::Action::Drain),
        Command::Disable { config, backend } => {
            operator::control(&resolve(&config)?, &backend, operator::Action::Disable)
        }
        Command::Enable { config, backend } => {
            operator::control(&resolve(&config)?, &backend, operator::Action::Enable)
        }
        Command::Weight { config, backend, weight } => {
            operator::setting(&resolve(&config)?, &backend, &format!("weight?value={}", operator::query_value(&weight)))
        }
        Command::Maxconn { config, backend, maxconn } => operator::setting(
            &resolve(&config)?,
            &backend,
            &format!("maxconn?value={}", operator::query_value(&maxconn)),
        ),
        Command::Checks { config, action, backend } => {
            let verb = match action {
                args::ChecksAction::Disable => "disable-checks",
                args::ChecksAction::Enable => "enable-checks",
            };
            operator::setting(&resolve(&config)?, &backend, verb)
        }
        Command::ClearCounters { config, all } => endpoint::clear_counters(&resolve(&config)?, all),
        Command::Stop { config, detach } => endpoint::stop(&resolve(&config)?, detach),
        Command::Metrics { config } => endpoint::metrics(&resolve(&config)?),
        Command::Errors { config } => tables::errors(&resolve(&config)?),
        Command::Clones { config, action, id, sip, offset, limit, force } => {
            let delete = action.and(id);
            tables::clones(&resolve(&config)?, delete.as_deref(), force, sip, offset, limit)
        }
        Command::Reload { config } => endpoint::reload(&resolve(&config)?),
        Command::GenerateCompletions { out } => completions::generate(&out),
        Command::Leave { config, wait } => endpoint::membership(&resolve(&config)?, false, wait),
        Command::Join { config } => endpoint::membership(&resolve(&config)?, true, None),
        Command::BirdConfig { config } => {
            let path = resolve(&config)?;
            print!("{}", dispatcher::announce::bird_config(&dispatcher::config::Config::load(&path)?)?);
            Ok(ExitCode::SUCCESS)
        }
    }
}
