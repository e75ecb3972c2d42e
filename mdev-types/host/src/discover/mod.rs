//! Discovery: builds the [`Inventory`] of a host from sysfs through any [`Host`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;
use tracing::{debug, warn};

use crate::{Host, HostError, HostExt, paths};
use fault::Outcome;
use mdev_types::fault::{DeviceFault, FaultScope};
use mdev_types::ids::PciAddress;
use mdev_types::model::{Assignability, Capability, Gpu, Inventory, MdevParent, PciDevice, Vendor};
use mdev_types::parse::{ParseError, TypeDescription};

mod fault;
mod groups;
mod identity;
mod mdev;
mod names;
mod pci;

pub use names::model_name;

/// Why discovery failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DiscoverError {
    /// A kernel read failed for a reason other than the object disappearing.
    #[error(transparent)]
    Host(#[from] HostError),
    /// An attribute holds text the kernel would never print.
    #[error("{path} is malformed: {source}", path = path.display())]
    Malformed {
        /// The sysfs attribute file that held the malformed text.
        path: PathBuf,
        /// What was wrong.
        #[source]
        source: ParseError,
    },
    /// An identity attribute reads back as all ones, as config space does from a device that no longer
    /// answers on the bus.
    #[error("{path} reads back {text:?} (all ones): the device no longer answers on the bus", path = path.display())]
    AllOnes {
        /// The attribute.
        path: PathBuf,
        /// The text read.
        text: String,
    },
}

/// Reads everything vgpu-manager needs to know about `host`.
///
/// Every device is read on its own. One whose attributes cannot be read or parsed is named in
/// [`Inventory::faults`] (with the path, the errno or the bad text, and the fix where one is known) and
/// every other device is listed as usual; one that disappears while it is read (hot unplug, VFs being
/// disabled, a driver unbinding: `ENOENT`/`ENODEV`) is absent from the result. Only a failure to list
/// the host's own directories (`/sys/bus/pci/devices`, `/sys/class/mdev_bus`, …) is an error.
pub fn discover(host: &dyn Host) -> Result<Inventory, DiscoverError> {
    discover_with(host, true)
}

/// [`discover`] without the listings of `/sys/kernel/iommu_groups`: [`Inventory::iommu_groups`] is
/// empty and no fault of a group is reported. Each device's and instance's own group is still read
/// (its `iommu_group` link), and GPUs are judged for assignment from those, so this is everything
/// placement and planning use. It is the cheaper read where groups are many: VFIO gives every mdev
/// instance a group of its own (drivers/vfio/vfio.h, `VFIO_EMULATED_IOMMU`: "the VFIO core fakes up
/// an iommu_group"), so a host running 48 instances lists 48 more directories in [`discover`].
pub fn discover_without_groups(host: &dyn Host) -> Result<Inventory, DiscoverError> {
    discover_with(host, false)
}

/// [`discover`], reading the IOMMU groups' listings only when `groups`.
fn discover_with(host: &dyn Host, groups: bool) -> Result<Inventory, DiscoverError> {
    let mut pci_devices = Vec::new();
    let mut faults = Vec::new();
    for name in host.list_optional(Path::new(paths::PCI_DEVICES))? {
        let Ok(addr) = name.parse::<PciAddress>() else {
            warn!(entry = %name, "ignoring a /sys/bus/pci/devices entry that is not a PCI address");
            continue;
        };
        match fault::classify(
            host,
            FaultScope::PciDevice,
            &name,
            &paths::pci_device(&addr),
            pci::read_pci_device(host, addr),
        ) {
            Outcome::Read(d) => pci_devices.push(d),
            Outcome::Gone => debug!(%addr, "device disappeared during discovery"),
            Outcome::Faulted(f) => {
                warn!(%addr, "{f}");
                faults.push(f);
            }
        }
    }
    pci_devices.sort_by_key(|d| d.address);
    let (mdev_parents, parent_faults) = mdev::read_parents(host)?;
    let (mdev_instances, instance_faults) =
        mdev::read_instances(host, &mdev::listed(&mdev_parents))?;
    let (iommu_groups, group_faults) = if groups {
        groups::read_groups(host)?
    } else {
        Default::default()
    };
    faults.extend(parent_faults);
    faults.extend(instance_faults);
    faults.extend(group_faults);
    faults.sort_by(|a, b| (a.scope, &a.device).cmp(&(b.scope, &b.device)));
    let gpus = assemble_gpus(&pci_devices, &mdev_parents);
    Ok(Inventory {
        host: host.describe(),
        pci_devices,
        mdev_parents,
        mdev_instances,
        iommu_groups,
        gpus,
        faults,
    })
}

/// The fault of GPU `id` (a PCI address or an mdev parent name) now, if it has one: its PCI function
/// (when `id` is listed under `/sys/bus/pci/devices`) and its mdev parent (when registered), each read
/// as [`discover`] reads them, and nothing else of the host. A device that is absent, or went away while
/// it was read, has no fault. The cheap check of one GPU a request names.
pub fn device_fault(host: &dyn Host, id: &str) -> Option<DeviceFault> {
    if let Ok(addr) = id.parse::<PciAddress>() {
        let dir = paths::pci_device(&addr);
        if host.exists(&dir)
            && let Outcome::Faulted(f) = fault::classify(
                host,
                FaultScope::PciDevice,
                id,
                &dir,
                pci::read_pci_device(host, addr),
            )
        {
            return Some(f);
        }
    }
    mdev::parent_fault(host, id)
}

/// A virtual parent is a GPU when one of its types describes a display or a vGPU.
fn is_display_parent(p: &MdevParent) -> bool {
    p.types
        .iter()
        .any(|t| !matches!(t.details, TypeDescription::Unknown))
}

fn assemble_gpus(devices: &[PciDevice], parents: &[MdevParent]) -> Vec<Gpu> {
    let by_addr: BTreeMap<PciAddress, &PciDevice> =
        devices.iter().map(|d| (d.address, d)).collect();
    let mut gpus = Vec::new();
    for dev in devices
        .iter()
        .filter(|d| d.is_gpu_class() && d.physfn.is_none())
    {
        let mut capabilities = Vec::new();
        if let Some(p) = parents.iter().find(|p| p.pci == Some(dev.address)) {
            capabilities.push(Capability::Mdev {
                types: p.types.len(),
            });
        }
        if let Some(s) = &dev.sriov {
            capabilities.push(Capability::Sriov {
                total_vfs: s.total_vfs,
                num_vfs: s.num_vfs,
            });
            // NVIDIA classic vGPU on Ampere and later: each VF is an mdev parent of its own.
            let on_vfs: Vec<&MdevParent> = s
                .vfs
                .iter()
                .filter_map(|vf| parents.iter().find(|p| p.pci == Some(*vf)))
                .collect();
            if !on_vfs.is_empty()
                && !capabilities
                    .iter()
                    .any(|c| matches!(c, Capability::Mdev { .. }))
            {
                capabilities.push(Capability::MdevOnVfs {
                    vfs: on_vfs.len(),
                    types: on_vfs.iter().map(|p| p.types.len()).max().unwrap_or(0),
                });
            }
            let vendor_vfio = s
                .vfs
                .iter()
                .filter(|vf| by_addr.get(vf).is_some_and(|d| d.nvidia_vf.is_some()))
                .count();
            if vendor_vfio > 0 {
                capabilities.push(Capability::NvidiaVendorVfio { vfs: vendor_vfio });
            }
        }
        gpus.push(Gpu {
            id: dev.address.to_string(),
            pci: Some(dev.address),
            vendor: Vendor::from_pci(dev.vendor),
            model: model_name(dev.vendor, dev.device),
            driver: dev.driver.clone(),
            numa_node: dev.numa_node,
            boot_vga: dev.boot_vga,
            capabilities,
            passthrough: groups::assignability(dev, &by_addr),
        });
    }
    for p in parents
        .iter()
        .filter(|p| p.pci.is_none() && is_display_parent(p))
    {
        gpus.push(Gpu {
            id: p.name.clone(),
            pci: None,
            vendor: Vendor::Virtual,
            model: format!("{} (virtual mdev parent)", p.name),
            driver: p.driver.clone(),
            numa_node: None,
            boot_vga: false,
            capabilities: vec![Capability::Mdev {
                types: p.types.len(),
            }],
            passthrough: Assignability::No {
                reason: "it is a virtual device: only its mdev instances can be assigned"
                    .to_string(),
            },
        });
    }
    gpus
}
