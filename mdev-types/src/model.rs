//! What discovery reports about a host: PCI devices, mdev parents with their types and instances,
//! SR-IOV physical and virtual functions, NVIDIA vendor-specific VFIO state and IOMMU groups.
//!
//! The model is plain data (serde-serializable; `vgpuctl discover --json` prints it). It holds no handle
//! to the host it was read from.

use serde::{Deserialize, Serialize};

use crate::fault::{DeviceFault, FaultScope};
use crate::ids::{IommuGroup, MdevTypeId, MdevUuid, PciAddress, PciId};
use crate::parse::TypeDescription;

/// Everything discovery found on one host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// Which host was read (`sysfs at /`, `simulated host 'demo'`).
    pub host: String,
    /// Every PCI function, sorted by address.
    pub pci_devices: Vec<PciDevice>,
    /// Every registered mdev parent (PCI or virtual), sorted by name.
    pub mdev_parents: Vec<MdevParent>,
    /// Every existing mdev instance, sorted by UUID.
    pub mdev_instances: Vec<MdevInstance>,
    /// Every IOMMU group with its members, sorted by number.
    pub iommu_groups: Vec<IommuGroupInfo>,
    /// The GPUs (display controllers, 3D controllers, accelerators, and virtual display parents) with
    /// what each can offer a guest.
    pub gpus: Vec<Gpu>,
    /// Devices that could not be read, each named with the failing path and cause; every other device
    /// is listed as usual. Empty on a healthy host.
    #[serde(default)]
    pub faults: Vec<DeviceFault>,
}

impl Inventory {
    /// The fault of the GPU, PCI device or mdev parent named `id`, if discovery could not read it.
    pub fn fault_of(&self, id: &str) -> Option<&DeviceFault> {
        self.faults.iter().find(|f| {
            f.device == id && matches!(f.scope, FaultScope::PciDevice | FaultScope::MdevParent)
        })
    }

    /// The mdev parent registered on `gpu` itself: the one at its PCI address, or the virtual parent
    /// of its name.
    pub fn own_parent(&self, gpu: &Gpu) -> Option<&MdevParent> {
        self.mdev_parents.iter().find(|p| match gpu.pci {
            Some(a) => p.pci == Some(a),
            None => p.name == gpu.id,
        })
    }

    /// The mdev parents of `gpu` seen as one: its own parent, or — when its SR-IOV VFs are its
    /// parents (every VF lists the same types and holds one vGPU) — one parent named and placed as
    /// the GPU, with the first VF's types, each holding the instances of every VF and the sum of
    /// their `available_instances` (what the kernel shows; how many more fit in the GPU's framebuffer
    /// can be fewer). `None` when the GPU has no mdev parent.
    pub fn gpu_mdev_parent(&self, gpu: &Gpu) -> Option<MdevParent> {
        if let Some(p) = self.own_parent(gpu) {
            return Some(p.clone());
        }
        let parents = self.gpu_parents(gpu);
        let first = parents.iter().find(|p| !p.types.is_empty())?;
        let mut merged = MdevParent {
            name: gpu.id.clone(),
            pci: gpu.pci,
            driver: first.driver.clone(),
            types: first.types.clone(),
        };
        for t in &mut merged.types {
            let same = parents
                .iter()
                .flat_map(|p| &p.types)
                .filter(|u| u.id == t.id);
            t.instances = same
                .clone()
                .flat_map(|u| u.instances.iter().copied())
                .collect();
            t.available_instances = same
                .map(|u| u.available_instances)
                .fold(0, u32::saturating_add);
        }
        Some(merged)
    }

    /// The mdev parents that make vGPUs of `gpu`: the parent registered on the GPU itself (its PCI
    /// function, or the virtual parent of that name) or, when there is none, the parents registered
    /// on its SR-IOV VFs in VF order (NVIDIA classic vGPU on Ampere and later GPUs: one vGPU per VF).
    pub fn gpu_parents(&self, gpu: &Gpu) -> Vec<&MdevParent> {
        if let Some(p) = self.own_parent(gpu) {
            return vec![p];
        }
        let Some(pf) = gpu.pci else {
            return Vec::new();
        };
        let Some(vfs) = self
            .pci_devices
            .iter()
            .find(|d| d.address == pf)
            .and_then(|d| d.sriov.as_ref())
        else {
            return Vec::new();
        };
        vfs.vfs
            .iter()
            .filter_map(|vf| self.mdev_parents.iter().find(|p| p.pci == Some(*vf)))
            .collect()
    }

    /// Whether the mdev parents of `gpu` are its SR-IOV VFs, one vGPU each
    /// ([`Capability::MdevOnVfs`]).
    pub fn mdev_on_vfs(gpu: &Gpu) -> bool {
        gpu.capabilities
            .iter()
            .any(|c| matches!(c, Capability::MdevOnVfs { .. }))
    }

    /// The GPU whose vGPUs mdev parent `parent` makes: the GPU of that name or PCI function, or the
    /// physical function of the VF the parent is registered on.
    pub fn gpu_of_parent(&self, parent: &str) -> Option<&Gpu> {
        if let Some(g) = self.gpus.iter().find(|g| g.id == parent) {
            return Some(g);
        }
        let pci = self
            .mdev_parents
            .iter()
            .find(|p| p.name == parent)
            .and_then(|p| p.pci)
            .or_else(|| parent.parse::<PciAddress>().ok())?;
        let pf = self
            .pci_devices
            .iter()
            .find(|d| d.address == pci)
            .and_then(|d| d.physfn)
            .unwrap_or(pci);
        self.gpus.iter().find(|g| g.pci == Some(pf))
    }
}

/// One PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciDevice {
    /// Its PCI address, the name of its `/sys/bus/pci/devices/` entry.
    pub address: PciAddress,
    /// `vendor`.
    pub vendor: PciId,
    /// `device`.
    pub device: PciId,
    /// `subsystem_vendor`, when present.
    pub subsystem_vendor: Option<PciId>,
    /// `subsystem_device`, when present.
    pub subsystem_device: Option<PciId>,
    /// `class` (24 bits: base class, subclass, programming interface).
    pub class: u32,
    /// The bound driver (name of the `driver` link), if any.
    pub driver: Option<String>,
    /// `driver_override`, if set.
    pub driver_override: Option<String>,
    /// The IOMMU group (`iommu_group` link), absent when the kernel runs without an IOMMU.
    pub iommu_group: Option<IommuGroup>,
    /// `numa_node`, absent when the kernel reports -1.
    pub numa_node: Option<u32>,
    /// `boot_vga` is 1: the firmware console runs on this device.
    pub boot_vga: bool,
    /// SR-IOV physical-function state, when the device has the capability.
    pub sriov: Option<SriovPf>,
    /// For a virtual function: its physical function (`physfn` link).
    pub physfn: Option<PciAddress>,
    /// NVIDIA vendor-specific VFIO state (`nvidia/` directory of a VF), when present.
    pub nvidia_vf: Option<NvidiaVfState>,
}

impl PciDevice {
    /// Base class 0x03 (display controller) or 0x12 (processing accelerator).
    pub fn is_gpu_class(&self) -> bool {
        matches!(self.class >> 16, 0x03 | 0x12)
    }

    /// Base class 0x06 (bridge).
    pub fn is_bridge(&self) -> bool {
        self.class >> 16 == 0x06
    }
}

/// SR-IOV state of a physical function (`sriov_*` attributes and `virtfn*` links).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SriovPf {
    /// `sriov_totalvfs`.
    pub total_vfs: u32,
    /// `sriov_numvfs`.
    pub num_vfs: u32,
    /// `sriov_drivers_autoprobe`: whether new VFs are probed by drivers automatically.
    pub drivers_autoprobe: bool,
    /// `sriov_vf_device`, the device id VFs will have, when the kernel exposes it.
    pub vf_device: Option<PciId>,
    /// The enabled VFs (`virtfn0`, `virtfn1`, …) in index order.
    pub vfs: Vec<PciAddress>,
}

/// One vGPU type a NVIDIA vendor-specific VFIO VF can take (a row of `nvidia/creatable_vgpu_types`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaVgpuType {
    /// The numeric type id written to `current_vgpu_type`.
    pub id: u32,
    /// The vGPU name, e.g. `NVIDIA L40S-4Q`.
    pub name: String,
}

/// NVIDIA vendor-specific VFIO state of one VF (`nvidia/creatable_vgpu_types`, `nvidia/current_vgpu_type`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaVfState {
    /// Types that can be created on this VF now (empty once the GPU's framebuffer is used up).
    pub creatable: Vec<NvidiaVgpuType>,
    /// The vGPU type this VF currently has; `None` when `current_vgpu_type` is 0.
    pub current_type: Option<u32>,
}

/// A registered mdev parent: a device whose driver offers mediated devices.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MdevParent {
    /// The parent's device name as in `/sys/class/mdev_bus/<name>` (a PCI address or e.g. `mbochs`).
    pub name: String,
    /// The PCI address, when the parent is a PCI device.
    pub pci: Option<PciAddress>,
    /// The parent's driver, when known.
    pub driver: Option<String>,
    /// Its supported types, sorted by id.
    pub types: Vec<MdevType>,
}

/// One entry of `mdev_supported_types/`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MdevType {
    /// The directory name, e.g. `nvidia-231`.
    pub id: MdevTypeId,
    /// `name`, when the driver provides it (e.g. `GRID T4-2Q`).
    pub name: Option<String>,
    /// `description`, raw, when the driver provides it.
    pub description: Option<String>,
    /// The description parsed into the vendor's fields.
    pub details: TypeDescription,
    /// `device_api`, e.g. `vfio-pci`.
    pub device_api: String,
    /// `available_instances`.
    pub available_instances: u32,
    /// Instances of this type that exist now (`devices/`).
    pub instances: Vec<MdevUuid>,
}

/// An existing mdev instance (`/sys/bus/mdev/devices/<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdevInstance {
    /// Its UUID, the name of its `/sys/bus/mdev/devices/` entry.
    pub uuid: MdevUuid,
    /// The parent's device name.
    pub parent: String,
    /// Its type (`mdev_type` link).
    pub type_id: MdevTypeId,
    /// Its IOMMU group, when it has one.
    pub iommu_group: Option<IommuGroup>,
    /// The bound driver (usually `vfio_mdev` or the vendor's), if any.
    pub driver: Option<String>,
}

/// An IOMMU group and the devices in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IommuGroupInfo {
    /// Group number.
    pub group: IommuGroup,
    /// PCI members, sorted.
    pub pci_devices: Vec<PciAddress>,
    /// mdev members.
    pub mdevs: Vec<MdevUuid>,
}

/// Which vendor made a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA (0x10de).
    Nvidia,
    /// Intel (0x8086).
    Intel,
    /// AMD (0x1002).
    Amd,
    /// Virtual devices such as the kernel's sample mdev drivers.
    Virtual,
    /// Anything else.
    Other,
}

impl Vendor {
    /// Every vendor, in declaration order.
    pub const ALL: [Vendor; 5] = [
        Vendor::Nvidia,
        Vendor::Intel,
        Vendor::Amd,
        Vendor::Virtual,
        Vendor::Other,
    ];

    /// The vendor of a PCI vendor id.
    pub fn from_pci(id: PciId) -> Self {
        match id {
            PciId::NVIDIA => Vendor::Nvidia,
            PciId::INTEL => Vendor::Intel,
            PciId::AMD => Vendor::Amd,
            _ => Vendor::Other,
        }
    }

    /// Lower-case name as used in profiles (`nvidia`, `intel`, `amd`, `virtual`, `other`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Intel => "intel",
            Vendor::Amd => "amd",
            Vendor::Virtual => "virtual",
            Vendor::Other => "other",
        }
    }
}

/// A GPU and what it can offer a guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// Stable name: the PCI address, or the parent name for a virtual mdev parent.
    pub id: String,
    /// The PCI address, for PCI GPUs.
    pub pci: Option<PciAddress>,
    /// Who makes it, from the PCI vendor id; `Virtual` for a non-PCI mdev parent.
    pub vendor: Vendor,
    /// A human model name (`NVIDIA T4`, or `NVIDIA device 0x10de:0x2335` when unknown).
    pub model: String,
    /// The driver bound to it (its `driver` link), or `None` when unbound.
    pub driver: Option<String>,
    /// NUMA node, when known.
    pub numa_node: Option<u32>,
    /// The firmware console runs on it.
    pub boot_vga: bool,
    /// Every way it can be virtualized, in the order found.
    pub capabilities: Vec<Capability>,
    /// Whether the whole device could be handed to a guest through VFIO, and why not.
    pub passthrough: Assignability,
}

/// One way a GPU can be virtualized.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Capability {
    /// It is an mdev parent (classic NVIDIA vGPU, Intel GVT-g, kernel samples).
    Mdev {
        /// Number of types.
        types: usize,
    },
    /// It is an SR-IOV physical function.
    Sriov {
        /// `sriov_totalvfs`.
        total_vfs: u32,
        /// `sriov_numvfs`.
        num_vfs: u32,
    },
    /// Its SR-IOV VFs are mdev parents, one vGPU on each, sharing the GPU's framebuffer: NVIDIA
    /// classic vGPU on Ampere and later GPUs (NVIDIA vGPU User Guide 13–16, "Creating an NVIDIA vGPU
    /// on a Linux with KVM Hypervisor", GPUs that support SR-IOV).
    MdevOnVfs {
        /// VFs registered as mdev parents.
        vfs: usize,
        /// Number of types (the types every such VF lists).
        types: usize,
    },
    /// Its VFs carry NVIDIA's vendor-specific VFIO interface (`nvidia/creatable_vgpu_types`).
    NvidiaVendorVfio {
        /// VFs that have the interface.
        vfs: usize,
    },
}

/// Whether a device can be assigned to a guest whole through VFIO.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "assignable", rename_all = "kebab-case")]
pub enum Assignability {
    /// It can (its IOMMU group holds nothing the host needs).
    Yes {
        /// The IOMMU group it is in (`/sys/kernel/iommu_groups/<n>`).
        iommu_group: IommuGroup,
    },
    /// It cannot, for this reason (a sentence naming what to change).
    No {
        /// Why not and what would change it.
        reason: String,
    },
}
