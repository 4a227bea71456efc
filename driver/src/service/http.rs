//! A service's HTTP port: `/metrics` (Prometheus text), `/healthz` (the
//! process serves HTTP) and `/readyz` (every readiness check passes; the
//! body names the ones that do not).

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;

use super::connections::{self, Limits, Plain};

/// A service's metrics, as OpenMetrics text.
pub trait MetricsText: Send + Sync {
    fn encode(&self) -> Result<String, std::fmt::Error>;
}

/// One named readiness condition, e.g. "registered".
pub struct ReadyCheck {
    pub name: &'static str,
    pub check: Box<dyn Fn() -> bool + Send + Sync>,
}

impl ReadyCheck {
    pub fn new(name: &'static str, check: impl Fn() -> bool + Send + Sync + 'static) -> Self {
        Self { name, check: Box::new(check) }
    }
}

/// What the HTTP handlers read.
pub struct HttpState {
    pub metrics: Arc<dyn MetricsText>,
    pub ready: Vec<ReadyCheck>,
}

impl HttpState {
    /// Names of the checks that fail now.
    pub fn not_ready(&self) -> Vec<&'static str> {
        self.ready.iter().filter(|c| !(c.check)()).map(|c| c.name).collect()
    }
}

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Serves until `shutdown` resolves, with the port's connection bounds
/// ([`Limits::PORT`]: idle 10 s, a request 5 s, 256 connections).
pub async fn serve(
    listener: TcpListener,
    state: Arc<HttpState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    connections::serve("metrics", listener, Plain, router(state), Limits::PORT, shutdown).await;
    Ok(())
}

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    match state.metrics.encode() {
        Ok(text) => ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], text)
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n")).into_response(),
    }
}

async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    let failing = state.not_ready();
    if failing.is_empty() {
        (StatusCode::OK, "ok\n".to_owned()).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", failing.join(", "))).into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    use super::*;

    struct Stub;

    impl MetricsText for Stub {
        fn encode(&self) -> Result<String, std::fmt::Error> {
            Ok("# TYPE gpu_dra_published_devices gauge\n".to_owned())
        }
    }

    async fn get(router: &Router, path: &str) -> (StatusCode, String) {
        let response = router.clone().oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn readyz_names_what_is_missing() {
        let registered = Arc::new(AtomicBool::new(false));
        let flag = registered.clone();
        let state = Arc::new(HttpState {
            metrics: Arc::new(Stub),
            ready: vec![
                ReadyCheck::new("registered", move || flag.load(Ordering::Relaxed)),
                ReadyCheck::new("serving", || true),
            ],
        });
        let app = router(state);
        assert_eq!(get(&app, "/healthz").await, (StatusCode::OK, "ok\n".into()));
        assert_eq!(get(&app, "/readyz").await, (StatusCode::SERVICE_UNAVAILABLE, "not ready: registered\n".into()));
        registered.store(true, Ordering::Relaxed);
        assert_eq!(get(&app, "/readyz").await, (StatusCode::OK, "ok\n".into()));
        let (status, body) = get(&app, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("# TYPE gpu_dra_published_devices gauge"), "{body}");
    }
}
