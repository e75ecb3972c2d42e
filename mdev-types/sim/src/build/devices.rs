//! PCI functions and the VFs enabled at start.

use std::collections::BTreeSet;

use super::Ctx;
use crate::error::SimError;
use crate::model::{Model, PciDev, Sriov, VfIommu};
use crate::spec::{SimSpec, VfIommuSpec};
use crate::{pci, sriov};

pub(super) fn pci_devices(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.pci.iter().enumerate() {
        let at = |f: &str| format!("pci[{i}].{f}");
        if model.pci.contains_key(&p.address) {
            return Err(cx.err(
                at("address"),
                format!("{} is listed twice; keep one entry", p.address),
            ));
        }
        if p.class > 0xff_ffff {
            return Err(cx.err(at("class"), "a class code has 24 bits, e.g. 0x030200"));
        }
        if let Some(n) = p.numa_node {
            let too_big = spec
                .host
                .numa_nodes
                .is_some_and(|max| u32::try_from(n).is_ok_and(|n| n >= max));
            if n < -1 || too_big {
                return Err(cx.err(
                    at("numa_node"),
                    format!("{n} is not an online node: use -1 or 0..host.numa_nodes"),
                ));
            }
        }
        let sriov = match &p.sriov {
            None => None,
            Some(s) => {
                if s.stride == 0 && s.total_vfs > 1 {
                    return Err(cx.err(at("sriov.stride"), "VF stride must be at least 1"));
                }
                Some(Sriov {
                    total: s.total_vfs,
                    num: 0,
                    autoprobe: s.drivers_autoprobe.unwrap_or(true),
                    offset: s.offset,
                    stride: s.stride,
                    vf_device: s.vf_device.0,
                    vf_subsystem_device: s
                        .vf_subsystem_device
                        .or(p.subsystem_device)
                        .map_or(0, |id| id.0),
                    vf_iommu: match s.vf_iommu {
                        VfIommuSpec::Own => VfIommu::Own,
                        VfIommuSpec::Pf => VfIommu::Pf,
                    },
                })
            }
        };
        let dev = PciDev {
            addr: p.address,
            vendor: p.vendor.0,
            device: p.device.0,
            subsystem_vendor: p.subsystem_vendor.map_or(0, |id| id.0),
            subsystem_device: p.subsystem_device.map_or(0, |id| id.0),
            class: p.class,
            revision: p.revision.unwrap_or(0),
            numa_node: p.numa_node.unwrap_or(-1),
            boot_vga: p.boot_vga.unwrap_or(false),
            parent: p.parent,
            driver: None,
            driver_override: p.driver_override.clone(),
            iommu_group: p.iommu_group,
            sriov,
            vf_of: None,
        };
        if p.boot_vga.is_some() && !dev.is_vga() {
            return Err(cx.err(
                at("boot_vga"),
                format!(
                    "class 0x{:06x} is not a VGA controller (0x0300xx): the kernel shows boot_vga only on VGA devices; remove it",
                    p.class
                ),
            ));
        }
        model.pci.insert(p.address, dev);
    }
    // Bridges, drivers and VF address ranges need every device known.
    for (i, p) in spec.pci.iter().enumerate() {
        let at = |f: &str| format!("pci[{i}].{f}");
        if let Some(up) = p.parent {
            match model.pci.get(&up) {
                None => {
                    return Err(cx.err(
                        at("parent"),
                        format!("bridge {up} is not listed; add it under [[pci]] or drop `parent`"),
                    ));
                }
                Some(b) if !b.is_bridge() => {
                    return Err(cx.err(
                        at("parent"),
                        format!("{up} has class 0x{:06x}, not a bridge (0x06xxxx)", b.class),
                    ));
                }
                Some(_) => {}
            }
            let mut seen = BTreeSet::new();
            let mut cur = p.address;
            while let Some(next) = model.pci.get(&cur).and_then(|d| d.parent) {
                if !seen.insert(cur) {
                    return Err(cx.err(at("parent"), "bridges form a loop"));
                }
                cur = next;
            }
        }
        if let Some(drv) = &p.driver {
            let Some(d) = model.driver(drv) else {
                return Err(cx.err(
                    at("driver"),
                    format!("driver '{drv}' is not declared; add a [[driver]] named '{drv}'"),
                ));
            };
            let dev = &model.pci[&p.address];
            if !pci::driver_matches(model, dev, &d.name) {
                return Err(cx.err(
                    at("driver"),
                    format!(
                        "driver '{drv}' does not match {:04x}:{:04x} (class 0x{:06x}); extend its `match` or set driver_override = \"{drv}\"",
                        dev.vendor, dev.device, dev.class
                    ),
                ));
            }
            if let Some(d) = model.pci.get_mut(&p.address) {
                d.driver = Some(drv.clone());
            }
        }
        if let Some(s) = &model.pci[&p.address].sriov {
            for idx in 0..s.total {
                match Model::vf_address(&p.address, s, idx) {
                    None => {
                        return Err(cx.err(
                            at("sriov.offset"),
                            format!(
                                "VF {idx} would lie beyond bus ff; lower offset/stride/total_vfs"
                            ),
                        ));
                    }
                    Some(a) if model.pci.contains_key(&a) => {
                        return Err(cx.err(
                            at("sriov.offset"),
                            format!("VF {idx} would be at {a}, which is already a listed device"),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

pub(super) fn initial_vfs(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.pci.iter().enumerate() {
        let Some(s) = &p.sriov else { continue };
        if s.num_vfs == 0 {
            continue;
        }
        let total = model.pci.get(&p.address).map_or(0, |d| model.total_vfs(d));
        if s.num_vfs > total {
            return Err(cx.err(
                format!("pci[{i}].sriov.num_vfs"),
                format!("{} VFs exceed sriov_totalvfs {total}", s.num_vfs),
            ));
        }
        sriov::add_vfs(model, &p.address, s.num_vfs).map_err(|e| {
            cx.err(
                format!("pci[{i}].sriov.num_vfs"),
                format!("enabling the VFs failed: {e}"),
            )
        })?;
    }
    Ok(())
}
