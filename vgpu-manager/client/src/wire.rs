//! The structures `org.vgpumanager.Manager1` returns. D-Bus has no "maybe" type, so absent values travel
//! as `""` (strings) or `-1` (numbers); the accessor methods turn them back into `Option`s.

use serde::{Deserialize, Serialize};
use zbus::{OwnedObjectPath, Type};

/// One instance, as `ListInstances`/`GetInstance` return it: D-Bus signature `(ssssssbbssit)`.
///
/// Its object path is not sent: it is a function of the UUID ([`InstanceInfo::path`]), and leaving it
/// out makes a listing a third smaller, and cheaper for the bus, which validates every object path in
/// a message it routes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type)]
pub struct InstanceInfo {
    /// The instance's mdev UUID; its object path is derived from it.
    pub uuid: String,
    /// The GPU id (PCI address or parent name).
    pub gpu: String,
    /// The mdev parent's sysfs device name (e.g. `0000:3b:00.0`).
    pub parent: String,
    /// The mdev type id, e.g. `nvidia-231`.
    pub type_id: String,
    /// The profile it was made from; `""` when made from a type or not by vgpu-manager.
    pub profile: String,
    /// `running`, `stopped` or `waiting-for-parent`.
    pub state: String,
    /// A persistent definition exists.
    pub defined: bool,
    /// Started automatically (definitions only).
    pub autostart: bool,
    /// Who owns it: `daemon` (created by vgpud), `adopted` (existed, taken over by a definition or an
    /// explicit stop/destroy) or `foreign` (made by mdevctl or by hand: vgpud's automatic actions never
    /// touch it; an explicit, authorized stop/destroy naming it adopts it first).
    pub owner: String,
    /// Free-form label given at creation (a VM name, a pool slot); `""` when none.
    pub label: String,
    /// IOMMU group number while running; `-1` when none.
    pub iommu_group: i32,
    /// When it was created or defined, seconds since the Unix epoch.
    pub created_at: u64,
}

/// One definition, as `ListDefinitions` returns it: D-Bus signature `(sssbsa(ss))`. mdevctl keys
/// definitions by parent and UUID, so one UUID may appear under several parents (foreign files).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type)]
pub struct DefinitionInfo {
    /// The mdev parent's sysfs device name (the directory of its file under `/etc/mdevctl.d`).
    pub parent: String,
    /// The mdev UUID.
    pub uuid: String,
    /// The mdev type id.
    pub type_id: String,
    /// Started when its parent appears (mdevctl's `"start": "auto"`).
    pub autostart: bool,
    /// `daemon` (one of vgpud's definitions) or `foreign` (a file in `/etc/mdevctl.d` vgpud did not
    /// write: listed, never started by vgpud on its own; `AdoptDefinition` takes it over).
    pub owner: String,
    /// mdev attributes (name, value), in write order.
    pub attrs: Vec<(String, String)>,
}

/// One device discovery could not read, as `ListFaults` returns it: D-Bus signature `(sssss)`. The device
/// is not managed (nothing is placed on it, its instances and definitions are kept) until it reads again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type)]
pub struct FaultInfo {
    /// What kind of device: `pci-device`, `mdev-parent`, `mdev-instance` or `iommu-group`.
    pub scope: String,
    /// Its id: a PCI address, an mdev parent name, an mdev UUID or an IOMMU group number.
    pub device: String,
    /// The kernel path whose read failed.
    pub path: String,
    /// What went wrong, as a sentence (`reading failed: EIO`, `it is malformed: …`).
    pub problem: String,
    /// What to do about it; `""` when no fix is known.
    pub fix: String,
}

impl FaultInfo {
    /// The fix, if one is known.
    pub fn fix(&self) -> Option<&str> {
        non_empty(&self.fix)
    }
}

impl DefinitionInfo {
    /// True for a definition vgpud did not write.
    pub fn is_foreign(&self) -> bool {
        self.owner == "foreign"
    }
}

impl InstanceInfo {
    /// Its object path, serving `org.vgpumanager.Instance1` (see [`crate::instance_path`]).
    pub fn path(&self) -> OwnedObjectPath {
        crate::instance_path(&self.uuid)
    }

    /// The profile, if any.
    pub fn profile(&self) -> Option<&str> {
        non_empty(&self.profile)
    }

    /// The label, if any.
    pub fn label(&self) -> Option<&str> {
        non_empty(&self.label)
    }

    /// The IOMMU group, if it has one.
    pub fn iommu_group(&self) -> Option<u32> {
        u32::try_from(self.iommu_group).ok()
    }
}

/// An mdev type a GPU offers and how many more instances of it fit: signature `(su)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, zbus::Variant)]
pub struct TypeSlot {
    /// The mdev type id, e.g. `nvidia-231`.
    pub type_id: String,
    /// `available_instances` now.
    pub available: u32,
}

/// One GPU, as `ListGpus` returns it: signature `(ossssia(su)as)`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type)]
pub struct GpuInfo {
    /// Its object path (serving `org.vgpumanager.Gpu1`).
    pub path: OwnedObjectPath,
    /// GPU id (PCI address or parent name).
    pub id: String,
    /// Vendor (`nvidia`, `intel`, …).
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Bound driver; `""` when none.
    pub driver: String,
    /// NUMA node; `-1` when unknown.
    pub numa_node: i32,
    /// The mdev types it offers, with room left.
    pub types: Vec<TypeSlot>,
    /// UUIDs of the instances running on it.
    pub instances: Vec<String>,
}

impl GpuInfo {
    /// The driver, if one is bound.
    pub fn driver(&self) -> Option<&str> {
        non_empty(&self.driver)
    }

    /// The NUMA node, if known.
    pub fn numa_node(&self) -> Option<u32> {
        u32::try_from(self.numa_node).ok()
    }
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_the_documented_ones() {
        assert_eq!(InstanceInfo::SIGNATURE.to_string(), "(ssssssbbssit)");
        assert_eq!(GpuInfo::SIGNATURE.to_string(), "(ossssia(su)as)");
        assert_eq!(FaultInfo::SIGNATURE.to_string(), "(sssss)");
    }
}
