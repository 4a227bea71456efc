//! Fault injection for the crash tests: with `GPU_DRA_KILL_AT=<step>` (or
//! `<step>:<n>`, the n-th time) in its environment, the plugin sends
//! itself SIGKILL when a prepare or unprepare reaches that step, so a test
//! can stop it exactly between two side effects. Unset (always, outside
//! tests) it costs one atomic load.
//!
//! One list of steps for every prepare that has side effects beyond its
//! record and spec: dynamic MIG (`after-…`), ComputeDomains (`cd-…`) and
//! VFIO passthrough (`vfio-…`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// A point between two side effects of a prepare or unprepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Dynamic MIG: the `PrepareStarted` record naming the placements is written.
    AfterRecord,
    /// Dynamic MIG: a GPU instance was created.
    AfterGpuInstance,
    /// Dynamic MIG: its compute instance was created.
    AfterComputeInstance,
    /// Dynamic MIG: the CDI spec is written; the record still says started.
    AfterSpec,
    /// Dynamic MIG unprepare: a compute instance was destroyed.
    AfterComputeDestroyed,
    /// Dynamic MIG unprepare: a GPU instance was destroyed.
    AfterGpuDestroyed,
    /// Dynamic MIG: MIG mode was switched (off at prepare, on at unprepare).
    AfterMigMode,
    /// Unprepare (every claim but a ComputeDomain's): the claim's spec is
    /// removed, its record not yet.
    AfterSpecRemoved,
    /// ComputeDomain prepare: the `PrepareStarted` record is written.
    DomainRecorded,
    /// ComputeDomain prepare: the daemon's configuration and peer list are
    /// written; no daemon runs yet.
    DomainDaemonConfigured,
    /// ComputeDomain prepare: `nvidia-imex` was started.
    DomainDaemonStarted,
    /// ComputeDomain prepare: the channel's device node was created.
    DomainNodeCreated,
    /// ComputeDomain prepare: the CDI spec is written; the record still says started.
    DomainSpecWritten,
    /// ComputeDomain prepare: the record says completed; no answer sent yet.
    DomainCompleted,
    /// ComputeDomain unprepare: the claim's record is removed, its spec not yet.
    DomainUnrecorded,
    /// ComputeDomain unprepare: the claim's spec is removed; the daemon and
    /// device nodes no claim needs are not yet.
    DomainSpecRemoved,
    /// ComputeDomain unprepare: the daemon was stopped; its directory remains.
    DomainDaemonStopped,
    /// VFIO prepare: the `PrepareStarted` record naming the group is written.
    VfioRecorded,
    /// VFIO prepare: a device's `driver_override` says `vfio-pci`.
    VfioOverride,
    /// VFIO prepare: a device was unbound from its driver.
    VfioUnbound,
    /// VFIO prepare: `drivers_probe` was written for a device.
    VfioProbed,
    /// VFIO prepare: the group is bound to `vfio-pci`; no spec yet.
    VfioBound,
    /// VFIO give-back: a device was unbound from `vfio-pci`.
    VfioReleased,
}

impl Step {
    pub const ALL: [Step; 23] = [
        Step::AfterRecord,
        Step::AfterGpuInstance,
        Step::AfterComputeInstance,
        Step::AfterSpec,
        Step::AfterComputeDestroyed,
        Step::AfterGpuDestroyed,
        Step::AfterMigMode,
        Step::AfterSpecRemoved,
        Step::DomainRecorded,
        Step::DomainDaemonConfigured,
        Step::DomainDaemonStarted,
        Step::DomainNodeCreated,
        Step::DomainSpecWritten,
        Step::DomainCompleted,
        Step::DomainUnrecorded,
        Step::DomainSpecRemoved,
        Step::DomainDaemonStopped,
        Step::VfioRecorded,
        Step::VfioOverride,
        Step::VfioUnbound,
        Step::VfioProbed,
        Step::VfioBound,
        Step::VfioReleased,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Step::AfterRecord => "after-record",
            Step::AfterGpuInstance => "after-gpu-instance",
            Step::AfterComputeInstance => "after-compute-instance",
            Step::AfterSpec => "after-spec",
            Step::AfterComputeDestroyed => "after-compute-destroyed",
            Step::AfterGpuDestroyed => "after-gpu-destroyed",
            Step::AfterMigMode => "after-mig-mode",
            Step::AfterSpecRemoved => "after-spec-removed",
            Step::DomainRecorded => "cd-recorded",
            Step::DomainDaemonConfigured => "cd-daemon-configured",
            Step::DomainDaemonStarted => "cd-daemon-started",
            Step::DomainNodeCreated => "cd-node-created",
            Step::DomainSpecWritten => "cd-spec-written",
            Step::DomainCompleted => "cd-completed",
            Step::DomainUnrecorded => "cd-unrecorded",
            Step::DomainSpecRemoved => "cd-spec-removed",
            Step::DomainDaemonStopped => "cd-daemon-stopped",
            Step::VfioRecorded => "vfio-recorded",
            Step::VfioOverride => "vfio-override",
            Step::VfioUnbound => "vfio-unbound",
            Step::VfioProbed => "vfio-probed",
            Step::VfioBound => "vfio-bound",
            Step::VfioReleased => "vfio-released",
        }
    }
}

/// The environment variable naming the kill point.
pub const ENV: &str = "GPU_DRA_KILL_AT";

fn target() -> Option<(Step, u32)> {
    static TARGET: OnceLock<Option<(Step, u32)>> = OnceLock::new();
    *TARGET.get_or_init(|| parse(&std::env::var(ENV).ok()?))
}

fn parse(value: &str) -> Option<(Step, u32)> {
    let (name, nth) = match value.split_once(':') {
        Some((name, n)) => (name, n.parse().ok()?),
        None => (value, 1),
    };
    Step::ALL.into_iter().find(|s| s.name() == name).map(|s| (s, nth))
}

/// Kills the process if the test asked for this step (the n-th time).
pub fn reached(step: Step) {
    static SEEN: AtomicU32 = AtomicU32::new(0);
    let Some((wanted, nth)) = target() else { return };
    if wanted == step && SEEN.fetch_add(1, Ordering::SeqCst) + 1 == nth {
        tracing::warn!(step = step.name(), "{ENV}: killing the plugin here");
        let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_points_parse() {
        assert_eq!(parse("after-spec"), Some((Step::AfterSpec, 1)));
        assert_eq!(parse("after-gpu-instance:3"), Some((Step::AfterGpuInstance, 3)));
        assert_eq!(parse("cd-daemon-started:2"), Some((Step::DomainDaemonStarted, 2)));
        assert_eq!(parse("elsewhere"), None);
        assert_eq!(parse("after-spec:x"), None);
        for step in Step::ALL {
            assert_eq!(parse(step.name()), Some((step, 1)));
        }
        let mut names: Vec<&str> = Step::ALL.iter().map(|s| s.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Step::ALL.len(), "names are unique");
    }
}
