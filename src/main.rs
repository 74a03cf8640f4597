use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use waitroom::config::Config;

/// A waiting room in front of an order API: a fair, capped line in Redis.
#[derive(Parser)]
#[command(name = "waitroom", version)]
struct Cli {
    /// The configuration file.
    #[arg(long, value_name = "PATH", default_value = "proxy.yaml")]
    config: PathBuf,
    /// Validate the configuration and exit (needs no Redis).
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    waitroom::logging::init();
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(error) => {
            for problem in &error.problems {
                eprintln!("{problem}");
            }
            return ExitCode::from(2);
        }
    };
    if cli.check {
        println!("{}: configuration is valid", cli.config.display());
        return ExitCode::SUCCESS;
    }
    match waitroom::server::run(config, cli.config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("waitroom: {error}");
            ExitCode::from(1)
        }
    }
}
