//! The webhook's and the metrics ports' connections under hostile clients:
//! every phase is bounded (docs/binaries.md: a connection that sends nothing is
//! closed after 10 s, a request's body and review take at most 5 s), fds
//! come back, a valid review is answered while 1,000 hostile connections
//! are open, the accept loop backs off at the fd limit, a bad certificate
//! rotation keeps the old one, and a claim no node can hold is answered at
//! once at 1,000 nodes.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::https_client::{self, TlsStream};
use integration_tests::plugin_process::{PluginDirs, PluginOptions, PluginProcess};
use integration_tests::wait;
use integration_tests::webhook_process::{WebhookOptions, WebhookProcess, one_gpu_requests, replace, review};
use serde_json::{Value, json};

/// The idle bound (10 s), plus the grace to close (1 s), plus slack for a
/// loaded machine.
const IDLE_BOUND: Duration = Duration::from_millis(12_500);
/// The review bound (5 s) plus slack.
const REVIEW_BOUND: Duration = Duration::from_millis(6_500);

fn raise_fd_limit(wanted: u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let soft = wanted.min(hard);
    if limit.current.is_some_and(|c| c >= soft) {
        return;
    }
    setrlimit(Resource::Nofile, Rlimit { current: Some(soft), maximum: limit.maximum }).expect("raising RLIMIT_NOFILE");
}

fn valid_claim() -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": "ok", "namespace": "default"},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
}

/// Posts a valid review; its answer and how long it took.
fn valid_review(webhook: &WebhookProcess, config: &Arc<rustls::ClientConfig>) -> (Value, Duration) {
    let start = Instant::now();
    let (status, body) = https_client::post(webhook.port, config, "/validate", &review("uid-ok", valid_claim()))
        .unwrap_or_else(|e| panic!("the valid review failed: {e}\n{}", webhook.log()));
    let took = start.elapsed();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["response"]["uid"], "uid-ok", "{body}");
    assert_eq!(body["response"]["allowed"], true, "{body}");
    (body, took)
}

/// Waits until the controller's open fds are back to `baseline` (a watch
/// reconnecting may add one or two).
fn wait_for_fds(webhook: &WebhookProcess, baseline: usize, within: Duration) {
    let open = || format!("{} fds open, {baseline} before, after {within:?}", webhook.fds());
    wait::wait_until("the webhook's fds to close", within, || webhook.fds() <= baseline + 2, open);
}

/// One hostile behaviour: set-up on a fresh connection, then what it keeps
/// doing until the server closes it.
struct Hostile {
    name: &'static str,
    alpn: &'static [u8],
    bound: Duration,
    start: fn(&mut TlsStream),
    poke: fn(&mut TlsStream) -> std::io::Result<()>,
    every: Duration,
}

fn nothing(_: &mut TlsStream) -> std::io::Result<()> {
    Ok(())
}

fn write(stream: &mut TlsStream, bytes: &[u8]) {
    stream.write_all(bytes).unwrap();
    stream.flush().unwrap();
}

const HEAD_1000: &[u8] =
    b"POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n";

/// HTTP/2: the preface, empty SETTINGS, then HEADERS (END_HEADERS, no
/// END_STREAM: a body is promised) for streams 1, 3 and 5 of a POST to
/// /validate, HPACK-encoded with static-table names.
fn h2_streams(stream: &mut TlsStream) {
    let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    bytes.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let mut block = vec![0x83, 0x87, 0x44, 9];
    block.extend_from_slice(b"/validate");
    block.extend_from_slice(&[0x41, 9]);
    block.extend_from_slice(b"localhost");
    for id in [1u8, 3, 5] {
        let len = block.len() as u8;
        bytes.extend_from_slice(&[0, 0, len, 1, 0x4, 0, 0, 0, id]);
        bytes.extend_from_slice(&block);
    }
    write(stream, &bytes);
}

fn hostile_kinds() -> Vec<Hostile> {
    vec![
        Hostile {
            name: "idle after the handshake",
            alpn: b"http/1.1",
            bound: IDLE_BOUND,
            start: |_| {},
            poke: nothing,
            every: Duration::from_millis(200),
        },
        Hostile {
            name: "headers never finished",
            alpn: b"http/1.1",
            bound: IDLE_BOUND,
            start: |s| write(s, b"POST /validate HTTP/1.1\r\nHost: localhost\r\n"),
            poke: nothing,
            every: Duration::from_millis(200),
        },
        Hostile {
            name: "idle keep-alive after an answer",
            alpn: b"http/1.1",
            bound: IDLE_BOUND,
            start: |s| {
                let body = review("uid-keepalive", valid_claim());
                let head =
                    format!("POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n", body.len());
                write(s, head.as_bytes());
                write(s, &body);
                let (status, _) = https_client::read_response(s).unwrap();
                assert_eq!(status, 200);
            },
            poke: nothing,
            every: Duration::from_millis(200),
        },
        Hostile {
            name: "Content-Length with no body",
            alpn: b"http/1.1",
            bound: REVIEW_BOUND,
            start: |s| write(s, HEAD_1000),
            poke: nothing,
            every: Duration::from_millis(200),
        },
        Hostile {
            name: "a body dribbled a byte a second",
            alpn: b"http/1.1",
            bound: REVIEW_BOUND,
            start: |s| write(s, HEAD_1000),
            poke: |s| s.write_all(b" "),
            every: Duration::from_secs(1),
        },
        Hostile {
            name: "an unending chunked body",
            alpn: b"http/1.1",
            bound: REVIEW_BOUND,
            start: |s| {
                write(s, b"POST /validate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n");
            },
            poke: |s| s.write_all(b"1\r\n \r\n"),
            every: Duration::from_millis(100),
        },
        Hostile {
            name: "HTTP/2 streams promising a body",
            alpn: b"h2",
            bound: REVIEW_BOUND,
            start: h2_streams,
            poke: nothing,
            every: Duration::from_millis(200),
        },
    ]
}

#[test]
fn hostile_connections_are_closed_within_their_bounds_and_fds_come_back() {
    raise_fd_limit(4096);
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: 2, gpus_per_node: 8, fd_limit: None });
    let baseline = webhook.fds();
    let mut threads = Vec::new();
    for kind in hostile_kinds() {
        let config = webhook.client(&[kind.alpn]);
        let port = webhook.port;
        threads.push(std::thread::spawn(move || {
            let mut stream = https_client::connect(port, &config).unwrap();
            (kind.start)(&mut stream);
            let since = Instant::now();
            let took = https_client::time_until_closed(&mut stream, since, kind.bound, kind.every, kind.poke);
            (kind.name, kind.bound, took)
        }));
    }
    // A TCP connection that never starts the TLS handshake.
    let port = webhook.port;
    threads.push(std::thread::spawn(move || {
        let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        (&tcp).write_all(b"\x16\x03\x01").unwrap();
        let since = Instant::now();
        let took = tcp_closed_within(&tcp, since, IDLE_BOUND);
        ("TLS handshake never finished", IDLE_BOUND, took)
    }));
    // The metrics port: the same bounds, plain HTTP.
    for (name, head) in [
        ("metrics port: idle", &b""[..]),
        (
            "metrics port: Content-Length with no body",
            b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n",
        ),
        ("metrics port: headers never finished", b"GET /metrics HTTP/1.1\r\n"),
    ] {
        let port = webhook.metrics_port;
        threads.push(std::thread::spawn(move || {
            let tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            (&tcp).write_all(head).unwrap();
            let since = Instant::now();
            (name, IDLE_BOUND, tcp_closed_within(&tcp, since, IDLE_BOUND))
        }));
    }
    // Meanwhile valid reviews are answered at once.
    let config = webhook.client(&[b"http/1.1"]);
    let (_, took) = valid_review(&webhook, &config);
    assert!(took < Duration::from_secs(1), "a valid review took {took:?} next to hostile connections");
    let mut failures = Vec::new();
    for thread in threads {
        let (name, bound, took) = thread.join().unwrap();
        match took {
            Some(took) => println!("{name}: closed after {took:?} (bound {bound:?})"),
            None => failures.push(format!("{name}: still open after {bound:?}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}\n{}", webhook.log());
    wait_for_fds(&webhook, baseline, Duration::from_secs(5));
}

/// Time from `since` until the server closes a plain TCP connection.
fn tcp_closed_within(tcp: &std::net::TcpStream, since: Instant, limit: Duration) -> Option<Duration> {
    use std::io::Read as _;
    tcp.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buffer = [0u8; 4096];
    loop {
        match (&*tcp).read(&mut buffer) {
            Ok(0) => return Some(since.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return Some(since.elapsed()),
        }
        if since.elapsed() > limit {
            return None;
        }
    }
}

#[test]
fn a_valid_review_is_answered_while_1000_hostile_connections_are_open() {
    raise_fd_limit(8192);
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: 2, gpus_per_node: 8, fd_limit: None });
    let baseline = webhook.fds();
    let config = webhook.client(&[b"http/1.1"]);
    // A third each: TLS done and idle, a body promised and never sent, a
    // TLS handshake never finished; opened from ten threads, so that all
    // are open well within the idle bound.
    let port = webhook.port;
    let openers: Vec<_> = (0..10)
        .map(|t| {
            let config = config.clone();
            std::thread::spawn(move || {
                let (mut tls, mut tcp) = (Vec::new(), Vec::new());
                for i in (t..1000).step_by(10) {
                    match i % 3 {
                        0 => tls.push(https_client::connect(port, &config).unwrap()),
                        1 => {
                            let mut stream = https_client::connect(port, &config).unwrap();
                            write(&mut stream, HEAD_1000);
                            tls.push(stream);
                        }
                        _ => {
                            let stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                            (&stream).write_all(b"\x16\x03\x01").unwrap();
                            tcp.push(stream);
                        }
                    }
                }
                (tls, tcp)
            })
        })
        .collect();
    let opened_at = Instant::now();
    let (mut tls, mut tcp) = (Vec::new(), Vec::new());
    for opener in openers {
        let (t, c) = opener.join().unwrap();
        tls.extend(t);
        tcp.extend(c);
    }
    println!("1,000 hostile connections opened in {:?}", opened_at.elapsed());
    let opened = webhook.fds();
    assert!(opened >= baseline + 900, "only {opened} fds open ({baseline} before): connections were refused");
    let (_, took) = valid_review(&webhook, &config);
    println!("valid review answered in {took:?} next to 1,000 hostile connections");
    assert!(took < Duration::from_secs(1), "a valid review took {took:?} next to 1,000 hostile connections");
    // The server closes them all (the clients keep theirs open).
    wait_for_fds(&webhook, baseline, IDLE_BOUND + Duration::from_secs(5));
    drop((tls, tcp));
}

#[test]
fn at_the_fd_limit_the_accept_loop_backs_off_and_logs_once() {
    // Probe what the controller holds when idle, then give it little more.
    let probe = WebhookProcess::start(&WebhookOptions { nodes: 1, gpus_per_node: 8, fd_limit: None });
    let idle_fds = probe.fds() as u64;
    drop(probe);
    let limit = idle_fds + 24;
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: 1, gpus_per_node: 8, fd_limit: Some(limit) });
    let config = webhook.client(&[b"http/1.1"]);
    // Requests in flight (their bodies never come) hold fds that eviction
    // cannot take; open them until the server stops accepting.
    let mut busy = Vec::new();
    let mut pending = Vec::new();
    for _ in 0..limit * 4 {
        let tcp = std::net::TcpStream::connect(("127.0.0.1", webhook.port)).unwrap();
        tcp.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let connection = rustls::ClientConnection::new(config.clone(), name).unwrap();
        let mut stream = rustls::StreamOwned::new(connection, tcp);
        let mut handshake = Ok(());
        while stream.conn.is_handshaking() && handshake.is_ok() {
            handshake = stream.conn.complete_io(&mut stream.sock).map(|_| ());
        }
        if handshake.is_err() {
            // Not accepted: the server is at its limit. Keep it queued.
            pending.push(stream);
            break;
        }
        // At the limit the server may close one that is still idle (its
        // headers not read yet) to make room: it is not busy then.
        if stream.write_all(HEAD_1000).and_then(|()| stream.flush()).is_ok() {
            busy.push(stream);
        }
    }
    assert!(!pending.is_empty(), "the server never reached its fd limit of {limit}");
    for _ in 0..10 {
        pending.push(rustls::StreamOwned::new(
            rustls::ClientConnection::new(
                config.clone(),
                rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            )
            .unwrap(),
            std::net::TcpStream::connect(("127.0.0.1", webhook.port)).unwrap(),
        ));
    }
    // At the limit, with connections waiting: it must not spin.
    let cpu_before = webhook.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let cpu = webhook.cpu_time().saturating_sub(cpu_before);
    assert!(cpu < Duration::from_millis(500), "{cpu:?} of CPU in 2 s at the fd limit: the accept loop spins");
    // The bodies time out, fds come back, and a review gets through.
    drop(pending);
    let (_, took) = valid_review(&webhook, &config);
    assert!(took < REVIEW_BOUND, "{took:?}");
    let log = webhook.log();
    let lines = log.lines().filter(|l| l.contains("accepting connections fails")).count();
    assert_eq!(lines, 1, "logged {lines} times:\n{log}");
    drop(busy);
}

#[test]
fn a_bad_certificate_rotation_keeps_serving_the_old_one() {
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: 1, gpus_per_node: 8, fd_limit: None });
    let dir = webhook.dir.path();
    let old_pem = std::fs::read_to_string(dir.join("tls.crt")).unwrap();
    let old = webhook.client(&[b"http/1.1"]);
    // A certificate rotated before its key.
    let fresh = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::thread::sleep(Duration::from_millis(1100));
    replace(&dir.join("tls.crt"), fresh.cert.pem().as_bytes());
    valid_review(&webhook, &old);
    // A PEM block that is not X.509.
    std::thread::sleep(Duration::from_millis(1100));
    replace(&dir.join("tls.crt"), b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n");
    replace(&dir.join("tls.key"), fresh.signing_key.serialize_pem().as_bytes());
    valid_review(&webhook, &old);
    let log = webhook.log();
    assert!(log.contains("is not the key of the certificate"), "{log}");
    assert!(log.contains("is not a valid X.509 certificate"), "{log}");
    // The pair, complete: served from the next handshake on.
    std::thread::sleep(Duration::from_millis(1100));
    replace(&dir.join("tls.crt"), fresh.cert.pem().as_bytes());
    valid_review(&webhook, &https_client::config(&fresh.cert.pem(), &[b"http/1.1"]));
    // A fresh client (no session to resume) trusting only the old one fails.
    let old = https_client::config(&old_pem, &[b"http/1.1"]);
    assert!(https_client::connect(webhook.port, &old).is_err(), "the old certificate is still served");
}

#[test]
fn a_claim_no_node_can_hold_is_answered_at_once_at_1000_nodes() {
    let webhook = WebhookProcess::start(&WebhookOptions { nodes: 1000, gpus_per_node: 16, fd_limit: None });
    let config = webhook.client(&[b"http/1.1"]);
    for attempt in 0..3 {
        let start = Instant::now();
        let body = review(&format!("uid-17-{attempt}"), one_gpu_requests(&format!("c17-{attempt}"), 17));
        let (status, answer) = https_client::post(webhook.port, &config, "/validate", &body).unwrap();
        let took = start.elapsed();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(status, 200);
        assert_eq!(answer["response"]["uid"], format!("uid-17-{attempt}"), "{answer}");
        assert_eq!(answer["response"]["allowed"], true, "{answer}");
        println!("17 one-GPU requests on 1,000 nodes x 16 GPUs: {took:?} ({answer})");
        assert!(took < Duration::from_secs(2), "{took:?}\n{}", webhook.log());
    }
    // The controller was not held up either: a valid review is immediate.
    let (_, took) = valid_review(&webhook, &config);
    assert!(took < Duration::from_secs(1), "{took:?}");
}

#[test]
fn the_node_agents_metrics_port_closes_hostile_connections() {
    let server = integration_tests::apiserver::ApiServer::start_in_thread().unwrap();
    let dirs = PluginDirs::new("gpus:\n  - model: H100-80GB\n    count: 2\n").unwrap();
    server.write_kubeconfig(&dirs.kubeconfig).unwrap();
    let options = PluginOptions { metrics_addr: "127.0.0.1:0".into(), ..PluginOptions::default() };
    let mut plugin = PluginProcess::spawn(&dirs, &options).unwrap();
    let line =
        plugin.wait_for_log("serving /metrics", Duration::from_secs(60)).unwrap_or_else(|| panic!("{}", plugin.log()));
    let addr = line.split_whitespace().find_map(|w| w.strip_prefix("addr=")).unwrap().to_owned();
    let mut threads = Vec::new();
    for (name, head) in [
        ("idle", &b""[..]),
        ("Content-Length with no body", b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"),
        ("headers never finished", b"GET /healthz HTTP/1.1\r\n"),
        (
            "an unending chunked body",
            b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n \r\n",
        ),
    ] {
        let addr = addr.clone();
        threads.push(std::thread::spawn(move || {
            let tcp = std::net::TcpStream::connect(addr.as_str()).unwrap();
            (&tcp).write_all(head).unwrap();
            let since = Instant::now();
            (name, tcp_closed_within(&tcp, since, IDLE_BOUND))
        }));
    }
    for thread in threads {
        let (name, took) = thread.join().unwrap();
        let took = took.unwrap_or_else(|| panic!("{name}: still open after {IDLE_BOUND:?}\n{}", plugin.log()));
        println!("node agent's metrics port, {name}: closed after {took:?}");
    }
}
