//! Reading PCI functions: identity, driver, IOMMU group, NUMA node, SR-IOV and NVIDIA vendor VFIO state.

use std::path::{Path, PathBuf};

use super::{DiscoverError, identity};
use crate::{Host, HostExt, paths};
use mdev_types::ids::{IommuGroup, PciAddress, PciId};
use mdev_types::model::{NvidiaVfState, PciDevice, SriovPf};
use mdev_types::parse;

/// Reads an attribute and parses it, naming the path on failure.
pub(super) fn attr<T>(
    host: &dyn Host,
    path: &Path,
    f: impl FnOnce(&str) -> Result<T, parse::ParseError>,
) -> Result<T, DiscoverError> {
    let text = host.read(path)?;
    f(&text).map_err(|source| DiscoverError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// Like [`attr`], or `None` when the attribute does not exist.
pub(super) fn attr_opt<T>(
    host: &dyn Host,
    path: &Path,
    f: impl FnOnce(&str) -> Result<T, parse::ParseError>,
) -> Result<Option<T>, DiscoverError> {
    match host.read_optional(path)? {
        None => Ok(None),
        Some(text) => f(&text)
            .map(Some)
            .map_err(|source| DiscoverError::Malformed {
                path: path.to_path_buf(),
                source,
            }),
    }
}

pub(super) fn pci_id(text: &str) -> Result<PciId, parse::ParseError> {
    text.parse::<PciId>()
        .map_err(|_| parse::ParseError::Invalid {
            what: "PCI id",
            text: text.trim().chars().take(40).collect(),
            expected: "a 16-bit hex id such as 0x10de",
        })
}

/// The last path component of a link, parsed (e.g. `iommu_group` → `42`, `physfn` → an address).
fn link_as<T: std::str::FromStr>(host: &dyn Host, path: &Path) -> Result<Option<T>, DiscoverError> {
    let Some(name) = host.link_name(path)? else {
        return Ok(None);
    };
    name.parse()
        .map(Some)
        .map_err(|_| DiscoverError::Malformed {
            path: path.to_path_buf(),
            source: parse::ParseError::Invalid {
                what: "link target",
                text: name,
                expected: "a target whose last component names the object",
            },
        })
}

/// NVIDIA's PCI vendor id.
const NVIDIA: u16 = 0x10de;

/// Whether a function of `class` is VGA compatible: the display class's VGA subclass, or the
/// pre-class-code VGA device (`pci_is_vga`, include/linux/pci.h).
fn is_vga(class: u32) -> bool {
    matches!(class >> 8, 0x0300 | 0x0001)
}

/// Reads one PCI function.
pub(super) fn read_pci_device(
    host: &dyn Host,
    addr: PciAddress,
) -> Result<PciDevice, DiscoverError> {
    let a = |name: &str| paths::pci_attr(&addr, name);
    let numa = attr_opt(host, &a("numa_node"), parse::parse_i64)?;
    let driver_override = host
        .read_optional(&a("driver_override"))?
        .filter(|s| s != "(null)" && !s.is_empty());
    let id = identity::read_identity(host, &addr)?;
    if id.vendor.0 == 0xffff {
        // No PCI vendor has id 0xffff: it is what a config-space read returns from a device that no
        // longer answers (PCI Local Bus Specification, "Configuration Space": a read of an absent
        // function returns all ones).
        return Err(DiscoverError::AllOnes {
            path: id.vendor_path,
            text: format!("{}", id.vendor),
        });
    }
    let physfn = link_as::<PciAddress>(host, &a("physfn"))?;
    // NVIDIA's driver makes `nvidia/` on the VFs of its GPUs only; `boot_vga` is visible on VGA
    // functions only (drivers/pci/pci-sysfs.c `pci_dev_attrs_are_visible`, `pci_is_vga`). Neither
    // is looked for elsewhere: each look is a system call that finds nothing.
    let nvidia_vf = if physfn.is_some() && id.vendor.0 == NVIDIA {
        read_nvidia_vf(host, &addr)?
    } else {
        None
    };
    let boot_vga = if is_vga(id.class) {
        attr_opt(host, &a("boot_vga"), parse::parse_bool01)?.unwrap_or(false)
    } else {
        false
    };
    Ok(PciDevice {
        address: addr,
        vendor: id.vendor,
        device: id.device,
        subsystem_vendor: id.subsystem_vendor,
        subsystem_device: id.subsystem_device,
        class: id.class,
        driver: id.driver,
        driver_override,
        iommu_group: link_as::<IommuGroup>(host, &a("iommu_group"))?,
        numa_node: numa.and_then(|n| u32::try_from(n).ok()),
        boot_vga,
        sriov: read_sriov(host, &addr)?,
        physfn,
        nvidia_vf,
    })
}

fn read_sriov(host: &dyn Host, addr: &PciAddress) -> Result<Option<SriovPf>, DiscoverError> {
    let a = |name: &str| paths::pci_attr(addr, name);
    let Some(total_vfs) = attr_opt(host, &a("sriov_totalvfs"), parse::parse_u32)? else {
        return Ok(None);
    };
    let mut vfs: Vec<(u32, PciAddress)> = Vec::new();
    for name in host.list(&paths::pci_device(addr))? {
        let Some(index) = name
            .strip_prefix("virtfn")
            .and_then(|i| i.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(vf) = link_as::<PciAddress>(host, &a(&name))? {
            vfs.push((index, vf));
        }
    }
    vfs.sort();
    Ok(Some(SriovPf {
        total_vfs,
        num_vfs: attr(host, &a("sriov_numvfs"), parse::parse_u32)?,
        drivers_autoprobe: attr_opt(host, &a("sriov_drivers_autoprobe"), parse::parse_bool01)?
            .unwrap_or(true),
        vf_device: attr_opt(host, &a("sriov_vf_device"), pci_id)?,
        vfs: vfs.into_iter().map(|(_, vf)| vf).collect(),
    }))
}

fn read_nvidia_vf(
    host: &dyn Host,
    addr: &PciAddress,
) -> Result<Option<NvidiaVfState>, DiscoverError> {
    let dir: PathBuf = paths::pci_attr(addr, "nvidia");
    let Some(creatable) = attr_opt(
        host,
        &dir.join("creatable_vgpu_types"),
        parse::parse_creatable_vgpu_types,
    )?
    else {
        return Ok(None);
    };
    let current = attr_opt(host, &dir.join("current_vgpu_type"), parse::parse_u32)?.unwrap_or(0);
    Ok(Some(NvidiaVfState {
        creatable,
        current_type: (current != 0).then_some(current),
    }))
}
