//! Matching SR-IOV VFs (Intel xe, AMD MxGPU) and NVIDIA vendor-specific VFIO types.

use crate::profile::{Delivery, match_profile};

use super::build::*;
use super::hosts::*;

// ---- SR-IOV VFs (Intel xe, AMD MxGPU) ----
#[test]
fn flex_without_vfs_splits_memory_for_the_profile() {
    let inv = flex_host(0, Some("xe"), |_, _| {});
    // 16 GiB / 2 GiB = 8 VFs of exactly 2 GiB.
    let b = best(&one(&inv, "vdi-2g", FLEX)).clone();
    assert_eq!(sriov_target(&b), (None, 8, true));
    assert_eq!(
        (b.framebuffer_mib, b.waste_mib, b.capacity),
        (Some(2048), Some(0), 8)
    );
    assert_eq!(
        b.target.to_string(),
        "VF of 0000:4d:00.0 after enabling 8 VFs"
    );
    assert_eq!(
        sriov_target(best(&one(&inv, "vdi-1g", FLEX))),
        (None, 16, true)
    );
    assert_eq!(
        sriov_target(best(&one(&inv, "compute-8g", FLEX))),
        (None, 2, true)
    );
    // No minimum: as many VFs as the device has.
    let p = profile("name = \"any\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\n");
    let b = match_profile(&p, &inv).gpus[0].best.clone().unwrap();
    assert_eq!(sriov_target(&b), (None, 31, true));
    assert_eq!(b.framebuffer_mib, Some(16384 / 31));
    // A Flex VF has no display engine: a workstation that wants two heads cannot use it.
    let m = one(&inv, "workstation-4g", FLEX);
    assert_eq!(
        refused(&m, "VF of 0000:4d:00.0")[0].to_string(),
        "0 display heads < 2 required"
    );
}

#[test]
fn flex_with_vfs_uses_the_fixed_split() {
    let inv = flex_host(4, Some("xe"), |i, vf| {
        if i == 0 {
            vf.driver = Some("vfio-pci".to_string());
        }
    });
    let m = one(&inv, "vdi-2g", FLEX);
    let b = best(&m);
    // The unbound VF is chosen before one already on vfio-pci.
    assert_eq!(
        sriov_target(b),
        (Some("0000:4d:01.1".to_string()), 4, false)
    );
    assert_eq!(
        (b.framebuffer_mib, b.waste_mib, b.capacity),
        (Some(4096), Some(2048), 4)
    );
    let m = one(&inv, "compute-8g", FLEX);
    assert!(m.best.is_none());
    let msg = messages(&m);
    assert!(
        msg.contains("framebuffer 4 GiB < 8 GiB required (16 GiB split evenly over the 4 enabled VFs; the split is fixed while VFs exist"),
        "{msg}"
    );
}

#[test]
fn sriov_prerequisites_are_named() {
    let inv = flex_host(0, None, |_, _| {});
    let msg = messages(&one(&inv, "vdi-2g", FLEX));
    assert!(msg.contains("0000:4d:00.0 has no driver bound"), "{msg}");

    let inv = flex_host(2, Some("xe"), |_, vf| vf.iommu_group = None);
    let m = one(&inv, "vdi-2g", FLEX);
    assert!(m.best.is_none());
    assert!(
        messages(&m).contains("no IOMMU group: 0000:4d:01.0 has none"),
        "{}",
        messages(&m)
    );

    let mut pf = bound(dev(FLEX, 0x8086, 0x56c0), "xe");
    pf.iommu_group = None;
    let mut b = InvBuilder::new();
    b.sriov_gpu(pf, "Flex", 31, 0, |_, _| {});
    let msg = messages(&one(&b.build(), "vdi-2g", FLEX));
    assert!(msg.contains("no IOMMU group: 0000:4d:00.0"), "{msg}");
}

#[test]
fn unknown_sriov_device_has_no_known_memory() {
    let mut b = InvBuilder::new();
    b.sriov_gpu(
        bound(dev(FLEX, 0x8086, 0x0bd5), "xe"),
        "Intel device",
        63,
        0,
        |_, _| {},
    );
    let msg = messages(&one(&b.build(), "vdi-2g", FLEX));
    assert!(
        msg.contains("framebuffer unknown (device 0x8086:0x0bd5 is not in the device table"),
        "{msg}"
    );
}

#[test]
fn mi300x_serves_compute_not_desktops() {
    let inv = mi300x_host();
    let b = best(&one(&inv, "compute-8g", MI300X)).clone();
    // 192 GiB / 8 GiB would be 24 VFs; the device offers 8, so 24 GiB each.
    assert_eq!(sriov_target(&b), (None, 8, true));
    assert_eq!(b.framebuffer_mib, Some(24 * 1024));
    let m = one(&inv, "vdi-2g", MI300X);
    assert_eq!(
        messages(&m),
        "AMD Instinct MI300X: AMD Instinct MI300X is a compute accelerator without a graphics engine; class vdi needs one"
    );
}

// ---- NVIDIA vendor-specific VFIO ----
#[test]
fn l40s_vendor_vfio_types_by_name() {
    let inv = l40s_host(16, |_| Some(nvidia_vf(L40S_TYPES, None)));
    let b = best(&one(&inv, "vdi-2g", L40S)).clone();
    assert_eq!(
        vfio_target(&b),
        ("0000:41:01.0".to_string(), 1156, "NVIDIA L40S-2B")
    );
    assert_eq!((b.framebuffer_mib, b.capacity), (Some(2048), 16));
    assert_eq!(b.target.backend(), Delivery::NvidiaVendorVfio);
    let b = best(&one(&inv, "compute-8g", L40S)).clone();
    // 48 GiB hold six 8 GiB vGPUs, whatever the number of free VFs.
    assert_eq!((vfio_target(&b).1, b.capacity), (1171, 6));
    let m = one(&inv, "workstation-4g", L40S);
    assert_eq!(vfio_target(best(&m)).2, "NVIDIA L40S-4Q");
    assert_eq!(best(&m).heads, Some(4));
    assert_eq!(
        refused(&m, "NVIDIA L40S-4C")[0].to_string(),
        "1 display heads < 2 required"
    );
}

#[test]
fn l40s_capacity_counts_framebuffer_already_used() {
    // Two VFs hold a 16Q each: 32 of 48 GiB used, so two 8 GiB vGPUs fit although 14 VFs are free.
    let inv = l40s_host(16, |i| Some(nvidia_vf(L40S_TYPES, (i < 2).then_some(1164))));
    let b = best(&one(&inv, "compute-8g", L40S)).clone();
    assert_eq!(
        vfio_target(&b),
        ("0000:41:01.2".to_string(), 1171, "NVIDIA L40S-8C")
    );
    assert_eq!(b.capacity, 2);
    let m = one(&inv, "passthrough", L40S);
    assert!(
        messages(&m).contains("in use: 2 of its VFs hold a vGPU"),
        "{}",
        messages(&m)
    );
}

#[test]
fn l40s_refusals() {
    let inv = l40s_host(0, |_| None);
    let msg = messages(&one(&inv, "vdi-2g", L40S));
    assert_eq!(
        msg,
        "nvidia-vendor-vfio on 0000:41:00.0: SR-IOV VFs are not enabled on 0000:41:00.0; enable them with `/usr/lib/nvidia/sriov-manage -e 0000:41:00.0`"
    );
    let inv = l40s_host(4, |_| None);
    assert!(messages(&one(&inv, "vdi-2g", L40S)).contains("have no nvidia/ directory"));
    let inv = l40s_host(2, |_| Some(nvidia_vf(L40S_TYPES, Some(1164))));
    assert!(messages(&one(&inv, "vdi-2g", L40S)).ends_with("all 2 VFs already hold a vGPU"));
    let inv = l40s_host(4, |i| {
        Some(nvidia_vf(
            if i == 0 { L40S_TYPES } else { &[] },
            (i == 0).then_some(1161),
        ))
    });
    let msg = messages(&one(&inv, "vdi-2g", L40S));
    assert!(
        msg.ends_with("creatable_vgpu_types lists no type: the framebuffer is used up by 1 vGPUs"),
        "{msg}"
    );
}
