//! What the real server checks before it stores an object, reduced to what
//! catches driver bugs: the body decodes as the API type, names are DNS
//! subdomains, ResourceSlices pass `ValidateResourceSlice` (the driver's
//! port of it) and keep their immutable fields.

use gpu_dra_driver::k8s_format::check_dns1123_subdomain;
use gpu_dra_driver::slices::{ServerRules, validate_slice_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::errors::ApiError;
use super::kinds::Kind;

fn decode<T: DeserializeOwned>(kind: &Kind, name: &str, object: &Value) -> Result<T, ApiError> {
    serde_json::from_value(object.clone()).map_err(|e| {
        ApiError::bad_request(format!(
            "{} \"{name}\": the body does not decode as {}: {e}",
            kind.qualified(),
            kind.kind
        ))
    })
}

/// Checks `object` (and, on update, that it keeps what `old` fixed) as
/// Kubernetes 1.`minor` does.
pub fn check(kind: &Kind, name: &str, object: &Value, old: Option<&Value>, minor: u32) -> Result<(), ApiError> {
    check_dns1123_subdomain(name)
        .map_err(|e| ApiError::invalid(kind, name, &format!("metadata.name: Invalid value: \"{name}\": {e}")))?;
    match kind.kind {
        "ResourceSlice" => {
            let slice: ResourceSlice = decode(kind, name, object)?;
            // As the release it reports at /version validates (1.35+ takes
            // taint effect None and 16 taints per device).
            let errors = validate_slice_for(&slice, ServerRules { minor });
            if !errors.is_empty() {
                let causes = errors.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                return Err(ApiError::invalid(kind, name, &format!("[{causes}]")));
            }
            // ValidateResourceSliceUpdate: driver, pool name and node name are immutable.
            if let Some(old) = old {
                for field in ["/spec/driver", "/spec/pool/name", "/spec/nodeName"] {
                    if object.pointer(field) != old.pointer(field) {
                        let path = field.trim_start_matches('/').replace('/', ".");
                        return Err(ApiError::invalid(
                            kind,
                            name,
                            &format!("{path}: Invalid value: field is immutable"),
                        ));
                    }
                }
            }
        }
        "ResourceClaim" => {
            decode::<ResourceClaim>(kind, name, object)?;
            // ValidateResourceClaimUpdate: the spec is immutable.
            if old.is_some_and(|old| old.get("spec") != object.get("spec")) {
                return Err(ApiError::invalid(kind, name, "spec: Invalid value: field is immutable"));
            }
        }
        // ValidateResourceClaimTemplateUpdate: the spec is immutable.
        "ResourceClaimTemplate" if old.is_some_and(|old| old.get("spec") != object.get("spec")) => {
            return Err(ApiError::invalid(kind, name, "spec: Invalid value: field is immutable"));
        }
        "DeviceClass" => {
            decode::<DeviceClass>(kind, name, object)?;
        }
        "Node" => {
            decode::<Node>(kind, name, object)?;
        }
        "Lease" => {
            decode::<Lease>(kind, name, object)?;
        }
        // ValidateEventUpdate (events.k8s.io/v1): what happened and who
        // reported it cannot change; only series and counts move.
        "Event" => {
            if let Some(old) = old {
                for field in [
                    "regarding",
                    "reason",
                    "note",
                    "eventTime",
                    "action",
                    "reportingController",
                    "reportingInstance",
                    "type",
                ] {
                    if old.get(field) != object.get(field) {
                        return Err(ApiError::invalid(
                            kind,
                            name,
                            &format!("{field}: Invalid value: field is immutable"),
                        ));
                    }
                }
            }
        }
        _ => {}
    }
    Ok(())
}
