mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let args = cli::args::Cli::parse();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            // In the journal: at error priority, on one line.
            let text = dispatcher::logging::error_text(&e);
            if dispatcher::logging::to_journal() {
                eprintln!("<3>dispatcher: {}", text.replace('\n', " "));
            } else {
                eprintln!("dispatcher: {text}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
