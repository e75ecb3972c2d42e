//! Reading IOMMU groups and judging whether a device can be assigned whole.

use std::collections::BTreeMap;
use std::path::Path;

use tracing::{debug, warn};

use super::DiscoverError;
use super::fault::{Outcome, classify};
use crate::{Host, HostExt, paths};
use mdev_types::fault::{DeviceFault, FaultScope};
use mdev_types::ids::{IommuGroup, MdevUuid, PciAddress};
use mdev_types::model::{Assignability, IommuGroupInfo, PciDevice};

/// Reads `/sys/kernel/iommu_groups/*/devices`, each group on its own (see `mdev::read_parents`).
pub(super) fn read_groups(
    host: &dyn Host,
) -> Result<(Vec<IommuGroupInfo>, Vec<DeviceFault>), DiscoverError> {
    let mut out = Vec::new();
    let mut faults = Vec::new();
    for name in host.list_optional(Path::new(paths::IOMMU_GROUPS))? {
        let Ok(group) = name.parse::<IommuGroup>() else {
            continue;
        };
        let dir = paths::iommu_group_devices(group.0);
        match classify(
            host,
            FaultScope::IommuGroup,
            &name,
            &dir,
            read_group(host, group, &dir),
        ) {
            Outcome::Read(info) => out.push(info),
            Outcome::Gone => debug!(%group, "IOMMU group disappeared during discovery"),
            Outcome::Faulted(f) => {
                warn!(%group, "{f}");
                faults.push(f);
            }
        }
    }
    out.sort_by_key(|g| g.group);
    Ok((out, faults))
}

fn read_group(
    host: &dyn Host,
    group: IommuGroup,
    dir: &Path,
) -> Result<IommuGroupInfo, DiscoverError> {
    let mut info = IommuGroupInfo {
        group,
        pci_devices: Vec::new(),
        mdevs: Vec::new(),
    };
    for member in host.list_optional(dir)? {
        if let Ok(a) = member.parse::<PciAddress>() {
            info.pci_devices.push(a);
        } else if let Ok(u) = member.parse::<MdevUuid>() {
            info.mdevs.push(u);
        }
    }
    info.pci_devices.sort();
    info.mdevs.sort();
    Ok(info)
}

/// Drivers that leave a device safely unused by the host (Documentation/driver-api/vfio.rst, "Groups,
/// Devices, and IOMMUs": every device in a group must be bound to a VFIO bus driver or pci-stub, or unbound).
const SAFE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub"];

/// Whether `dev` could be handed to a guest whole through VFIO, with the reason when not.
pub(super) fn assignability(
    dev: &PciDevice,
    all: &BTreeMap<PciAddress, &PciDevice>,
) -> Assignability {
    let Some(group) = dev.iommu_group else {
        return Assignability::No {
            reason: "it has no IOMMU group: the kernel runs without an IOMMU, so VFIO cannot isolate it \
                     (enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on)"
                .to_string(),
        };
    };
    if let Some(s) = dev.sriov.as_ref().filter(|s| s.num_vfs > 0) {
        // vfio-pci's probe refuses a PF whose VFs are enabled (drivers/vfio/pci/vfio_pci_core.c,
        // vfio_pci_core_register_device: -EBUSY when pdev->is_physfn && num_vfs).
        return Assignability::No {
            reason: format!(
                "its {} SR-IOV VFs are enabled, and vfio-pci does not take a PF with VFs: set sriov_numvfs to 0 first",
                s.num_vfs
            ),
        };
    }
    if dev.boot_vga {
        return Assignability::No {
            reason: "it is the boot VGA device: the host console runs on it".to_string(),
        };
    }
    let blockers: Vec<String> = all
        .values()
        .filter(|o| o.address != dev.address && o.iommu_group == Some(group))
        .filter(|o| !o.is_bridge())
        .filter(|o| {
            o.driver
                .as_deref()
                .is_some_and(|d| !SAFE_DRIVERS.contains(&d))
        })
        .map(|o| {
            format!(
                "{} (driver {})",
                o.address,
                o.driver.as_deref().unwrap_or("none")
            )
        })
        .collect();
    if blockers.is_empty() {
        Assignability::Yes { iommu_group: group }
    } else {
        Assignability::No {
            reason: format!(
                "IOMMU group {group} also holds {} which the host is using: a guest would get them too \
                 (move the GPU to another slot or bind them to vfio-pci first)",
                blockers.join(", ")
            ),
        }
    }
}
