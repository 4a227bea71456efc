//! `gpu-kubelet-plugin`: argument parsing, logging and wiring; the work is
//! done in the `gpu-dra-driver` library.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use gpu_kubelet_plugin::cli::{Cli, Command, LogFormat, LoggingArgs};
use gpu_kubelet_plugin::inspect;

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.logging);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let result = match &cli.command {
        Command::PrintSlices(args) => inspect::print_slices(args, &mut stdout.lock()),
        Command::PrintCdi(args) => inspect::print_cdi(args, &mut stdout.lock(), &mut stderr.lock()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, every cause included: easy to read in `kubectl logs`
            // and to grep.
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {line}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(args: &LoggingArgs) {
    let filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
