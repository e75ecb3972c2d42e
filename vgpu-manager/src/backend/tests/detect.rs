//! Which backend each GPU gets.

use super::{host, host_toml};
use crate::backend::{BackendError, BackendKind, detect, detect_gpu};

fn kinds(name: &str) -> Vec<(String, Option<BackendKind>)> {
    let (h, inv) = host(name);
    detect(&h, &inv)
        .unwrap()
        .into_iter()
        .map(|d| (d.gpu, d.backend.map(|b| b.kind())))
        .collect()
}

#[test]
fn demo_gpus_get_their_vendor_interface() {
    let k = kinds("demo");
    let want = [
        ("0000:00:02.0", BackendKind::IntelGvtG),
        ("0000:01:00.0", BackendKind::NvidiaMdev),
        ("0000:03:00.0", BackendKind::IntelXeSriov),
        ("0000:83:00.0", BackendKind::NvidiaMdev),
        ("0000:85:00.0", BackendKind::NvidiaVfio),
        ("0000:86:00.0", BackendKind::AmdGim),
    ];
    for (gpu, kind) in want {
        let got = k.iter().find(|(g, _)| g == gpu).map(|(_, b)| *b);
        assert_eq!(got, Some(Some(kind)), "{gpu}: {k:?}");
    }
}

#[test]
fn vendors_host_layouts() {
    let k = kinds("vendors");
    let want = [
        ("0000:00:02.0", BackendKind::IntelI915Iov),
        ("0000:3b:00.0", BackendKind::IntelXeSriov),
        ("0000:5e:00.0", BackendKind::NvidiaMdev),
        ("0000:86:00.0", BackendKind::NvidiaVfio),
        ("0000:af:00.0", BackendKind::AmdGim),
        ("0000:d8:00.0", BackendKind::AmdGim),
    ];
    for (gpu, kind) in want {
        let got = k.iter().find(|(g, _)| g == gpu).map(|(_, b)| *b);
        assert_eq!(got, Some(Some(kind)), "{gpu}: {k:?}");
    }
}

#[test]
fn sample_parents_are_generic() {
    let k = kinds("samples");
    assert!(!k.is_empty());
    for (g, b) in &k {
        assert_eq!(*b, Some(BackendKind::GenericMdev), "{g}");
    }
}

#[test]
fn layout_decides_not_just_the_driver() {
    // An xe PF without sriov_admin (e.g. a kernel before 6.19) and an i915 GPU without GVT-g types or
    // prelim_iov have no backend, and say why.
    let (h, inv) = host_toml(
        r#"
[[driver]]
name = "xe"
match = ["8086:56c0"]
sriov_configure = true

[[pci]]
address = "0000:03:00.0"
vendor = "8086"
device = "56c0"
class = 0x038000
driver = "xe"
iommu_group = 1

[pci.sriov]
total_vfs = 31
vf_device = "56c0"
offset = 1
stride = 1
"#,
    );
    let d = detect(&h, &inv).unwrap();
    assert_eq!(d.len(), 1);
    assert!(d[0].backend.is_none());
    assert!(d[0].why_none.as_deref().unwrap().contains("driver xe"));
    let e = detect_gpu(&h, &inv, "03:00.0").unwrap_err();
    assert!(matches!(e, BackendError::NoBackend { .. }), "{e}");
    let e = detect_gpu(&h, &inv, "0000:99:00.0").unwrap_err();
    assert!(matches!(e, BackendError::UnknownGpu { .. }), "{e}");
    assert!(e.to_string().contains("vgpuctl discover"));
}

#[test]
fn capabilities_describe_the_scheduler() {
    let (h, inv) = host("demo");
    let xe = detect_gpu(&h, &inv, "0000:03:00.0").unwrap().capabilities();
    assert!(xe.scheduling.per_slot_weights && xe.scheduling.runtime);
    assert_eq!(xe.max_slots, 31);
    let nv = detect_gpu(&h, &inv, "0000:83:00.0").unwrap().capabilities();
    assert!(!nv.scheduling.per_slot_weights && !nv.scheduling.runtime);
    // T4 #2 has one foreign vGPU already.
    assert_eq!(
        nv.slots,
        vec!["8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61".to_string()]
    );
}
