//! Discovery: builds the [`Inventory`] of a host from sysfs through any [`Host`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use thiserror::Error;
use tracing::{debug, warn};

use crate::{Host, HostError, HostExt, paths};
use mdev_types::ids::PciAddress;
use mdev_types::model::{Assignability, Capability, Gpu, Inventory, MdevParent, PciDevice, Vendor};
use mdev_types::parse::{ParseError, TypeDescription};

mod groups;
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
}

/// Reads everything vgpu-manager needs to know about `host`.
///
/// Devices that disappear while they are being read (hot unplug, VFs being disabled) are skipped with a
/// log line instead of failing the whole discovery.
pub fn discover(host: &dyn Host) -> Result<Inventory, DiscoverError> {
    let mut pci_devices = Vec::new();
    for name in host.list_optional(Path::new(paths::PCI_DEVICES))? {
        let Ok(addr) = name.parse::<PciAddress>() else {
            warn!(entry = %name, "ignoring a /sys/bus/pci/devices entry that is not a PCI address");
            continue;
        };
        match pci::read_pci_device(host, addr) {
            Ok(d) => pci_devices.push(d),
            Err(DiscoverError::Host(e))
                if e.is_not_found() && !host.exists(&paths::pci_device(&addr)) =>
            {
                debug!(%addr, "device disappeared during discovery");
            }
            Err(e) => return Err(e),
        }
    }
    pci_devices.sort_by_key(|d| d.address);
    let mdev_parents = mdev::read_parents(host)?;
    let mdev_instances = mdev::read_instances(host)?;
    let iommu_groups = groups::read_groups(host)?;
    let gpus = assemble_gpus(&pci_devices, &mdev_parents);
    Ok(Inventory {
        host: host.describe(),
        pci_devices,
        mdev_parents,
        mdev_instances,
        iommu_groups,
        gpus,
    })
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
