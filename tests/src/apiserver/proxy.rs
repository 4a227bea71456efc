//! The pod proxy subresource, `/api/v1/namespaces/NS/pods/ID/proxy/PATH`
//! (`kubectl get --raw`, `kubectl gpu claims` reaching a node agent's
//! `/metrics`), as the real server does it (Kubernetes v1.37.2):
//! - `pkg/registry/core/pod/strategy.go` `ResourceLocation`: ID is `name`,
//!   `name:port` or `scheme:name:port`, else 400 `invalid pod request`; the
//!   pod must exist (404); with no port, the first container port of the
//!   pod; the address is the pod's first `status.podIPs` entry and must be
//!   a global unicast address, else 400 `address not allowed` (so a pod
//!   whose IP is loopback or link-local is never proxied to); the port is
//!   used as written (a port name is not resolved);
//! - `pkg/registry/core/pod/rest/subresources.go` `ProxyREST.Connect`: the
//!   path after `proxy` is joined to that address;
//! - `k8s.io/apimachinery/pkg/util/proxy/transport.go`: an upstream that
//!   cannot be reached is 503 `error trying to reach service: ...`; what
//!   the upstream answers is passed through, status and body.
//!
//! Only GET and `http` are served here (the real server also proxies the
//! other verbs and `https`); a request for those is refused, not faked.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, header};
use axum::response::{IntoResponse, Response};
use http_body_util::{BodyExt, Empty};
use serde_json::Value;

use super::errors::ApiError;
use super::kinds;
use super::store::Store;

/// The real server's transport dials for up to 30 s; so does this.
const DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// A pod proxy request: namespace, ID (`name[:port]`), the rest of the path.
#[derive(Debug, PartialEq, Eq)]
pub struct ProxyPath<'a> {
    pub namespace: &'a str,
    pub id: &'a str,
    pub rest: &'a str,
}

/// Whether `path` is a pod proxy request.
pub fn parse(path: &str) -> Option<ProxyPath<'_>> {
    let tail = path.strip_prefix("/api/v1/namespaces/")?;
    let (namespace, tail) = tail.split_once('/')?;
    let tail = tail.strip_prefix("pods/")?;
    let (id, tail) = tail.split_once('/')?;
    let rest = match tail.strip_prefix("proxy")? {
        "" => "/",
        rest if rest.starts_with('/') => rest,
        _ => return None,
    };
    Some(ProxyPath { namespace, id, rest })
}

/// `SplitSchemeNamePort`: `name`, `name:port` or `scheme:name:port`
/// (scheme `http` or `https`); `None` when invalid.
fn split_id(id: &str) -> Option<(&str, &str, &str)> {
    let parts: Vec<&str> = id.split(':').collect();
    let (scheme, name, port) = match parts.as_slice() {
        [name] => ("", *name, ""),
        [name, port] => ("", *name, *port),
        [scheme, name, port] if *scheme == "http" || *scheme == "https" => (*scheme, *name, *port),
        _ => return None,
    };
    (!name.is_empty()).then_some((scheme, name, port))
}

/// Go's `net.IP.IsGlobalUnicast`.
fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified() || v4.is_loopback() || v4.is_multicast() || v4.is_link_local() || v4.is_broadcast())
        }
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_loopback() || v6.is_multicast() || v6.is_unicast_link_local()),
    }
}

/// Where the real server would send the request: `ResourceLocation`.
fn location(store: &Store, request: &ProxyPath<'_>) -> Result<SocketAddr, ApiError> {
    let invalid = || ApiError::bad_request(format!("invalid pod request {:?}", request.id));
    let (scheme, name, port) = split_id(request.id).ok_or_else(invalid)?;
    if scheme == "https" {
        return Err(ApiError::bad_request("the API server stand-in proxies http only"));
    }
    let kind = kinds::by_kind("Pod").ok_or_else(|| ApiError::bad_request("the stand-in does not serve Pods"))?;
    let pod = store.get(kind, Some(request.namespace), name)?;
    let port = if port.is_empty() { first_container_port(&pod).unwrap_or_default() } else { port.to_string() };
    let ip = pod.pointer("/status/podIPs/0/ip").and_then(Value::as_str).unwrap_or_default();
    let ip: IpAddr = match ip.parse() {
        Ok(ip) if is_global_unicast(ip) => ip,
        _ => return Err(ApiError::bad_request("address not allowed")),
    };
    // The real server would dial `ip:name` for a named or empty port and
    // fail to reach it: the same 503 here.
    let port: u16 = port.parse().map_err(|_| unreachable(&format!("dial tcp: address {ip}:{port}: invalid port")))?;
    Ok(SocketAddr::new(ip, port))
}

fn first_container_port(pod: &Value) -> Option<String> {
    pod.pointer("/spec/containers")?.as_array()?.iter().find_map(|c| {
        let port = c.pointer("/ports/0/containerPort")?.as_i64()?;
        Some(port.to_string())
    })
}

fn unreachable(why: &str) -> ApiError {
    ApiError {
        code: 503,
        reason: "ServiceUnavailable",
        message: format!("error trying to reach service: {why}"),
        details: None,
    }
}

async fn forward(addr: SocketAddr, path_and_query: &str) -> Result<Response, ApiError> {
    let stream = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unreachable(&format!("dial tcp {addr}: i/o timeout")))?
        .map_err(|e| unreachable(&format!("dial tcp {addr}: {e}")))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| unreachable(&e.to_string()))?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path_and_query)
        .header(header::HOST, addr.to_string())
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let response = sender.send_request(request).await.map_err(|e| unreachable(&e.to_string()))?;
    let status = response.status();
    let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
    let body = response.into_body().collect().await.map_err(|e| unreachable(&e.to_string()))?.to_bytes();
    let mut out = (status, Body::from(body)).into_response();
    if let Some(content_type) = content_type {
        out.headers_mut().insert(header::CONTENT_TYPE, content_type);
    }
    Ok(out)
}

/// Serves a pod proxy request.
pub async fn serve(
    store: &Store,
    method: &Method,
    request: &ProxyPath<'_>,
    query: Option<&str>,
) -> Result<Response, ApiError> {
    if *method != Method::GET {
        return Err(ApiError::method_not_allowed(method.as_str()));
    }
    let addr = location(store, request)?;
    let path_and_query = match query {
        Some(q) if !q.is_empty() => format!("{}?{q}", request.rest),
        _ => request.rest.to_string(),
    };
    forward(addr, &path_and_query).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_ids_read_as_the_real_server_reads_them() {
        assert_eq!(
            parse("/api/v1/namespaces/gpu/pods/plugin-x:8080/proxy/metrics"),
            Some(ProxyPath { namespace: "gpu", id: "plugin-x:8080", rest: "/metrics" })
        );
        assert_eq!(parse("/api/v1/namespaces/gpu/pods/p/proxy").map(|p| p.rest), Some("/"));
        assert_eq!(parse("/api/v1/namespaces/gpu/pods/p/status"), None);
        assert_eq!(parse("/api/v1/namespaces/gpu/pods/p/proxyx"), None);
        assert_eq!(split_id("p"), Some(("", "p", "")));
        assert_eq!(split_id("p:80"), Some(("", "p", "80")));
        assert_eq!(split_id("https:p:443"), Some(("https", "p", "443")));
        assert_eq!(split_id("ftp:p:21"), None);
        assert_eq!(split_id(":80"), None);
    }

    #[test]
    fn loopback_and_link_local_are_not_proxied_to() {
        for refused in ["127.0.0.1", "169.254.1.1", "0.0.0.0", "::1", "fe80::1", "224.0.0.1"] {
            assert!(!is_global_unicast(refused.parse().unwrap()), "{refused}");
        }
        for allowed in ["10.0.0.7", "192.168.1.5", "198.18.0.1", "2001:db8::1"] {
            assert!(is_global_unicast(allowed.parse().unwrap()), "{allowed}");
        }
    }
}
