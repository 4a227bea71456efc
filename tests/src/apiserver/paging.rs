//! `limit` and `continue` on lists, as the real server pages them
//! (`apiserver/pkg/storage/etcd3/store.go` `GetList`,
//! `apiserver/pkg/storage/continue.go`):
//!
//! - `limit` > 0: at most that many items, in key order (namespace, then
//!   name); when more remain, `metadata.continue` holds an opaque token
//!   naming where the next page starts. No `limit` (or 0): everything, no
//!   token.
//! - `continue`: the page after the token's key, `limit` again. A token
//!   that cannot be read is 400 BadRequest; a `resourceVersion` beside a
//!   `continue` is 400 too ("specifying resource version is not allowed
//!   when using continue", `ValidateListOptions`).
//! - The last page has no `continue`.
//! - `resourceVersion=0` without `continue`: the watch cache answers, with
//!   everything in one page (`limit` ignored), as the stand-in always did.
//!
//! Unlike the real server, later pages are read from the current objects,
//! not from the first page's snapshot (etcd serves them at the token's
//! revision; the stand-in keeps no past states of objects), and
//! `remainingItemCount`, which the real server may omit, is never set.
//! The token is hex-encoded JSON `{"rv": N, "start": "ns/name"}` (the real
//! one is base64 JSON with the etcd key); clients treat both as opaque.

use serde_json::{Value, json};

use super::errors::ApiError;

/// One page of a list and the token for the next.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Value>,
    pub resource_version: u64,
    pub continue_token: Option<String>,
}

fn key_of(item: &Value) -> (String, String) {
    let field =
        |f: &str| item.pointer(&format!("/metadata/{f}")).and_then(Value::as_str).unwrap_or_default().to_string();
    (field("namespace"), field("name"))
}

fn encode(rv: u64, start: &(String, String)) -> String {
    let text = json!({"rv": rv, "start": format!("{}/{}", start.0, start.1)}).to_string();
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

fn decode(token: &str) -> Option<(u64, (String, String))> {
    if !token.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..token.len()).step_by(2).map(|i| u8::from_str_radix(token.get(i..i + 2)?, 16).ok()).collect();
    let value: Value = serde_json::from_slice(&bytes?).ok()?;
    let rv = value.get("rv")?.as_u64()?;
    let (ns, name) = value.get("start")?.as_str()?.split_once('/')?;
    Some((rv, (ns.to_string(), name.to_string())))
}

/// What a list request asks for: where to start, how many.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Items after this (namespace, name); `None`: from the first.
    pub after: Option<(String, String)>,
    /// At most this many; `None`: all.
    pub limit: Option<usize>,
    /// The first page's resourceVersion, from a token.
    pub token_rv: Option<u64>,
}

impl Request {
    /// How many items to read: one more than the limit tells whether
    /// another page follows.
    pub fn read(&self) -> usize {
        self.limit.map_or(usize::MAX, |l| l.saturating_add(1))
    }
}

/// Reads `limit`, `continue` and `resourceVersion`.
pub fn request(limit: Option<&str>, token: Option<&str>, resource_version: Option<&str>) -> Result<Request, ApiError> {
    let limit = match limit.filter(|l| !l.is_empty()) {
        None => 0,
        Some(l) => l.parse::<i64>().map_err(|_| ApiError::bad_request(format!("limit: Invalid value: {l:?}")))?,
    };
    let limit = usize::try_from(limit).ok().filter(|l| *l > 0);
    match token.filter(|t| !t.is_empty()) {
        None if resource_version == Some("0") => Ok(Request { after: None, limit: None, token_rv: None }),
        None => Ok(Request { after: None, limit, token_rv: None }),
        Some(_) if resource_version.is_some_and(|v| !v.is_empty()) => Err(ApiError::bad_request(
            "resourceVersion: Forbidden: specifying resource version is not allowed when using continue",
        )),
        Some(t) => {
            let (rv, start) =
                decode(t).ok_or_else(|| ApiError::bad_request("continue key is not valid: cannot be decoded"))?;
            Ok(Request { after: Some(start), limit, token_rv: Some(rv) })
        }
    }
}

/// The page from the items read for `request` (at most [`Request::read`],
/// in key order) at `rv`.
pub fn page(request: &Request, mut items: Vec<Value>, rv: u64) -> Page {
    let rv = request.token_rv.unwrap_or(rv);
    match request.limit {
        Some(limit) if items.len() > limit => {
            items.truncate(limit);
            let token = items.last().map(|last| encode(rv, &key_of(last)));
            Page { items, resource_version: rv, continue_token: token }
        }
        _ => Page { items, resource_version: rv, continue_token: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(n: usize) -> Vec<Value> {
        (0..n).map(|i| json!({"metadata": {"name": format!("s-{i:02}")}})).collect()
    }

    /// What the store reads for `request`.
    fn read(request: &Request, n: usize) -> Vec<Value> {
        items(n)
            .into_iter()
            .filter(|i| request.after.as_ref().is_none_or(|a| key_of(i) > *a))
            .take(request.read())
            .collect()
    }

    fn names(page: &Page) -> Vec<&str> {
        page.items.iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect()
    }

    #[test]
    fn pages_follow_the_token_to_the_end() {
        let first_request = request(Some("2"), None, None).unwrap();
        let first = page(&first_request, read(&first_request, 5), 7);
        assert_eq!(names(&first), ["s-00", "s-01"]);
        let second_request = request(Some("2"), first.continue_token.as_deref(), None).unwrap();
        let second = page(&second_request, read(&second_request, 5), 9);
        assert_eq!((names(&second), second.resource_version), (vec!["s-02", "s-03"], 7));
        let third_request = request(Some("2"), second.continue_token.as_deref(), None).unwrap();
        let third = page(&third_request, read(&third_request, 5), 9);
        assert_eq!((names(&third), third.continue_token.as_deref()), (vec!["s-04"], None));
        let all_request = request(None, None, None).unwrap();
        let all = page(&all_request, read(&all_request, 5), 7);
        assert_eq!((all.items.len(), all.continue_token), (5, None));
        let cached = request(Some("2"), None, Some("0")).unwrap();
        assert_eq!(page(&cached, read(&cached, 5), 7).items.len(), 5, "the watch cache ignores limit");
    }

    #[test]
    fn bad_tokens_and_a_version_beside_one_are_refused() {
        assert_eq!(request(Some("1"), Some("zz"), None).unwrap_err().code, 400);
        let first = request(Some("1"), None, None).unwrap();
        let token = page(&first, read(&first, 3), 1).continue_token.unwrap();
        assert_eq!(request(Some("1"), Some(&token), Some("5")).unwrap_err().code, 400);
    }
}
