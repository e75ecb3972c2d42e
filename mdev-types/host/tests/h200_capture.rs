//! Discovery on a real sysfs capture: tests/fixtures/h200-passthrough (an H200 passed through whole to a
//! VM without an IOMMU; see that folder's README).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use mdev_types::ids::{PciAddress, PciId};
use mdev_types::model::{Assignability, Vendor};
use vgpu_host::SysfsHost;
use vgpu_host::discover::discover;

fn capture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/h200-passthrough")
}

#[test]
fn h200_is_found_and_not_assignable_for_lack_of_an_iommu() {
    let root = capture();
    assert!(
        root.join("sys").is_dir(),
        "the capture is missing at {}",
        root.display()
    );
    let host = SysfsHost::new(&root).unwrap();
    let inv = discover(&host).unwrap();

    assert_eq!(inv.pci_devices.len(), 1);
    let dev = &inv.pci_devices[0];
    let addr: PciAddress = "0000:00:06.0".parse().unwrap();
    assert_eq!(dev.address, addr);
    assert_eq!((dev.vendor, dev.device), (PciId::NVIDIA, PciId(0x2335)));
    assert_eq!(dev.subsystem_device, Some(PciId(0x18bf)));
    assert_eq!(dev.class, 0x030200);
    assert_eq!(dev.driver.as_deref(), Some("nvidia"));
    assert_eq!(dev.driver_override, None);
    assert_eq!(dev.numa_node, None);
    assert_eq!(dev.iommu_group, None);
    assert!(dev.sriov.is_none() && dev.physfn.is_none() && dev.nvidia_vf.is_none());

    assert!(
        inv.mdev_parents.is_empty() && inv.mdev_instances.is_empty() && inv.iommu_groups.is_empty()
    );
    assert_eq!(inv.gpus.len(), 1);
    let gpu = &inv.gpus[0];
    assert_eq!(gpu.vendor, Vendor::Nvidia);
    assert_eq!(gpu.model, "NVIDIA H200");
    assert!(gpu.capabilities.is_empty(), "{:?}", gpu.capabilities);
    match &gpu.passthrough {
        Assignability::No { reason } => assert!(reason.contains("no IOMMU group"), "{reason}"),
        other => panic!("expected not assignable, got {other:?}"),
    }
}
