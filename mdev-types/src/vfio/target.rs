//! What a preflight opens (a PCI function on vfio-pci or an mdev instance) and which VFIO backend it
//! uses, decided from sysfs through the [`Host`] boundary.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::VfioCheckError;
use crate::host::{Host, HostExt, paths};
use crate::ids::{MdevUuid, PciAddress};

/// A device VFIO can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "kebab-case")]
pub enum Target {
    /// A PCI function (whole GPU or SR-IOV VF) bound to vfio-pci.
    Pci(PciAddress),
    /// A mediated device instance.
    Mdev(MdevUuid),
}

impl Target {
    /// Its sysfs directory (`/sys/bus/pci/devices/<addr>` or `/sys/bus/mdev/devices/<uuid>`).
    pub fn sysfs_path(&self) -> PathBuf {
        match self {
            Target::Pci(a) => paths::pci_device(a),
            Target::Mdev(u) => paths::mdev_device(u),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Pci(a) => write!(f, "PCI device {a}"),
            Target::Mdev(u) => write!(f, "mdev {u}"),
        }
    }
}

impl FromStr for Target {
    type Err = VfioCheckError;

    /// An mdev UUID or a PCI address (`0000:01:00.0`, `01:00.0`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(u) = s.parse::<MdevUuid>() {
            return Ok(Target::Mdev(u));
        }
        s.parse::<PciAddress>()
            .map(Target::Pci)
            .map_err(|_| VfioCheckError::BadTarget(s.to_string()))
    }
}

/// How VFIO is reached: the legacy container/group API or iommufd with the device's cdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backend {
    /// `/dev/vfio/vfio` container + `/dev/vfio/<group>` (VFIO_TYPE1v2_IOMMU).
    Type1,
    /// `/dev/iommu` + `/dev/vfio/devices/vfioN` (Documentation/driver-api/vfio.rst, "VFIO device cdev").
    Iommufd,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Type1 => "type1 container",
            Backend::Iommufd => "iommufd + vfio cdev",
        })
    }
}

/// What a target looks like in sysfs right now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetState {
    /// The target.
    pub target: Target,
    /// Its IOMMU group number.
    pub iommu_group: u32,
    /// Its vfio cdev name (`vfio0`) when the kernel registered one (`<dev>/vfio-dev/`).
    pub cdev: Option<String>,
    /// The bound driver.
    pub driver: Option<String>,
}

/// Reads the target's group, cdev and driver, refusing what VFIO cannot open.
pub fn inspect(host: &dyn Host, target: &Target) -> Result<TargetState, VfioCheckError> {
    let dir = target.sysfs_path();
    if !host.exists(&dir) {
        return Err(VfioCheckError::NoSuchTarget(*target));
    }
    let driver = host.link_name(&dir.join("driver"))?;
    if let Target::Pci(addr) = target
        && driver.as_deref() != Some(crate::viability::VFIO_PCI)
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
pub fn choose_backend(host: &dyn Host, state: &TargetState) -> (Backend, String) {
    let iommu = Path::new("/dev/iommu");
    match &state.cdev {
        Some(cdev) if host.exists(iommu) => {
            let node = Path::new("/dev/vfio/devices").join(cdev);
            if host.exists(&node) {
                (
                    Backend::Iommufd,
                    format!("/dev/iommu and {} exist", node.display()),
                )
            } else {
                (
                    Backend::Type1,
                    format!("{} is missing (no devtmpfs node)", node.display()),
                )
            }
        }
        Some(_) => (
            Backend::Type1,
            "/dev/iommu is missing (kernel without IOMMUFD, or iommufd not loaded)".to_string(),
        ),
        None => (
            Backend::Type1,
            "the device has no vfio cdev (kernel without CONFIG_VFIO_DEVICE_CDEV)".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::sim::SimHost;
    use crate::ops::bind_driver;

    #[test]
    fn targets_parse_from_uuid_or_address() {
        let t: Target = "01:00.0".parse().unwrap();
        assert_eq!(t, Target::Pci("0000:01:00.0".parse().unwrap()));
        let t: Target = "0b3a8f7e-4c3d-4a6e-9a57-2f1c9b6b1e01".parse().unwrap();
        assert!(matches!(t, Target::Mdev(_)));
        let e = "gpu0".parse::<Target>().unwrap_err();
        assert!(e.to_string().contains("gpu0"), "{e}");
    }

    #[test]
    fn a_pci_device_must_be_on_vfio_pci() {
        let h = SimHost::builtin("demo").unwrap();
        let addr: PciAddress = "0000:01:00.0".parse().unwrap();
        let e = inspect(&h, &Target::Pci(addr)).unwrap_err();
        assert!(
            matches!(&e, VfioCheckError::NotOnVfioPci { driver: Some(d), .. } if d == "nvidia"),
            "{e}"
        );
        assert!(e.to_string().contains("vgpuctl"), "{e}");
        bind_driver(&h, &addr, "vfio-pci").unwrap();
        let s = inspect(&h, &Target::Pci(addr)).unwrap();
        assert_eq!(s.iommu_group, 2);
        // The simulated host has no /dev/iommu: the container path is chosen, with the reason.
        let (b, why) = choose_backend(&h, &s);
        assert_eq!(b, Backend::Type1);
        assert!(
            why.contains("vfio cdev") || why.contains("/dev/iommu"),
            "{why}"
        );
    }

    #[test]
    fn missing_target_is_named() {
        let h = SimHost::builtin("demo").unwrap();
        let t: Target = "0000:ee:00.0".parse().unwrap();
        let e = inspect(&h, &t).unwrap_err();
        assert!(e.to_string().contains("0000:ee:00.0"), "{e}");
    }
}
