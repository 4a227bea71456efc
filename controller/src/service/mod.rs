//! `gpu-dra-controller run`: the cluster-side service. It watches the
//! cluster into a [`cluster::ClusterState`] and, while it leads, explains
//! claims that cannot be allocated (events) and allocates the claims
//! delegated to it.
//!
//! One task owns the state: watch events arrive on a channel and are
//! applied in order; a periodic pass acts on the state. Writes are awaited
//! one at a time, so the state never sees two of its own decisions race.

pub(crate) mod cluster;
mod lease;
mod log_limit;
mod metrics;
mod reconcile;
mod watch;
pub(crate) mod webhook;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use dra_cel::{CelEnvironment, NEWEST_MINOR};
use gpu_dra_driver::service::api_call;
use gpu_dra_driver::service::http::{HttpState, ReadyCheck};
use gpu_dra_driver::service::kube_client;
use kube::Api;
use tokio::sync::mpsc;

use crate::args::{Listen, RunArgs};
use crate::{events, leadership};

/// Runs until SIGTERM or SIGINT.
pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    let identity = args.identity.clone().unwrap_or_else(default_identity);
    let timeouts = kube_client::ApiTimeouts::with_read(args.api_timeout);
    let (client, source) = kube_client::client(args.kubeconfig.as_deref(), &user_agent(&identity), timeouts)
        .await
        .context("connecting to the API server")?;
    let minor = match tokio::time::timeout(args.api_timeout, client.apiserver_version()).await {
        Ok(Ok(info)) => info.minor.trim_end_matches('+').parse().unwrap_or(NEWEST_MINOR),
        Ok(Err(error)) => {
            tracing::warn!(
                error = %api_call::describe(&error),
                "cannot read the server version; evaluating selectors as Kubernetes 1.{NEWEST_MINOR}"
            );
            NEWEST_MINOR
        }
        Err(_) => {
            tracing::warn!(
                "the server version did not arrive in time; evaluating selectors as Kubernetes 1.{NEWEST_MINOR}"
            );
            NEWEST_MINOR
        }
    };
    tracing::info!(%source, server_minor = minor, %identity, "starting");
    let metrics = Arc::new(metrics::Metrics::new());

    let leadership = if args.leader_elect {
        leadership::Leadership::elected(args.leader_elect_renew_deadline)
    } else {
        leadership::Leadership::sole()
    };
    if args.leader_elect {
        let leases = Api::namespaced(client.clone(), &args.namespace);
        if args.leader_elect_renew_deadline >= args.leader_elect_lease_duration {
            anyhow::bail!(
                "--leader-elect-renew-deadline must be shorter than --leader-elect-lease-duration, or two replicas could lead at once"
            );
        }
        let config = lease::LeaseConfig {
            duration: args.leader_elect_lease_duration,
            renew_deadline: args.leader_elect_renew_deadline,
            retry_period: args.leader_elect_retry_period,
            ..lease::LeaseConfig::new(&args.namespace, &identity)
        };
        tokio::spawn(lease::run(leases, config, leadership.clone()));
    }

    let synced = Arc::new(AtomicBool::new(false));
    if let Listen::At(addr) = args.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        // The bound address (port 0 picks one).
        let addr = listener.local_addr().unwrap_or(addr);
        let flag = synced.clone();
        let state = Arc::new(HttpState {
            metrics: metrics.clone(),
            ready: vec![ReadyCheck::new("synced", move || flag.load(Ordering::Relaxed))],
        });
        tokio::spawn(async move {
            if let Err(error) = gpu_dra_driver::service::http::serve(listener, state, std::future::pending()).await {
                tracing::error!(%error, "the metrics port stopped");
            }
        });
        tracing::info!(%addr, "serving /metrics, /healthz, /readyz");
    }

    let (changes_tx, changes) = mpsc::channel(4096);
    watch::spawn_all(&client, changes_tx, timeouts.watch_timeout_seconds());
    let state = Arc::new(std::sync::Mutex::new(cluster::ClusterState::new(
        &args.driver_name,
        CelEnvironment {
            // The driver's gate says the cluster has DRAListTypeAttributes.
            list_type_attributes: args.feature_gates.enabled(gpu_dra_driver::feature_gates::Gate::ListTypeAttributes),
            ..CelEnvironment::stored_expressions(minor)
        },
    )));
    if args.webhook_port != 0 {
        let (Some(cert), Some(key)) = (args.tls_cert_file.clone(), args.tls_key_file.clone()) else {
            anyhow::bail!(
                "--webhook-port needs --tls-cert-file and --tls-key-file (the certificate the apiserver trusts)"
            );
        };
        let config = webhook::WebhookConfig { addr: (args.webhook_host, args.webhook_port).into(), cert, key };
        kube_client::install_crypto_provider();
        let fleet = state.clone();
        let driver = args.driver_name.clone();
        let webhook_metrics = metrics.clone();
        let gates = args.feature_gates;
        tokio::spawn(async move {
            if let Err(error) = webhook::serve(config, &driver, gates, minor, fleet, webhook_metrics).await {
                tracing::error!(error = %format!("{error:#}"), "the webhook stopped");
                std::process::exit(1);
            }
        });
    }
    let writes = leadership::Writes { leadership, call_timeout: args.api_timeout };
    if args.compute_domains {
        let events = events::EventWriter::new(client.clone(), &identity, args.event_qps, writes.clone());
        let invalid = metrics.invalid_objects.get_or_create(&metrics::KindLabel { kind: "ComputeDomain".to_owned() });
        tokio::spawn(crate::compute_domain::run(client.clone(), writes.clone(), events, invalid.clone()));
    }
    let mut owner = reconcile::Owner::new(client, state, &args, &identity, metrics, synced, writes);
    tokio::select! {
        result = owner.run(changes) => result,
        _ = shutdown() => {
            tracing::info!("stopping");
            Ok(())
        }
    }
}

/// `gpu-dra-controller/VERSION (IDENTITY)`: the API server's audit log
/// tells the replicas apart (client-go's agents add a comment the same way);
/// the plain form when the identity cannot be a header value.
fn user_agent(identity: &str) -> String {
    let plain = concat!("gpu-dra-controller/", env!("CARGO_PKG_VERSION"));
    let printable = identity.len() <= 128 && identity.bytes().all(|b| b.is_ascii_graphic());
    if printable { format!("{plain} ({identity})") } else { plain.to_owned() }
}

fn default_identity() -> String {
    let base = std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| "gpu-dra-controller".to_owned());
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{base}-{}", &suffix[..8])
}

async fn shutdown() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
