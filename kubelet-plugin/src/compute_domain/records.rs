//! The rules a ComputeDomain checkpoint record must keep before the agent
//! acts on it: the GPU checkpoint's (a valid claim UID, and a spec file
//! name, if any, that is the one derived from it: see
//! [`crate::state::checkpoint::derived`]), a domain (whose UID the
//! record's decoding already checked), channels the driver has, and no MPS
//! daemon. A record that breaks one is damaged: set aside, nothing it
//! names deleted, started or signalled.

use gpu_dra_driver::cdi;
use gpu_dra_driver::compute_domain::imex::CHANNEL_COUNT;
use gpu_dra_driver::names::{ClaimUid, DriverName};

use crate::state::checkpoint::{ClaimRecord, derived};

/// The record's claim UID when it keeps the rules; else why not, naming
/// the field.
pub fn check(record: &ClaimRecord, driver: &DriverName) -> Result<ClaimUid, Damage> {
    let uid = derived::check_uid(record)?;
    derived::check_spec_file(record, &cdi::claim_spec_file_name(driver, &uid))?;
    if record.mps.is_some() {
        return Err(Damage::Mps);
    }
    let domain = record.compute_domain.as_ref().ok_or(Damage::NoDomain)?;
    if let Some(channel) = domain.channels.iter().find(|c| **c >= CHANNEL_COUNT) {
        return Err(Damage::Channel { channel: *channel });
    }
    Ok(uid)
}

/// Which field of a ComputeDomain record breaks its rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error(transparent)]
    Files(#[from] derived::Mismatch),
    #[error("field `mps`: a ComputeDomain claim has no MPS daemon")]
    Mps,
    #[error("field `computeDomain` is missing: every ComputeDomain record names its domain")]
    NoDomain,
    #[error("field `computeDomain.channels` holds {channel}; the driver's channels are 0 to {}", CHANNEL_COUNT - 1)]
    Channel { channel: u32 },
}

#[cfg(test)]
mod tests {
    use gpu_dra_driver::names::DomainUid;

    use super::*;
    use crate::state::checkpoint::test_support::record;
    use crate::state::checkpoint::{DomainClaim, DomainClaimKind};

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn domain_record(spec_file: &str, channels: Vec<u32>) -> ClaimRecord {
        let mut r = record(UID, &[]);
        r.cdi_spec_file = Some(spec_file.to_owned());
        r.compute_domain = Some(DomainClaim {
            domain_uid: DomainUid::new(UID).unwrap(),
            namespace: "team".into(),
            kind: DomainClaimKind::Channel,
            channels,
        });
        r
    }

    #[test]
    fn only_a_record_of_its_own_files_and_channels_passes() {
        let driver = DriverName::new("compute-domain.nvidia.com").unwrap();
        let own = format!("k8s.compute-domain.nvidia.com-claim_{UID}.json");
        assert_eq!(check(&domain_record(&own, vec![0]), &driver).unwrap().as_str(), UID);
        let other = "k8s.compute-domain.nvidia.com-claim_1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a.json";
        for name in [other, "../victim", "/etc/passwd", &format!("k8s.gpu.nvidia.com-claim_{UID}.json")] {
            let error = check(&domain_record(name, vec![0]), &driver).unwrap_err().to_string();
            assert!(error.starts_with("field `cdiSpecFile` is"), "{name}: {error}");
        }
        let error = check(&domain_record(&own, vec![0, 2048]), &driver).unwrap_err().to_string();
        assert!(error.contains("holds 2048"), "{error}");
        let mut none = domain_record(&own, vec![0]);
        none.compute_domain = None;
        assert!(check(&none, &driver).unwrap_err().to_string().starts_with("field `computeDomain`"));
    }

    #[test]
    fn a_domain_uid_that_is_a_path_does_not_decode() {
        let own = format!("k8s.compute-domain.nvidia.com-claim_{UID}.json");
        let mut value = serde_json::to_value(domain_record(&own, vec![0])).unwrap();
        for bad in ["/outside/dom", "../../.."] {
            value["computeDomain"]["domainUid"] = serde_json::json!(bad);
            let error = serde_json::from_value::<ClaimRecord>(value.clone()).unwrap_err().to_string();
            assert!(error.contains("invalid ComputeDomain UID"), "{bad}: {error}");
        }
    }
}
