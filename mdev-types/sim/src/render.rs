//! Renders the simulated sysfs tree from the typed state: PCI functions, PCI drivers and IOMMU groups
//! here; mdev, NVIDIA vendor-VFIO and xe `sriov_admin` in their modules. Attribute formats are the
//! kernel's (drivers/pci/pci-sysfs.c, drivers/pci/iov.c, drivers/base/bus.c, drivers/iommu/iommu.c).

use super::attr::Attr;
use super::model::Model;
use super::vfs::Vfs;
use super::{mdev, nvidia, xe};

/// Renders the whole simulated sysfs tree (PCI, IOMMU groups, mdev, vendor files, modules).
pub(crate) fn render(model: &Model) -> Vfs {
    let mut v = Vfs::default();
    pci_bus(model, &mut v);
    iommu_groups(model, &mut v);
    mdev::render(model, &mut v);
    nvidia::render(model, &mut v);
    xe::render(model, &mut v);
    super::i915_iov::render(model, &mut v);
    super::modules::render(model, &mut v);
    v
}

/// `/sys/bus/pci`, every function's directory and the driver directories.
fn pci_bus(model: &Model, v: &mut Vfs) {
    v.mkdir("/sys/bus/pci/devices");
    v.wo("/sys/bus/pci/drivers_probe", Attr::DriversProbe);
    for d in &model.drivers {
        let dir = format!("/sys/bus/pci/drivers/{}", d.name);
        v.wo(&format!("{dir}/bind"), Attr::Bind(d.name.clone()));
        v.wo(&format!("{dir}/unbind"), Attr::Unbind(d.name.clone()));
        v.wo(&format!("{dir}/new_id"), Attr::NewId(d.name.clone()));
        v.wo(&format!("{dir}/remove_id"), Attr::RemoveId(d.name.clone()));
    }
    for d in model.pci.values() {
        let a = d.addr;
        let dir = model.dev_dir(&a);
        let f = |name: &str| format!("{dir}/{name}");
        v.ro(&f("vendor"), format!("0x{:04x}\n", d.vendor));
        v.ro(&f("device"), format!("0x{:04x}\n", d.device));
        v.ro(
            &f("subsystem_vendor"),
            format!("0x{:04x}\n", d.subsystem_vendor),
        );
        v.ro(
            &f("subsystem_device"),
            format!("0x{:04x}\n", d.subsystem_device),
        );
        v.ro(&f("class"), format!("0x{:06x}\n", d.class));
        v.ro(&f("revision"), format!("0x{:02x}\n", d.revision));
        v.ro(&f("uevent"), uevent(&a, d));
        v.rw(
            &f("numa_node"),
            format!("{}\n", d.numa_node),
            Attr::NumaNode(a),
        );
        // driver_override_show: sysfs_emit("%s\n") of a NULL pointer prints "(null)".
        v.rw(
            &f("driver_override"),
            format!("{}\n", d.driver_override.as_deref().unwrap_or("(null)")),
            Attr::DriverOverride(a),
        );
        if d.is_vga() {
            v.ro(&f("boot_vga"), format!("{}\n", u8::from(d.boot_vga)));
        }
        v.link(&f("subsystem"), "/sys/bus/pci");
        v.link(&format!("/sys/bus/pci/devices/{a}"), &dir);
        if let Some(drv) = &d.driver {
            let ddir = format!("/sys/bus/pci/drivers/{drv}");
            v.link(&f("driver"), &ddir);
            v.link(&format!("{ddir}/{a}"), &dir);
        }
        if let Some(g) = d.iommu_group {
            v.link(&f("iommu_group"), &format!("/sys/kernel/iommu_groups/{g}"));
        }
        if let Some(s) = &d.sriov {
            v.ro(&f("sriov_totalvfs"), format!("{}\n", model.total_vfs(d)));
            v.rw(
                &f("sriov_numvfs"),
                format!("{}\n", s.num),
                Attr::SriovNumvfs(a),
            );
            v.ro(&f("sriov_offset"), format!("{}\n", s.offset));
            v.ro(&f("sriov_stride"), format!("{}\n", s.stride));
            // sriov_vf_device_show prints "%x\n" (no 0x, no padding).
            v.ro(&f("sriov_vf_device"), format!("{:x}\n", s.vf_device));
            v.rw(
                &f("sriov_drivers_autoprobe"),
                format!("{}\n", u8::from(s.autoprobe)),
                Attr::SriovAutoprobe(a),
            );
            for (i, vf) in model.vfs_of(&a) {
                v.link(&f(&format!("virtfn{i}")), &model.dev_dir(&vf));
            }
        }
        if let Some((pf, _)) = d.vf_of {
            v.link(&f("physfn"), &model.dev_dir(&pf));
        }
    }
}

/// A PCI function's `uevent` as `uevent_show` prints it (drivers/base/core.c): `DRIVER` from
/// `dev_uevent` while a driver is bound, then `pci_uevent`'s fields (drivers/pci/pci-driver.c).
fn uevent(a: &mdev_types::ids::PciAddress, d: &super::model::PciDev) -> String {
    let mut s = String::new();
    if let Some(drv) = &d.driver {
        s.push_str(&format!("DRIVER={drv}\n"));
    }
    s.push_str(&format!(
        "PCI_CLASS={:04X}\nPCI_ID={:04X}:{:04X}\nPCI_SUBSYS_ID={:04X}:{:04X}\nPCI_SLOT_NAME={a}\n",
        d.class, d.vendor, d.device, d.subsystem_vendor, d.subsystem_device
    ));
    s.push_str(&format!(
        "MODALIAS=pci:v{:08X}d{:08X}sv{:08X}sd{:08X}bc{:02X}sc{:02X}i{:02x}\n",
        d.vendor,
        d.device,
        d.subsystem_vendor,
        d.subsystem_device,
        (d.class >> 16) & 0xff,
        (d.class >> 8) & 0xff,
        d.class & 0xff
    ));
    s
}

/// `reserved_regions` of a PCI group under Intel VT-d, printed by `iommu_group_show_resv_regions` as
/// `"0x%016llx 0x%016llx %s"` in address order (drivers/iommu/intel/iommu.c
/// `intel_iommu_get_resv_regions`): the interrupt window (IOAPIC_RANGE_START..END) as `msi` for every
/// device, and for ISA bridges the first 16 MiB as `direct-relaxable` (CONFIG_INTEL_IOMMU_FLOPPY_WA).
fn reserved_regions(model: &Model, group: u32) -> String {
    let isa = model
        .pci
        .values()
        .any(|d| d.iommu_group == Some(group) && d.class >> 8 == 0x0601);
    let mut s = String::new();
    if isa {
        s.push_str("0x0000000000000000 0x0000000000ffffff direct-relaxable\n");
    }
    s.push_str("0x00000000fee00000 0x00000000feefffff msi\n");
    s
}

/// `/sys/kernel/iommu_groups/<n>/{devices/,type}`; groups vfio allocates for mdevs (emulated IOMMU)
/// are named `vfio-noiommu` and have no default domain (`type` shows `unknown`).
///
/// The `iommu_groups` kset exists whenever the kernel has IOMMU support (drivers/iommu/iommu.c
/// `iommu_init`), empty on a machine without an IOMMU.
fn iommu_groups(model: &Model, v: &mut Vfs) {
    v.mkdir("/sys/kernel/iommu_groups");
    let mdev_groups: Vec<u32> = model.mdevs.values().map(|m| m.iommu_group).collect();
    for (g, members) in model.groups() {
        let dir = format!("/sys/kernel/iommu_groups/{g}");
        v.mkdir(&format!("{dir}/devices"));
        for (name, target) in members {
            v.link(&format!("{dir}/devices/{name}"), &target);
        }
        if mdev_groups.contains(&g) {
            v.ro(&format!("{dir}/name"), "vfio-noiommu\n");
            v.ro(&format!("{dir}/type"), "unknown\n");
            v.ro(&format!("{dir}/reserved_regions"), "");
        } else {
            v.ro(
                &format!("{dir}/type"),
                format!("{}\n", model.iommu_domain_type),
            );
            v.ro(
                &format!("{dir}/reserved_regions"),
                reserved_regions(model, g),
            );
        }
    }
}
