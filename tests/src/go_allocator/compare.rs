//! Whether both allocators chose the same: per claim, allocated or not, and
//! if allocated the node and every result's request, driver, pool and
//! device, in order. Share IDs (random in Go, sequential in `simulate`)
//! and reasons are not compared.

use serde::Deserialize;

/// One claim's choice.
#[derive(Debug, Clone)]
pub struct Choice {
    /// `namespace/name`.
    pub claim: String,
    /// `None`: not allocated.
    pub placed: Option<Placement>,
    /// A fatal error rather than "does not fit".
    pub error: bool,
    /// Why not allocated, in that side's words (shown, not compared).
    pub reason: Option<String>,
}

impl PartialEq for Choice {
    fn eq(&self, other: &Self) -> bool {
        (&self.claim, &self.placed, self.error) == (&other.claim, &other.placed, other.error)
    }
}

impl Eq for Choice {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub node: String,
    /// `request driver/pool/device`, in result order.
    pub devices: Vec<String>,
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.placed, self.error) {
            (Some(p), _) => write!(f, "{} on {}: {}", self.claim, p.node, p.devices.join(", ")),
            (None, true) => write!(f, "{}: error: {}", self.claim, self.reason.as_deref().unwrap_or_default()),
            (None, false) => write!(f, "{}: not allocated", self.claim),
        }
    }
}

/// `{"results": [...]}` as `simulate -o json` and the Go program print it;
/// only what is compared.
#[derive(Debug, Deserialize)]
struct Document {
    results: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    namespace: Option<String>,
    name: Option<String>,
    allocated: bool,
    node: Option<String>,
    allocation: Option<Allocation>,
    #[serde(default)]
    error: bool,
    reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Allocation {
    devices: Option<Devices>,
}

#[derive(Debug, Deserialize)]
struct Devices {
    #[serde(default)]
    results: Vec<DeviceResult>,
}

#[derive(Debug, Deserialize)]
struct DeviceResult {
    request: String,
    driver: String,
    pool: String,
    device: String,
}

/// The choices in a results document.
pub fn choices(json: &str) -> Result<Vec<Choice>, serde_json::Error> {
    let doc: Document = serde_json::from_str(json)?;
    Ok(doc
        .results
        .into_iter()
        .map(|e| Choice {
            claim: format!("{}/{}", e.namespace.unwrap_or_default(), e.name.unwrap_or_default()),
            placed: e.allocated.then(|| Placement {
                node: e.node.unwrap_or_default(),
                devices: e
                    .allocation
                    .and_then(|a| a.devices)
                    .map(|d| d.results)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|r| format!("{} {}/{}/{}", r.request, r.driver, r.pool, r.device))
                    .collect(),
            }),
            error: e.error,
            reason: e.reason,
        })
        .collect())
}

/// Claims where the two sides differ, with both choices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub index: usize,
    pub ours: Option<Choice>,
    pub go: Option<Choice>,
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let show = |c: &Option<Choice>| c.as_ref().map_or_else(|| "(no result)".to_string(), Choice::to_string);
        write!(f, "claim #{}: ours {}; Go {}", self.index + 1, show(&self.ours), show(&self.go))
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Claims both allocated identically.
    pub same_allocated: usize,
    /// Claims neither allocated (both found no node, or both refused).
    pub same_refused: usize,
    pub mismatches: Vec<Mismatch>,
}

impl Comparison {
    pub fn identical(&self) -> bool {
        self.mismatches.is_empty()
    }
}

/// Compares claim by claim; a claim only one side reports is a mismatch.
pub fn compare(ours: &[Choice], go: &[Choice]) -> Comparison {
    let mut out = Comparison::default();
    for index in 0..ours.len().max(go.len()) {
        let (a, b) = (ours.get(index), go.get(index));
        match (a, b) {
            (Some(a), Some(b)) if a == b => {
                if a.placed.is_some() {
                    out.same_allocated += 1;
                } else {
                    out.same_refused += 1;
                }
            }
            _ => out.mismatches.push(Mismatch { index, ours: a.cloned(), go: b.cloned() }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIMULATE: &str = r#"{"results": [
        {"namespace": "bench", "name": "claim-00001", "allocated": true, "node": "node-0000",
         "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
            "pool": "node-0000", "device": "gpu-0", "shareID": "00000000-0000-0000-0000-000000000001"}]},
            "nodeSelector": {"nodeSelectorTerms": []}},
         "error": false, "reason": null},
        {"namespace": "bench", "name": "claim-00002", "allocated": false, "node": null,
         "allocation": null, "error": false, "reason": "claim bench/claim-00002 cannot be allocated"}]}"#;

    const GO: &str = r#"{"results": [
        {"namespace": "bench", "name": "claim-00001", "allocated": true, "node": "node-0000",
         "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
            "pool": "node-0000", "device": "gpu-0", "shareID": "4b7c5c43-1ae1-4d0e-8a56-0f3f7a0b2b9c"}]}},
         "error": false},
        {"namespace": "bench", "name": "claim-00002", "allocated": false, "allocation": null, "error": false,
         "reason": "cannot be allocated on any of 1 nodes"}]}"#;

    #[test]
    fn both_documents_give_the_same_choices_whatever_the_share_ids_and_reasons() {
        let (ours, go) = (choices(SIMULATE).unwrap(), choices(GO).unwrap());
        assert_eq!(
            ours[0],
            Choice {
                claim: "bench/claim-00001".into(),
                placed: Some(Placement {
                    node: "node-0000".into(),
                    devices: vec!["gpu gpu.nvidia.com/node-0000/gpu-0".into()]
                }),
                error: false,
                reason: None,
            }
        );
        let c = compare(&ours, &go);
        assert!(c.identical(), "{:?}", c.mismatches);
        assert_eq!((c.same_allocated, c.same_refused), (1, 1));
    }

    #[test]
    fn another_device_node_or_a_missing_claim_is_a_mismatch() {
        let ours = choices(SIMULATE).unwrap();
        let other_device = choices(&GO.replace("\"gpu-0\"", "\"gpu-1\"")).unwrap();
        let other_node = choices(&GO.replace("\"node\": \"node-0000\"", "\"node\": \"node-0001\"")).unwrap();
        for go in [other_device, other_node] {
            let c = compare(&ours, &go);
            assert_eq!(c.mismatches.len(), 1);
            assert_eq!(c.mismatches[0].index, 0);
            assert!(c.mismatches[0].to_string().starts_with("claim #1: ours bench/claim-00001 on node-0000"));
        }
        let c = compare(&ours, &ours[..1]);
        assert_eq!(c.mismatches.len(), 1);
        assert!(c.mismatches[0].to_string().ends_with("Go (no result)"), "{}", c.mismatches[0]);
    }

    #[test]
    fn an_error_is_not_the_same_as_no_fit() {
        let ours = choices(SIMULATE).unwrap();
        let go =
            choices(&GO.replace("\"allocation\": null, \"error\": false", "\"allocation\": null, \"error\": true"))
                .unwrap();
        assert_eq!(compare(&ours, &go).mismatches.len(), 1);
    }
}
