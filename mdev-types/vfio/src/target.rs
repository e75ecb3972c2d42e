//! What a preflight opens (a PCI function on vfio-pci or an mdev instance) and which VFIO backend it
//! uses, decided from sysfs through the [`Host`] boundary.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::VfioCheckError;
use mdev_types::vfio_api::{VfioBackend, VfioTarget};
use vgpu_host::{Host, HostExt, paths};

/// What a target looks like in sysfs right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetState {
    /// The mdev instance or PCI device described.
    pub target: VfioTarget,
    /// The number of its IOMMU group (`/sys/kernel/iommu_groups/<n>`).
    pub iommu_group: u32,
    /// Its vfio cdev name (`vfio0`) when the kernel registered one (`<dev>/vfio-dev/`).
    pub cdev: Option<String>,
    /// The driver bound to it, or `None` when none is bound.
    pub driver: Option<String>,
}

/// Reads the target's group, cdev and driver, refusing what VFIO cannot open.
pub fn inspect(host: &dyn Host, target: &VfioTarget) -> Result<TargetState, VfioCheckError> {
    let dir = paths::vfio_target(target);
    if !host.exists(&dir) {
        return Err(VfioCheckError::NoSuchTarget(*target));
    }
    let driver = host.link_name(&dir.join("driver"))?;
    if let VfioTarget::Pci(addr) = target
        && driver.as_deref() != Some(vgpu_host::viability::VFIO_PCI)
    {
        return Err(VfioCheckError::NotOnVfioPci {
            addr: *addr,
            driver,
        });
    }
    let group = host
        .link_name(&dir.join("iommu_group"))?
        .and_then(|g| g.parse::<u32>().ok())
        .ok_or(VfioCheckError::NoIommuGroup(*target))?;
    let cdev = host
        .list_optional(&dir.join("vfio-dev"))?
        .into_iter()
        .find(|n| n.starts_with("vfio"));
    Ok(TargetState {
        target: *target,
        iommu_group: group,
        cdev,
        driver,
    })
}

/// Picks the backend: iommufd when `/dev/iommu` and the device's `/dev/vfio/devices/vfioN` exist,
/// otherwise the type1 container. Returns the choice and the reason, for the report.
pub fn choose_backend(host: &dyn Host, state: &TargetState) -> (VfioBackend, String) {
    let iommu = Path::new("/dev/iommu");
    match &state.cdev {
        Some(cdev) if host.exists(iommu) => {
            let node = Path::new("/dev/vfio/devices").join(cdev);
            if host.exists(&node) {
                (
                    VfioBackend::Iommufd,
                    format!("/dev/iommu and {} exist", node.display()),
                )
            } else {
                (
                    VfioBackend::Type1,
                    format!("{} is missing (no devtmpfs node)", node.display()),
                )
            }
        }
        Some(_) => (
            VfioBackend::Type1,
            "/dev/iommu is missing (kernel without IOMMUFD, or iommufd not loaded)".to_string(),
        ),
        None => (
            VfioBackend::Type1,
            "the device has no vfio cdev (kernel without CONFIG_VFIO_DEVICE_CDEV)".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mdev_types::ids::PciAddress;
    use vgpu_host::ops::bind_driver;
    use vgpu_sim::SimHost;

    #[test]
    fn a_pci_device_must_be_on_vfio_pci() {
        let h = SimHost::builtin("demo").unwrap();
        let addr: PciAddress = "0000:01:00.0".parse().unwrap();
        let e = inspect(&h, &VfioTarget::Pci(addr)).unwrap_err();
        assert!(
            matches!(&e, VfioCheckError::NotOnVfioPci { driver: Some(d), .. } if d == "nvidia"),
            "{e}"
        );
        assert!(e.to_string().contains("vgpuctl"), "{e}");
        bind_driver(&h, &addr, "vfio-pci").unwrap();
        let s = inspect(&h, &VfioTarget::Pci(addr)).unwrap();
        assert_eq!(s.iommu_group, 2);
        // The simulated host has no /dev/iommu: the container path is chosen, with the reason.
        let (b, why) = choose_backend(&h, &s);
        assert_eq!(b, VfioBackend::Type1);
        assert!(
            why.contains("vfio cdev") || why.contains("/dev/iommu"),
            "{why}"
        );
    }

    #[test]
    fn missing_target_is_named() {
        let h = SimHost::builtin("demo").unwrap();
        let t: VfioTarget = "0000:ee:00.0".parse().unwrap();
        let e = inspect(&h, &t).unwrap_err();
        assert!(e.to_string().contains("0000:ee:00.0"), "{e}");
    }
}
