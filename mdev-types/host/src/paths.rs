//! The sysfs ABI paths vgpu-manager uses, in one place.
//!
//! Sources: Documentation/ABI/testing/sysfs-bus-pci (PCI attributes, SR-IOV, `driver_override`),
//! Documentation/driver-api/vfio-mediated-device.rst and Documentation/ABI/testing/sysfs-bus-vfio-mdev
//! (mdev parents, types, `create`, `remove`), Documentation/ABI/testing/sysfs-kernel-iommu_groups.

use std::path::PathBuf;

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use mdev_types::vfio_api::VfioTarget;

/// `/sys/bus/pci/devices` — one link per PCI function.
pub const PCI_DEVICES: &str = "/sys/bus/pci/devices";
/// `/sys/bus/pci/drivers` — one directory per PCI driver, with `bind`/`unbind`.
pub const PCI_DRIVERS: &str = "/sys/bus/pci/drivers";
/// `/sys/bus/pci/drivers_probe` — write an address to probe drivers for it.
pub const PCI_DRIVERS_PROBE: &str = "/sys/bus/pci/drivers_probe";
/// `/sys/class/mdev_bus` — one link per registered mdev parent.
pub const MDEV_BUS_CLASS: &str = "/sys/class/mdev_bus";
/// `/sys/bus/mdev/devices` — one link per mdev instance.
pub const MDEV_DEVICES: &str = "/sys/bus/mdev/devices";
/// `/sys/kernel/iommu_groups` — one directory per IOMMU group.
pub const IOMMU_GROUPS: &str = "/sys/kernel/iommu_groups";

/// The sysfs directory of a device VFIO opens: `/sys/bus/pci/devices/<addr>` or
/// `/sys/bus/mdev/devices/<uuid>`.
pub fn vfio_target(target: &VfioTarget) -> PathBuf {
    match target {
        VfioTarget::Pci(a) => pci_device(a),
        VfioTarget::Mdev(u) => mdev_device(u),
    }
}

/// `/sys/bus/pci/devices/<addr>`.
pub fn pci_device(addr: &PciAddress) -> PathBuf {
    PathBuf::from(format!("{PCI_DEVICES}/{addr}"))
}

/// `/sys/bus/pci/devices/<addr>/<attr>`.
pub fn pci_attr(addr: &PciAddress, attr: &str) -> PathBuf {
    pci_device(addr).join(attr)
}

/// `/sys/bus/pci/drivers/<driver>`.
pub fn pci_driver(driver: &str) -> PathBuf {
    PathBuf::from(format!("{PCI_DRIVERS}/{driver}"))
}

/// `/sys/class/mdev_bus/<parent>` where `parent` is the parent's device name (a PCI address or, for
/// virtual parents such as the kernel samples, a name like `mbochs`).
pub fn mdev_parent(parent: &str) -> PathBuf {
    PathBuf::from(format!("{MDEV_BUS_CLASS}/{parent}"))
}

/// `/sys/class/mdev_bus/<parent>/mdev_supported_types/<type>`.
pub fn mdev_type_dir(parent: &str, ty: &MdevTypeId) -> PathBuf {
    mdev_parent(parent)
        .join("mdev_supported_types")
        .join(ty.as_str())
}

/// `/sys/bus/mdev/devices/<uuid>`.
pub fn mdev_device(uuid: &MdevUuid) -> PathBuf {
    PathBuf::from(format!("{MDEV_DEVICES}/{uuid}"))
}

/// `/sys/kernel/iommu_groups/<n>/devices`.
pub fn iommu_group_devices(group: u32) -> PathBuf {
    PathBuf::from(format!("{IOMMU_GROUPS}/{group}/devices"))
}
