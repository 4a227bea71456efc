use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::state::checkpoint::{VfioMember, VfioSwitch};
use crate::vfio::fake_kernel::{FakeKernel, bdf};
use crate::vfio::sysfs;

const GPU: &str = "0000:65:00.0";
const AUDIO: &str = "0000:65:00.1";
const FAST: Timing = Timing { timeout: Duration::from_millis(200), poll: Duration::from_millis(5) };

fn node(dir: &tempfile::TempDir) -> FakeKernel {
    FakeKernel::new(dir.path(), &[(GPU, 12, "nvidia"), (AUDIO, 12, "snd_hda_intel"), ("0000:b3:00.0", 40, "nvidia")])
}

fn original() -> Vec<(String, Option<String>)> {
    vec![
        (GPU.into(), Some("nvidia".into())),
        (AUDIO.into(), Some("snd_hda_intel".into())),
        ("0000:b3:00.0".into(), Some("nvidia".into())),
    ]
}

fn passed_through() -> Vec<(String, Option<String>)> {
    vec![
        (GPU.into(), Some("vfio-pci".into())),
        (AUDIO.into(), Some("vfio-pci".into())),
        ("0000:b3:00.0".into(), Some("nvidia".into())),
    ]
}

fn no_kills(_: Step) -> Result<(), SwitchError> {
    Ok(())
}

#[test]
fn the_whole_group_goes_to_vfio_pci_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = node(&dir);
    let switch = plan(&kernel, &bdf(GPU), 12, &[bdf("0000:b3:00.0")]).unwrap();
    assert_eq!(switch.members.len(), 2, "the GPU and its audio function");
    assert_eq!(switch.members[1].original_driver.as_deref(), Some("snd_hda_intel"));
    bind(&kernel, &switch, &mut no_kills, FAST).unwrap();
    assert_eq!(kernel.drivers(), passed_through());
    assert!(kernel.group_node_exists(12));
    give_back(&kernel, &switch, &mut no_kills, FAST).unwrap();
    assert_eq!(kernel.drivers(), original());
    assert_eq!((kernel.override_of(GPU), kernel.override_of(AUDIO)), (String::new(), String::new()));
    assert!(!kernel.group_node_exists(12));
    give_back(&kernel, &switch, &mut no_kills, FAST).unwrap();
    assert_eq!(kernel.drivers(), original(), "giving back twice changes nothing");
}

/// A kill at the n-th time `step` is reached, then what start-up does
/// with the `PrepareStarted` record: give back. Every device ends bound to
/// one driver, its own.
#[test]
fn a_kill_at_any_step_of_the_switch_is_given_back() {
    let steps = [Step::VfioOverride, Step::VfioUnbound, Step::VfioProbed, Step::VfioBound];
    for step in steps {
        for nth in 1..=2 {
            let dir = tempfile::tempdir().unwrap();
            let kernel = node(&dir);
            let switch = plan(&kernel, &bdf(GPU), 12, &[]).unwrap();
            let mut seen = 0;
            let mut kill = |s: Step| {
                seen += usize::from(s == step);
                if s == step && seen == nth { Err(SwitchError::Killed(s)) } else { Ok(()) }
            };
            let killed = bind(&kernel, &switch, &mut kill, FAST);
            if step == Step::VfioBound && nth == 2 {
                assert!(killed.is_ok(), "bound is reached once");
                continue;
            }
            assert!(matches!(killed, Err(SwitchError::Killed(s)) if s == step), "{step:?} {nth}: {killed:?}");
            give_back(&kernel, &switch, &mut no_kills, FAST).unwrap();
            assert_eq!(kernel.drivers(), original(), "killed at {step:?} #{nth}");
        }
    }
}

#[test]
fn a_kill_while_giving_back_is_finished_by_the_next_give_back() {
    for nth in 1..=2 {
        let dir = tempfile::tempdir().unwrap();
        let kernel = node(&dir);
        let switch = plan(&kernel, &bdf(GPU), 12, &[]).unwrap();
        bind(&kernel, &switch, &mut no_kills, FAST).unwrap();
        let mut seen = 0;
        let mut kill = |s: Step| {
            seen += 1;
            if seen == nth { Err(SwitchError::Killed(s)) } else { Ok(()) }
        };
        assert!(matches!(give_back(&kernel, &switch, &mut kill, FAST), Err(SwitchError::Killed(Step::VfioReleased))));
        give_back(&kernel, &switch, &mut no_kills, FAST).unwrap();
        assert_eq!(kernel.drivers(), original());
    }
}

#[test]
fn a_switch_that_times_out_is_rolled_back() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = node(&dir);
    kernel.vfio_binds.store(false, Ordering::SeqCst);
    let switch = plan(&kernel, &bdf(GPU), 12, &[]).unwrap();
    let err = bind(&kernel, &switch, &mut no_kills, FAST).unwrap_err();
    assert!(matches!(err, SwitchError::TimedOut(_)), "{err}");
    assert!(err.to_string().contains("IOMMU group 12 of GPU 0000:65:00.0 was not bound to vfio-pci"), "{err}");
    give_back(&kernel, &switch, &mut no_kills, FAST).unwrap();
    assert_eq!(kernel.drivers(), original());
}

#[test]
fn refusals_touch_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = node(&dir);
    // Another GPU in the group.
    let err = plan(&kernel, &bdf(GPU), 12, &[bdf(AUDIO)]).unwrap_err();
    assert!(err.to_string().contains("shares IOMMU group 12 with GPU 0000:65:00.1"), "{err}");
    // The inventory's group is not the kernel's.
    let err = plan(&kernel, &bdf(GPU), 40, &[]).unwrap_err();
    assert!(err.to_string().contains("rather than IOMMU group 40"), "{err}");
    // A device bound to something else.
    let err = plan(&kernel, &bdf(AUDIO), 12, &[]).unwrap_err();
    assert!(err.to_string().contains("bound to snd_hda_intel, expected nvidia or vfio-pci"), "{err}");
    // An iommu_group link that leaves the sysfs root.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join("12/devices")).unwrap();
    let link = kernel.sys.sys_root.join("devices/pci0000:00").join(GPU).join("iommu_group");
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(outside.path().join("12"), &link).unwrap();
    let err = plan(&kernel, &bdf(GPU), 12, &[]).unwrap_err();
    assert!(matches!(err, SwitchError::Sysfs(sysfs::SysfsError::Forged { .. })), "{err}");
    assert_eq!(kernel.drivers(), original());
    assert_eq!(kernel.override_of(GPU), "(null)");
    // A record naming no canonical PCI address is refused before any write.
    let forged = VfioSwitch {
        pci_bus_id: GPU.into(),
        iommu_group: 12,
        members: vec![VfioMember { pci_bus_id: "0000:65:00.0/../../x".into(), original_driver: None }],
    };
    assert!(matches!(bind(&kernel, &forged, &mut no_kills, FAST), Err(SwitchError::Refused(_))));
    assert!(matches!(give_back(&kernel, &forged, &mut no_kills, FAST), Err(SwitchError::Refused(_))));
    assert_eq!(kernel.override_of(GPU), "(null)");
}
