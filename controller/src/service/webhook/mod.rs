//! The validating webhook: `admission.k8s.io/v1` AdmissionReviews of
//! ResourceClaims and ResourceClaimTemplates over HTTPS, on every replica
//! (not only the leader).
//!
//! Hostile requests are bounded: the body at the apiserver's 3 MiB, JSON
//! nesting by serde_json's recursion limit (128); a connection that sends
//! nothing (TLS handshake, headers, idle keep-alive) is closed after 10 s,
//! a request's body and review take at most 5 s (a body that is not in by
//! then closes its connection), and at most 1,024 connections are open
//! (the longest idle one makes room: `connections`). The review runs on its
//! own thread; it waits for the cluster state and searches it within what
//! is left of the 5 s, and a review not done in time is admitted with a
//! warning (a warning is advice; the apiserver's default webhook timeout is
//! 10 s, and with `failurePolicy: Fail` a late answer would refuse the
//! claim).

pub(crate) mod review;
mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, TryLockError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use axum::body::Body;
use axum::extract::State;
use axum::http::{Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use gpu_dra_driver::service::connections::{self, Connection, Handshake, Limits};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::net::{TcpListener, TcpStream};

use super::cluster::ClusterState;
use super::metrics::Metrics;
pub use review::{Fleet, review, selector_env};

/// `MaxRequestBodyBytes` of the apiserver.
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;
/// A connection with no request in flight, the TLS handshake included.
const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// A review from its headers to its answer, the body included.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// What the review's thread leaves for the answer to get out in time.
const ANSWER_MARGIN: Duration = Duration::from_millis(500);
const MAX_CONNECTIONS: usize = 1024;
/// How often a review looks whether the cluster state is free.
const LOCK_POLL: Duration = Duration::from_millis(2);

/// The fleet as the owner keeps it, for a review that must be done by
/// `deadline`: it never waits for the state, or searches it, past that.
pub struct SharedFleet {
    pub state: Arc<Mutex<ClusterState>>,
    pub deadline: Instant,
}

impl Fleet for SharedFleet {
    fn warnings(&self, claim: &ResourceClaim) -> Vec<String> {
        let mut state = loop {
            match self.state.try_lock() {
                Ok(state) => break state,
                Err(TryLockError::Poisoned(poisoned)) => break poisoned.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() + LOCK_POLL < self.deadline => {
                    std::thread::sleep(LOCK_POLL)
                }
                Err(TryLockError::WouldBlock) => {
                    return vec![
                        "not checked against the cluster: the controller was busy for the whole review time".to_owned(),
                    ];
                }
            }
        };
        let left = self.deadline.saturating_duration_since(Instant::now());
        state.fleet_warnings(claim, left)
    }
}

struct Reviewer {
    driver: String,
    gates: gpu_dra_driver::feature_gates::FeatureGates,
    cel: dra_cel::SelectorEnv,
    state: Arc<Mutex<ClusterState>>,
    metrics: Arc<Metrics>,
}

/// Where the webhook listens and with which certificate.
pub struct WebhookConfig {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The TLS handshake, with the certificate of the moment.
#[derive(Clone)]
struct Tls(tokio_rustls::TlsAcceptor);

impl Handshake for Tls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    async fn handshake(&self, tcp: TcpStream) -> std::io::Result<Self::Io> {
        self.0.accept(tcp).await
    }
}

/// Binds the port and serves until the process ends.
pub async fn serve(
    config: WebhookConfig,
    driver: &str,
    gates: gpu_dra_driver::feature_gates::FeatureGates,
    server_minor: u32,
    state: Arc<Mutex<ClusterState>>,
    metrics: Arc<Metrics>,
) -> anyhow::Result<()> {
    let resolver = Arc::new(tls::ReloadingCert::new(config.cert, config.key)?);
    let mut tls_config = rustls::ServerConfig::builder().with_no_client_auth().with_cert_resolver(resolver);
    tls_config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = Tls(tokio_rustls::TlsAcceptor::from(Arc::new(tls_config)));
    let listener =
        TcpListener::bind(config.addr).await.with_context(|| format!("binding the webhook port {}", config.addr))?;
    let reviewer = Arc::new(Reviewer {
        driver: driver.to_owned(),
        gates,
        cel: selector_env(server_minor, &gates),
        state,
        metrics,
    });
    let app = Router::new().route("/validate", post(validate)).with_state(reviewer);
    tracing::info!(addr = %config.addr, "serving the validating webhook at /validate");
    // The connection layer's own bound is a backstop: `validate` answers
    // within REVIEW_TIMEOUT.
    let limits =
        Limits { idle: IDLE_TIMEOUT, request: REVIEW_TIMEOUT + connections::GRACE, max_connections: MAX_CONNECTIONS };
    connections::serve("webhook", listener, acceptor, app, limits, std::future::pending()).await;
    Ok(())
}

async fn validate(
    State(reviewer): State<Arc<Reviewer>>,
    Extension(connection): Extension<Connection>,
    request: Request<Body>,
) -> Response {
    let started = Instant::now();
    let deadline = started + REVIEW_TIMEOUT;
    let body = axum::body::to_bytes(request.into_body(), MAX_BODY_BYTES);
    let body = match tokio::time::timeout(REVIEW_TIMEOUT - ANSWER_MARGIN, body).await {
        Ok(Ok(body)) => body,
        Ok(Err(_)) => {
            reviewer.metrics.error("webhook_body");
            connection.close_after_response();
            let message = format!("the request body is larger than {MAX_BODY_BYTES} bytes");
            return json_response(StatusCode::PAYLOAD_TOO_LARGE, review::error_review("", &message));
        }
        Err(_) => {
            reviewer.metrics.error("webhook_body");
            connection.close_after_response();
            let message = format!("the request body did not arrive within {:?}", REVIEW_TIMEOUT - ANSWER_MARGIN);
            return json_response(StatusCode::REQUEST_TIMEOUT, review::error_review("", &message));
        }
    };
    let uid = review::request_uid(&body);
    let worker = reviewer.clone();
    let fleet_deadline = deadline - ANSWER_MARGIN;
    let job = tokio::task::spawn_blocking(move || {
        let fleet = SharedFleet { state: worker.state.clone(), deadline: fleet_deadline };
        review(&body, &worker.driver, &worker.gates, &worker.cel, &fleet)
    });
    match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), job).await {
        Ok(Ok((response, allowed))) => {
            if !allowed {
                reviewer.metrics.error("webhook_denied");
            }
            json_response(StatusCode::OK, response)
        }
        Ok(Err(_)) | Err(_) => {
            reviewer.metrics.error("webhook_timeout");
            let warning = format!(
                "not checked: the review did not finish within {REVIEW_TIMEOUT:?}; admitted (the webhook only advises on what it cannot check)"
            );
            json_response(StatusCode::OK, review::admitted_with_warning(&uid, &warning))
        }
    }
}

fn json_response(status: StatusCode, body: serde_json::Value) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}
