//! Snapshot → metric families, pure. Two namings of the same readings:
//! ours (`gpu_dra_device_*`, base units, DRA names in the labels) and
//! dcgm-exporter's (`DCGM_FI_DEV_*` with its labels and units), so that
//! NVIDIA's Grafana dashboard for dcgm-exporter works unchanged.
//!
//! A device a claim holds has one series per holder (ours) or per pod
//! (dcgm-exporter's, which labels each series with one pod); a device no
//! claim holds has one series without claim labels, and so has one whose
//! claims were all refused series by the cap ([`super::series_cap`]).

use std::collections::BTreeSet;

use super::readings::{ClaimHolder, DeviceReading, DeviceSample, Snapshot};

/// Which metric names and labels device readings get.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Naming {
    /// `gpu_dra_device_*` in base units (bytes, watts, hertz).
    #[default]
    Native,
    /// dcgm-exporter's `DCGM_FI_DEV_*` names, units and labels.
    Dcgm,
}

/// What families need besides the snapshot.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    pub naming: Naming,
    /// The node's name (dcgm-exporter's `Hostname` label).
    pub hostname: &'a str,
    /// The DRA driver name (dcgm-exporter's `dra_driver_name`).
    pub driver: &'a str,
}

/// One metric family: all gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// One reading: its names, help and how to get it from a sample (in the
/// native unit; `dcgm_scale` converts to dcgm-exporter's).
struct Field {
    native: &'static str,
    dcgm: &'static str,
    help: &'static str,
    read: fn(&DeviceSample) -> Option<f64>,
    dcgm_scale: f64,
}

const MIB: f64 = 1024.0 * 1024.0;

#[allow(clippy::cast_precision_loss)] // counts and bytes far below 2^53
fn as_f64(v: Option<u64>) -> Option<f64> {
    v.map(|v| v as f64)
}

const FIELDS: &[Field] = &[
    Field {
        native: "gpu_dra_device_gpu_utilization_percent",
        dcgm: "DCGM_FI_DEV_GPU_UTIL",
        help: "Percent of the last sample period a kernel ran on the device (NVML; absent for MIG devices)",
        read: |s| s.gpu_utilization_percent,
        dcgm_scale: 1.0,
    },
    Field {
        native: "gpu_dra_device_memory_utilization_percent",
        dcgm: "DCGM_FI_DEV_MEM_COPY_UTIL",
        help: "Percent of the last sample period device memory was read or written (NVML; absent for MIG devices)",
        read: |s| s.memory_utilization_percent,
        dcgm_scale: 1.0,
    },
    Field {
        native: "gpu_dra_device_memory_used_bytes",
        dcgm: "DCGM_FI_DEV_FB_USED",
        help: "Device memory in use (dcgm naming: MiB)",
        read: |s| as_f64(s.memory_used_bytes),
        dcgm_scale: 1.0 / MIB,
    },
    Field {
        native: "gpu_dra_device_memory_total_bytes",
        dcgm: "DCGM_FI_DEV_FB_TOTAL",
        help: "Device memory in all (dcgm naming: MiB)",
        read: |s| as_f64(s.memory_total_bytes),
        dcgm_scale: 1.0 / MIB,
    },
    Field {
        native: "gpu_dra_device_memory_free_bytes",
        dcgm: "DCGM_FI_DEV_FB_FREE",
        help: "Device memory free (dcgm naming: MiB)",
        read: |s| match (s.memory_total_bytes, s.memory_used_bytes) {
            (Some(total), Some(used)) => as_f64(Some(total.saturating_sub(used))),
            _ => None,
        },
        dcgm_scale: 1.0 / MIB,
    },
    Field {
        native: "gpu_dra_device_power_watts",
        dcgm: "DCGM_FI_DEV_POWER_USAGE",
        help: "Power draw of the board (absent for MIG devices)",
        read: |s| s.power_watts,
        dcgm_scale: 1.0,
    },
    Field {
        native: "gpu_dra_device_temperature_celsius",
        dcgm: "DCGM_FI_DEV_GPU_TEMP",
        help: "GPU core temperature (absent for MIG devices)",
        read: |s| s.temperature_celsius,
        dcgm_scale: 1.0,
    },
    Field {
        native: "gpu_dra_device_sm_clock_hertz",
        dcgm: "DCGM_FI_DEV_SM_CLOCK",
        help: "Streaming-multiprocessor clock (dcgm naming: MHz)",
        read: |s| s.sm_clock_mhz.map(|mhz| mhz * 1e6),
        dcgm_scale: 1e-6,
    },
    Field {
        native: "gpu_dra_device_ecc_corrected_errors",
        dcgm: "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        help: "Corrected ECC errors since the driver loaded (absent without ECC)",
        read: |s| as_f64(s.ecc_corrected_errors),
        dcgm_scale: 1.0,
    },
    Field {
        native: "gpu_dra_device_ecc_uncorrected_errors",
        dcgm: "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        help: "Uncorrected ECC errors since the driver loaded (absent without ECC)",
        read: |s| as_f64(s.ecc_uncorrected_errors),
        dcgm_scale: 1.0,
    },
];

const XID_NATIVE: &str = "gpu_dra_device_xid_errors";
const XID_NATIVE_HELP: &str = "Distinct critical XIDs the driver reported for the device since the plugin started";
const XID_DCGM: &str = "DCGM_FI_DEV_XID_ERRORS";
const XID_DCGM_HELP: &str = "The last critical XID the driver reported for the device";

/// Node-level families, the same in both namings.
const PREPARED_CLAIMS: &str = "gpu_dra_prepared_claims";
const ALLOCATED_DEVICES: &str = "gpu_dra_allocated_devices";
const FAULTY_DEVICES: &str = "gpu_dra_faulty_devices";
const IDLE_CLAIMS: &str = "gpu_dra_idle_claims";
const CLAIM_IDLE: &str = "gpu_dra_claim_idle_utilization_percent";
const SAMPLE_SECONDS: &str = "gpu_dra_telemetry_sample_seconds";

/// Every family name `families` can emit with `naming`, in order.
pub fn metric_names(naming: Naming) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = FIELDS.iter().map(|f| pick(naming, f.native, f.dcgm)).collect();
    names.push(pick(naming, XID_NATIVE, XID_DCGM));
    names.extend([PREPARED_CLAIMS, ALLOCATED_DEVICES, FAULTY_DEVICES, IDLE_CLAIMS, CLAIM_IDLE, SAMPLE_SECONDS]);
    names
}

fn pick(naming: Naming, native: &'static str, dcgm: &'static str) -> &'static str {
    match naming {
        Naming::Native => native,
        Naming::Dcgm => dcgm,
    }
}

/// The families of `snapshot`: every name of [`metric_names`], each with
/// the rows it has (a family with no rows still names itself).
pub fn families(snapshot: &Snapshot, cx: &Context<'_>) -> Vec<Family> {
    let series: Vec<(&DeviceReading, Vec<(String, String)>)> = snapshot
        .devices
        .iter()
        .flat_map(|d| series_labels(d, &snapshot.unlabelled_claims, cx).into_iter().map(move |l| (d, l)))
        .collect();
    let mut out: Vec<Family> = FIELDS
        .iter()
        .map(|field| {
            let scale = if cx.naming == Naming::Dcgm { field.dcgm_scale } else { 1.0 };
            let rows = series
                .iter()
                .filter_map(|(d, labels)| {
                    (field.read)(&d.sample).map(|v| Row { labels: labels.clone(), value: v * scale })
                })
                .collect();
            Family { name: pick(cx.naming, field.native, field.dcgm), help: field.help, rows }
        })
        .collect();
    out.push(xid_family(&series, cx.naming));
    out.extend(node_families(snapshot));
    out
}

#[allow(clippy::cast_precision_loss)]
fn xid_family(series: &[(&DeviceReading, Vec<(String, String)>)], naming: Naming) -> Family {
    let rows = series
        .iter()
        .map(|(d, labels)| {
            let value = match naming {
                Naming::Native => d.xids.len() as f64,
                Naming::Dcgm => d.xids.last().copied().map_or(0.0, f64::from),
            };
            Row { labels: labels.clone(), value }
        })
        .collect();
    match naming {
        Naming::Native => Family { name: XID_NATIVE, help: XID_NATIVE_HELP, rows },
        Naming::Dcgm => Family { name: XID_DCGM, help: XID_DCGM_HELP, rows },
    }
}

#[allow(clippy::cast_precision_loss)]
fn node_families(snapshot: &Snapshot) -> Vec<Family> {
    let count = |n: usize| vec![Row { labels: vec![], value: n as f64 }];
    let allocated = snapshot.devices.iter().filter(|d| !d.holders.is_empty()).count();
    let faulty = snapshot.devices.iter().filter(|d| d.faulty).count();
    let idle_rows = snapshot
        .idle
        .iter()
        .filter(|r| !snapshot.unlabelled_claims.contains(&r.claim.uid))
        .map(|r| Row {
            labels: vec![
                ("claim_namespace".into(), r.claim.namespace.clone()),
                ("claim_name".into(), r.claim.name.clone()),
                ("claim_uid".into(), r.claim.uid.clone()),
                ("pods".into(), r.claim.pod_names()),
                ("devices".into(), r.devices.join(",")),
                ("window_seconds".into(), r.window_seconds.to_string()),
            ],
            value: r.average_percent,
        })
        .collect();
    vec![
        Family { name: PREPARED_CLAIMS, help: "Claims prepared on this node", rows: count(snapshot.prepared_claims) },
        Family {
            name: ALLOCATED_DEVICES,
            help: "Published devices that a prepared claim holds",
            rows: count(allocated),
        },
        Family {
            name: FAULTY_DEVICES,
            help: "Published devices with a fault (XID, lost); the publisher taints them",
            rows: count(faulty),
        },
        Family {
            name: IDLE_CLAIMS,
            help: "Prepared claims whose devices stayed under the idle threshold for the idle window",
            rows: count(snapshot.idle.len()),
        },
        Family {
            name: CLAIM_IDLE,
            help: "An idle claim's average GPU utilization over the idle window (present only while it is idle)",
            rows: idle_rows,
        },
        Family {
            name: SAMPLE_SECONDS,
            help: "Duration of the last NVML sampling pass over every device",
            rows: snapshot.sample_seconds.map(|s| vec![Row { labels: vec![], value: s }]).unwrap_or_default(),
        },
    ]
}

/// The label sets of a device's series (none for the claims in
/// `unlabelled`).
fn series_labels(d: &DeviceReading, unlabelled: &BTreeSet<String>, cx: &Context<'_>) -> Vec<Vec<(String, String)>> {
    let holders: Vec<&ClaimHolder> =
        d.holders.iter().map(AsRef::as_ref).filter(|h| !unlabelled.contains(&h.uid)).collect();
    match cx.naming {
        Naming::Native => native_labels(d, &holders),
        Naming::Dcgm => dcgm_labels(d, &holders, cx),
    }
}

fn native_labels(d: &DeviceReading, holders: &[&ClaimHolder]) -> Vec<Vec<(String, String)>> {
    let id = &d.identity;
    let mut base = vec![
        ("device".to_string(), id.device.clone()),
        ("uuid".to_string(), id.uuid.clone()),
        ("gpu".to_string(), id.gpu_minor.to_string()),
        ("model".to_string(), id.model.clone()),
    ];
    if let Some(mig) = &id.mig {
        base.push(("mig_profile".into(), mig.profile.clone()));
        base.push(("parent_uuid".into(), mig.parent_uuid.clone()));
    }
    if holders.is_empty() {
        return vec![base];
    }
    holders
        .iter()
        .map(|h| {
            let mut labels = base.clone();
            labels.extend(claim_labels(h));
            labels
        })
        .collect()
}

fn claim_labels(h: &ClaimHolder) -> [(String, String); 4] {
    [
        ("claim_namespace".into(), h.namespace.clone()),
        ("claim_name".into(), h.name.clone()),
        ("claim_uid".into(), h.uid.clone()),
        ("pods".into(), h.pod_names()),
    ]
}

/// dcgm-exporter's labels: `gpu`, `UUID` (the parent GPU's for a MIG
/// device), `pci_bus_id`, `device` (`nvidia<minor>`), `modelName`,
/// `Hostname`, `GPU_I_PROFILE`/`GPU_I_ID` for MIG; per pod `pod`,
/// `namespace` and its DRA mode's `dra_*` labels. (`container`: a claim
/// names pods, not containers, so it is left out.)
fn dcgm_labels(d: &DeviceReading, holders: &[&ClaimHolder], cx: &Context<'_>) -> Vec<Vec<(String, String)>> {
    let id = &d.identity;
    let gpu_uuid = id.mig.as_ref().map_or(&id.uuid, |m| &m.parent_uuid);
    let mut base = vec![("gpu".to_string(), id.gpu_minor.to_string()), ("UUID".to_string(), gpu_uuid.clone())];
    if let Some(bus) = &id.pci_bus_id {
        base.push(("pci_bus_id".into(), bus.clone()));
    }
    base.extend([
        ("device".to_string(), format!("nvidia{}", id.gpu_minor)),
        ("modelName".to_string(), id.model.clone()),
    ]);
    if let Some(mig) = &id.mig {
        base.push(("GPU_I_PROFILE".into(), mig.profile.clone()));
        base.push(("GPU_I_ID".into(), mig.gpu_instance_id.to_string()));
    }
    base.push(("Hostname".into(), cx.hostname.to_string()));
    let mut out = Vec::new();
    for h in holders {
        let mut dra = vec![
            ("dra_claim_name".to_string(), h.name.clone()),
            ("dra_claim_namespace".to_string(), h.namespace.clone()),
            ("dra_device_name".to_string(), id.device.clone()),
            ("dra_driver_name".to_string(), cx.driver.to_string()),
            ("dra_pool_name".to_string(), cx.hostname.to_string()),
        ];
        if let Some(mig) = &id.mig {
            dra.push(("dra_mig_device_uuid".into(), id.uuid.clone()));
            dra.push(("dra_mig_profile".into(), mig.profile.clone()));
        }
        if h.pods.is_empty() {
            let mut labels = base.clone();
            labels.extend(dra.iter().cloned());
            out.push(labels);
        }
        for pod in &h.pods {
            let mut labels = base.clone();
            labels.push(("pod".into(), pod.name.clone()));
            labels.push(("namespace".into(), h.namespace.clone()));
            labels.extend(dra.iter().cloned());
            out.push(labels);
        }
    }
    if out.is_empty() {
        out.push(base);
    }
    out
}

#[cfg(test)]
mod tests;
