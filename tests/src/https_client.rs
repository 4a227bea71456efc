//! A small HTTPS client for the webhook's tests and benchmark: a TLS
//! connection that trusts one certificate, with HTTP/1.1 written by hand,
//! so that a test can also misbehave on purpose (stop halfway, dribble,
//! never end a body) and time when the server closes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// A client configuration trusting only `ca_pem`, offering `alpn`.
pub fn config(ca_pem: &str, alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("a PEM certificate")).expect("a usable root");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// Connects to `127.0.0.1:port` as `localhost` and completes the handshake.
pub fn connect(port: u16, config: &Arc<ClientConfig>) -> io::Result<TlsStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let name = ServerName::try_from("localhost").map_err(io::Error::other)?;
    let connection = ClientConnection::new(config.clone(), name).map_err(io::Error::other)?;
    let mut stream = StreamOwned::new(connection, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// POSTs `body` to `path` and reads the answer: status and body.
pub fn post(port: u16, config: &Arc<ClientConfig>, path: &str, body: &[u8]) -> io::Result<(u16, Vec<u8>)> {
    let mut stream = connect(port, config)?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()?;
    read_response(&mut stream)
}

/// Reads one HTTP/1.1 response with a Content-Length body.
pub fn read_response(stream: &mut impl Read) -> io::Result<(u16, Vec<u8>)> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed before the headers ended"));
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..header_end]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no status in {head:?}")))?;
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer.split_off(header_end);
    while body.len() < length {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    body.truncate(length);
    Ok((status, body))
}

/// Whether the peer has closed `stream`, waiting at most `wait` for news;
/// data that arrives (an answer) is read and dropped.
pub fn closed(stream: &mut TlsStream, wait: Duration) -> bool {
    let _ = stream.sock.set_read_timeout(Some(wait.max(Duration::from_millis(1))));
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => false,
        Err(_) => true,
    }
}

/// Waits until the peer closes `stream` (at most `limit`); how long it took
/// from `since`, or `None` when it was still open at the limit. `poke` runs
/// between two looks (to dribble a byte, say); its error means closed.
pub fn time_until_closed(
    stream: &mut TlsStream,
    since: Instant,
    limit: Duration,
    every: Duration,
    mut poke: impl FnMut(&mut TlsStream) -> io::Result<()>,
) -> Option<Duration> {
    loop {
        if closed(stream, every) {
            return Some(since.elapsed());
        }
        if since.elapsed() > limit {
            return None;
        }
        if poke(stream).and_then(|()| stream.flush()).is_err() {
            return Some(since.elapsed());
        }
    }
}
