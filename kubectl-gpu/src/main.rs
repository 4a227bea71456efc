//! `kubectl-gpu`: a kubectl plugin for the GPU DRA driver (`kubectl gpu
//! nodes|claims|why|fit`), reading the cluster with the user's kubeconfig
//! and explaining with the controller's `simulate` engine, so it works
//! where the controller is not installed.

mod claims;
mod cluster;
mod deadline;
mod explain;
mod fit;
mod node_metrics;
mod nodes;
mod output;
mod printable;
mod utilization;
mod why;

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use clap::{Parser, Subcommand};

use gpu_dra_simulate::Format;
use output::Paint;

/// GPUs of the cluster as the GPU DRA driver publishes them.
#[derive(Debug, Parser)]
#[command(name = "kubectl gpu", bin_name = "kubectl gpu", version)]
struct Cli {
    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Namespace (default: the context's).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// All namespaces (`claims`).
    #[arg(short = 'A', long = "all-namespaces", global = true)]
    all_namespaces: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", global = true, value_enum, default_value_t = Format::Table)]
    output: Format,
    /// How long `claims` waits for the node agents' metrics (e.g. 5s,
    /// 500ms; 0s skips them).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = gpu_dra_driver::duration::parse)]
    metrics_timeout: Duration,
    /// How long the whole command may wait for the API server, as
    /// kubectl's: a duration (10s, 1m) or whole seconds; 0 for no limit
    /// (each request still gives up after 30 s without an answer).
    #[arg(long, global = true, value_name = "DURATION", default_value = "30s", value_parser = deadline::parse)]
    request_timeout: deadline::RequestTimeout,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Per node: GPUs by model, MIG devices by profile, devices allocated,
    /// shared and free, device taints.
    Nodes,
    /// Claims with the pods reserving them, their node, devices and GPU
    /// utilization (from the node agents' metrics, through the API server's
    /// pod proxy).
    Claims,
    /// Why a claim, or a pod's claims, is not allocated (simulated on the
    /// cluster's slices, classes and current allocations).
    Why {
        /// NAME (a claim, else a pod), pod/NAME or resourceclaim/NAME.
        target: String,
    },
    /// Would these claims, templates or pods fit now, where, and if not why.
    Fit {
        /// Files or directories of YAML/JSON manifests; `-` reads standard input.
        #[arg(short = 'f', long = "filename", value_name = "PATH", required = true)]
        files: Vec<PathBuf>,
    },
}

/// What a command prints: its output, and warnings for standard error.
#[derive(Debug, Default)]
struct Printed {
    text: String,
    warnings: Vec<String>,
}

impl From<String> for Printed {
    fn from(text: String) -> Self {
        Printed { text, warnings: Vec::new() }
    }
}

/// Runs the command within `--request-timeout`.
async fn run_bounded(cli: Cli, paint: Paint) -> Result<Printed> {
    let limit = cli.request_timeout;
    let started = tokio::time::Instant::now();
    let connection = deadline::within(limit, cluster::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()))
        .await
        .ok_or_else(|| anyhow!("reading the kubeconfig's credentials took longer than --request-timeout {limit}"))??;
    let server = connection.server.clone();
    let left = deadline::RequestTimeout(limit.0.map(|l| l.saturating_sub(started.elapsed())));
    deadline::within(left, run(cli, connection, paint))
        .await
        .ok_or_else(|| anyhow!(deadline::expired(&server, limit)))?
}

async fn run(cli: Cli, connection: cluster::Connection, paint: Paint) -> Result<Printed> {
    let client = &connection.client;
    let namespace = cli.namespace.clone().unwrap_or_else(|| connection.default_namespace.clone());
    let format = cli.output;
    match &cli.command {
        Command::Nodes => {
            let mut held = nodes::Holdings::default();
            cluster::each_claims_page(client, None, |page| {
                held.add(&page);
                Ok(())
            })
            .await?;
            let mut summaries = nodes::Summaries::new(held, cluster::taint_rules(client).await?);
            cluster::each_slices_page(client, |page| {
                summaries.add(&page);
                Ok(())
            })
            .await?;
            let summaries = summaries.finish();
            match format {
                Format::Table if summaries.is_empty() => Ok(format!("No {} devices found.\n", nodes::DRIVER).into()),
                Format::Table => Ok(output::table(&nodes::HEADERS, &nodes::rows(&summaries), &paint).into()),
                _ => output::document(&summaries, format).map(Printed::from),
            }
        }
        Command::Claims => {
            let scope = (!cli.all_namespaces).then_some(namespace.as_str());
            let mut summaries = Vec::new();
            cluster::each_claims_page(client, scope, |page| {
                summaries.extend(claims::summarize(&page));
                Ok(())
            })
            .await?;
            claims::sort(&mut summaries);
            let per_node = if cli.metrics_timeout.is_zero() {
                BTreeMap::new()
            } else {
                node_metrics::scrape_nodes(client, &claims::nodes(&summaries), cli.metrics_timeout).await
            };
            let warnings = claims::attach_utilization(&mut summaries, &per_node);
            let text = match format {
                Format::Table if summaries.is_empty() => "No resourceclaims found.\n".to_string(),
                Format::Table => output::table(&claims::HEADERS, &claims::rows(&summaries), &paint),
                _ => output::document(&summaries, format)?,
            };
            Ok(Printed { text, warnings })
        }
        Command::Why { target } => {
            let target = why::parse_target(target)?;
            let claim = match &target {
                why::Target::Claim(name) | why::Target::Either(name) => {
                    cluster::claim(client, &namespace, name).await?
                }
                why::Target::Pod(_) => None,
            };
            let answer = match (&target, claim) {
                (_, Some(c)) => {
                    let cluster = cluster::read_for_simulate(client, HashSet::from([explain::claim_key(&c)])).await?;
                    why::why_claim(cluster, &c)?
                }
                (why::Target::Claim(name), None) => {
                    bail!("resourceclaims \"{name}\" not found in namespace \"{namespace}\"")
                }
                (why::Target::Pod(name) | why::Target::Either(name), None) => {
                    match cluster::pod(client, &namespace, name).await? {
                        Some(pod) => {
                            let templates = cluster::templates(client, &namespace).await?;
                            let cluster = cluster::read_for_simulate(client, why::pod_claim_keys(&pod)).await?;
                            why::why_pod(cluster, &pod, &templates)?
                        }
                        None if matches!(target, why::Target::Pod(_)) => {
                            bail!("pods \"{name}\" not found in namespace \"{namespace}\"")
                        }
                        None => bail!("no resourceclaim or pod \"{name}\" in namespace \"{namespace}\""),
                    }
                }
            };
            match format {
                Format::Table => Ok(why::render(&answer, &paint).into()),
                _ => output::document(&answer, format).map(Printed::from),
            }
        }
        Command::Fit { files } => {
            let wanted = fit::read(files, &namespace)?;
            let assumed = fit::assumed_gates(&wanted);
            let cluster = cluster::read_for_simulate(client, fit::replaced(&wanted)).await?;
            let outcomes = fit::fit(cluster, wanted)?;
            let text = match format {
                Format::Table if outcomes.is_empty() => "No claims to fit.\n".to_string(),
                Format::Table => output::table(&fit::HEADERS, &fit::rows(&outcomes), &paint),
                _ => output::document(&serde_json::json!({ "results": outcomes }), format)?,
            };
            Ok(Printed { text, warnings: assumed.into_iter().collect() })
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's message already reads `error: ...`, naming the argument.
            let _ = e.print();
            return ExitCode::FAILURE;
        }
    };
    let paint = Paint::for_stdout();
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run_bounded(cli, paint)));
    match result {
        Ok(printed) => {
            // kubectl's form for what did not stop the command.
            for warning in &printed.warnings {
                eprintln!("Warning: {}", gpu_dra_driver::printable::escape(warning));
            }
            let _ = std::io::stdout().lock().write_all(printed.text.as_bytes());
            ExitCode::SUCCESS
        }
        Err(err) => {
            // One line: a server's message with line breaks is escaped too.
            eprintln!("error: {}", gpu_dra_driver::printable::escape(&format!("{err:#}")));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        super::Cli::command().debug_assert();
        let cli = <super::Cli as clap::Parser>::try_parse_from(["kubectl-gpu", "claims", "-A", "-o", "json"]).unwrap();
        assert!(cli.all_namespaces && cli.output == super::Format::Json);
        let err = <super::Cli as clap::Parser>::try_parse_from(["kubectl-gpu", "nodes", "-o", "wide"]).unwrap_err();
        assert!(err.to_string().contains("'wide'"), "{err}");
    }
}
