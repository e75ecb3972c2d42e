//! VFIO as clients see it: what to open ([`VfioTarget`]), through which IOMMU interface
//! ([`VfioBackend`]), and a device that was opened ([`OpenedDevice`], its file descriptors).
//!
//! Data only. The ioctls that open, bind, map and check a device live in the `vgpu-vfio` crate (its
//! `OpenedDeviceExt` trait), so a client that only receives a hand-off links no VFIO or KVM code.

use std::fmt;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::ids::{MdevUuid, PciAddress};

/// A device VFIO can open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "id", rename_all = "kebab-case")]
pub enum VfioTarget {
    /// A PCI function (whole GPU or SR-IOV VF) bound to vfio-pci.
    Pci(PciAddress),
    /// A mediated device instance.
    Mdev(MdevUuid),
}

impl fmt::Display for VfioTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VfioTarget::Pci(a) => write!(f, "PCI device {a}"),
            VfioTarget::Mdev(u) => write!(f, "mdev {u}"),
        }
    }
}

/// A text that names neither an mdev UUID nor a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0:?} is neither an mdev UUID nor a PCI address (give e.g. 0000:01:00.0)")]
pub struct BadTarget(pub String);

impl FromStr for VfioTarget {
    type Err = BadTarget;

    /// An mdev UUID or a PCI address (`0000:01:00.0`, `01:00.0`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(u) = s.parse::<MdevUuid>() {
            return Ok(VfioTarget::Mdev(u));
        }
        s.parse::<PciAddress>()
            .map(VfioTarget::Pci)
            .map_err(|_| BadTarget(s.to_string()))
    }
}

/// How VFIO is reached: the legacy container/group API or iommufd with the device's cdev.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VfioBackend {
    /// `/dev/vfio/vfio` container + `/dev/vfio/<group>` (VFIO_TYPE1v2_IOMMU).
    Type1,
    /// `/dev/iommu` + `/dev/vfio/devices/vfioN` (Documentation/driver-api/vfio.rst, "VFIO device cdev").
    Iommufd,
}

impl VfioBackend {
    /// Every backend.
    pub const ALL: [VfioBackend; 2] = [VfioBackend::Type1, VfioBackend::Iommufd];

    /// The short name used on the command line, on D-Bus and in JSON (`type1`, `iommufd`).
    pub fn as_str(self) -> &'static str {
        match self {
            VfioBackend::Type1 => "type1",
            VfioBackend::Iommufd => "iommufd",
        }
    }

    /// What it is, for messages (`type1 container`, `iommufd + vfio cdev`).
    pub fn describe(self) -> &'static str {
        match self {
            VfioBackend::Type1 => "type1 container",
            VfioBackend::Iommufd => "iommufd + vfio cdev",
        }
    }
}

impl fmt::Display for VfioBackend {
    /// The description ([`VfioBackend::describe`]); [`VfioBackend::as_str`] is the short name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.describe())
    }
}

/// A text that names no VFIO backend.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0:?} is not a VFIO backend (known: type1, iommufd)")]
pub struct UnknownBackend(pub String);

impl FromStr for VfioBackend {
    type Err = UnknownBackend;

    /// The short name ([`VfioBackend::as_str`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        VfioBackend::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| UnknownBackend(s.to_string()))
    }
}

/// One device opened for a VMM: its device fd and the fd of its IOMMU context (the type1 container, or
/// the iommufd with the IOAS the device is attached to).
#[derive(Debug)]
pub struct OpenedDevice {
    /// The mdev instance or PCI device that was opened.
    pub target: VfioTarget,
    /// The number of its IOMMU group (`/sys/kernel/iommu_groups/<n>`).
    pub iommu_group: u32,
    /// The IOMMU interface it was opened through.
    pub backend: VfioBackend,
    /// The VFIO device fd (regions, IRQs, config space).
    pub device: OwnedFd,
    /// The type1 container or the iommufd (DMA mappings).
    pub iommu: OwnedFd,
    /// The IOAS the device is attached to (iommufd only). `None` with iommufd: the device fd is the
    /// cdev not yet bound to the iommufd (an unbound hand-off, for VMMs that bind it themselves, as
    /// QEMU does with `-device vfio-pci,fd=`); `vgpu-vfio`'s `bind_and_attach` binds it.
    pub ioas_id: Option<u32>,
}

impl OpenedDevice {
    /// Reassembles what a receiver got (the fds, and the backend and IOAS id from the same reply).
    pub fn from_parts(
        target: VfioTarget,
        iommu_group: u32,
        backend: VfioBackend,
        device: OwnedFd,
        iommu: OwnedFd,
        ioas_id: Option<u32>,
    ) -> OpenedDevice {
        OpenedDevice {
            target,
            iommu_group,
            backend,
            device,
            iommu,
            ioas_id,
        }
    }

    /// The device fd, borrowed.
    pub fn device_fd(&self) -> BorrowedFd<'_> {
        self.device.as_fd()
    }

    /// The container or iommufd, borrowed.
    pub fn iommu_fd(&self) -> BorrowedFd<'_> {
        self.iommu.as_fd()
    }
}

/// The raw fd numbers, for logs.
impl fmt::Display for OpenedDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} through the {} (device fd {}, iommu fd {}",
            self.target,
            self.backend,
            self.device.as_raw_fd(),
            self.iommu.as_raw_fd()
        )?;
        if let Some(i) = self.ioas_id {
            write!(f, ", IOAS {i}")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_from_uuid_or_address() {
        let t: VfioTarget = "01:00.0".parse().unwrap();
        assert_eq!(t, VfioTarget::Pci("0000:01:00.0".parse().unwrap()));
        let t: VfioTarget = "0b3a8f7e-4c3d-4a6e-9a57-2f1c9b6b1e01".parse().unwrap();
        assert!(matches!(t, VfioTarget::Mdev(_)));
        let e = "gpu0".parse::<VfioTarget>().unwrap_err();
        assert!(e.to_string().contains("gpu0"), "{e}");
    }

    #[test]
    fn backends_have_one_name_each() {
        for b in VfioBackend::ALL {
            assert_eq!(b.as_str().parse::<VfioBackend>(), Ok(b));
            let json = serde_json::to_string(&b).unwrap();
            assert_eq!(json, format!("\"{}\"", b.as_str()));
        }
        let e = "vfio".parse::<VfioBackend>().unwrap_err();
        assert!(e.to_string().contains("type1, iommufd"), "{e}");
    }
}
