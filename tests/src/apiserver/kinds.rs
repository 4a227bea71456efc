//! The resource types the stand-in serves, and how a request path names them.

/// One served resource type.
#[derive(Debug)]
pub struct Kind {
    /// API group; empty for the core group (`/api/v1`).
    pub group: &'static str,
    pub version: &'static str,
    /// URL segment, e.g. `resourceslices`.
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    /// Has a `/status` subresource: the main resource ignores status
    /// changes and `/status` changes only status.
    pub status_subresource: bool,
    /// `metadata.generation` is set on create and bumped when `spec` changes.
    pub generation: bool,
    /// `AllowCreateOnUpdate`: a PUT of a missing object creates it.
    pub create_on_update: bool,
    /// `AllowUnconditionalUpdate`: a PUT without `metadata.resourceVersion`
    /// is accepted (otherwise 409 Conflict).
    pub unconditional_update: bool,
    /// Field labels accepted in `fieldSelector` besides `metadata.name`
    /// (and `metadata.namespace` for namespaced types).
    pub fields: &'static [&'static str],
}

impl Kind {
    /// A `resource.k8s.io/v1` type as its registry strategy serves it:
    /// generation bumped by spec changes, no create on update,
    /// unconditional updates, only object-meta field labels.
    const fn resource(plural: &'static str, kind: &'static str, namespaced: bool, status_subresource: bool) -> Kind {
        Kind {
            group: "resource.k8s.io",
            version: "v1",
            plural,
            kind,
            namespaced,
            status_subresource,
            generation: true,
            create_on_update: false,
            unconditional_update: true,
            fields: &[],
        }
    }

    /// A `v1` type of `group` without `metadata.generation` (Node, Pod, the
    /// two Events), with no create on update and unconditional updates.
    const fn ungenerated(
        group: &'static str,
        plural: &'static str,
        kind: &'static str,
        namespaced: bool,
        status_subresource: bool,
        fields: &'static [&'static str],
    ) -> Kind {
        Kind {
            group,
            version: "v1",
            plural,
            kind,
            namespaced,
            status_subresource,
            generation: false,
            create_on_update: false,
            unconditional_update: true,
            fields,
        }
    }

    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_string() } else { format!("{}/{}", self.group, self.version) }
    }

    /// `resourceslices.resource.k8s.io`, as the real server names a
    /// resource in its error messages.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() { self.plural.to_string() } else { format!("{}.{}", self.plural, self.group) }
    }
}

/// What the stand-in serves. Field labels follow each type's field-label
/// conversion (`pkg/apis/resource/v1/conversion.go`
/// `AddFieldLabelConversionFunc`): ResourceSlice accepts `metadata.name`,
/// `spec.nodeName` and `spec.driver` only; Node adds `spec.unschedulable`;
/// the others accept object meta (`metadata.name`, and `metadata.namespace`
/// when namespaced). The update flags follow each registry strategy
/// (`pkg/registry/.../strategy.go`): only Lease creates on PUT and refuses a
/// PUT without resourceVersion.
pub static KINDS: &[Kind] = &[
    Kind {
        fields: &["spec.nodeName", "spec.driver"],
        ..Kind::resource("resourceslices", "ResourceSlice", false, false)
    },
    Kind::resource("resourceclaims", "ResourceClaim", true, true),
    // ResourceClaimTemplates: `pkg/registry/resource/resourceclaimtemplate`
    // (no status; the spec is immutable, ValidateResourceClaimTemplateUpdate).
    Kind::resource("resourceclaimtemplates", "ResourceClaimTemplate", true, false),
    // `pkg/registry/resource/devicetaintrule/strategy.go` (1.37, where
    // v1 serves it): cluster-scoped, a status subresource, generation.
    Kind::resource("devicetaintrules", "DeviceTaintRule", false, true),
    Kind::resource("deviceclasses", "DeviceClass", false, false),
    Kind::ungenerated("", "nodes", "Node", false, true, &["spec.unschedulable"]),
    // Pods: `pkg/registry/core/pod/strategy.go` (status subresource, no
    // create on update); field labels from `pkg/apis/core/v1/conversion.go`
    // (`spec.nodeName`, `status.phase` among others).
    Kind::ungenerated("", "pods", "Pod", true, true, &["spec.nodeName", "status.phase", "spec.schedulerName"]),
    // Events (`events.k8s.io/v1`): `pkg/registry/core/event/strategy.go`
    // (no status, unconditional updates); field labels from
    // `pkg/apis/events/v1/conversion.go` (the `regarding` reference, reason, type).
    Kind::ungenerated(
        "events.k8s.io",
        "events",
        "Event",
        true,
        false,
        &[
            "regarding.kind",
            "regarding.name",
            "regarding.namespace",
            "regarding.uid",
            "reason",
            "type",
            "reportingController",
        ],
    ),
    Kind {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        kind: "Lease",
        namespaced: true,
        status_subresource: false,
        generation: false,
        create_on_update: true,
        unconditional_update: false,
        fields: &[],
    },
    // ComputeDomains, a custom resource (the chart's CRD,
    // `templates/computedomains.yaml`: namespaced, status subresource), as
    // the apiextensions-apiserver serves one
    // (`pkg/registry/customresource/strategy.go`): generation bumped when
    // anything but metadata and status changes, status changed only
    // through `/status`, no create on update, no unconditional update.
    // The schema (defaults, `self == oldSelf`) is not enforced.
    Kind {
        group: "resource.nvidia.com",
        version: "v1beta1",
        plural: "computedomains",
        kind: "ComputeDomain",
        namespaced: true,
        status_subresource: true,
        generation: true,
        create_on_update: false,
        unconditional_update: false,
        fields: &[],
    },
    // Core Events (`v1`), as `kubectl get events` reads them: field labels
    // from `pkg/apis/core/v1/conversion.go` (`involvedObject.*`, reason,
    // source, type). Both groups share the one `events` collection, as in the
    // real server's storage, but the stand-in does not convert between the
    // two shapes (`regarding` / `involvedObject`): the driver writes
    // `events.k8s.io/v1` only, and this kind serves kubectl's reads (its
    // field selectors are checked as the real server checks them).
    Kind::ungenerated(
        "",
        "events",
        "Event",
        true,
        false,
        &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
    ),
];

/// The served type of kind `kind` (e.g. `ResourceSlice`).
pub fn by_kind(kind: &str) -> Option<&'static Kind> {
    KINDS.iter().find(|k| k.kind == kind)
}

/// A request path taken apart.
#[derive(Debug, PartialEq, Eq)]
pub struct Target {
    pub kind: &'static Kind,
    /// Set for namespaced requests; `None` lists or watches all namespaces.
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Only `status` exists.
    pub status: bool,
}

impl PartialEq for Kind {
    fn eq(&self, other: &Self) -> bool {
        self.plural == other.plural && self.group == other.group
    }
}
impl Eq for Kind {}

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...` into a target;
/// `None` when no served type matches (the server answers 404).
pub fn parse_path(path: &str) -> Option<Target> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some((*ns).to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some((*name).to_string()), None),
        [plural, name, sub] => (*plural, Some((*name).to_string()), Some(*sub)),
        _ => return None,
    };
    let kind = KINDS.iter().find(|k| k.group == group && k.version == version && k.plural == plural)?;
    // A namespaced name needs its namespace; cluster-scoped types have none.
    if (!kind.namespaced && namespace.is_some()) || (kind.namespaced && name.is_some() && namespace.is_none()) {
        return None;
    }
    let status = match sub {
        None => false,
        Some("status") if kind.status_subresource => true,
        Some(_) => return None,
    };
    Some(Target { kind, namespace, name, status })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let t = parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status").unwrap();
        assert_eq!(
            (t.kind.kind, t.namespace.as_deref(), t.name.as_deref(), t.status),
            ("ResourceClaim", Some("ns"), Some("c"), true)
        );
        let t = parse_path("/apis/resource.k8s.io/v1/resourceclaims").unwrap();
        assert_eq!((t.namespace, t.name), (None, None));
        assert_eq!(parse_path("/api/v1/nodes/n1").unwrap().kind.kind, "Node");
        assert!(parse_path("/apis/resource.k8s.io/v1/namespaces/ns/resourceslices").is_none());
        assert!(parse_path("/apis/resource.k8s.io/v1/resourceslices/a/status").is_none());
        assert!(parse_path("/apis/resource.k8s.io/v1/resourceclaims/c").is_none());
        assert!(parse_path("/apis/resource.k8s.io/v1beta1/resourceslices").is_none());
    }
}
