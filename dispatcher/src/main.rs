mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::args::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dispatcher: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
