//! A fault-injecting HTTP proxy between a binary and the API server
//! stand-in: the binary's kubeconfig points here, and each request is
//! forwarded unless a [`Rule`] set at run time matches it. Each fault is one
//! a real cluster produces:
//!
//! - [`Fault::Status`] 503: what a load balancer or `kubectl proxy` in front
//!   of an unavailable apiserver answers, an HTML page (ingress-nginx's and
//!   HAProxy's default 503 pages), not a Kubernetes `Status`.
//! - [`Fault::Status`] 429: the apiserver's API Priority and Fairness
//!   rejection, a `Status` with reason `TooManyRequests` and a
//!   `Retry-After: 1` header (`apf_filter.go`, `tooManyRequests`).
//! - [`Fault::TruncateThenStall`] / [`Fault::TruncateThenClose`]: a response
//!   whose body stops short of its Content-Length, the connection then held
//!   open or closed: an apiserver or proxy that dies or hangs mid-answer.
//! - [`Fault::Stall`]: a request never answered (a partitioned network, an
//!   apiserver stuck on etcd).
//! - [`Fault::Reset`]: the connection closed with no answer (an apiserver
//!   restarting, a load balancer dropping the backend).
//! - [`Fault::WatchGarbage`]: a watch stream with a line that is not a
//!   watch event, as a broken intermediary that mangles a chunk sends.
//!
//! It counts the connections it accepted (total, open, most open at once):
//! each is one connection of the binary to the API server.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body, Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

type ProxyBody = BoxBody<Bytes, std::io::Error>;

/// What to do with a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status without forwarding: 503 with an HTML page,
    /// 429 with a `Status` and `Retry-After`, any other with a `Status`.
    Status(u16),
    /// Answer with a `Status` of this code and message, not forwarded: a
    /// server's own words (a 403's names the user, the verb, the resource).
    StatusMessage(u16, &'static str),
    /// Forward, then send the headers (with the full Content-Length) and
    /// half of the body, and keep the connection open without sending more.
    TruncateThenStall,
    /// Forward, send half of the body, then close the connection.
    TruncateThenClose,
    /// Never answer; the request is not forwarded.
    Stall,
    /// Close the connection without answering; not forwarded.
    Reset,
    /// On a watch: forward, with a line that is not JSON after each chunk.
    WatchGarbage,
}

/// Which requests a fault applies to; every set field must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule {
    /// `GET`, `PUT`, ...; `None` matches any.
    pub method: Option<String>,
    /// A substring of the path; empty matches any.
    pub path_contains: String,
    /// A substring of the `User-Agent` (which binary, which replica).
    pub user_agent_contains: String,
    /// Only watches (`Some(true)`), only other requests (`Some(false)`).
    pub watch: Option<bool>,
}

impl Rule {
    /// Every request.
    pub fn any() -> Self {
        Self::default()
    }

    pub fn path(method: &str, path_contains: &str) -> Self {
        Self { method: Some(method.to_uppercase()), path_contains: path_contains.into(), ..Self::default() }
    }

    pub fn agent(mut self, user_agent_contains: &str) -> Self {
        self.user_agent_contains = user_agent_contains.into();
        self
    }

    pub fn watches(mut self, watch: bool) -> Self {
        self.watch = Some(watch);
        self
    }

    fn matches(&self, request: &Request<Incoming>) -> bool {
        let agent = request.headers().get(hyper::header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or("");
        let watch = request.uri().query().is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
        self.method.as_deref().is_none_or(|m| m == request.method().as_str())
            && request.uri().path().contains(&self.path_contains)
            && agent.contains(&self.user_agent_contains)
            && self.watch.is_none_or(|w| w == watch)
    }
}

/// Connection counts, as the proxy saw them.
#[derive(Debug, Default)]
pub struct Connections {
    accepted: AtomicUsize,
    open: AtomicUsize,
    most_open: AtomicUsize,
}

impl Connections {
    /// Connections accepted since the start (or the last reset).
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// The most open at one time since the start (or the last reset).
    pub fn most_open(&self) -> usize {
        self.most_open.load(Ordering::SeqCst)
    }

    /// Starts counting afresh (the open ones stay counted as open).
    pub fn reset(&self) {
        self.accepted.store(0, Ordering::SeqCst);
        self.most_open.store(self.open(), Ordering::SeqCst);
    }

    fn opened(&self) {
        self.accepted.fetch_add(1, Ordering::SeqCst);
        let now = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(now, Ordering::SeqCst);
    }

    fn closed(&self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

struct Shared {
    upstream: SocketAddr,
    rules: Mutex<Vec<(Rule, Fault)>>,
    connections: Connections,
}

impl Shared {
    fn fault_for(&self, request: &Request<Incoming>) -> Option<Fault> {
        let rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        rules.iter().find(|(rule, _)| rule.matches(request)).map(|(_, fault)| *fault)
    }
}

/// A running proxy; stops accepting when dropped.
pub struct FaultProxy {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:0` and forwards to `upstream`, on the current
    /// tokio runtime.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared { upstream, rules: Mutex::new(Vec::new()), connections: Connections::default() });
        let (stop, mut stopped) = oneshot::channel();
        let accepting = shared.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = &mut stopped => return,
                };
                let Ok((stream, _)) = accepted else { continue };
                let shared = accepting.clone();
                shared.connections.opened();
                tokio::spawn(async move {
                    let for_requests = shared.clone();
                    let service = hyper::service::service_fn(move |request| handle(for_requests.clone(), request));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                    shared.connections.closed();
                });
            }
        });
        Ok(Self { shared, addr, _stop: stop })
    }

    /// `http://127.0.0.1:PORT`, for a kubeconfig.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes a kubeconfig whose server is this proxy.
    pub fn write_kubeconfig(&self, path: &std::path::Path) -> std::io::Result<()> {
        std::fs::write(path, crate::apiserver::kubeconfig_yaml(&self.url()))
    }

    /// Adds a rule; the first matching rule decides a request.
    pub fn inject(&self, rule: Rule, fault: Fault) {
        self.shared.rules.lock().unwrap_or_else(|p| p.into_inner()).push((rule, fault));
    }

    /// Removes every rule: requests are forwarded again.
    pub fn clear(&self) {
        self.shared.rules.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    pub fn connections(&self) -> &Connections {
        &self.shared.connections
    }
}

/// Why a connection is closed on purpose ([`Fault::Reset`] and the like).
#[derive(Debug, thiserror::Error)]
#[error("fault proxy: {0}")]
struct Closed(&'static str);

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<ProxyBody>, Closed> {
    let fault = shared.fault_for(&request);
    match fault {
        Some(Fault::Status(code)) => return Ok(status_answer(code)),
        Some(Fault::StatusMessage(code, message)) => return Ok(status_with_message(code, message)),
        Some(Fault::Stall) => return std::future::pending().await,
        Some(Fault::Reset) => return Err(Closed("reset")),
        _ => {}
    }
    let response = match forward(shared.upstream, request).await {
        Ok(response) => response,
        Err(_) => return Ok(status_answer(502)),
    };
    match fault {
        Some(fault @ (Fault::TruncateThenStall | Fault::TruncateThenClose)) => {
            let (parts, body) = response.into_parts();
            let Ok(collected) = body.collect().await else { return Err(Closed("upstream body failed")) };
            let bytes = collected.to_bytes();
            let mut parts = parts;
            parts.headers.remove(hyper::header::TRANSFER_ENCODING);
            parts.headers.insert(hyper::header::CONTENT_LENGTH, bytes.len().into());
            let half = bytes.slice(..bytes.len() / 2);
            let body = Truncated { first: Some(half), close: fault == Fault::TruncateThenClose, full: bytes.len() };
            Ok(Response::from_parts(parts, BoxBody::new(body)))
        }
        Some(Fault::WatchGarbage) => {
            let (parts, body) = response.into_parts();
            Ok(Response::from_parts(parts, BoxBody::new(Garbled { inner: body, pending_garbage: false })))
        }
        _ => Ok(response.map(|b| b.map_err(std::io::Error::other).boxed())),
    }
}

async fn forward(upstream: SocketAddr, request: Request<Incoming>) -> Result<Response<Incoming>, std::io::Error> {
    let stream = TcpStream::connect(upstream).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender.send_request(request).await.map_err(std::io::Error::other)
}

/// A 503 HTML page like an ingress controller's, a 429 `Status` with
/// `Retry-After` like API Priority and Fairness', or a `Status`.
fn status_answer(code: u16) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let reason = status.canonical_reason().unwrap_or("Error");
    let builder = Response::builder().status(status);
    let (builder, body) = if code == 503 {
        let page = format!(
            "<html>\r\n<head><title>503 Service Temporarily Unavailable</title></head>\r\n<body>\r\n\
             <center><h1>503 Service Temporarily Unavailable</h1></center>\r\n<hr><center>nginx</center>\r\n\
             {}</body>\r\n</html>\r\n",
            "<!-- a padding to make the page a few KiB, as real error pages are -->\r\n".repeat(40)
        );
        (builder.header(hyper::header::CONTENT_TYPE, "text/html"), page)
    } else {
        let reason_word = if code == 429 { "TooManyRequests" } else { "InternalError" };
        let message = if code == 429 { "too many requests, please try again later" } else { reason };
        let body = serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason_word, "code": code,
        });
        let builder = builder.header(hyper::header::CONTENT_TYPE, "application/json");
        let builder = if code == 429 { builder.header(hyper::header::RETRY_AFTER, "1") } else { builder };
        (builder, body.to_string())
    };
    let body = Full::new(Bytes::from(body)).map_err(|never: Infallible| match never {}).boxed();
    builder.body(body).unwrap_or_else(|_| Response::new(BoxBody::default()))
}

/// A `Status` of `code` with `message`, as the apiserver writes one.
fn status_with_message(code: u16, message: &str) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    let body = Full::new(Bytes::from(body.to_string())).map_err(|never: Infallible| match never {}).boxed();
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(body)
        .unwrap_or_else(|_| Response::new(BoxBody::default()))
}

/// Half a body, then nothing (held open) or an error (hyper closes the
/// connection, short of the Content-Length it sent).
struct Truncated {
    first: Option<Bytes>,
    close: bool,
    full: usize,
}

impl Body for Truncated {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if let Some(first) = self.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        if self.close {
            let full = self.full;
            return Poll::Ready(Some(Err(std::io::Error::other(format!("cut short of {full} bytes")))));
        }
        // Never woken: the connection stays open with the body unfinished.
        Poll::Pending
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        hyper::body::SizeHint::with_exact(self.full as u64)
    }
}

/// The upstream watch stream with a line that is not JSON after each chunk.
struct Garbled {
    inner: Incoming,
    pending_garbage: bool,
}

impl Body for Garbled {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.pending_garbage {
            self.pending_garbage = false;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"<<this is not a watch event>>\n")))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                self.pending_garbage = frame.is_data();
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(std::io::Error::other(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
