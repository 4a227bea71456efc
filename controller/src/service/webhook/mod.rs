//! The validating webhook: `admission.k8s.io/v1` AdmissionReviews of
//! ResourceClaims and ResourceClaimTemplates over HTTPS, on every replica
//! (not only the leader).
//!
//! Hostile requests are bounded: the body at the apiserver's 3 MiB, JSON
//! nesting by serde_json's recursion limit (128), a TLS handshake at 10 s,
//! and each review at 5 s of its own thread (the apiserver's default
//! webhook timeout is 10 s); connections are served concurrently, so a slow
//! or malformed one never stalls the others.

mod review;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::net::TcpListener;

use super::cluster::ClusterState;
use super::metrics::Metrics;
pub use review::{Fleet, review, selector_env};

/// `MaxRequestBodyBytes` of the apiserver.
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// The fleet as the owner keeps it.
pub struct SharedFleet(pub Arc<Mutex<ClusterState>>);

impl Fleet for SharedFleet {
    fn warnings(&self, claim: &ResourceClaim) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).fleet_warnings(claim)
    }
}

struct Reviewer {
    driver: String,
    gates: gpu_dra_driver::feature_gates::FeatureGates,
    cel: gpu_dra_driver::selector::SelectorEnv,
    fleet: SharedFleet,
    metrics: Arc<Metrics>,
}

/// Where the webhook listens and with which certificate.
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Binds the port and serves until the process ends.
pub async fn serve(
    config: WebhookConfig,
    driver: &str,
    gates: gpu_dra_driver::feature_gates::FeatureGates,
    server_minor: u32,
    fleet: SharedFleet,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let resolver = Arc::new(tls::ReloadingCert::new(config.cert, config.key)?);
    let mut tls_config = rustls::ServerConfig::builder().with_no_client_auth().with_cert_resolver(resolver);
    tls_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config));
    let listener =
        TcpListener::bind(config.addr).await.with_context(|| format!("binding the webhook port {}", config.addr))?;
    let reviewer =
        Arc::new(Reviewer { driver: driver.to_owned(), gates, cel: selector_env(server_minor), fleet, metrics });
    let app = Router::new().route("/validate", post(validate)).with_state(reviewer);
    tracing::info!(addr = %config.addr, "serving the validating webhook at /validate");
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "accepting a webhook connection failed");
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
            let service = TowerToHyperService::new(app);
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HANDSHAKE_TIMEOUT);
            if let Err(error) = builder.serve_connection(TokioIo::new(tls), service).await {
                tracing::debug!(%peer, %error, "webhook connection ended");
            }
        });
    }
}

async fn validate(State(reviewer): State<Arc<Reviewer>>, request: Request<Body>) -> Response {
    let body = match axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            reviewer.metrics.error("webhook_body");
            let message = format!("the request body is larger than {MAX_BODY_BYTES} bytes");
            return json_response(StatusCode::PAYLOAD_TOO_LARGE, review::error_review("", &message));
        }
    };
    let worker = reviewer.clone();
    let job =
        tokio::task::spawn_blocking(move || review(&body, &worker.driver, &worker.gates, &worker.cel, &worker.fleet));
    match tokio::time::timeout(REVIEW_TIMEOUT, job).await {
        Ok(Ok((response, allowed))) => {
            if !allowed {
                reviewer.metrics.error("webhook_denied");
            }
            json_response(StatusCode::OK, response)
        }
        Ok(Err(_)) | Err(_) => {
            reviewer.metrics.error("webhook_timeout");
            json_response(StatusCode::OK, review::error_review("", "the review did not finish in time"))
        }
    }
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
