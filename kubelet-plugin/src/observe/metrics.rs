//! The plugin's Prometheus metrics. One [`Metrics`] per process, shared as
//! `Arc<Metrics>`; components call its methods and `/metrics` encodes it.
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `gpu_dra_requests_total` | counter | `operation`, `api` (kubelet gRPC calls) |
//! | `gpu_dra_request_duration_seconds` | histogram | `operation` (one gRPC call) |
//! | `gpu_dra_mig_nvml_duration_seconds` | histogram | `operation` (NVML's part of one dynamic-MIG claim: instances made or destroyed, MIG mode switched) |
//! | `gpu_dra_claims_total` | counter | `operation`, `result` (one per claim in a call) |
//! | `gpu_dra_errors_total` | counter | `kind` |
//! | `gpu_dra_published_devices` | gauge | |
//! | `gpu_dra_slice_generation` | gauge | |
//! | `gpu_dra_registered` | gauge | 1 once the kubelet confirmed registration |
//! | `gpu_dra_invalid_objects_total` | counter | `kind` (watched objects found undecodable, once each; ignored) |
//! | `gpu_dra_claim_series_dropped_total` | counter | claims refused per-claim telemetry series by `--max-claim-series` (once each time one goes without) |
//! | `gpu_dra_slice_writes_total` | counter | `op` (`create`, `update`, `delete`: ResourceSlice writes sent) |
//! | `gpu_dra_slice_fields_not_served` | gauge | `field` (1: the API server drops it, its gate is off) |
//!
//! With telemetry on, the device and claim families of
//! [`crate::observe::telemetry::families`] are encoded beside them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::observe::telemetry::TelemetryStore;
use crate::publish::publisher::{PublishError, PublishObserver, SliceWrite};
use gpu_dra_driver::slices::served::GatedField;

/// What the kubelet asked for.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Operation {
    Prepare,
    Unprepare,
}

/// Which kubelet API version served a call.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ApiVersion {
    V1,
    V1beta1,
}

/// How one claim of a call ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    Error,
}

/// Kinds of errors counted in `gpu_dra_errors_total`. Kept to a fixed set
/// so that the label's cardinality stays bounded.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum ErrorKind {
    /// A claim's prepare failed (its error went back to the kubelet).
    Prepare,
    /// A claim's unprepare failed.
    Unprepare,
    /// A claim in the request was malformed (UID, name, namespace).
    InvalidRequest,
    /// Reading a ResourceClaim from the API server failed.
    ClaimLookup,
    /// An opaque configuration could not be decoded or applied.
    Config,
    /// Reading or writing the checkpoint failed.
    Checkpoint,
    /// Writing or deleting a CDI spec failed.
    Cdi,
    /// Publishing ResourceSlices failed (retried).
    Publish,
    /// The kubelet reported a failed registration.
    Registration,
    /// The health stream to the kubelet failed.
    Health,
    /// A claim's call gave up at the kubelet's deadline (waiting for a lock).
    Deadline,
    /// Writing a claim's `status.devices` failed (its call still answered).
    ClaimStatus,
}

/// Label values in Prometheus' lower-case style.
macro_rules! label_values {
    ($($ty:ty { $($variant:ident => $text:literal),+ $(,)? })+) => {$(
        impl $ty {
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }
        impl EncodeLabelValue for $ty {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
                fmt::Write::write_str(encoder, self.as_str())
            }
        }
    )+};
}

label_values! {
    Operation { Prepare => "prepare", Unprepare => "unprepare" }
    ApiVersion { V1 => "v1", V1beta1 => "v1beta1" }
    Outcome { Ok => "ok", Error => "error" }
    ErrorKind {
        Prepare => "prepare", Unprepare => "unprepare", InvalidRequest => "invalid_request",
        ClaimLookup => "claim_lookup", Config => "config", Checkpoint => "checkpoint", Cdi => "cdi",
        Publish => "publish", Registration => "registration", Health => "health", Deadline => "deadline",
        ClaimStatus => "claim_status",
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    operation: Operation,
    api: ApiVersion,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    operation: Operation,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClaimLabels {
    operation: Operation,
    result: Outcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: ErrorKind,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SliceWriteLabels {
    op: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FieldLabels {
    field: &'static str,
}

type HistogramFamily = Family<OperationLabels, Histogram, fn() -> Histogram>;

/// Latency buckets from 0.5 ms to ~16 s: a prepare is a few fsyncs when all
/// is well and up to the kubelet's 45 s deadline when the API server is slow.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// The registry and every metric in it.
pub struct Metrics {
    registry: Registry,
    requests: Family<CallLabels, Counter>,
    duration: HistogramFamily,
    mig_nvml: HistogramFamily,
    claims: Family<ClaimLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    published_devices: Gauge<i64, AtomicI64>,
    slice_generation: Gauge<i64, AtomicI64>,
    registered: Gauge<i64, AtomicI64>,
    invalid_objects: Family<KindLabels, Counter>,
    claim_series_dropped: Counter,
    slice_writes: Family<SliceWriteLabels, Counter>,
    fields_not_served: Family<FieldLabels, Gauge<i64, AtomicI64>>,
}

impl fmt::Debug for Metrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Self::build(None)
    }

    /// With the telemetry families of `store` (their names are complete:
    /// `gpu_dra_device_*` or dcgm-exporter's `DCGM_FI_DEV_*`).
    pub fn with_telemetry(store: Arc<TelemetryStore>) -> Self {
        Self::build(Some(store))
    }

    fn build(telemetry: Option<Arc<TelemetryStore>>) -> Self {
        let mut root = Registry::default();
        let registry = root.sub_registry_with_prefix("gpu_dra");
        let requests = Family::<CallLabels, Counter>::default();
        registry.register("requests", "Kubelet gRPC calls by operation and API version", requests.clone());
        let duration: HistogramFamily = Family::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "request_duration",
            "Duration of one NodePrepareResources or NodeUnprepareResources call",
            Unit::Seconds,
            duration.clone(),
        );
        let mig_nvml: HistogramFamily = Family::new_with_constructor(latency_histogram);
        registry.register_with_unit(
            "mig_nvml_duration",
            "Time NVML took to make or destroy one claim's dynamic MIG instances (and switch MIG mode)",
            Unit::Seconds,
            mig_nvml.clone(),
        );
        let claims = Family::<ClaimLabels, Counter>::default();
        registry.register("claims", "Claims prepared or unprepared, by result", claims.clone());
        let errors = Family::<ErrorLabels, Counter>::default();
        registry.register("errors", "Errors by kind", errors.clone());
        let published_devices = Gauge::<i64, AtomicI64>::default();
        registry.register("published_devices", "Devices in the published ResourceSlices", published_devices.clone());
        let slice_generation = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "slice_generation",
            "Pool generation of the published ResourceSlices",
            slice_generation.clone(),
        );
        let registered = Gauge::<i64, AtomicI64>::default();
        registry.register("registered", "1 once the kubelet confirmed the plugin's registration", registered.clone());
        let invalid_objects = Family::<KindLabels, Counter>::default();
        registry.register(
            "invalid_objects",
            "Watched objects found undecodable (once each), which the plugin ignores",
            invalid_objects.clone(),
        );
        let claim_series_dropped = Counter::default();
        registry.register(
            "claim_series_dropped",
            "Prepared claims refused per-claim telemetry series by --max-claim-series (once each time one goes without)",
            claim_series_dropped.clone(),
        );
        let slice_writes = Family::<SliceWriteLabels, Counter>::default();
        registry.register("slice_writes", "ResourceSlice writes sent to the API server, by op", slice_writes.clone());
        let fields_not_served = Family::<FieldLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "slice_fields_not_served",
            "1 for a ResourceSlice field the API server drops (its feature gate is off)",
            fields_not_served.clone(),
        );
        if let Some(store) = telemetry {
            root.register_collector(Box::new(store));
        }
        Self {
            registry: root,
            requests,
            duration,
            mig_nvml,
            claims,
            errors,
            published_devices,
            slice_generation,
            registered,
            invalid_objects,
            claim_series_dropped,
            slice_writes,
            fields_not_served,
        }
    }

    /// A watched object of `kind` was found undecodable.
    pub fn invalid_object(&self, kind: &str) {
        self.invalid_objects.get_or_create(&KindLabels { kind: kind.to_owned() }).inc();
    }

    /// The counter of claims refused per-claim series (the telemetry
    /// task adds to it).
    pub fn claim_series_dropped(&self) -> Counter {
        self.claim_series_dropped.clone()
    }

    /// One kubelet call took `elapsed`.
    pub fn request(&self, operation: Operation, api: ApiVersion, elapsed: Duration) {
        self.requests.get_or_create(&CallLabels { operation, api }).inc();
        self.duration.get_or_create(&OperationLabels { operation }).observe(elapsed.as_secs_f64());
    }

    /// NVML took `elapsed` to make (prepare) or destroy (unprepare) one
    /// claim's dynamic MIG instances: the GPU's share of a prepare, told
    /// apart from the driver's own.
    pub fn mig_nvml(&self, operation: Operation, elapsed: Duration) {
        self.mig_nvml.get_or_create(&OperationLabels { operation }).observe(elapsed.as_secs_f64());
    }

    /// One claim of a call ended with `result`; a failure also counts as an
    /// error of the operation's kind.
    pub fn claim(&self, operation: Operation, result: Outcome) {
        self.claims.get_or_create(&ClaimLabels { operation, result }).inc();
        if result == Outcome::Error {
            let kind = match operation {
                Operation::Prepare => ErrorKind::Prepare,
                Operation::Unprepare => ErrorKind::Unprepare,
            };
            self.error(kind);
        }
    }

    /// Counts one error of `kind`.
    pub fn error(&self, kind: ErrorKind) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    pub fn set_published(&self, devices: usize, generation: i64) {
        self.published_devices.set(i64::try_from(devices).unwrap_or(i64::MAX));
        self.slice_generation.set(generation);
    }

    pub fn set_registered(&self, registered: bool) {
        self.registered.set(i64::from(registered));
    }

    /// The OpenMetrics text exposition of every metric.
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl gpu_dra_driver::service::http::MetricsText for Metrics {
    fn encode(&self) -> Result<String, fmt::Error> {
        Metrics::encode(self)
    }
}

impl PublishObserver for Metrics {
    fn published(&self, devices: usize, generation: i64) {
        self.set_published(devices, generation);
    }

    fn failed(&self, _error: &PublishError) {
        self.error(ErrorKind::Publish);
    }

    fn wrote(&self, op: SliceWrite) {
        self.slice_writes.get_or_create(&SliceWriteLabels { op: op.as_str() }).inc();
    }

    fn field_served(&self, field: GatedField, served: bool) {
        self.fields_not_served.get_or_create(&FieldLabels { field: field.name() }).set(i64::from(!served));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix} in\n{text}"))
    }

    #[test]
    fn calls_claims_and_errors_are_counted() {
        let m = Metrics::new();
        m.request(Operation::Prepare, ApiVersion::V1, Duration::from_millis(3));
        m.request(Operation::Prepare, ApiVersion::V1beta1, Duration::from_millis(3));
        m.claim(Operation::Prepare, Outcome::Ok);
        m.claim(Operation::Prepare, Outcome::Error);
        m.claim(Operation::Unprepare, Outcome::Ok);
        m.error(ErrorKind::Checkpoint);
        m.set_published(8, 3);
        m.set_registered(true);
        m.mig_nvml(Operation::Prepare, Duration::from_millis(4));
        let text = m.encode().unwrap();
        assert!(text.contains("gpu_dra_mig_nvml_duration_seconds_count{operation=\"prepare\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_mig_nvml_duration_seconds_sum{operation=\"prepare\"} 0.004"), "{text}");
        assert_eq!(
            line(&text, "gpu_dra_requests_total{operation=\"prepare\",api=\"v1\"}"),
            "gpu_dra_requests_total{operation=\"prepare\",api=\"v1\"} 1"
        );
        assert!(text.contains("gpu_dra_claims_total{operation=\"prepare\",result=\"error\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_claims_total{operation=\"unprepare\",result=\"ok\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_errors_total{kind=\"prepare\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_errors_total{kind=\"checkpoint\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_request_duration_seconds_count{operation=\"prepare\"} 2"), "{text}");
        assert!(text.contains("gpu_dra_published_devices 8"), "{text}");
        assert!(text.contains("gpu_dra_slice_generation 3"), "{text}");
        assert!(text.contains("gpu_dra_registered 1"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn telemetry_families_are_encoded_beside_the_plugins_own() {
        use crate::observe::telemetry::{Naming, families::metric_names};
        for naming in [Naming::Native, Naming::Dcgm] {
            let store = Arc::new(TelemetryStore::new(naming, "node-a", "gpu.nvidia.com"));
            let text = Metrics::with_telemetry(store).encode().unwrap();
            assert!(text.contains("# TYPE gpu_dra_registered gauge"), "{text}");
            for name in metric_names(naming) {
                assert!(text.contains(&format!("# TYPE {name} gauge")), "{name} missing:\n{text}");
            }
            assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        }
    }

    #[test]
    fn the_publisher_reports_through_the_observer() {
        let m = Metrics::new();
        PublishObserver::published(&m, 4, 2);
        m.wrote(SliceWrite::Create);
        m.wrote(SliceWrite::Update);
        m.wrote(SliceWrite::Update);
        m.field_served(GatedField::Taints, false);
        m.field_served(GatedField::AllowMultipleAllocations, false);
        m.field_served(GatedField::AllowMultipleAllocations, true);
        let text = m.encode().unwrap();
        assert!(text.contains("gpu_dra_published_devices 4"), "{text}");
        assert!(text.contains("gpu_dra_slice_writes_total{op=\"update\"} 2"), "{text}");
        assert!(text.contains("gpu_dra_slice_writes_total{op=\"create\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_slice_fields_not_served{field=\"taints\"} 1"), "{text}");
        assert!(text.contains("gpu_dra_slice_fields_not_served{field=\"allowMultipleAllocations\"} 0"), "{text}");
    }
}
