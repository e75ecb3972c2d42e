//! The simulated kernel's typed state. The sysfs tree is rendered from it ([`super::render`]); store
//! handlers change it ([`super::pci`], [`super::sriov`], [`super::mdev`], [`super::nvidia`],
//! [`super::xe`]).

use std::collections::{BTreeMap, BTreeSet};

use nix::errno::Errno;

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};

/// One PCI function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PciDev {
    pub addr: PciAddress,
    pub vendor: u16,
    pub device: u16,
    pub subsystem_vendor: u16,
    pub subsystem_device: u16,
    /// 24-bit class code.
    pub class: u32,
    pub revision: u8,
    /// -1 when the firmware gives no node (`NUMA_NO_NODE`).
    pub numa_node: i32,
    /// `boot_vga` value; the attribute exists only on VGA-class devices.
    pub boot_vga: bool,
    /// Upstream bridge; `None` for devices on a root bus.
    pub parent: Option<PciAddress>,
    pub driver: Option<String>,
    pub driver_override: Option<String>,
    pub iommu_group: Option<u32>,
    /// SR-IOV capability (physical functions only).
    pub sriov: Option<Sriov>,
    /// For a VF: its PF and its 0-based VF index (`virtfnN`).
    pub vf_of: Option<(PciAddress, u16)>,
}

impl PciDev {
    /// Bridges (class 0x06xx) have a type 1 header; vfio-pci refuses them.
    pub(crate) fn is_bridge(&self) -> bool {
        self.class >> 16 == 0x06
    }

    /// `pci_is_vga`: only VGA-compatible controllers have a `boot_vga` attribute
    /// (drivers/pci/pci-sysfs.c `pci_dev_attrs_are_visible`).
    pub(crate) fn is_vga(&self) -> bool {
        self.class >> 8 == 0x0300 || self.class >> 8 == 0x0001
    }
}

/// Where a PF's VFs get their IOMMU group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VfIommu {
    /// Each VF in a new group (ACS up to the root).
    Own,
    /// VFs join the PF's group.
    Pf,
}

/// SR-IOV capability state of a PF (drivers/pci/iov.c `struct pci_sriov`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sriov {
    /// `TotalVFs` from the capability.
    pub total: u16,
    /// `num_VFs`.
    pub num: u16,
    pub autoprobe: bool,
    pub offset: u16,
    pub stride: u16,
    pub vf_device: u16,
    pub vf_subsystem_device: u16,
    pub vf_iommu: VfIommu,
}

/// How a PCI driver matches devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdMatch {
    /// Vendor and device, `None` for `PCI_ANY_ID`.
    Id {
        vendor: Option<u16>,
        device: Option<u16>,
    },
    /// Class code under a mask.
    Class { class: u32, mask: u32 },
}

impl IdMatch {
    /// `pci_match_one_id` for the fields we model.
    pub(crate) fn matches(&self, dev: &PciDev) -> bool {
        match *self {
            IdMatch::Id { vendor, device } => {
                vendor.is_none_or(|v| v == dev.vendor) && device.is_none_or(|d| d == dev.device)
            }
            IdMatch::Class { class, mask } => (dev.class ^ class) & mask == 0,
        }
    }
}

/// What a driver's probe checks beyond id matching.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DriverKind {
    /// Accepts what it matches.
    Generic,
    /// vfio-pci: matches only through `driver_override` or `new_id`; refuses bridges, PFs with VFs
    /// enabled and devices without an IOMMU group.
    VfioPci,
    /// pci-stub: no static ids; accepts what it matches.
    PciStub,
}

/// A dynamic id added through `new_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DynId {
    pub vendor: u32,
    pub device: u32,
    pub subvendor: u32,
    pub subdevice: u32,
    pub class: u32,
    pub class_mask: u32,
}

/// `PCI_ANY_ID`.
pub(crate) const PCI_ANY_ID: u32 = 0xffff_ffff;

impl DynId {
    /// `pci_match_one_id`.
    pub(crate) fn matches(&self, dev: &PciDev) -> bool {
        let f = |want: u32, have: u16| want == PCI_ANY_ID || want == u32::from(have);
        f(self.vendor, dev.vendor)
            && f(self.device, dev.device)
            && f(self.subvendor, dev.subsystem_vendor)
            && f(self.subdevice, dev.subsystem_device)
            && (self.class ^ dev.class) & self.class_mask == 0
    }
}

/// A PCI driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Driver {
    pub name: String,
    pub kind: DriverKind,
    pub ids: Vec<IdMatch>,
    pub dynids: Vec<DynId>,
    /// Has an `sriov_configure` callback.
    pub sriov_configure: bool,
    /// `pci_sriov_set_totalvfs` done at probe (e.g. igb lowers 8 to 7).
    pub sriov_max_vfs: Option<u16>,
    /// Its remove() disables SR-IOV (igb does; nvme leaves VFs enabled).
    pub disable_sriov_on_unbind: bool,
    /// Its probe fails on VFs with this errno.
    pub vf_probe_errno: Option<Errno>,
}

/// How an mdev parent counts instances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Counting {
    /// No `get_available`: the mdev core counts one pool of `max` for all types and fails `create` with
    /// `EUSERS` (drivers/vfio/mdev/mdev_core.c `mdev_device_create`).
    Core { max: u32 },
    /// The driver counts in its own pools (`get_available`) and fails probe with `full_errno`.
    Driver {
        /// Pool names and capacities.
        pools: Vec<(String, u64)>,
        full_errno: Errno,
        /// A total instance limit not shown in `available_instances` (GVT-g's vGPU id range).
        create_limit: Option<u32>,
    },
}

/// One mdev type of a parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MdevType {
    pub id: MdevTypeId,
    /// The pretty name; the kernel prints the sysfs name when there is none.
    pub name: Option<String>,
    /// `None` when the driver has no `show_description` (the attribute is then hidden).
    pub description: Option<String>,
    pub device_api: String,
    pub max_instances: Option<u32>,
    /// Pool index and amount per instance.
    pub uses: Vec<(usize, u64)>,
}

/// Where an mdev parent device lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ParentLoc {
    /// A PCI function; registered while bound to `driver`.
    Pci { addr: PciAddress, driver: String },
    /// A class device under `/sys/devices/virtual/<class>/<name>` (the kernel samples).
    Virtual {
        /// The device class (and module) name.
        class: String,
        /// Whether the module that registers it is loaded.
        loaded: bool,
    },
}

/// An mdev parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parent {
    /// Device name (`/sys/class/mdev_bus/<name>`).
    pub name: String,
    pub loc: ParentLoc,
    /// The mdev bus driver instances bind to.
    pub mdev_driver: String,
    pub counting: Counting,
    /// NVIDIA's rule: one time-sliced type per GPU at a time.
    pub homogeneous: bool,
    pub types: Vec<MdevType>,
    /// `Some(pf)` for an SR-IOV VF of NVIDIA classic vGPU (vGPU software ≤ 16 on Ampere and later):
    /// the parent holds at most one instance, and its pools, homogeneous rule and per-type
    /// `max_instances` count the instances of every parent sharing the same physical GPU `pf` (all of
    /// them have the same types, in the same order). `None`: the parent counts only its own instances.
    pub shares_gpu: Option<PciAddress>,
}

/// An mdev instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mdev {
    pub parent: usize,
    pub ty: usize,
    pub iommu_group: u32,
}

/// One vGPU type of an NVIDIA vendor-specific VFIO GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VgpuType {
    pub id: u32,
    pub name: String,
    pub framebuffer_mib: u64,
}

/// NVIDIA vendor-specific VFIO state of one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NvidiaGpu {
    pub framebuffer_mib: u64,
    pub heterogeneous: bool,
    pub types: Vec<VgpuType>,
    /// VF index → vGPU type id.
    pub vgpus: BTreeMap<u16, u32>,
    /// VF index → last `vgpu_params` text.
    pub params: BTreeMap<u16, String>,
}

/// Scheduling and provisioning of one xe function (PF = index 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct XeFunc {
    pub exec_quantum_ms: u32,
    pub preempt_timeout_us: u32,
    /// Index into `low, normal, high`.
    pub priority: usize,
    /// Explicit VRAM quota in bytes (0 = unprovisioned).
    pub vram_quota: u64,
    /// VRAM the PF auto-provisioned at VF enable.
    pub vram_auto: u64,
    pub stopped: bool,
}

/// Intel xe SR-IOV PF state (`sriov_admin`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct XePf {
    pub driver: String,
    pub vram_bytes: Option<u64>,
    /// Index 0 is the PF, N is `vfN`, up to `sriov_totalvfs`.
    pub funcs: Vec<XeFunc>,
}

/// The whole simulated kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Model {
    pub name: String,
    /// `type` of PCI IOMMU groups (`DMA`, `DMA-FQ`, `identity`).
    pub iommu_domain_type: String,
    pub numa_nodes: Option<u32>,
    pub pci: BTreeMap<PciAddress, PciDev>,
    /// In registration order (the order `drivers_probe` tries them).
    pub drivers: Vec<Driver>,
    pub parents: Vec<Parent>,
    pub mdevs: BTreeMap<MdevUuid, Mdev>,
    pub nvidia: BTreeMap<PciAddress, NvidiaGpu>,
    pub xe: BTreeMap<PciAddress, XePf>,
    /// i915 `prelim_iov` PFs.
    pub i915: BTreeMap<PciAddress, super::i915_iov::I915Pf>,
    /// Module parameters.
    pub modules: Vec<super::modules::ModuleParams>,
}

/// Deepest bridge nesting followed when building a device path (guards against a malformed model).
const MAX_DEPTH: usize = 32;

impl Model {
    /// `/sys/devices/pciDDDD:BB/…/<addr>`: under its bridges, or on its root bus.
    pub(crate) fn dev_dir(&self, addr: &PciAddress) -> String {
        let mut chain = vec![*addr];
        let mut cur = *addr;
        while let Some(p) = self.pci.get(&cur).and_then(|d| d.parent) {
            if chain.len() > MAX_DEPTH || chain.contains(&p) {
                break;
            }
            chain.push(p);
            cur = p;
        }
        let root = chain.last().copied().unwrap_or(*addr);
        let mut path = format!("/sys/devices/pci{:04x}:{:02x}", root.domain, root.bus);
        for a in chain.iter().rev() {
            path.push('/');
            path.push_str(&a.to_string());
        }
        path
    }

    /// The directory of an mdev parent device.
    pub(crate) fn parent_dir(&self, p: &Parent) -> String {
        match &p.loc {
            ParentLoc::Pci { addr, .. } => self.dev_dir(addr),
            ParentLoc::Virtual { class, .. } => format!("/sys/devices/virtual/{class}/{}", p.name),
        }
    }

    /// A PCI parent is registered while its device is bound to the driver that registers it
    /// (`mdev_register_parent` in probe, `mdev_unregister_parent` in remove).
    pub(crate) fn parent_registered(&self, p: &Parent) -> bool {
        match &p.loc {
            ParentLoc::Pci { addr, driver } => self
                .pci
                .get(addr)
                .is_some_and(|d| d.driver.as_deref() == Some(driver.as_str())),
            ParentLoc::Virtual { loaded, .. } => *loaded,
        }
    }

    /// A driver by name.
    pub(crate) fn driver(&self, name: &str) -> Option<&Driver> {
        self.drivers.iter().find(|d| d.name == name)
    }

    /// `pci_sriov_get_totalvfs`: the driver's limit while bound, else the capability's TotalVFs.
    pub(crate) fn total_vfs(&self, dev: &PciDev) -> u16 {
        let Some(sriov) = &dev.sriov else { return 0 };
        let limit = dev
            .driver
            .as_deref()
            .and_then(|d| self.driver(d))
            .and_then(|d| d.sriov_max_vfs);
        limit.map_or(sriov.total, |l| l.min(sriov.total))
    }

    /// The IOMMU group numbers held by any device.
    fn groups_in_use(&self) -> BTreeSet<u32> {
        self.pci
            .values()
            .filter_map(|d| d.iommu_group)
            .chain(self.mdevs.values().map(|m| m.iommu_group))
            .collect()
    }

    /// `iommu_group_alloc` takes the lowest free id from an IDA (drivers/iommu/iommu.c).
    pub(crate) fn alloc_group(&self) -> u32 {
        let used = self.groups_in_use();
        (0..).find(|n| !used.contains(n)).unwrap_or(u32::MAX)
    }

    /// Every group with its member device names (PCI addresses and mdev UUIDs).
    pub(crate) fn groups(&self) -> BTreeMap<u32, Vec<(String, String)>> {
        let mut out: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
        for d in self.pci.values() {
            if let Some(g) = d.iommu_group {
                out.entry(g)
                    .or_default()
                    .push((d.addr.to_string(), self.dev_dir(&d.addr)));
            }
        }
        for (uuid, m) in &self.mdevs {
            if let Some(p) = self.parents.get(m.parent) {
                out.entry(m.iommu_group)
                    .or_default()
                    .push((uuid.to_string(), format!("{}/{uuid}", self.parent_dir(p))));
            }
        }
        out
    }

    /// The VF address `pci_iov_virtfn_bus`/`pci_iov_virtfn_devfn` compute for VF `index` of `pf`.
    pub(crate) fn vf_address(pf: &PciAddress, sriov: &Sriov, index: u16) -> Option<PciAddress> {
        let devfn = u32::from(pf.device) << 3 | u32::from(pf.function);
        let routed = devfn + u32::from(sriov.offset) + u32::from(sriov.stride) * u32::from(index);
        let bus = u32::from(pf.bus) + (routed >> 8);
        let devfn = routed & 0xff;
        PciAddress::new(
            pf.domain,
            u8::try_from(bus).ok()?,
            u8::try_from(devfn >> 3).ok()?,
            u8::try_from(devfn & 7).ok()?,
        )
    }

    /// The VFs of `pf`, by index.
    pub(crate) fn vfs_of(&self, pf: &PciAddress) -> Vec<(u16, PciAddress)> {
        let mut v: Vec<(u16, PciAddress)> = self
            .pci
            .values()
            .filter_map(|d| match d.vf_of {
                Some((p, i)) if p == *pf => Some((i, d.addr)),
                _ => None,
            })
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sriov(offset: u16, stride: u16) -> Sriov {
        Sriov {
            total: 8,
            num: 0,
            autoprobe: true,
            offset,
            stride,
            vf_device: 0,
            vf_subsystem_device: 0,
            vf_iommu: VfIommu::Own,
        }
    }

    #[test]
    fn vf_routing_ids_follow_offset_and_stride() {
        // QEMU's igb: offset 0x80, stride 2 → 01:10.0, 01:10.2 (the test guest of the real-kernel harness).
        let pf: PciAddress = "0000:01:00.0".parse().unwrap();
        let s = sriov(0x80, 2);
        assert_eq!(
            Model::vf_address(&pf, &s, 0).unwrap().to_string(),
            "0000:01:10.0"
        );
        assert_eq!(
            Model::vf_address(&pf, &s, 1).unwrap().to_string(),
            "0000:01:10.2"
        );
        // Past devfn 0xff the routing id carries into the next bus.
        let s = sriov(0x80, 0x40);
        assert_eq!(
            Model::vf_address(&pf, &s, 2).unwrap().to_string(),
            "0000:02:00.0"
        );
    }
}
