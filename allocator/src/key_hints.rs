//! A CEL "No such key" on a device, said in the terms of the selector that
//! raised it. On a device alone, `device.attributes["gpu.nvidia.con"].productName`
//! and `device.capacity["gpu.nvidia.com"].productName` fail alike (the key
//! is missing from the map read); the selector's own references tell them
//! apart: a domain no device publishes gets "did you mean" the domain that
//! does.

use std::collections::{BTreeSet, HashMap};

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, ResourceClaim};

use super::error::{AllocateError, FatalError};
use super::why;

/// `error` with a better hint when it is a "No such key" the selector's
/// references explain; `domains` lists the domains the fleet's devices
/// publish (computed only then).
pub(crate) fn improve(
    error: AllocateError,
    claims: &[&ResourceClaim],
    classes: &HashMap<String, DeviceClass>,
    domains: impl FnOnce() -> BTreeSet<String>,
) -> AllocateError {
    let AllocateError::Fatal(FatalError::CelRuntime { claim, source_ref, index, device, message }) = error else {
        return error;
    };
    let Some(key) = message.strip_prefix("No such key: ").map(|rest| rest.split(';').next().unwrap_or(rest).trim())
    else {
        return AllocateError::Fatal(FatalError::CelRuntime { claim, source_ref, index, device, message });
    };
    let hint = selector(claims, classes, &claim, &source_ref, index)
        .and_then(|expression| why::unpublished_domain_hint(expression, key, &domains()));
    let message = match hint {
        Some(hint) => format!("No such key: {key}; {hint}"),
        None => message,
    };
    AllocateError::Fatal(FatalError::CelRuntime { claim, source_ref, index, device, message })
}

/// The expression of selector `index` of `source_ref` (`class <name>` or
/// `request <name>`, `<name>/<sub>` for a prioritized-list alternative).
fn selector<'a>(
    claims: &[&'a ResourceClaim],
    classes: &'a HashMap<String, DeviceClass>,
    claim: &str,
    source_ref: &str,
    index: usize,
) -> Option<&'a str> {
    let pick = |selectors: Option<&'a Vec<DeviceSelector>>| -> Option<&'a str> {
        Some(selectors?.get(index)?.cel.as_ref()?.expression.as_str())
    };
    if let Some(class) = source_ref.strip_prefix("class ") {
        return pick(classes.get(class)?.spec.as_ref()?.selectors.as_ref());
    }
    let request = source_ref.strip_prefix("request ")?;
    let found = claims.iter().find(|c| {
        let ns = c.metadata.namespace.as_deref().unwrap_or_default();
        let name = c.metadata.name.as_deref().unwrap_or_default();
        claim == format!("{ns}/{name}") || claim == name
    })?;
    let requests = found.spec.as_ref()?.devices.as_ref()?.requests.as_ref()?;
    let (main, sub) = request.split_once('/').map_or((request, None), |(m, s)| (m, Some(s)));
    let r = requests.iter().find(|r| r.name == main)?;
    match sub {
        None => pick(r.exactly.as_ref()?.selectors.as_ref()),
        Some(sub) => pick(r.first_available.as_ref()?.iter().find(|s| s.name == sub)?.selectors.as_ref()),
    }
}
