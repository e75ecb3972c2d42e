//! SR-IOV: `sriov_numvfs`, `sriov_drivers_autoprobe`, and VF creation and removal
//! (drivers/pci/iov.c, Linux 6.12).

use nix::errno::Errno;

use super::kstr::{kstrtobool, kstrtou16};
use super::model::{Model, PciDev, VfIommu};
use super::{pci, xe};
use mdev_types::ids::PciAddress;

/// `sriov_numvfs_store`, in the kernel's order of checks:
/// not a u16 → `EINVAL`; above `sriov_totalvfs` → `ERANGE`; equal to the current count → success
/// without change; no driver bound → `ENOENT`; driver without `sriov_configure` → `ENOENT`; 0 disables;
/// non-zero while VFs are enabled → `EBUSY`; otherwise the driver enables the VFs.
pub(crate) fn store_numvfs(model: &mut Model, pf: &PciAddress, buf: &str) -> Result<(), Errno> {
    let num = kstrtou16(buf, 0).map_err(|_| Errno::EINVAL)?;
    let dev = model.pci.get(pf).ok_or(Errno::ENODEV)?;
    let sriov = dev.sriov.as_ref().ok_or(Errno::ENOENT)?;
    if num > model.total_vfs(dev) {
        return Err(Errno::ERANGE);
    }
    if num == sriov.num {
        return Ok(());
    }
    let drv = dev.driver.as_deref().ok_or(Errno::ENOENT)?;
    if !model.driver(drv).is_some_and(|d| d.sriov_configure) {
        return Err(Errno::ENOENT);
    }
    if num == 0 {
        remove_vfs(model, pf);
        return Ok(());
    }
    if sriov.num != 0 {
        return Err(Errno::EBUSY);
    }
    add_vfs(model, pf, num)
}

/// `sriov_drivers_autoprobe_store`: `kstrtobool`, else `EINVAL`.
pub(crate) fn store_autoprobe(model: &mut Model, pf: &PciAddress, buf: &str) -> Result<(), Errno> {
    let v = kstrtobool(buf)?;
    let s = model
        .pci
        .get_mut(pf)
        .and_then(|d| d.sriov.as_mut())
        .ok_or(Errno::ENOENT)?;
    s.autoprobe = v;
    Ok(())
}

/// `sriov_enable` → `sriov_add_vfs`: each VF is added (joining or allocating an IOMMU group), then
/// offered to the drivers (`pci_bus_add_device`), which only probe it when autoprobe is on.
pub(crate) fn add_vfs(model: &mut Model, pf: &PciAddress, num: u16) -> Result<(), Errno> {
    let pf_dev = model.pci.get(pf).ok_or(Errno::ENODEV)?.clone();
    let sriov = pf_dev.sriov.clone().ok_or(Errno::ENOENT)?;
    let addrs: Vec<PciAddress> = (0..num)
        .map(|i| Model::vf_address(pf, &sriov, i))
        .collect::<Option<_>>()
        // sriov_enable: the last VF's bus beyond the bridge's bus range → -ENOMEM.
        .ok_or(Errno::ENOMEM)?;
    if addrs.iter().any(|a| model.pci.contains_key(a)) {
        return Err(Errno::EBUSY);
    }
    for (i, addr) in (0u16..).zip(&addrs) {
        let group = match sriov.vf_iommu {
            _ if pf_dev.iommu_group.is_none() => None,
            VfIommu::Own => Some(model.alloc_group()),
            VfIommu::Pf => pf_dev.iommu_group,
        };
        let vf = PciDev {
            addr: *addr,
            vendor: pf_dev.vendor,
            device: sriov.vf_device,
            subsystem_vendor: pf_dev.subsystem_vendor,
            subsystem_device: sriov.vf_subsystem_device,
            class: pf_dev.class,
            revision: pf_dev.revision,
            numa_node: pf_dev.numa_node,
            boot_vga: false,
            parent: pf_dev.parent,
            driver: None,
            driver_override: None,
            iommu_group: group,
            sriov: None,
            vf_of: Some((*pf, i)),
        };
        model.pci.insert(*addr, vf);
    }
    if let Some(s) = model.pci.get_mut(pf).and_then(|d| d.sriov.as_mut()) {
        s.num = num;
    }
    xe::vfs_enabled(model, pf, num);
    for addr in &addrs {
        pci::attach(model, addr);
    }
    Ok(())
}

/// `sriov_disable` → `sriov_del_vfs`: every VF's driver is released and the VF removed.
pub(crate) fn remove_vfs(model: &mut Model, pf: &PciAddress) {
    for (_, vf) in model.vfs_of(pf) {
        pci::remove_device(model, &vf);
    }
    if let Some(s) = model.pci.get_mut(pf).and_then(|d| d.sriov.as_mut()) {
        s.num = 0;
    }
    xe::vfs_disabled(model, pf);
}
