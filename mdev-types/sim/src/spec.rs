//! The TOML description of a simulated host. Every table rejects unknown fields; values use the
//! kernel's spellings (PCI addresses, `0x10de`-style ids, errno names).
//!
//! ```toml
//! [[driver]]
//! name = "nvidia"
//! match = ["10de:*"]
//!
//! [[pci]]
//! address = "0000:3b:00.0"
//! vendor = "10de"
//! device = "1eb8"
//! class = 0x030200
//! driver = "nvidia"
//! iommu_group = 12
//! ```

use std::collections::BTreeMap;
use std::fmt;

use nix::errno::Errno;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::SimError;
use super::locate::{Locator, line_col};
use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress, PciId};

/// A whole simulated host.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimSpec {
    /// Host-wide settings.
    #[serde(default)]
    pub host: HostSpec,
    /// PCI drivers, in registration order (the order `drivers_probe` tries them).
    #[serde(default, rename = "driver")]
    pub drivers: Vec<DriverSpec>,
    /// PCI functions (VFs are created from their PF's `sriov` table, not listed here).
    #[serde(default)]
    pub pci: Vec<PciSpec>,
    /// mdev parents and their types.
    #[serde(default)]
    pub mdev_parent: Vec<MdevParentSpec>,
    /// mdev instances that exist when the host starts (e.g. made by someone else).
    #[serde(default)]
    pub mdev: Vec<MdevSpec>,
    /// NVIDIA GPUs using the vendor-specific VFIO interface on their VFs.
    #[serde(default)]
    pub nvidia_vfio: Vec<NvidiaVfioSpec>,
    /// Intel xe SR-IOV PFs with `sriov_admin`.
    #[serde(default)]
    pub xe_sriov: Vec<XeSriovSpec>,
    /// Intel i915 SR-IOV PFs with `prelim_iov` (out-of-tree driver).
    #[serde(default)]
    pub i915_iov: Vec<super::i915_iov::I915IovSpec>,
    /// Loaded modules' parameters (`/sys/module/<name>/parameters`).
    #[serde(default, rename = "module")]
    pub modules: Vec<super::modules::ModuleSpec>,
}

/// Host-wide settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostSpec {
    /// One line about the host, for humans.
    pub description: Option<String>,
    /// `type` shown by PCI IOMMU groups (`DMA`, `DMA-FQ`, `identity`); default `DMA`.
    pub iommu_domain_type: Option<String>,
    /// Number of online NUMA nodes (bounds `numa_node`); unchecked when absent.
    pub numa_nodes: Option<u32>,
}

/// How a PCI driver's probe behaves beyond id matching.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriverKindSpec {
    /// Binds whatever it matches.
    #[default]
    Generic,
    /// vfio-pci: matches only via `driver_override`/`new_id`; refuses bridges, PFs with enabled VFs and
    /// devices without an IOMMU group.
    VfioPci,
    /// pci-stub: matches only via `driver_override`/`new_id`.
    PciStub,
}

/// A PCI driver.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriverSpec {
    /// Driver name (`/sys/bus/pci/drivers/<name>`).
    pub name: String,
    /// Static id table: `"10de:1eb8"`, `"10de:*"` (any device), `"class:0x010802"`.
    #[serde(default, rename = "match")]
    pub matches: Vec<String>,
    /// Probe behaviour; default `generic`.
    #[serde(default)]
    pub kind: DriverKindSpec,
    /// Has an `sriov_configure` callback (writes to `sriov_numvfs` work while bound).
    #[serde(default)]
    pub sriov_configure: bool,
    /// `pci_sriov_set_totalvfs` done at probe (igb lowers 8 to 7).
    pub sriov_max_vfs: Option<u16>,
    /// remove() disables SR-IOV (default true; nvme leaves VFs enabled).
    pub disable_sriov_on_unbind: Option<bool>,
    /// The driver's probe fails on VFs with this errno (e.g. nvme on QEMU's offline secondary
    /// controllers: `ENODEV`), so VFs stay unbound.
    pub vf_probe_errno: Option<ErrnoName>,
}

/// A PCI function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PciSpec {
    /// `DDDD:BB:DD.F`.
    pub address: PciAddress,
    /// Vendor id, e.g. `"10de"`.
    pub vendor: PciId,
    /// Device id.
    pub device: PciId,
    /// Subsystem vendor id (default `0000`).
    pub subsystem_vendor: Option<PciId>,
    /// Subsystem device id (default `0000`).
    pub subsystem_device: Option<PciId>,
    /// 24-bit class code, e.g. `0x030200`.
    pub class: u32,
    /// Revision id (default 0).
    pub revision: Option<u8>,
    /// Bound driver at start.
    pub driver: Option<String>,
    /// `driver_override` at start.
    pub driver_override: Option<String>,
    /// NUMA node (default -1, none).
    pub numa_node: Option<i32>,
    /// `boot_vga` (VGA-class devices only; default false).
    pub boot_vga: Option<bool>,
    /// IOMMU group number; absent = no IOMMU group.
    pub iommu_group: Option<u32>,
    /// Upstream bridge (its address); absent = on the root bus of this address's bus.
    pub parent: Option<PciAddress>,
    /// SR-IOV capability (PFs only).
    pub sriov: Option<SriovSpec>,
}

/// Where VFs get their IOMMU group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VfIommuSpec {
    /// Each VF in a new group (ACS isolation).
    #[default]
    Own,
    /// VFs share the PF's group.
    Pf,
}

/// SR-IOV capability of a PF.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SriovSpec {
    /// `TotalVFs` of the capability.
    pub total_vfs: u16,
    /// VFs enabled at start (e.g. by a module parameter); default 0.
    #[serde(default)]
    pub num_vfs: u16,
    /// VF device id (`sriov_vf_device`).
    pub vf_device: PciId,
    /// VF subsystem device id (default: the PF's).
    pub vf_subsystem_device: Option<PciId>,
    /// First VF offset (routing id).
    pub offset: u16,
    /// VF stride (routing id).
    pub stride: u16,
    /// `sriov_drivers_autoprobe` at start (default true).
    pub drivers_autoprobe: Option<bool>,
    /// VF IOMMU grouping (default `own`).
    #[serde(default)]
    pub vf_iommu: VfIommuSpec,
}

/// Who counts an mdev parent's instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CountingSpec {
    /// The driver (`get_available`), in its `pools`.
    #[default]
    Driver,
    /// The mdev core: one shared `max_instances` for all types; full → `EUSERS`.
    Core,
}

/// An errno by name (`"ENOSPC"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrnoName(pub Errno);

/// Errnos a description may name.
const ERRNOS: &[(&str, Errno)] = &[
    ("EINVAL", Errno::EINVAL),
    ("ENOSPC", Errno::ENOSPC),
    ("ENOMEM", Errno::ENOMEM),
    ("EUSERS", Errno::EUSERS),
    ("EBUSY", Errno::EBUSY),
    ("EEXIST", Errno::EEXIST),
    ("ENODEV", Errno::ENODEV),
    ("ENOENT", Errno::ENOENT),
    ("EIO", Errno::EIO),
    ("EPERM", Errno::EPERM),
    ("EAGAIN", Errno::EAGAIN),
];

impl fmt::Display for ErrnoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = ERRNOS
            .iter()
            .find(|(_, e)| *e == self.0)
            .map_or("E?", |(n, _)| n);
        f.write_str(name)
    }
}

impl Serialize for ErrnoName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ErrnoName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ERRNOS
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, e)| ErrnoName(*e))
            .ok_or_else(|| {
                let names: Vec<&str> = ERRNOS.iter().map(|(n, _)| *n).collect();
                serde::de::Error::custom(format!(
                    "'{s}' is not an errno name this simulator knows: use one of {}",
                    names.join(", ")
                ))
            })
    }
}

/// An mdev parent: a PCI function (bound to the driver that registers it) or a virtual class device.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdevParentSpec {
    /// Device name: a PCI address, or a virtual device's name (`mtty`).
    pub device: String,
    /// For virtual parents: the class (`/sys/devices/virtual/<class>/<device>`).
    pub virtual_class: Option<String>,
    /// NVIDIA classic vGPU on an SR-IOV GPU (Ampere and later, vGPU software ≤ 16): `device` names the
    /// PF (listed under `[[pci]]` with a `[pci.sriov]` table and a bound driver), and every VF bound to
    /// the PF's driver is its own mdev parent (`/sys/class/mdev_bus/<VF address>`) holding at most one
    /// vGPU, while the pools, the homogeneous rule and each type's `max_instances` count per physical
    /// GPU over all its VFs (NVIDIA vGPU User Guide 13–16, "Creating an NVIDIA vGPU on a Linux with
    /// KVM Hypervisor", GPUs that support SR-IOV). Needs driver counting and no `virtual_class`;
    /// default false.
    #[serde(default)]
    pub on_vfs: bool,
    /// For virtual parents: whether the module that registers it is loaded at start (default true);
    /// [`SimHost::load_module`](super::SimHost::load_module) loads it later, like `modprobe`.
    #[serde(default)]
    pub unloaded: bool,
    /// The mdev bus driver instances bind to (`mtty`, `intel_vgpu_mdev`, `nvidia-vgpu-vfio`).
    pub mdev_driver: String,
    /// Who counts instances (default `driver`).
    #[serde(default)]
    pub counting: CountingSpec,
    /// For `counting = "core"`: the parent-wide instance count.
    pub max_instances: Option<u32>,
    /// For `counting = "driver"`: errno of a create on a type with nothing left (default by driver:
    /// `EIO` for `nvidia-vgpu-vfio`, else `ENOSPC`).
    pub full_errno: Option<ErrnoName>,
    /// A total instance limit the driver enforces at create but does not show in `available_instances`.
    pub create_limit: Option<u32>,
    /// One type at a time per parent (NVIDIA time-sliced vGPU).
    #[serde(default)]
    pub homogeneous: bool,
    /// Shared resource pools and their capacities (e.g. `framebuffer_mib = 16384`).
    #[serde(default)]
    pub pools: BTreeMap<String, u64>,
    /// The mdev types this parent offers (its `type` tables).
    #[serde(default, rename = "type")]
    pub types: Vec<MdevTypeSpec>,
}

/// One mdev type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdevTypeSpec {
    /// Directory name under `mdev_supported_types/` (`nvidia-231`).
    pub id: MdevTypeId,
    /// `name` (pretty name); absent → the kernel prints the type's sysfs name.
    pub name: Option<String>,
    /// `description` text without the trailing newline; absent → no `description` file.
    pub description: Option<String>,
    /// `device_api` (default `vfio-pci`).
    pub device_api: Option<String>,
    /// Instance limit of this type.
    pub max_instances: Option<u32>,
    /// Pool consumption per instance.
    #[serde(default)]
    pub uses: BTreeMap<String, u64>,
}

/// An existing mdev instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdevSpec {
    /// The instance's UUID, its name under `/sys/bus/mdev/devices/`.
    pub uuid: MdevUuid,
    /// Parent device name.
    pub parent: String,
    /// Type id.
    #[serde(rename = "type")]
    pub mdev_type: MdevTypeId,
}

/// An NVIDIA GPU whose VFs use the vendor-specific VFIO interface (`<vf>/nvidia/`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvidiaVfioSpec {
    /// The PCI address of the NVIDIA PF whose VFs get the `nvidia/` directory.
    pub pf: PciAddress,
    /// Framebuffer shared by the vGPUs, MiB.
    pub framebuffer_mib: u64,
    /// Mixed-size (heterogeneous) mode; default false.
    #[serde(default)]
    pub heterogeneous: bool,
    /// The vGPU types, in the order the driver lists them.
    #[serde(rename = "type")]
    pub types: Vec<VgpuTypeSpec>,
    /// vGPUs existing at start.
    #[serde(default, rename = "vgpu")]
    pub vgpus: Vec<VgpuSpec>,
}

/// One NVIDIA vGPU type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VgpuTypeSpec {
    /// Type id (non-zero).
    pub id: u32,
    /// Name, e.g. `NVIDIA L40S-2Q`.
    pub name: String,
    /// Framebuffer, MiB.
    pub framebuffer_mib: u64,
}

/// An existing vendor-VFIO vGPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VgpuSpec {
    /// 0-based VF index (`virtfnN`).
    pub vf: u16,
    /// Type id.
    #[serde(rename = "type")]
    pub type_id: u32,
}

/// An Intel xe SR-IOV PF with `sriov_admin`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XeSriovSpec {
    /// The PCI address of the xe PF that gets `sriov_admin/`.
    pub pf: PciAddress,
    /// Device VRAM in bytes (discrete parts; enables `vram_quota`).
    pub vram_bytes: Option<u64>,
    /// The PF driver that provides `sriov_admin` (default `xe`).
    pub driver: Option<String>,
}

impl SimSpec {
    /// Parses a TOML description. `file` names it in errors, which carry the line, column and schema
    /// path of the problem.
    pub fn from_toml(file: &str, text: &str) -> Result<Self, SimError> {
        toml::from_str::<SimSpec>(text).map_err(|e| {
            let offset = e.span().map_or(0, |s| s.start);
            let (line, column) = line_col(text, offset);
            let field = Locator::new(text).path_at(line);
            SimError::Toml {
                file: file.to_string(),
                line,
                column,
                field: if field.is_empty() {
                    "(document)".to_string()
                } else {
                    field
                },
                message: e.message().trim().to_string(),
            }
        })
    }
}
