//! The files a claim has, derived from its UID under the plugin's own
//! directories. A record names some of them (its CDI spec file, its MPS
//! daemon's root) so that older plugins can read it; start-up never takes
//! those names from the record: it derives them, and a record that says
//! otherwise is damaged (set aside, nothing of it deleted). So a forged
//! record cannot lead start-up to delete or unmount anything else.

use std::path::{Path, PathBuf};

use gpu_dra_driver::cdi;
use gpu_dra_driver::names::{ClaimUid, DriverName, InvalidName};

use super::records::ClaimRecord;

/// What a claim's record may name, derived from its UID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimFiles {
    /// The spec file's name in the CDI directory.
    pub spec_file: String,
    /// `<mps-dir>/<claimUID>`.
    pub mps_root: PathBuf,
}

impl ClaimFiles {
    pub fn new(driver: &DriverName, uid: &ClaimUid, mps_dir: &Path) -> Self {
        Self { spec_file: cdi::claim_spec_file_name(driver, uid), mps_root: mps_dir.join(uid.as_str()) }
    }
}

/// The name of `record`'s spec file in the CDI directory, derived from its
/// UID: ours, or for a claim adopted from NVIDIA's plugin that names it,
/// NVIDIA's (see [`cdi::nvidia_claim_spec_file_name`]).
pub fn spec_file(record: &ClaimRecord, driver: &DriverName, uid: &ClaimUid) -> String {
    let nvidia = cdi::nvidia_claim_spec_file_name(driver, uid);
    if record.adopted.is_some() && record.cdi_spec_file.as_deref() == Some(nvidia.as_str()) {
        return nvidia;
    }
    cdi::claim_spec_file_name(driver, uid)
}

/// Checks that `record` names only the files derived from its UID; the
/// UID (checked) on success, else why not, naming the field.
pub fn check(record: &ClaimRecord, driver: &DriverName, mps_dir: &Path) -> Result<ClaimUid, Mismatch> {
    let uid = check_uid(record)?;
    let files = ClaimFiles::new(driver, &uid, mps_dir);
    check_spec_file(record, &spec_file(record, driver, &uid))?;
    if let Some(daemon) = &record.mps
        && daemon.root != files.mps_root
    {
        return Err(Mismatch::MpsRoot { found: daemon.root.clone(), derived: files.mps_root });
    }
    Ok(uid)
}

/// Which field of a record breaks the rule that a record names only the
/// files derived from its UID (or has no valid UID at all).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("field `uid`: {0}")]
    Uid(#[source] InvalidName),
    #[error(
        "field `cdiSpecFile` is {}, but this claim's spec file is {derived:?}: a record names only its own files",
        quoted(found)
    )]
    SpecFile { found: String, derived: String },
    #[error(
        "field `mps.root` is {}, but this claim's MPS directory is {derived:?}: a record names only its own files",
        quoted(&found.to_string_lossy())
    )]
    MpsRoot { found: PathBuf, derived: PathBuf },
}

/// The record's claim UID, checked.
pub fn check_uid(record: &ClaimRecord) -> Result<ClaimUid, Mismatch> {
    ClaimUid::new(record.uid.as_str()).map_err(Mismatch::Uid)
}

/// Checks that the record's `cdiSpecFile`, if any, is `derived` (the name
/// [`cdi::claim_spec_file_name`] gives its claim).
pub fn check_spec_file(record: &ClaimRecord, derived: &str) -> Result<(), Mismatch> {
    match &record.cdi_spec_file {
        Some(name) if name != derived => Err(Mismatch::SpecFile { found: name.clone(), derived: derived.to_owned() }),
        _ => Ok(()),
    }
}

/// The most of a stored value a message quotes.
const QUOTE_MAX: usize = 200;

/// `value` quoted for a message, cut to [`QUOTE_MAX`] bytes (with its
/// length) so that a forged megabyte is not echoed back.
pub fn quoted(value: &str) -> String {
    if value.len() <= QUOTE_MAX {
        return format!("{value:?}");
    }
    let mut end = QUOTE_MAX;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::checkpoint::MpsDaemon;
    use crate::state::checkpoint::test_support::record;

    const UID: &str = "0b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";

    fn driver() -> DriverName {
        DriverName::new("gpu.nvidia.com").unwrap()
    }

    fn daemon(root: &str) -> MpsDaemon {
        MpsDaemon::at(root.into())
    }

    #[test]
    fn the_derived_names_pass() {
        let mut r = record(UID, &["gpu-0"]);
        r.cdi_spec_file = Some(format!("k8s.gpu.nvidia.com-claim_{UID}.json"));
        r.mps = Some(daemon(&format!("/state/mps/{UID}")));
        assert_eq!(check(&r, &driver(), Path::new("/state/mps")).unwrap().as_str(), UID);
        r.cdi_spec_file = None;
        assert!(check(&r, &driver(), Path::new("/state/mps")).is_ok(), "an old record without the name");
    }

    #[test]
    fn nvidias_name_is_the_spec_file_of_an_adopted_record_only() {
        let uid = ClaimUid::new(UID).unwrap();
        let nvidia = format!("k8s.gpu.nvidia.com-claim_{UID}.yaml");
        let mut r = record(UID, &["gpu-0"]);
        r.cdi_spec_file = Some(nvidia.clone());
        assert!(check(&r, &driver(), Path::new("/m")).is_err(), "a record of ours never names NVIDIA's file");
        r.adopted = Some(crate::state::checkpoint::Adopted { from: "v2".into(), not_served: None });
        assert_eq!(check(&r, &driver(), Path::new("/m")).unwrap(), uid);
        assert_eq!(spec_file(&r, &driver(), &uid), nvidia);
        r.cdi_spec_file = Some(format!("k8s.gpu.nvidia.com-claim_{UID}.json"));
        assert_eq!(spec_file(&r, &driver(), &uid), format!("k8s.gpu.nvidia.com-claim_{UID}.json"));
    }

    #[test]
    fn any_other_name_is_refused_naming_the_field() {
        let mps = Path::new("/state/mps");
        let other = "1b4f5a1e-9c1d-4a57-8d3c-1f2e3d4c5b6a";
        for name in [
            "/etc/passwd".to_owned(),
            "../../x".to_owned(),
            format!("k8s.gpu.nvidia.com-claim_{other}.json"),
            format!("sub/k8s.gpu.nvidia.com-claim_{UID}.json"),
            format!("k8s.other.com-claim_{UID}.json"),
        ] {
            let mut r = record(UID, &["gpu-0"]);
            r.cdi_spec_file = Some(name.clone());
            let error = check(&r, &driver(), mps).unwrap_err().to_string();
            assert!(error.starts_with("field `cdiSpecFile` is"), "{name}: {error}");
        }
        for root in ["/tmp/outside".to_owned(), format!("/state/mps/{UID}/../{other}"), format!("/state/mps/{other}")] {
            let mut r = record(UID, &["gpu-0"]);
            r.mps = Some(daemon(&root));
            let error = check(&r, &driver(), mps).unwrap_err().to_string();
            assert!(error.starts_with("field `mps.root` is"), "{root}: {error}");
        }
        let mut r = record(UID, &["gpu-0"]);
        r.uid = "../x".into();
        assert!(check(&r, &driver(), mps).unwrap_err().to_string().starts_with("field `uid`"));
    }

    #[test]
    fn long_values_are_quoted_cut_with_their_length() {
        assert_eq!(quoted("ab"), "\"ab\"");
        let long = "é".repeat(1000);
        let q = quoted(&long);
        assert!(q.ends_with("... (2000 bytes)") && q.len() < 260, "{q}");
    }
}
