//! A plain-HTTP front for the real API server, for one binary: it forwards
//! every request with that binary's credentials (a `kube::Client` made
//! with its token; watches stream through) and, once, runs a test's action
//! just before forwarding a chosen request. The action changes the object
//! the request writes, so the real API server answers that request 409
//! Conflict: a real conflict at a chosen moment, which a test cannot time
//! from outside.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use kube::client::Body;
use tokio::net::TcpListener;

type Action = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// The request to act before (its method and a suffix of its path), the
/// action, and the answers the API server gave to the matching requests.
pub struct Trap {
    method: String,
    path_suffix: String,
    action: Action,
    fired: AtomicBool,
    answers: Mutex<Vec<u16>>,
}

impl Trap {
    pub fn new<F, Fut>(method: &str, path_suffix: &str, action: F) -> Arc<Self>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        Arc::new(Self {
            method: method.to_string(),
            path_suffix: path_suffix.to_string(),
            action: Box::new(move || Box::pin(action())),
            fired: AtomicBool::new(false),
            answers: Mutex::new(Vec::new()),
        })
    }

    /// The status codes the API server answered the matching requests
    /// with, in order (the first is the one the action ran before).
    pub fn answers(&self) -> Vec<u16> {
        self.answers.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn matches<B>(&self, request: &Request<B>) -> bool {
        request.method().as_str() == self.method && request.uri().path().ends_with(&self.path_suffix)
    }
}

/// A running front; stops when dropped.
pub struct Intercept {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Intercept {
    /// Serves on a loopback port, forwarding through `upstream`.
    pub async fn start(upstream: kube::Client, trap: Arc<Trap>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (upstream, trap) = (upstream.clone(), trap.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let (upstream, trap) = (upstream.clone(), trap.clone());
                        async move { Ok::<_, Infallible>(forward(&upstream, &trap, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// A kubeconfig pointing here, without credentials (the front adds them).
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: front\n  cluster:\n    server: http://{}\nusers:\n- name: \
             user\n  user: {{}}\ncontexts:\n- name: front\n  context:\n    cluster: front\n    user: user\n\
             current-context: front\n",
            self.addr
        );
        std::fs::write(path, yaml)
    }
}

impl Drop for Intercept {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(upstream: &kube::Client, trap: &Trap, request: Request<Incoming>) -> Response<Body> {
    let trapped = trap.matches(&request);
    let (mut parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return answer(StatusCode::BAD_REQUEST, format!("reading the request: {e}")),
    };
    parts.headers.remove(http::header::HOST);
    parts.headers.remove(http::header::AUTHORIZATION);
    if trapped && !trap.fired.swap(true, Ordering::SeqCst) {
        (trap.action)().await;
    }
    match upstream.send(Request::from_parts(parts, Body::from(body))).await {
        Ok(response) => {
            if trapped {
                trap.answers.lock().unwrap_or_else(|e| e.into_inner()).push(response.status().as_u16());
            }
            response
        }
        Err(e) => answer(StatusCode::BAD_GATEWAY, format!("forwarding: {e}")),
    }
}

fn answer(status: StatusCode, message: String) -> Response<Body> {
    let mut response = Response::new(Body::from(message.into_bytes()));
    *response.status_mut() = status;
    response
}
