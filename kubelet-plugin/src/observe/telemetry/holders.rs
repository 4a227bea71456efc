//! The pods holding each prepared claim: its `reservedFor`, read from the
//! API server when the claim first appears and then every
//! [`REFRESH`] (pods come and go on a shared claim), never on the prepare
//! path. A failed read keeps what was known.

use std::collections::HashMap;
use std::time::Duration;

use gpu_dra_driver::k8s_format::RESERVED_FOR_MAX;
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use tokio::time::Instant;

use super::readings::PodRef;
use super::snapshot::PreparedClaim;

/// How often a known claim's `reservedFor` is read again.
pub const REFRESH: Duration = Duration::from_secs(60);

/// The pods of a claim's `reservedFor`, sorted by name; at most the API's
/// [`RESERVED_FOR_MAX`] entries are read.
pub fn reserving_pods(claim: &ResourceClaim) -> Vec<PodRef> {
    let mut pods: Vec<PodRef> = claim
        .status
        .iter()
        .flat_map(|s| s.reserved_for.iter().flatten())
        .take(RESERVED_FOR_MAX)
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
        .map(|r| PodRef { name: r.name.clone(), uid: r.uid.clone() })
        .collect();
    pods.sort();
    pods
}

/// Known pods by claim UID, with when they were read.
pub struct ClaimPods {
    client: kube::Client,
    known: HashMap<String, (Instant, Vec<PodRef>)>,
}

impl ClaimPods {
    pub fn new(client: kube::Client) -> Self {
        Self { client, known: HashMap::new() }
    }

    /// The pods of every claim in `claims`, reading those unknown or stale.
    pub async fn refresh(&mut self, claims: &[PreparedClaim]) -> HashMap<String, Vec<PodRef>> {
        self.known.retain(|uid, _| claims.iter().any(|c| &c.uid == uid));
        let now = Instant::now();
        for claim in claims {
            let stale = self.known.get(&claim.uid).is_none_or(|(at, _)| now.duration_since(*at) >= REFRESH);
            if !stale {
                continue;
            }
            let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), &claim.namespace);
            match api.get_opt(&claim.name).await {
                Ok(Some(found)) if found.metadata.uid.as_deref() == Some(claim.uid.as_str()) => {
                    self.known.insert(claim.uid.clone(), (now, reserving_pods(&found)));
                }
                // Gone or replaced: it is about to be unprepared.
                Ok(_) => {
                    self.known.insert(claim.uid.clone(), (now, Vec::new()));
                }
                Err(error) => {
                    tracing::debug!(claim = %format!("{}/{}", claim.namespace, claim.name), %error,
                        "cannot read the claim's reservedFor; keeping what was known");
                }
            }
        }
        self.known.iter().map(|(uid, (_, pods))| (uid.clone(), pods.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::resource::v1::{ResourceClaimConsumerReference, ResourceClaimStatus};

    use super::*;

    #[test]
    fn only_pods_of_reserved_for_count_sorted() {
        let consumer = |group: Option<&str>, resource: &str, name: &str| ResourceClaimConsumerReference {
            api_group: group.map(Into::into),
            resource: resource.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        };
        let claim = ResourceClaim {
            status: Some(ResourceClaimStatus {
                reserved_for: Some(vec![
                    consumer(None, "pods", "web-1"),
                    consumer(Some("example.com"), "pods", "not-a-pod"),
                    consumer(Some(""), "pods", "web-0"),
                    consumer(None, "jobs", "j"),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods = reserving_pods(&claim);
        assert_eq!(pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["web-0", "web-1"]);
        assert_eq!(pods[0].uid, "uid-web-0");
        assert!(reserving_pods(&ResourceClaim::default()).is_empty());
    }

    /// A server (forged, or a future API) sending more than the API's 256.
    #[test]
    fn reserved_for_is_read_up_to_the_apis_maximum() {
        let consumers = (0..10_000)
            .map(|i| ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: format!("p-{i:05}"),
                uid: format!("u-{i}"),
            })
            .collect();
        let claim = ResourceClaim {
            status: Some(ResourceClaimStatus { reserved_for: Some(consumers), ..Default::default() }),
            ..Default::default()
        };
        let pods = reserving_pods(&claim);
        assert_eq!(pods.len(), RESERVED_FOR_MAX);
        assert_eq!(pods.last().map(|p| p.name.as_str()), Some("p-00255"));
    }
}
