//! Fault injection for the crash tests: with `GPU_DRA_KILL_AT=<step>` (or
//! `<step>:<n>`, the n-th time) in its environment, the plugin sends
//! itself SIGKILL when a dynamic MIG prepare or unprepare reaches that
//! step, so a test can stop it exactly between two side effects. Unset
//! (always, outside tests) it costs one atomic load.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// A point between two side effects of a dynamic MIG prepare or unprepare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The `PrepareStarted` record naming the placements is written.
    AfterRecord,
    /// A GPU instance was created.
    AfterGpuInstance,
    /// Its compute instance was created.
    AfterComputeInstance,
    /// The CDI spec is written; the record still says started.
    AfterSpec,
    /// Unprepare: a compute instance was destroyed.
    AfterComputeDestroyed,
    /// Unprepare: a GPU instance was destroyed.
    AfterGpuDestroyed,
    /// MIG mode was switched (off at prepare, on at unprepare).
    AfterMigMode,
}

impl Step {
    pub const ALL: [Step; 7] = [
        Step::AfterRecord,
        Step::AfterGpuInstance,
        Step::AfterComputeInstance,
        Step::AfterSpec,
        Step::AfterComputeDestroyed,
        Step::AfterGpuDestroyed,
        Step::AfterMigMode,
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
        assert_eq!(parse("elsewhere"), None);
        assert_eq!(parse("after-spec:x"), None);
        for step in Step::ALL {
            assert_eq!(parse(step.name()), Some((step, 1)));
        }
    }
}
