//! Hand-built inventories: small builders for every vendor path, with descriptions in the exact text
//! the drivers print, parsed by the real parsers.

use mdev_types::ids::{IommuGroup, MdevUuid, PciAddress, PciId};
use mdev_types::model::{
    Assignability, Capability, Gpu, Inventory, MdevParent, MdevType, NvidiaVfState, NvidiaVgpuType,
    PciDevice, SriovPf, Vendor,
};
use mdev_types::parse::parse_type_description;

use crate::profile::Profile;

pub fn addr(s: &str) -> PciAddress {
    s.parse().unwrap()
}

/// A profile from TOML text (panics on invalid text: tests only feed valid ones here).
pub fn profile(text: &str) -> Profile {
    Profile::from_toml("test.toml", text).unwrap()
}

/// A shipped profile.
pub fn shipped(name: &str) -> Profile {
    crate::profile::Catalog::builtin()
        .unwrap()
        .get(name)
        .unwrap()
        .clone()
}

/// A PCI function (display class 0x0302, no driver, own IOMMU group numbered after its bus).
pub fn dev(a: &str, vendor: u16, device: u16) -> PciDevice {
    let address = addr(a);
    PciDevice {
        address,
        vendor: PciId(vendor),
        device: PciId(device),
        subsystem_vendor: None,
        subsystem_device: None,
        class: 0x030200,
        driver: None,
        driver_override: None,
        iommu_group: Some(IommuGroup(
            u32::from(address.bus) * 256
                + u32::from(address.device) * 8
                + u32::from(address.function),
        )),
        numa_node: Some(0),
        boot_vga: false,
        sriov: None,
        physfn: None,
        nvidia_vf: None,
    }
}

fn mdev_type(id: &str, name: Option<&str>, desc: Option<&str>, avail: u32) -> MdevType {
    MdevType {
        id: id.parse().unwrap(),
        name: name.map(str::to_string),
        description: desc.map(str::to_string),
        details: parse_type_description(desc),
        device_api: "vfio-pci".to_string(),
        available_instances: avail,
        instances: Vec::new(),
    }
}

/// An NVIDIA classic type as the driver prints it.
pub fn nv_type(id: &str, name: &str, fb_mib: u64, heads: u32, res: &str, avail: u32) -> MdevType {
    let desc = format!(
        "num_heads={heads}, frl_config=60, framebuffer={fb_mib}M, max_resolution={res}, max_instance={avail}\n"
    );
    mdev_type(id, Some(name), Some(&desc), avail)
}

/// An Intel GVT-g type as kvmgt.c prints it.
pub fn gvt_type(id: &str, low: u64, high: u64, res: &str, weight: u32, avail: u32) -> MdevType {
    let desc = format!(
        "low_gm_size: {low}MB\nhigh_gm_size: {high}MB\nfence: 4\nresolution: {res}\nweight: {weight}\n"
    );
    mdev_type(id, Some(id), Some(&desc), avail)
}

/// An mbochs type (`virtual display, N MB video memory`).
pub fn mbochs_type(id: &str, mib: u64, avail: u32) -> MdevType {
    let desc = format!("virtual display, {mib} MB video memory\n");
    mdev_type(id, None, Some(&desc), avail)
}

/// An mdpy type (`virtual display, WxH framebuffer`).
pub fn mdpy_type(id: &str, res: &str, avail: u32) -> MdevType {
    let desc = format!("virtual display, {res} framebuffer\n");
    mdev_type(id, None, Some(&desc), avail)
}

/// A type whose description no parser knows.
pub fn odd_type(id: &str, desc: Option<&str>, avail: u32) -> MdevType {
    mdev_type(id, None, desc, avail)
}

/// Gives `t` `n` existing instances.
pub fn with_instances(mut t: MdevType, n: usize) -> MdevType {
    t.instances = (0..n)
        .map(|i| {
            format!("00000000-0000-4000-8000-{i:012}")
                .parse::<MdevUuid>()
                .unwrap()
        })
        .collect();
    t
}

/// Builds an [`Inventory`] GPU by GPU.
pub struct InvBuilder {
    inv: Inventory,
}

impl InvBuilder {
    pub fn new() -> Self {
        InvBuilder {
            inv: Inventory {
                host: "hand-built".to_string(),
                pci_devices: Vec::new(),
                mdev_parents: Vec::new(),
                mdev_instances: Vec::new(),
                iommu_groups: Vec::new(),
                gpus: Vec::new(),
                faults: Vec::new(),
            },
        }
    }

    pub fn build(self) -> Inventory {
        self.inv
    }

    fn push_gpu(&mut self, d: &PciDevice, vendor: Vendor, model: &str, caps: Vec<Capability>) {
        let passthrough = match d.iommu_group {
            Some(g) => Assignability::Yes { iommu_group: g },
            None => Assignability::No {
                reason: "it has no IOMMU group: the kernel runs without an IOMMU".to_string(),
            },
        };
        self.inv.gpus.push(Gpu {
            id: d.address.to_string(),
            pci: Some(d.address),
            vendor,
            model: model.to_string(),
            driver: d.driver.clone(),
            numa_node: d.numa_node,
            boot_vga: d.boot_vga,
            capabilities: caps,
            passthrough,
        });
    }

    /// A GPU that is an mdev parent (NVIDIA classic or Intel GVT-g).
    pub fn mdev_gpu(&mut self, d: PciDevice, model: &str, types: Vec<MdevType>) -> &mut Self {
        let vendor = Vendor::from_pci(d.vendor);
        self.push_gpu(
            &d,
            vendor,
            model,
            vec![Capability::Mdev { types: types.len() }],
        );
        self.inv.mdev_parents.push(MdevParent {
            name: d.address.to_string(),
            pci: Some(d.address),
            driver: d.driver.clone(),
            types,
        });
        self.inv.pci_devices.push(d);
        self
    }

    /// A GPU with no virtualization capability (passthrough only).
    pub fn plain_gpu(&mut self, d: PciDevice, model: &str) -> &mut Self {
        let vendor = Vendor::from_pci(d.vendor);
        self.push_gpu(&d, vendor, model, Vec::new());
        self.inv.pci_devices.push(d);
        self
    }

    /// An SR-IOV PF with `total` VFs of which `vfs` are enabled (VF n at function n+1 of the PF's
    /// device, own IOMMU groups). `each_vf` adjusts every VF (e.g. to add NVIDIA state).
    pub fn sriov_gpu(
        &mut self,
        mut pf: PciDevice,
        model: &str,
        total: u32,
        vfs: u32,
        mut each_vf: impl FnMut(u32, &mut PciDevice),
    ) -> &mut Self {
        let mut addrs = Vec::new();
        for i in 0..vfs {
            let a = PciAddress::new(
                pf.address.domain,
                pf.address.bus,
                pf.address.device + 1 + (i / 8) as u8,
                (i % 8) as u8,
            )
            .unwrap();
            let mut vf = dev(&a.to_string(), pf.vendor.0, pf.device.0 + 1);
            vf.physfn = Some(pf.address);
            each_vf(i, &mut vf);
            addrs.push(a);
            self.inv.pci_devices.push(vf);
        }
        pf.sriov = Some(SriovPf {
            total_vfs: total,
            num_vfs: vfs,
            drivers_autoprobe: false,
            vf_device: None,
            vfs: addrs,
        });
        let vendor = Vendor::from_pci(pf.vendor);
        let mut caps = vec![Capability::Sriov {
            total_vfs: total,
            num_vfs: vfs,
        }];
        if vendor == Vendor::Nvidia {
            caps.push(Capability::NvidiaVendorVfio { vfs: vfs as usize });
        }
        self.push_gpu(&pf, vendor, model, caps);
        self.inv.pci_devices.push(pf);
        self
    }

    /// A virtual mdev parent (kernel sample driver).
    pub fn virtual_parent(&mut self, name: &str, types: Vec<MdevType>) -> &mut Self {
        self.inv.gpus.push(Gpu {
            id: name.to_string(),
            pci: None,
            vendor: Vendor::Virtual,
            model: format!("{name} (virtual mdev parent)"),
            driver: Some(name.to_string()),
            numa_node: None,
            boot_vga: false,
            capabilities: vec![Capability::Mdev { types: types.len() }],
            passthrough: Assignability::No {
                reason: "it is a virtual device".to_string(),
            },
        });
        self.inv.mdev_parents.push(MdevParent {
            name: name.to_string(),
            pci: None,
            driver: Some(name.to_string()),
            types,
        });
        self
    }

    /// Edits the last GPU entry (e.g. to make it not assignable).
    pub fn last_gpu(&mut self) -> &mut Gpu {
        self.inv.gpus.last_mut().unwrap()
    }
}

/// A driver-bound PF/GPU.
pub fn bound(mut d: PciDevice, driver: &str) -> PciDevice {
    d.driver = Some(driver.to_string());
    d
}

/// NVIDIA vendor-specific VFIO state with the given creatable types and current type.
pub fn nvidia_vf(creatable: &[(u32, &str)], current: Option<u32>) -> NvidiaVfState {
    NvidiaVfState {
        creatable: creatable
            .iter()
            .map(|(id, name)| NvidiaVgpuType {
                id: *id,
                name: name.to_string(),
            })
            .collect(),
        current_type: current,
    }
}

/// The T4 types of a real vGPU 16 host, a subset: (id, name, fb MiB, heads, resolution).
pub const T4_TYPES: &[(&str, &str, u64, u32, &str)] = &[
    ("nvidia-222", "GRID T4-1B", 1024, 4, "5120x2880"),
    ("nvidia-223", "GRID T4-2B", 2048, 4, "5120x2880"),
    ("nvidia-224", "GRID T4-2B4", 2048, 4, "5120x2880"),
    ("nvidia-225", "GRID T4-1A", 1024, 1, "1280x1024"),
    ("nvidia-226", "GRID T4-2A", 2048, 1, "1280x1024"),
    ("nvidia-230", "GRID T4-1Q", 1024, 4, "5120x2880"),
    ("nvidia-231", "GRID T4-2Q", 2048, 4, "5120x2880"),
    ("nvidia-232", "GRID T4-4Q", 4096, 4, "5120x2880"),
    ("nvidia-233", "GRID T4-8Q", 8192, 4, "5120x2880"),
    ("nvidia-319", "GRID T4-4C", 4096, 1, "4096x2160"),
    ("nvidia-320", "GRID T4-8C", 8192, 1, "4096x2160"),
];

/// T4 classic-mdev types, each with `avail` instances available (16 GiB / fb, capped by `avail`).
pub fn t4_types(avail: u32) -> Vec<MdevType> {
    T4_TYPES
        .iter()
        .map(|(id, name, fb, heads, res)| {
            let max = u32::try_from(16384 / fb).unwrap();
            nv_type(id, name, *fb, *heads, res, avail.min(max))
        })
        .collect()
}

/// L40S vendor-VFIO creatable types (a subset of a real table).
pub const L40S_TYPES: &[(u32, &str)] = &[
    (1155, "NVIDIA L40S-1B"),
    (1156, "NVIDIA L40S-2B"),
    (1157, "NVIDIA L40S-1Q"),
    (1158, "NVIDIA L40S-2Q"),
    (1159, "NVIDIA L40S-4Q"),
    (1161, "NVIDIA L40S-8Q"),
    (1164, "NVIDIA L40S-16Q"),
    (1170, "NVIDIA L40S-4C"),
    (1171, "NVIDIA L40S-8C"),
];
