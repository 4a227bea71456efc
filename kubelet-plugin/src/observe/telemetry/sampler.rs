//! Reads one device's numbers: NVML in production ([`NvmlReader`]), a
//! table in tests. Each call that NVML refuses (not supported on this
//! board, on a MIG device, or a symbol an old driver lacks) leaves its
//! reading `None`; nothing here fails the pass.

use std::time::{Duration, Instant};

use super::readings::DeviceSample;

/// Reads devices by UUID (`GPU-…` or `MIG-…`).
pub trait DeviceReader: Send {
    fn read(&mut self, uuid: &str) -> DeviceSample;
}

/// One pass over `uuids`: the samples, in order, and how long it took.
pub fn sample_all(reader: &mut dyn DeviceReader, uuids: &[String]) -> (Vec<DeviceSample>, Duration) {
    let started = Instant::now();
    let samples = uuids.iter().map(|uuid| reader.read(uuid)).collect();
    (samples, started.elapsed())
}

/// NVML, initialized once and kept for the process's life.
pub struct NvmlReader {
    nvml: nvml_wrapper::Nvml,
}

impl NvmlReader {
    pub fn new(nvml: nvml_wrapper::Nvml) -> Self {
        Self { nvml }
    }
}

impl DeviceReader for NvmlReader {
    fn read(&mut self, uuid: &str) -> DeviceSample {
        use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, TemperatureSensor};
        let Ok(device) = self.nvml.device_by_uuid(uuid) else {
            tracing::debug!(%uuid, "NVML does not know the device; no telemetry for it");
            return DeviceSample::default();
        };
        let utilization = device.utilization_rates().ok();
        let memory = device.memory_info().ok();
        DeviceSample {
            gpu_utilization_percent: utilization.as_ref().map(|u| f64::from(u.gpu)),
            memory_utilization_percent: utilization.as_ref().map(|u| f64::from(u.memory)),
            memory_used_bytes: memory.as_ref().map(|m| m.used),
            memory_total_bytes: memory.as_ref().map(|m| m.total),
            power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            temperature_celsius: device.temperature(TemperatureSensor::Gpu).ok().map(f64::from),
            sm_clock_mhz: device.clock_info(Clock::SM).ok().map(f64::from),
            ecc_corrected_errors: device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile).ok(),
            ecc_uncorrected_errors: device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    struct Table(HashMap<String, DeviceSample>);

    impl DeviceReader for Table {
        fn read(&mut self, uuid: &str) -> DeviceSample {
            self.0.get(uuid).cloned().unwrap_or_default()
        }
    }

    #[test]
    fn a_pass_reads_every_device_in_order_and_unknown_ones_are_empty() {
        let busy = DeviceSample { gpu_utilization_percent: Some(90.0), ..DeviceSample::default() };
        let mut table = Table(HashMap::from([("GPU-b".to_string(), busy.clone())]));
        let (samples, _) = sample_all(&mut table, &["GPU-a".into(), "GPU-b".into()]);
        assert_eq!(samples, vec![DeviceSample::default(), busy]);
    }
}
