mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::args::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // In the journal: at error priority, on one line.
            if dispatcher::logging::to_journal() {
                eprintln!("<3>dispatcher: {}", format!("{e:#}").replace('\n', " "));
            } else {
                eprintln!("dispatcher: {e:#}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
