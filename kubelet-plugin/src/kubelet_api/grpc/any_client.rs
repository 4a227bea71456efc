//! Accepted socket connections behind an [`AuthorityRewriter`], so clients
//! that send the socket path as `:authority` are served (see `authority`).

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;

use super::authority::AuthorityRewriter;

/// Room between a client and the server, per direction.
const BUFFER: usize = 64 * 1024;

/// The server's end of one client connection.
#[derive(Debug)]
pub struct Connection(DuplexStream);

/// The listener's connections, each rewritten on its way to the server.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = std::io::Result<Connection>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(relay))
}

/// Relays `client` through the rewriter: client bytes are rewritten into
/// the server's end, the server's replies are copied back as they are.
fn relay(client: UnixStream) -> Connection {
    let (server_end, relay_end) = tokio::io::duplex(BUFFER);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(relay_end);
    tokio::spawn(async move {
        let mut rewriter = AuthorityRewriter::default();
        let mut buf = vec![0u8; BUFFER];
        let mut out = Vec::with_capacity(BUFFER);
        loop {
            let n = match client_read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            out.clear();
            if let Err(error) = rewriter.feed(buf.get(..n).unwrap_or_default(), &mut out) {
                tracing::debug!(%error, "closing a gRPC connection");
                break;
            }
            if to_server.write_all(&out).await.is_err() {
                break;
            }
        }
        let _ = to_server.shutdown().await;
    });
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    Connection(server_end)
}

impl tonic::transport::server::Connected for Connection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for Connection {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
