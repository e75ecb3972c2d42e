//! The driver binding tests, on the simulated host (an integration test: `vgpu-sim` builds on this crate).
#![allow(clippy::unwrap_used)]
use mdev_types::ids::PciAddress;
use vgpu_host::ops::*;
use vgpu_host::ops::{LifecycleError, VfioBindError};
use vgpu_host::{Host, HostExt, paths};
use vgpu_sim::SimHost;

fn a(s: &str) -> PciAddress {
    s.parse().unwrap()
}

fn driver(h: &dyn Host, addr: &PciAddress) -> Option<String> {
    current_driver(h, addr).unwrap()
}

#[test]
fn boot_vga_and_shared_groups_are_refused_without_touching_sysfs() {
    let h = SimHost::builtin("demo").unwrap();
    let e = bind_vfio(&h, &a("0000:00:02.0")).unwrap_err();
    assert!(e.to_string().contains("boot VGA"), "{e}");
    assert_eq!(driver(&h, &a("0000:00:02.0")).as_deref(), Some("i915"));
    let e = bind_vfio(&h, &a("0000:83:00.0")).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("0000:84:00.0") && msg.contains("igb"), "{msg}");
    assert!(msg.contains("IOMMU group 11"), "{msg}");
    assert_eq!(driver(&h, &a("0000:83:00.0")).as_deref(), Some("nvidia"));
    let e = bind_vfio(&h, &a("0000:ee:00.0")).unwrap_err();
    assert!(matches!(
        e,
        VfioBindError::Lifecycle(LifecycleError::DeviceGone { .. })
    ));
}

#[test]
fn whole_gpu_binds_and_restores() {
    let h = SimHost::builtin("demo").unwrap();
    let gpu = a("0000:01:00.0");
    let rec = bind_vfio(&h, &gpu).unwrap();
    assert_eq!(rec.previous_driver.as_deref(), Some("nvidia"));
    assert_eq!(driver(&h, &gpu).as_deref(), Some("vfio-pci"));
    restore_driver(&h, &rec).unwrap();
    assert_eq!(driver(&h, &gpu).as_deref(), Some("nvidia"));
    let over = h.read_optional(&paths::pci_attr(&gpu, "driver_override"));
    assert_eq!(over.unwrap().as_deref(), Some("(null)"));
}

#[test]
fn vf_restores_to_its_driver_with_autoprobe_off() {
    // The demo's Flex 170 VFs bind to xe like their PF (same device id, demo.toml).
    let h = SimHost::builtin("demo").unwrap();
    let pf = a("0000:03:00.0");
    vgpu_host::ops::set_sriov_numvfs(&h, &pf, 1).unwrap();
    let vf = a("0000:03:00.1");
    assert_eq!(driver(&h, &vf).as_deref(), Some("xe"));
    vgpu_host::ops::set_sriov_autoprobe(&h, &pf, false).unwrap();
    let rec = bind_vfio(&h, &vf).unwrap();
    assert_eq!(driver(&h, &vf).as_deref(), Some("vfio-pci"));
    assert!(vf_without_autoprobe(&h, &vf).unwrap());
    // Without the temporary override the kernel refuses the bind (pci_device_can_probe).
    restore_driver(&h, &rec).unwrap();
    assert_eq!(driver(&h, &vf).as_deref(), Some("xe"));
    let over = h.read_optional(&paths::pci_attr(&vf, "driver_override"));
    assert_eq!(over.unwrap().as_deref(), Some("(null)"));
}

#[test]
fn a_pf_with_vfs_is_refused() {
    let h = SimHost::builtin("samples").unwrap();
    let pf = a("0000:01:00.0");
    vgpu_host::ops::set_sriov_numvfs(&h, &pf, 2).unwrap();
    let e = bind_vfio(&h, &pf).unwrap_err();
    assert!(e.to_string().contains("sriov_numvfs to 0"), "{e}");
    assert_eq!(driver(&h, &pf).as_deref(), Some("igb"));
}
