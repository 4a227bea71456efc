//! A claim's GPU utilization from a node agent's `/metrics` text, pure.
//!
//! The node agent labels each device's series with the claim holding it:
//! `gpu_dra_device_gpu_utilization_percent{device, claim_uid, ...}` in its
//! own naming, `DCGM_FI_DEV_GPU_UTIL{dra_device_name, dra_claim_namespace,
//! dra_claim_name, pod, ...}` in dcgm-exporter's (one series per pod).
//! A claim's utilization is the mean over its devices that have a reading;
//! a device NVML gives no utilization for (a MIG device) has no series, and
//! a claim none of whose devices has one gets a reason, never a zero.

use std::collections::BTreeMap;

use serde::Serialize;

const NATIVE: &str = "gpu_dra_device_gpu_utilization_percent";
const DCGM: &str = "DCGM_FI_DEV_GPU_UTIL";
/// Every per-device family of either naming starts with one of these.
const DEVICE_PREFIXES: [&str; 2] = ["gpu_dra_device_", "DCGM_FI_DEV_"];

/// Which claim to look for.
#[derive(Debug, Clone, Copy)]
pub struct ClaimKey<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

/// A claim's utilization, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Utilization {
    /// The mean GPU utilization of its devices, and each device's.
    Percent { mean: f64, devices: BTreeMap<String, f64> },
    /// Why it is not known (metrics unreachable, a MIG device, ...).
    Unavailable(String),
}

impl Utilization {
    /// The table's cell: `42%`, or `-`.
    pub fn cell(&self) -> String {
        match self {
            Utilization::Percent { mean, .. } => format!("{mean:.0}%"),
            Utilization::Unavailable(_) => "-".into(),
        }
    }
}

/// One sample line: family name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }
}

/// The samples of a Prometheus text exposition; comment lines and lines
/// that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Sample> {
    text.lines().filter_map(|line| parse_line(line.trim())).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        let (parsed, after) = parse_labels(inner)?;
        labels = parsed;
        rest = after;
    }
    // The value, then an optional timestamp.
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample { name: name.to_string(), labels, value })
}

/// `k="v",k2="v2"}` → the labels and what follows the `}`.
fn parse_labels(mut text: &str) -> Option<(BTreeMap<String, String>, &str)> {
    let mut labels = BTreeMap::new();
    loop {
        text = text.trim_start();
        if let Some(after) = text.strip_prefix('}') {
            return Some((labels, after));
        }
        let eq = text.find('=')?;
        let key = text[..eq].trim().to_string();
        let quoted = text[eq + 1..].trim_start().strip_prefix('"')?;
        let mut value = String::new();
        let mut end = None;
        let mut escaped = false;
        for (i, c) in quoted.char_indices() {
            match (escaped, c) {
                (true, 'n') => {
                    value.push('\n');
                    escaped = false;
                }
                (true, c) => {
                    value.push(c);
                    escaped = false;
                }
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = Some(i + 1);
                    break;
                }
                (false, c) => value.push(c),
            }
        }
        labels.insert(key, value);
        text = quoted[end?..].trim_start();
        text = text.strip_prefix(',').unwrap_or(text);
    }
}

/// Whether a sample is about the claim: `claim_uid` (ours) or
/// `dra_claim_namespace` and `dra_claim_name` (dcgm-exporter's).
fn is_of(sample: &Sample, claim: ClaimKey<'_>) -> bool {
    sample.label("claim_uid") == Some(claim.uid)
        || (sample.label("dra_claim_namespace") == Some(claim.namespace)
            && sample.label("dra_claim_name") == Some(claim.name))
}

/// The claim's utilization on the node whose samples these are.
pub fn of_claim(samples: &[Sample], claim: ClaimKey<'_>, node: &str) -> Utilization {
    let mut devices = BTreeMap::new();
    let mut seen = false;
    for sample in samples.iter().filter(|s| is_of(s, claim)) {
        if !DEVICE_PREFIXES.iter().any(|p| sample.name.starts_with(p)) {
            continue;
        }
        seen = true;
        if sample.name == NATIVE || sample.name == DCGM {
            let device = sample.label("device").filter(|_| sample.name == NATIVE).or(sample.label("dra_device_name"));
            if let Some(device) = device {
                devices.insert(device.to_string(), sample.value);
            }
        }
    }
    if !seen {
        return Utilization::Unavailable(format!(
            "the node agent on {node} reports no device of this claim (not prepared there yet)"
        ));
    }
    if devices.is_empty() {
        return Utilization::Unavailable(format!(
            "the node agent on {node} has no utilization for its devices (NVML gives none for MIG devices)"
        ));
    }
    #[allow(clippy::cast_precision_loss)] // a handful of devices
    let mean = devices.values().sum::<f64>() / devices.len() as f64;
    Utilization::Percent { mean, devices }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: ClaimKey<'static> = ClaimKey { namespace: "ml", name: "train", uid: "u-1" };

    #[test]
    fn lines_parse_with_escapes_timestamps_and_comments() {
        let samples = parse(
            "# HELP x y\n# TYPE x gauge\nx{a=\"1\",b=\"q\\\"uote\\\\\",c=\"line\\nbreak\"} 2.5 1700000000\nup 1\nbroken{a=1} 3\n\n",
        );
        assert_eq!(samples.len(), 2, "{samples:?}");
        assert_eq!(samples[0].label("b"), Some("q\"uote\\"));
        assert_eq!(samples[0].label("c"), Some("line\nbreak"));
        assert_eq!(samples[0].value, 2.5);
        assert_eq!((samples[1].name.as_str(), samples[1].value), ("up", 1.0));
    }

    #[test]
    fn a_claims_utilization_is_the_mean_of_its_devices() {
        let text = "\
gpu_dra_device_gpu_utilization_percent{device=\"gpu-0\",uuid=\"GPU-a\",claim_namespace=\"ml\",claim_name=\"train\",claim_uid=\"u-1\",pods=\"p\"} 30.0
gpu_dra_device_gpu_utilization_percent{device=\"gpu-1\",uuid=\"GPU-b\",claim_namespace=\"ml\",claim_name=\"train\",claim_uid=\"u-1\",pods=\"p\"} 50.0
gpu_dra_device_gpu_utilization_percent{device=\"gpu-2\",uuid=\"GPU-c\",claim_namespace=\"ml\",claim_name=\"other\",claim_uid=\"u-2\",pods=\"q\"} 99.0
gpu_dra_device_gpu_utilization_percent{device=\"gpu-3\",uuid=\"GPU-d\"} 0.0
";
        let got = of_claim(&parse(text), KEY, "node-a");
        let Utilization::Percent { mean, devices } = &got else { panic!("{got:?}") };
        assert_eq!(*mean, 40.0);
        assert_eq!(devices.keys().collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
        assert_eq!(got.cell(), "40%");
    }

    #[test]
    fn dcgm_naming_counts_a_device_once_whatever_its_pods() {
        let text = "\
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",pod=\"p0\",namespace=\"ml\",dra_claim_name=\"train\",dra_claim_namespace=\"ml\",dra_device_name=\"gpu-0\"} 20
DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-a\",pod=\"p1\",namespace=\"ml\",dra_claim_name=\"train\",dra_claim_namespace=\"ml\",dra_device_name=\"gpu-0\"} 20
DCGM_FI_DEV_GPU_UTIL{gpu=\"1\",UUID=\"GPU-b\",pod=\"p0\",namespace=\"ml\",dra_claim_name=\"train\",dra_claim_namespace=\"ml\",dra_device_name=\"gpu-1\"} 80
";
        assert_eq!(of_claim(&parse(text), KEY, "node-a").cell(), "50%");
    }

    #[test]
    fn a_mig_claim_or_an_unprepared_one_has_a_reason_not_a_zero() {
        let mig = "gpu_dra_device_memory_used_bytes{device=\"gpu-0-mig-1g10gb-19-6\",claim_uid=\"u-1\"} 1073741824\n";
        let got = of_claim(&parse(mig), KEY, "node-a");
        assert!(matches!(&got, Utilization::Unavailable(r) if r.contains("MIG")), "{got:?}");
        assert_eq!(got.cell(), "-");
        let got = of_claim(&parse("gpu_dra_prepared_claims 0\n"), KEY, "node-a");
        assert!(matches!(&got, Utilization::Unavailable(r) if r.contains("not prepared")), "{got:?}");
    }
}
