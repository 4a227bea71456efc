//! HTTP dispatch: verbs on collection and object URLs, as the real
//! server's `endpoints/handlers` map them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::apply::{self, merge_patch};
use super::errors::ApiError;
use super::faults::{Faults, RequestRecord};
use super::kinds::{self, Kind, Target};
use super::paging;
use super::selectors::{FieldSelector, LabelSelector};
use super::store::{Store, Write};
use super::watch::{WatchRequest, error_line};

/// Everything a request can reach.
pub struct Shared {
    pub store: Store,
    pub faults: Faults,
    pub bookmark_interval: Duration,
}

type Params = HashMap<String, String>;

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn error_response(err: &ApiError) -> Response {
    json_response(err.code, &err.status())
}

/// The single entry point (installed as the router's fallback).
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let params: Params = match Query::<Params>::try_from_uri(&uri) {
        Ok(Query(p)) => p,
        Err(e) => return error_response(&ApiError::bad_request(format!("invalid query: {e}"))),
    };
    let watch = params.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verdict = shared.faults.verdict(method.as_str(), &path, watch);
    if let Some(delay) = verdict.delay {
        tokio::time::sleep(delay).await;
    }
    let response = match verdict.fail {
        Some(code) => error_response(&ApiError::injected(code)),
        None => match super::proxy::parse(&path) {
            Some(proxied) => super::proxy::serve(&shared.store, &method, &proxied, uri.query())
                .await
                .unwrap_or_else(|err| error_response(&err)),
            None => dispatch(&shared, &method, &path, &params, &headers, &body, watch).await,
        },
    };
    shared.faults.record(RequestRecord {
        method: method.to_string(),
        path,
        query: uri.query().unwrap_or_default().to_string(),
        watch,
        user_agent: headers.get(header::USER_AGENT).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string(),
        status: response.status().as_u16(),
    });
    response
}

async fn dispatch(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
    watch: bool,
) -> Response {
    if path == "/version" {
        let minor = shared.store.server_minor();
        return json_response(
            200,
            &json!({"major": "1", "minor": minor.to_string(), "gitVersion": format!("v1.{minor}.0-standin"), "platform": "linux/amd64"}),
        );
    }
    if *method == Method::GET
        && let Some(document) = super::discovery::document(path)
    {
        return json_response(200, &document);
    }
    let Some(target) = kinds::parse_path(path) else {
        return error_response(&ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("the server could not find the requested resource ({path})"),
            details: None,
        });
    };
    if watch && *method == Method::GET && target.name.is_none() {
        return start_watch(shared, target, params);
    }
    match serve(shared, method, &target, params, headers, body) {
        Ok((code, value)) => json_response(code, &value),
        Err(err) => error_response(&err),
    }
}

/// The field manager of a write: `?fieldManager=`, else the user agent's
/// first segment (the real server's default for non-apply writes).
fn manager(params: &Params, headers: &HeaderMap) -> String {
    params.get("fieldManager").cloned().unwrap_or_else(|| {
        headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or("unknown")
            .to_string()
    })
}

fn selectors(kind: &Kind, params: &Params) -> Result<(LabelSelector, FieldSelector), ApiError> {
    Ok((
        LabelSelector::parse(params.get("labelSelector").map_or("", String::as_str))?,
        FieldSelector::parse(params.get("fieldSelector").map_or("", String::as_str), kind)?,
    ))
}

fn parse_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("the request body is not JSON: {e}")))
}

fn list_object(kind: &Kind, items: Vec<Value>, rv: u64) -> Value {
    json!({
        "apiVersion": kind.api_version(),
        "kind": format!("{}List", kind.kind),
        "metadata": {"resourceVersion": rv.to_string()},
        "items": items,
    })
}

fn serve(
    shared: &Shared,
    method: &Method,
    target: &Target,
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let store = &shared.store;
    let kind = target.kind;
    let ns = target.namespace.as_deref();
    let manager = manager(params, headers);
    match (method.as_str(), target.name.as_deref()) {
        ("GET", None) => {
            // `limit` and `continue` as the real server pages (paging.rs).
            let (labels, fields) = selectors(kind, params)?;
            let param = |name: &str| params.get(name).map(String::as_str);
            let request = paging::request(param("limit"), param("continue"), param("resourceVersion"))?;
            let (items, rv) = store.list_after(kind, ns, (&labels, &fields), request.after.as_ref(), request.read());
            let page = paging::page(&request, items, rv);
            let mut list = list_object(kind, page.items, page.resource_version);
            if let Some(token) = page.continue_token {
                list["metadata"]["continue"] = json!(token);
            }
            Ok((200, list))
        }
        ("GET", Some(name)) => Ok((200, store.get(kind, ns, name)?)),
        ("POST", None) => Ok((201, store.create(kind, ns, parse_body(body)?, &manager)?)),
        ("PUT", Some(name)) => {
            let object = parse_body(body)?;
            let write = Write { kind, namespace: ns, name, status: target.status, manager: &manager, put: true };
            match store.update(&write, |_, _| Ok(object.clone())) {
                // AllowCreateOnUpdate (Lease): a PUT of a missing object creates it.
                Err(e) if e.code == 404 && kind.create_on_update && !target.status => {
                    let mut object = object;
                    apply::merge_patch(&mut object, &json!({"metadata": {"name": name}}));
                    Ok((201, store.create(kind, ns, object, &manager)?))
                }
                other => Ok((200, other?)),
            }
        }
        ("PATCH", Some(name)) => patch(store, target, name, params, headers, body, &manager),
        ("DELETE", Some(name)) => {
            // DeleteOptions.preconditions, when a body is sent.
            let options: Value = if body.is_empty() { Value::Null } else { parse_body(body)? };
            let rv = options.pointer("/preconditions/resourceVersion").and_then(Value::as_str);
            let uid = options.pointer("/preconditions/uid").and_then(Value::as_str);
            Ok((200, store.delete(kind, ns, name, rv, uid)?))
        }
        ("DELETE", None) => {
            let (labels, fields) = selectors(kind, params)?;
            let deleted = store.delete_collection(kind, ns, &labels, &fields);
            Ok((200, list_object(kind, deleted, store.resource_version())))
        }
        (other, _) => Err(ApiError::method_not_allowed(other)),
    }
}

fn patch(
    store: &Store,
    target: &Target,
    name: &str,
    params: &Params,
    headers: &HeaderMap,
    body: &Bytes,
    manager: &str,
) -> Result<(u16, Value), ApiError> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let content_type = content_type.split(';').next().unwrap_or_default().trim();
    let force = params.get("force").is_some_and(|f| f == "true");
    let write = Write {
        kind: target.kind,
        namespace: target.namespace.as_deref(),
        name,
        status: target.status,
        manager,
        put: false,
    };
    match content_type {
        "application/merge-patch+json" => {
            if force {
                return Err(ApiError::bad_request("force: Invalid value: may not be specified for non-apply patch"));
            }
            let patch = parse_body(body)?;
            Ok((
                200,
                store.update(&write, |current, _| {
                    let mut next = current.clone();
                    merge_patch(&mut next, &patch);
                    Ok(next)
                })?,
            ))
        }
        "application/apply-patch+yaml" => {
            // Apply requires a field manager (the real server: 422/400
            // "fieldManager: Required value: is required for apply patch").
            if !params.contains_key("fieldManager") {
                return Err(ApiError::bad_request("fieldManager: Required value: is required for apply patch"));
            }
            let applied: Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(_) => {
                    // The YAML parser is quadratic in flow nesting: refuse
                    // hostile depth first, as the real server bounds input.
                    let text = std::str::from_utf8(body)
                        .map_err(|e| ApiError::bad_request(format!("the apply configuration is not UTF-8: {e}")))?;
                    gpu_dra_driver::nesting::check(text).map_err(|e| ApiError::bad_request(e.to_string()))?;
                    serde_yaml_ng::from_str(text).map_err(|e| {
                        ApiError::bad_request(format!("the apply configuration is neither JSON nor YAML: {e}"))
                    })?
                }
            };
            match applied.pointer("/metadata/name").and_then(Value::as_str) {
                Some(n) if n != name => {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({n}) does not match the name on the URL ({name})"
                    )));
                }
                _ => {}
            }
            let existed = store.get(target.kind, target.namespace.as_deref(), name).is_ok();
            let object = store.apply(&write, applied, force)?;
            Ok((if existed { 200 } else { 201 }, object))
        }
        other => Err(ApiError::unsupported_media_type(other)),
    }
}

fn start_watch(shared: &Arc<Shared>, target: Target, params: &Params) -> Response {
    let (labels, fields) = match selectors(target.kind, params) {
        Ok(s) => s,
        Err(e) => return error_response(&e),
    };
    let request = WatchRequest {
        kind: target.kind,
        namespace: target.namespace.clone(),
        labels,
        fields,
        bookmarks: params.get("allowWatchBookmarks").is_some_and(|b| b == "true"),
        send_initial_events: params.get("sendInitialEvents").is_some_and(|b| b == "true"),
        timeout: params.get("timeoutSeconds").and_then(|t| t.parse().ok()).map(Duration::from_secs),
        bookmark_interval: shared.bookmark_interval,
    };
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    match shared.store.watch(
        target.kind,
        target.namespace.as_deref(),
        params.get("resourceVersion").map(String::as_str),
    ) {
        Ok(start) => {
            let drops = shared.faults.watch_drops();
            tokio::spawn(request.run(start, tx, drops));
        }
        // The watch cache answers an expired resourceVersion with 200 and
        // one ERROR event carrying the 410 Status, then ends the stream.
        Err(err) if err.code == 410 => {
            let _ = tx.try_send(error_line(&err.status()));
        }
        Err(err) => return error_response(&err),
    }
    let stream = tokio_stream::StreamExt::map(ReceiverStream::new(rx), Ok::<Bytes, std::convert::Infallible>);
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}
