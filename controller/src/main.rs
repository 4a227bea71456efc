//! `gpu-dra-controller`: the cluster-side component of the GPU DRA driver.
//! Argument parsing and wiring only; the logic lives in `gpu-dra-driver`.

mod manifests;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Cluster-side tools of the GPU DRA driver.
#[derive(Debug, Parser)]
#[command(name = "gpu-dra-controller", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check ResourceSlices against the apiserver's validation rules (for
    /// servers 1.34 to 1.36) without a cluster. Reads YAML or JSON files,
    /// multi-document streams and `List`s; objects of other kinds are
    /// skipped with a note. Exits 1 if any slice is invalid.
    ValidateSlices {
        /// Files or directories to read; `-` reads standard input.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        files: Vec<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::ValidateSlices { files } => {
            validate::run(files, &mut std::io::stdout().lock(), &mut std::io::stderr().lock())
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {line}");
            ExitCode::FAILURE
        }
    }
}
