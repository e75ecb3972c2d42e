//! PCI driver binding: matching, probe, `bind`, `unbind`, `new_id`, `remove_id`, `drivers_probe`,
//! `driver_override` and `numa_node` — with the errnos of drivers/base/bus.c, drivers/base/dd.c and
//! drivers/pci/pci-driver.c (Linux 6.12).

use nix::errno::Errno;

use super::kstr::{kstrtoint, sysfs_streq};
use super::model::{DriverKind, DynId, Model, PCI_ANY_ID, PciDev};
use super::{mdev, nvidia, sriov, xe};
use mdev_types::ids::PciAddress;

/// `PAGE_SIZE` on x86-64; `driver_override` refuses values of `PAGE_SIZE - 1` bytes or more.
const PAGE_SIZE: usize = 4096;
/// `MAX_NUMNODES` with Debian's `CONFIG_NODES_SHIFT=10`.
const MAX_NUMNODES: i32 = 1024;

/// `bus_find_device_by_name`: the device whose name equals `buf` by `sysfs_streq`.
fn find_device(model: &Model, buf: &str) -> Option<PciAddress> {
    model
        .pci
        .keys()
        .find(|a| sysfs_streq(&a.to_string(), buf))
        .copied()
}

/// `pci_match_device`: with `driver_override` set only that driver matches (any id); otherwise the
/// dynamic ids, then the static table. vfio-pci and pci-stub have no static ids that match without an
/// override (vfio-pci's table entry is `override_only`, pci-stub's table is empty).
pub(crate) fn driver_matches(model: &Model, dev: &PciDev, drv_name: &str) -> bool {
    let Some(drv) = model.driver(drv_name) else {
        return false;
    };
    if let Some(o) = &dev.driver_override
        && o != drv_name
    {
        return false;
    }
    if drv.dynids.iter().any(|id| id.matches(dev)) {
        return true;
    }
    if drv.kind == DriverKind::Generic && drv.ids.iter().any(|id| id.matches(dev)) {
        return true;
    }
    dev.driver_override.as_deref() == Some(drv_name)
}

/// `really_probe` → `pci_device_probe` → the driver's probe. Binds on success.
pub(crate) fn probe(model: &mut Model, addr: &PciAddress, drv_name: &str) -> Result<(), Errno> {
    let dev = model.pci.get(addr).ok_or(Errno::ENODEV)?;
    // pci_device_can_probe: VFs of a PF with sriov_drivers_autoprobe=0 probe only with an override.
    if let Some((pf, _)) = dev.vf_of {
        let autoprobe = model
            .pci
            .get(&pf)
            .and_then(|p| p.sriov.as_ref())
            .is_none_or(|s| s.autoprobe);
        if !autoprobe && dev.driver_override.is_none() {
            return Err(Errno::ENODEV);
        }
    }
    // __pci_device_probe: no matching id → -ENODEV.
    if !driver_matches(model, dev, drv_name) {
        return Err(Errno::ENODEV);
    }
    let drv = model.driver(drv_name).ok_or(Errno::ENODEV)?;
    if let (Some(_), Some(e)) = (dev.vf_of, drv.vf_probe_errno) {
        return Err(e);
    }
    if drv.kind == DriverKind::VfioPci {
        // vfio_pci_core_register_device: type 1 headers → -EINVAL; PF with VFs → -EBUSY.
        if dev.is_bridge() {
            return Err(Errno::EINVAL);
        }
        if dev.sriov.as_ref().is_some_and(|s| s.num > 0) {
            return Err(Errno::EBUSY);
        }
        // drivers/vfio/group.c vfio_group_find_or_alloc: no IOMMU group (and no noiommu) → -EINVAL.
        if dev.iommu_group.is_none() {
            return Err(Errno::EINVAL);
        }
    }
    if let Some(d) = model.pci.get_mut(addr) {
        d.driver = Some(drv_name.to_string());
    }
    Ok(())
}

/// `device_attach`: tries every driver in registration order; probe failures move on to the next.
pub(crate) fn attach(model: &mut Model, addr: &PciAddress) {
    if model.pci.get(addr).is_none_or(|d| d.driver.is_some()) {
        return;
    }
    let names: Vec<String> = model.drivers.iter().map(|d| d.name.clone()).collect();
    for name in names {
        let matches = model
            .pci
            .get(addr)
            .is_some_and(|d| driver_matches(model, d, &name));
        if matches && probe(model, addr, &name).is_ok() {
            return;
        }
    }
}

/// `device_release_driver` → `pci_device_remove`: the driver's remove() and its side effects.
pub(crate) fn release(model: &mut Model, addr: &PciAddress) {
    let Some(drv) = model.pci.get(addr).and_then(|d| d.driver.clone()) else {
        return;
    };
    // mdev parents registered by this driver go away with all their instances.
    mdev::unregister_parents_of(model, addr, &drv);
    // A vendor-VFIO vGPU on a VF is destroyed with the VF's nvidia binding.
    nvidia::release_vf(model, addr, &drv);
    let disables = model
        .driver(&drv)
        .is_some_and(|d| d.disable_sriov_on_unbind);
    if disables && model.pci.get(addr).is_some_and(|d| d.sriov.is_some()) {
        sriov::remove_vfs(model, addr);
    }
    xe::release_pf(model, addr, &drv);
    if let Some(d) = model.pci.get_mut(addr) {
        d.driver = None;
    }
}

/// `bind_store` (drivers/base/bus.c): missing or non-matching device → `ENODEV`; already bound →
/// `EBUSY` (`__driver_probe_device`); otherwise the probe's own errno.
pub(crate) fn bind(model: &mut Model, drv: &str, buf: &str) -> Result<(), Errno> {
    let addr = find_device(model, buf).ok_or(Errno::ENODEV)?;
    let dev = model.pci.get(&addr).ok_or(Errno::ENODEV)?;
    if !driver_matches(model, dev, drv) {
        return Err(Errno::ENODEV);
    }
    if dev.driver.is_some() {
        return Err(Errno::EBUSY);
    }
    probe(model, &addr, drv)
}

/// `unbind_store` (drivers/base/bus.c): the device must exist and be bound to this driver, else `ENODEV`.
pub(crate) fn unbind(model: &mut Model, drv: &str, buf: &str) -> Result<(), Errno> {
    let addr = find_device(model, buf).ok_or(Errno::ENODEV)?;
    if model.pci.get(&addr).and_then(|d| d.driver.as_deref()) != Some(drv) {
        return Err(Errno::ENODEV);
    }
    release(model, &addr);
    Ok(())
}

/// `drivers_probe_store` (drivers/base/bus.c): unknown device → `ENODEV`; otherwise success whether or
/// not a driver bound (`bus_rescan_devices_helper` ignores probe failures).
pub(crate) fn drivers_probe(model: &mut Model, buf: &str) -> Result<(), Errno> {
    let addr = find_device(model, buf).ok_or(Errno::ENODEV)?;
    attach(model, &addr);
    Ok(())
}

/// `driver_override_store` → `__device_set_driver_override` (drivers/base/dd.c): too long → `EINVAL`;
/// empty or a lone newline clears it; otherwise the text up to the first newline.
pub(crate) fn set_driver_override(
    model: &mut Model,
    addr: &PciAddress,
    buf: &str,
) -> Result<(), Errno> {
    if buf.len() >= PAGE_SIZE - 1 {
        return Err(Errno::EINVAL);
    }
    // The kernel sees a C string: it ends at the first NUL.
    let s = buf.split('\0').next().unwrap_or("");
    let value = match s.find('\n') {
        _ if s.is_empty() => None,
        Some(0) => None,
        Some(i) => Some(s[..i].to_string()),
        None => Some(s.to_string()),
    };
    let dev = model.pci.get_mut(addr).ok_or(Errno::ENODEV)?;
    dev.driver_override = value;
    Ok(())
}

/// `numa_node_store` (drivers/pci/pci-sysfs.c): not a number, below -1, beyond `MAX_NUMNODES` or an
/// offline node → `EINVAL`.
pub(crate) fn set_numa_node(model: &mut Model, addr: &PciAddress, buf: &str) -> Result<(), Errno> {
    let node = kstrtoint(buf, 0).map_err(|_| Errno::EINVAL)?;
    if (node < 0 && node != -1) || node >= MAX_NUMNODES {
        return Err(Errno::EINVAL);
    }
    let online = model
        .numa_nodes
        .is_none_or(|n| u32::try_from(node).is_ok_and(|node| node < n));
    if node != -1 && !online {
        return Err(Errno::EINVAL);
    }
    let dev = model.pci.get_mut(addr).ok_or(Errno::ENODEV)?;
    dev.numa_node = node;
    Ok(())
}

/// `sscanf(buf, "%x %x …")`: the hex fields converted before the first that fails.
fn scan_hex(buf: &str, max: usize) -> Vec<u64> {
    let mut out = Vec::new();
    for tok in buf.split_whitespace().take(max) {
        let t = tok
            .strip_prefix("0x")
            .or_else(|| tok.strip_prefix("0X"))
            .unwrap_or(tok);
        let digits: String = t.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
        let Ok(v) = u64::from_str_radix(&digits, 16) else {
            break;
        };
        out.push(v);
        if digits.len() != t.len() {
            // The next conversion would start at a non-hex, non-space character and fail.
            break;
        }
    }
    out
}

/// `new_id_store` (drivers/pci/pci-driver.c): fewer than two fields → `EINVAL`; an id the static table
/// or (without driver_data) an existing dynamic id already covers → `EEXIST`; then the id is added and
/// unbound devices are probed (`driver_attach`).
pub(crate) fn new_id(model: &mut Model, drv: &str, buf: &str) -> Result<(), Errno> {
    let f = scan_hex(buf, 7);
    if f.len() < 2 {
        return Err(Errno::EINVAL);
    }
    let field = |i: usize, default: u32| f.get(i).map_or(default, |v| *v as u32);
    let id = DynId {
        vendor: field(0, 0),
        device: field(1, 0),
        subvendor: field(2, PCI_ANY_ID),
        subdevice: field(3, PCI_ANY_ID),
        class: field(4, 0),
        class_mask: field(5, 0),
    };
    let driver_data = f.get(6).copied().unwrap_or(0);
    let d = model.driver(drv).ok_or(Errno::ENODEV)?;
    if f.len() != 7 && static_table_covers(d, &id) {
        return Err(Errno::EEXIST);
    }
    // Only driver_data values of an existing id_table entry are accepted; our tables carry 0.
    if d.kind != DriverKind::PciStub && driver_data != 0 {
        return Err(Errno::EINVAL);
    }
    if f.len() != 7 && d.dynids.iter().any(|e| dynid_covers(e, &id)) {
        return Err(Errno::EEXIST);
    }
    if let Some(d) = model.drivers.iter_mut().find(|d| d.name == drv) {
        d.dynids.push(id);
    }
    // driver_attach: every unbound device the driver now matches is probed.
    let addrs: Vec<PciAddress> = model.pci.keys().copied().collect();
    for a in addrs {
        let candidate = model
            .pci
            .get(&a)
            .is_some_and(|dev| dev.driver.is_none() && driver_matches(model, dev, drv));
        if candidate {
            let _ = probe(model, &a, drv);
        }
    }
    Ok(())
}

/// `do_pci_match_id(id_table, id, false)`: a static entry covers the new id's vendor and device.
fn static_table_covers(d: &super::model::Driver, id: &DynId) -> bool {
    d.kind == DriverKind::Generic
        && d.ids.iter().any(|m| match *m {
            super::model::IdMatch::Id { vendor, device } => {
                vendor.is_none_or(|v| u32::from(v) == id.vendor)
                    && device.is_none_or(|v| u32::from(v) == id.device)
            }
            super::model::IdMatch::Class { class, mask } => (id.class ^ class) & mask == 0,
        })
}

/// `pci_match_one_id(existing, new)`.
fn dynid_covers(e: &DynId, id: &DynId) -> bool {
    let f = |want: u32, have: u32| want == PCI_ANY_ID || want == have;
    f(e.vendor, id.vendor)
        && f(e.device, id.device)
        && f(e.subvendor, id.subvendor)
        && f(e.subdevice, id.subdevice)
        && (e.class ^ id.class) & e.class_mask == 0
}

/// `remove_id_store`: fewer than two fields → `EINVAL`; no such dynamic id → `ENODEV`.
pub(crate) fn remove_id(model: &mut Model, drv: &str, buf: &str) -> Result<(), Errno> {
    let f = scan_hex(buf, 6);
    if f.len() < 2 {
        return Err(Errno::EINVAL);
    }
    let field = |i: usize, default: u32| f.get(i).map_or(default, |v| *v as u32);
    let (vendor, device) = (field(0, 0), field(1, 0));
    let (subvendor, subdevice) = (field(2, PCI_ANY_ID), field(3, PCI_ANY_ID));
    let (class, class_mask) = (field(4, 0), field(5, 0));
    let d = model
        .drivers
        .iter_mut()
        .find(|d| d.name == drv)
        .ok_or(Errno::ENODEV)?;
    let pos = d
        .dynids
        .iter()
        .position(|id| {
            id.vendor == vendor
                && id.device == device
                && (subvendor == PCI_ANY_ID || id.subvendor == subvendor)
                && (subdevice == PCI_ANY_ID || id.subdevice == subdevice)
                && (id.class ^ class) & class_mask == 0
        })
        .ok_or(Errno::ENODEV)?;
    d.dynids.remove(pos);
    Ok(())
}

/// Removes a device from the bus (VF teardown): driver released first, then the device and whatever
/// hangs off it (its IOMMU group membership goes with it).
pub(crate) fn remove_device(model: &mut Model, addr: &PciAddress) {
    release(model, addr);
    model.pci.remove(addr);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sscanf_hex_stops_at_the_first_bad_field() {
        assert_eq!(scan_hex("10de 1eb8", 7), vec![0x10de, 0x1eb8]);
        assert_eq!(scan_hex("0x8086 0x10ca\n", 7), vec![0x8086, 0x10ca]);
        assert_eq!(scan_hex("8086", 7), vec![0x8086]);
        assert_eq!(scan_hex("8086 zz 1", 7), vec![0x8086]);
        assert_eq!(scan_hex("8086:10ca", 7), vec![0x8086]);
        assert!(scan_hex("", 7).is_empty());
    }
}
