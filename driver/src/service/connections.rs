//! Serving HTTP (1.1 and 2) with every phase of a connection bounded, so
//! that no client can hold a connection, an fd or a task longer than the
//! bounds say, and a server at its fd limit waits instead of spinning:
//!
//! - a connection with no request in flight (TLS handshake, headers not yet
//!   complete, an idle keep-alive) is closed after [`Limits::idle`];
//! - a request (its body included) gets [`Limits::request`], then a 503,
//!   and its connection is closed once the answer is out; a handler may ask
//!   for that too ([`Connection::close_after_response`]);
//! - at most [`Limits::max_connections`] at a time: one more makes the
//!   longest-idle connection close (or, when none has been idle for
//!   [`MIN_IDLE_TO_EVICT`], is refused);
//! - `accept` failing (`EMFILE` at the fd limit, ...) backs off up to 1 s
//!   and is logged once per episode, not once per attempt.
//!
//! Closing is graceful first (the answer in flight is delivered; HTTP/2
//! gets a GOAWAY), then hard after [`GRACE`].

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::Instant;
use tower::ServiceExt as _;

/// How long a connection being closed may take to deliver what is in
/// flight before it is dropped.
pub const GRACE: Duration = Duration::from_secs(1);
/// The longest pause between two `accept`s while they fail.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a connection must have been idle to be closed for room: a
/// new one is still in its TLS handshake, and may be the apiserver's.
const MIN_IDLE_TO_EVICT: Duration = Duration::from_secs(1);
/// HTTP/2 streams at once on one connection.
const MAX_STREAMS: u32 = 32;

/// The bounds of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// A connection with no request in flight.
    pub idle: Duration,
    /// A request, from its headers to its answer.
    pub request: Duration,
    pub max_connections: usize,
}

impl Limits {
    /// The bounds of a metrics/health port: its scrapes are small.
    pub const PORT: Limits =
        Limits { idle: Duration::from_secs(10), request: Duration::from_secs(5), max_connections: 256 };
}

/// Turns an accepted TCP stream into the stream HTTP is read from (TLS, or
/// nothing for plain HTTP). It runs under [`Limits::idle`].
pub trait Handshake: Clone + Send + Sync + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

/// Plain HTTP.
#[derive(Debug, Clone, Copy)]
pub struct Plain;

impl Handshake for Plain {
    type Io = TcpStream;
    async fn handshake(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

/// A handler's hold on its connection, in the request's extensions.
#[derive(Debug, Clone)]
pub struct Connection(Arc<Activity>);

impl Connection {
    /// Closes the connection once the answer is out (e.g. its request body
    /// never arrived: the connection cannot serve another request).
    pub fn close_after_response(&self) {
        self.0.update(|s| s.closing = true);
    }
}

/// What a connection is doing, for its watchdog and for eviction.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    changed: Notify,
    /// Asked to close at once (evicted).
    evict: Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    in_flight: usize,
    /// When `in_flight` last changed (or the connection was accepted).
    since: Instant,
    closing: bool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            state: Mutex::new(ActivityState { in_flight: 0, since: Instant::now(), closing: false }),
            changed: Notify::new(),
            evict: Notify::new(),
        }
    }

    fn get(&self) -> ActivityState {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, change: impl FnOnce(&mut ActivityState)) {
        change(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner));
        self.changed.notify_one();
    }

    fn begin(&self) {
        self.update(|s| {
            s.in_flight += 1;
            s.since = Instant::now();
        });
    }

    fn end(&self) {
        self.update(|s| {
            s.in_flight = s.in_flight.saturating_sub(1);
            s.since = Instant::now();
        });
    }

    /// Resolves when the connection should close.
    async fn expired(&self, limits: Limits) {
        loop {
            let notified = self.changed.notified();
            let state = self.get();
            let deadline = match (state.in_flight, state.closing) {
                (0, true) => return,
                (0, false) => state.since + limits.idle,
                // Requests time themselves out; this is a backstop.
                (_, _) => state.since + limits.request + GRACE,
            };
            if Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// The open connections, for the count and for eviction.
#[derive(Default)]
struct Registry {
    next: AtomicU64,
    open: Mutex<HashMap<u64, Arc<Activity>>>,
}

impl Registry {
    /// Registers a new connection, making room when at `max`; `None` when
    /// every open connection has a request in flight.
    fn admit(self: &Arc<Self>, max: usize) -> Option<Registered> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.len() >= max && !evict_longest_idle(&open) {
            return None;
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let activity = Arc::new(Activity::new());
        open.insert(id, activity.clone());
        Some(Registered { registry: self.clone(), id, activity })
    }

    fn evict_one(&self) -> bool {
        evict_longest_idle(&self.open.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// Asks the connection idle longest (at least [`MIN_IDLE_TO_EVICT`]) to
/// close; false when none is.
fn evict_longest_idle(open: &HashMap<u64, Arc<Activity>>) -> bool {
    let idle = open
        .values()
        .map(|a| (a.get(), a))
        .filter(|(s, _)| s.in_flight == 0 && !s.closing && s.since.elapsed() >= MIN_IDLE_TO_EVICT)
        .min_by_key(|(s, _)| s.since);
    match idle {
        Some((_, activity)) => {
            activity.update(|s| s.closing = true);
            activity.evict.notify_one();
            true
        }
        None => false,
    }
}

/// A connection's place in the registry, given up when it ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
    activity: Arc<Activity>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.open.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// Serves `app` on `listener` until `shutdown` resolves. `name` says which
/// server a log line is about.
pub async fn serve<H: Handshake>(
    name: &'static str,
    listener: TcpListener,
    handshake: H,
    app: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let registry = Arc::new(Registry::default());
    let mut failing = Backoff::default();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = &mut shutdown => return,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // At the fd limit, an idle connection's fd is better spent
                // on a new one (the apiserver's review may be waiting).
                if is_fd_limit(&error) {
                    registry.evict_one();
                }
                let pause = failing.failed(name, &error);
                tokio::time::sleep(pause).await;
                continue;
            }
        };
        failing.succeeded();
        let Some(registered) = registry.admit(limits.max_connections) else {
            tracing::debug!(server = name, %peer, "refusing a connection: every connection is busy");
            continue;
        };
        tokio::spawn(serve_connection(name, tcp, peer, handshake.clone(), app.clone(), limits, registered));
    }
}

fn is_fd_limit(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(EMFILE | ENFILE))
}

/// Linux's "too many open files" (per process, and system-wide).
const EMFILE: i32 = 24;
const ENFILE: i32 = 23;

/// Accept failures: how long to pause, and when they were last logged.
#[derive(Debug, Default)]
struct Backoff {
    /// Failures in a row.
    failures: u32,
    /// Failures not logged since the last line.
    unlogged: u64,
    logged: Option<Instant>,
}

/// At most one line about failing accepts per this long: at the fd limit,
/// evicting an idle connection lets the next accept work, so failures and
/// successes alternate.
const LOG_EVERY: Duration = Duration::from_secs(60);

impl Backoff {
    fn failed(&mut self, name: &str, error: &io::Error) -> Duration {
        self.unlogged += 1;
        if self.logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            tracing::warn!(
                server = name,
                %error,
                failures = self.unlogged,
                "accepting connections fails; pausing up to 1s between tries (at the open-file limit the longest idle connection is closed to make room); logged at most once a minute"
            );
            self.logged = Some(Instant::now());
            self.unlogged = 0;
        }
        self.failures = self.failures.saturating_add(1);
        backoff(self.failures)
    }

    fn succeeded(&mut self) {
        self.failures = 0;
    }
}

/// 10 ms, doubling, at most [`MAX_BACKOFF`].
fn backoff(failures: u32) -> Duration {
    Duration::from_millis(10u64.saturating_mul(1 << failures.clamp(1, 8).saturating_sub(1))).min(MAX_BACKOFF)
}

async fn serve_connection<H: Handshake>(
    name: &'static str,
    tcp: TcpStream,
    peer: SocketAddr,
    handshake: H,
    app: Router,
    limits: Limits,
    registered: Registered,
) {
    let activity = registered.activity.clone();
    let io = tokio::select! {
        io = handshake.handshake(tcp) => match io {
            Ok(io) => io,
            Err(error) => {
                tracing::debug!(server = name, %peer, %error, "handshake failed");
                return;
            }
        },
        _ = activity.expired(limits) => {
            tracing::debug!(server = name, %peer, "handshake timed out");
            return;
        }
        _ = activity.evict.notified() => return,
    };
    let service = hyper::service::service_fn({
        let activity = activity.clone();
        move |request: Request<Incoming>| handle(app.clone(), activity.clone(), limits, request)
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.idle);
    builder.http2().timer(TokioTimer::new()).max_concurrent_streams(MAX_STREAMS);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let closed_by_us = tokio::select! {
        result = connection.as_mut() => {
            if let Err(error) = result {
                tracing::debug!(server = name, %peer, %error, "connection ended");
            }
            false
        }
        _ = activity.expired(limits) => true,
        _ = activity.evict.notified() => true,
    };
    if closed_by_us {
        connection.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(GRACE, connection).await;
    }
    drop(registered);
}

/// One request, under [`Limits::request`].
async fn handle(
    app: Router,
    activity: Arc<Activity>,
    limits: Limits,
    mut request: Request<Incoming>,
) -> Result<Response<Body>, std::convert::Infallible> {
    activity.begin();
    request.extensions_mut().insert(Connection(activity.clone()));
    let answer = tokio::time::timeout(limits.request, app.oneshot(request.map(Body::new))).await;
    let response = match answer {
        Ok(Ok(response)) => response,
        Ok(Err(infallible)) => match infallible {},
        Err(_) => {
            activity.update(|s| s.closing = true);
            let mut response =
                Response::new(Body::from(format!("the request did not complete within {:?}\n", limits.request)));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        }
    };
    activity.end();
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_a_second() {
        let pauses: Vec<u64> = (1..=9).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(pauses, vec![10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_makes_room_and_a_busy_one_does_not() {
        let registry = Arc::new(Registry::default());
        let first = registry.admit(2).unwrap();
        tokio::time::advance(Duration::from_millis(10)).await;
        let second = registry.admit(2).unwrap();
        second.activity.begin();
        // At the limit: the first one is idle, but too new to be closed.
        assert!(registry.admit(2).is_none());
        tokio::time::advance(MIN_IDLE_TO_EVICT).await;
        let third = registry.admit(2).unwrap();
        assert!(first.activity.get().closing && !second.activity.get().closing);
        drop(first);
        third.activity.begin();
        assert!(registry.admit(2).is_none(), "both open connections are busy");
        third.activity.end();
        tokio::time::advance(MIN_IDLE_TO_EVICT).await;
        assert!(registry.admit(2).is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_follows_the_phases() {
        let limits = Limits { idle: Duration::from_secs(10), request: Duration::from_secs(5), max_connections: 1 };
        let activity = Arc::new(Activity::new());
        let start = Instant::now();
        activity.expired(limits).await;
        assert_eq!(start.elapsed(), limits.idle);
        // A request in flight holds it open until the request's bound.
        activity.begin();
        let start = Instant::now();
        let watch = activity.clone();
        let waiter = tokio::spawn(async move { watch.expired(limits).await });
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(!waiter.is_finished());
        activity.end();
        Connection(activity.clone()).close_after_response();
        waiter.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }
}
