//! create / destroy through each kind of interface, on the simulated kernel.

use std::path::Path;

use vgpu_host::{Host, HostExt};

use super::{backend, host};
use crate::backend::{BackendError, Created, NewVgpu};
use crate::profile::{Catalog, ProfileTarget};

fn option_target(h: &vgpu_sim::SimHost, gpu: &str, profile: &str) -> ProfileTarget {
    let (_, inv) = (h, vgpu_host::discover::discover(h).unwrap());
    let p = Catalog::builtin().unwrap().resolve(profile).unwrap();
    let b = backend(h, &inv, gpu);
    let opts = b.options(&p, &inv);
    assert!(!opts.is_empty(), "{gpu} offers nothing for {profile}");
    opts[0].target.clone()
}

fn req(target: ProfileTarget) -> NewVgpu {
    NewVgpu { target }
}

#[test]
fn xe_vf_enable_bind_and_release() {
    let (h, inv) = host("demo");
    let target = option_target(&h, "0000:03:00.0", "vdi-2g");
    assert!(
        matches!(
            target,
            ProfileTarget::SriovVf {
                enable_vfs: true,
                ..
            }
        ),
        "{target}"
    );
    let b = backend(&h, &inv, "0000:03:00.0");
    let created = b.create(&h, &req(target)).unwrap();
    let Created::Vf { vf, .. } = &created else {
        panic!("{created:?}")
    };
    let dev = format!("/sys/bus/pci/devices/{vf}");
    assert_eq!(
        h.link_name(Path::new(&format!("{dev}/driver")))
            .unwrap()
            .as_deref(),
        Some("vfio-pci")
    );
    // Autoprobe was switched off before the VFs were enabled.
    assert_eq!(
        h.read_trimmed(Path::new(
            "/sys/bus/pci/devices/0000:03:00.0/sriov_drivers_autoprobe"
        ))
        .unwrap(),
        "0"
    );
    b.destroy(&h, &created).unwrap();
    assert_eq!(
        h.link_name(Path::new(&format!("{dev}/driver"))).unwrap(),
        None
    );
}

#[test]
fn nvidia_vendor_vfio_sets_and_clears_the_type() {
    let (h, inv) = host("demo");
    let target = option_target(&h, "0000:85:00.0", "vdi-2g");
    let ProfileTarget::NvidiaVendorVfio { vf, type_id, .. } = target.clone() else {
        panic!("{target}")
    };
    let b = backend(&h, &inv, "0000:85:00.0");
    let created = b.create(&h, &req(target.clone())).unwrap();
    let cur = format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
    assert_eq!(
        h.read_trimmed(Path::new(&cur)).unwrap(),
        type_id.to_string()
    );
    // A second vGPU on the same VF: the driver refuses, and the error says why.
    let e = b.create(&h, &req(target)).unwrap_err();
    assert!(
        e.to_string().contains("EPERM: the VF already has a vGPU"),
        "{e}"
    );
    b.destroy(&h, &created).unwrap();
    assert_eq!(h.read_trimmed(Path::new(&cur)).unwrap(), "0");
}

#[test]
fn mdev_backends_leave_creating_mdevs_to_the_daemon() {
    let (h, inv) = host("demo");
    let target = option_target(&h, "0000:00:02.0", "vdi-1g");
    let b = backend(&h, &inv, "0000:00:02.0");
    let before = h.list_optional(Path::new("/sys/bus/mdev/devices")).unwrap();
    let e = b.create(&h, &req(target)).unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
    assert!(e.to_string().contains("vgpuctl create"), "{e}");
    let after = h.list_optional(Path::new("/sys/bus/mdev/devices")).unwrap();
    assert_eq!(before, after, "nothing was created");
    // A target of another interface is refused by name.
    let other = option_target(&h, "0000:03:00.0", "vdi-2g");
    let e = b.create(&h, &req(other)).unwrap_err();
    assert!(matches!(e, BackendError::Unsupported { .. }), "{e}");
}

#[test]
fn gim_cannot_enable_vfs_at_runtime() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, "0000:86:00.0");
    let target = ProfileTarget::SriovVf {
        pf: "0000:86:00.0".parse().unwrap(),
        vf: None,
        vf_driver: None,
        num_vfs: 6,
        enable_vfs: true,
    };
    let e = b.create(&h, &req(target)).unwrap_err();
    assert!(e.to_string().contains("vf_num"), "{e}");
    // An enabled VF is assigned through vfio-pci.
    let vf: mdev_types::ids::PciAddress = "0000:86:00.1".parse().unwrap();
    let created = b
        .create(
            &h,
            &req(ProfileTarget::SriovVf {
                pf: "0000:86:00.0".parse().unwrap(),
                vf: Some(vf),
                vf_driver: None,
                num_vfs: 4,
                enable_vfs: false,
            }),
        )
        .unwrap();
    b.destroy(&h, &created).unwrap();
}

#[test]
fn enable_vfs_is_the_backends_own() {
    let (h, inv) = host("demo");
    // xe: autoprobe off, then the count; the VFs appear without a driver.
    let xe = backend(&h, &inv, "0000:03:00.0");
    xe.enable_vfs(&h, 8).unwrap();
    let pf = Path::new("/sys/bus/pci/devices/0000:03:00.0");
    assert_eq!(h.read_trimmed(&pf.join("sriov_numvfs")).unwrap(), "8");
    assert_eq!(
        h.read_trimmed(&pf.join("sriov_drivers_autoprobe")).unwrap(),
        "0"
    );
    let vf1 = Path::new("/sys/bus/pci/devices/0000:03:00.1");
    assert!(h.exists(vf1) && h.link_name(&vf1.join("driver")).unwrap().is_none());
    // The same count again changes nothing (drivers/pci/iov.c); another count is refused.
    xe.enable_vfs(&h, 8).unwrap();
    let e = xe.enable_vfs(&h, 4).unwrap_err();
    assert!(e.to_string().contains("0000:03:00.0"), "{e}");
    // GIM makes its VFs at module load; mdev backends have none.
    let gim = backend(&h, &inv, "0000:86:00.0");
    let e = gim.enable_vfs(&h, 6).unwrap_err();
    assert!(e.to_string().contains("vf_num"), "{e}");
    let t4 = backend(&h, &inv, "0000:01:00.0");
    let e = t4.enable_vfs(&h, 2).unwrap_err();
    assert!(e.to_string().contains("no SR-IOV VFs"), "{e}");
}
