//! `gpu-kubelet-plugin`: argument parsing, logging and wiring; the work is
//! done in the `gpu-dra-driver` library.

use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use gpu_kubelet_plugin::cli::{Cli, Command, LogFormat, LoggingArgs};
use gpu_kubelet_plugin::inspect;
use gpu_kubelet_plugin::run;

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    init_logging(&cli.logging);
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let result = match &cli.command {
        Command::PrintSlices(args) => inspect::print_slices(args, &mut stdout.lock()),
        Command::PrintCdi(args) => inspect::print_cdi(args, &mut stdout.lock(), &mut stderr.lock()),
        Command::Run(args) => runtime().and_then(|rt| rt.block_on(run::run(args))),
        Command::MpsLaunch(args) => gpu_kubelet_plugin::prepare::mps::launch::exec(args),
        Command::MpsSupervisor(args) => gpu_kubelet_plugin::prepare::mps::launch::supervise(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line, every cause included: easy to read in `kubectl logs`
            // and to grep; a server's or a file's control characters escaped.
            let line = format!("{err:#}").replace('\n', " ");
            eprintln!("error: {}", gpu_dra_driver::printable::escape(&line));
            ExitCode::FAILURE
        }
    }
}

/// Two workers keep the footprint small (RSS target 16 MiB); blocking file
/// work (fsync) goes to a bounded pool so concurrent claims do not wait on
/// one another's disk writes.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context as _;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .thread_name("gpu-kubelet-plugin")
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// One malloc arena for the whole process. glibc gives each thread that
/// allocates (workers, and up to 16 blocking threads doing fsyncs) an arena
/// of its own, and freed memory stays spread over them; the plugin is
/// I/O-bound, so one arena costs no speed and keeps RSS under its 16 MiB
/// target (about 1 MiB less on a fully MIG-partitioned node).
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes malloc's tuning; it is called first
    // thing in main, before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn init_logging(args: &LoggingArgs) {
    let mut filter = EnvFilter::try_new(&args.log_level).unwrap_or_else(|_| EnvFilter::new("warn"));
    if let Some(Ok(quiet)) =
        gpu_dra_driver::service::kube_client::request_log_directive(&args.log_level).map(str::parse)
    {
        filter = filter.add_directive(quiet);
    }
    // Colours only on a terminal: logs in files and `kubectl logs` stay greppable.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
