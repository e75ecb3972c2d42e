//! What a VFIO device reports about itself: flags, regions and interrupts.
//!
//! Source: include/uapi/linux/vfio.h (VFIO_DEVICE_FLAGS_*, the vfio-pci region and IRQ index enums
//! VFIO_PCI_BAR0_REGION_INDEX … VFIO_PCI_VGA_REGION_INDEX, VFIO_PCI_INTX_IRQ_INDEX … VFIO_PCI_REQ_IRQ_INDEX).

use std::os::fd::AsRawFd;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};
use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FLAGS_CAPS, VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_PLATFORM,
    VFIO_DEVICE_FLAGS_RESET,
};

use super::sys;
use mdev_types::ids::PciId;

/// One region of the device (`VFIO_DEVICE_GET_REGION_INFO`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// Region index.
    pub index: u32,
    /// vfio-pci's name for the index (`bar0` … `bar5`, `rom`, `config`, `vga`), or `region<N>`.
    pub name: String,
    /// `VFIO_REGION_INFO_FLAG_*` (1 read, 2 write, 4 mmap, 8 caps).
    pub flags: u32,
    /// Size in bytes (0: the device does not implement it).
    pub size: u64,
    /// Offset of the region in the device fd.
    pub offset: u64,
}

/// One interrupt index (`VFIO_DEVICE_GET_IRQ_INFO`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IrqInfo {
    /// IRQ index.
    pub index: u32,
    /// vfio-pci's name for the index (`intx`, `msi`, `msix`, `err`, `req`), or `irq<N>`.
    pub name: String,
    /// `VFIO_IRQ_INFO_*` (1 eventfd, 2 maskable, 4 automasked, 8 noresize).
    pub flags: u32,
    /// Number of vectors.
    pub count: u32,
}

/// The device's self-description (`VFIO_DEVICE_GET_INFO` and the per-index queries).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    /// `VFIO_DEVICE_FLAGS_*`.
    pub flags: u32,
    /// The flags by name (`reset`, `pci`, `platform`, `caps`).
    pub flag_names: Vec<String>,
    /// `num_regions`.
    pub num_regions: u32,
    /// `num_irqs`.
    pub num_irqs: u32,
    /// Every region the device answered for (an absent VGA region, EINVAL, is left out).
    pub regions: Vec<RegionInfo>,
    /// Every interrupt index the device answered for (unimplemented ones, EINVAL, are left out).
    pub irqs: Vec<IrqInfo>,
    /// Vendor id read from the config region.
    pub vendor: Option<PciId>,
    /// Device id read from the config region.
    pub device: Option<PciId>,
}

/// The config region's index for vfio-pci devices (VFIO_PCI_CONFIG_REGION_INDEX).
pub(crate) const CONFIG_REGION: u32 = 7;

fn region_name(i: u32) -> String {
    match i {
        0..=5 => format!("bar{i}"),
        6 => "rom".into(),
        CONFIG_REGION => "config".into(),
        8 => "vga".into(),
        _ => format!("region{i}"),
    }
}

fn irq_name(i: u32) -> String {
    match i {
        0 => "intx".into(),
        1 => "msi".into(),
        2 => "msix".into(),
        3 => "err".into(),
        4 => "req".into(),
        _ => format!("irq{i}"),
    }
}

fn flag_names(flags: u32) -> Vec<String> {
    [
        (VFIO_DEVICE_FLAGS_RESET, "reset"),
        (VFIO_DEVICE_FLAGS_PCI, "pci"),
        (VFIO_DEVICE_FLAGS_PLATFORM, "platform"),
        (VFIO_DEVICE_FLAGS_CAPS, "caps"),
    ]
    .into_iter()
    .filter(|(bit, _)| flags & bit != 0)
    .map(|(_, n)| n.to_string())
    .collect()
}

impl DeviceInfo {
    /// Queries an open VFIO device fd.
    pub(crate) fn read(fd: &impl AsRawFd) -> Result<Self, (&'static str, Errno)> {
        let (flags, num_regions, num_irqs) =
            sys::device_info(fd).map_err(|e| ("VFIO_DEVICE_GET_INFO", e))?;
        let mut regions = Vec::new();
        for index in 0..num_regions {
            match sys::region_info(fd, index) {
                Ok((flags, size, offset)) => regions.push(RegionInfo {
                    index,
                    name: region_name(index),
                    flags,
                    size,
                    offset,
                }),
                // A device without legacy VGA answers EINVAL for that index (vfio_pci_core.c
                // vfio_pci_ioctl_get_region_info: VGA region only with vdev->has_vga).
                Err(Errno::EINVAL) => {}
                Err(e) => return Err(("VFIO_DEVICE_GET_REGION_INFO", e)),
            }
        }
        let mut irqs = Vec::new();
        for index in 0..num_irqs {
            match sys::irq_info(fd, index) {
                Ok((flags, count)) => irqs.push(IrqInfo {
                    index,
                    name: irq_name(index),
                    flags,
                    count,
                }),
                // Emulated devices answer EINVAL for indexes they do not implement although num_irqs
                // counts them (samples/vfio-mdev/mtty.c mtty_get_irq_info: only INTx and MSI).
                Err(Errno::EINVAL) => {}
                Err(e) => return Err(("VFIO_DEVICE_GET_IRQ_INFO", e)),
            }
        }
        Ok(Self {
            flags,
            flag_names: flag_names(flags),
            num_regions,
            num_irqs,
            regions,
            irqs,
            vendor: None,
            device: None,
        })
    }

    /// The config region, when the device has one.
    pub fn config_region(&self) -> Option<&RegionInfo> {
        self.regions
            .iter()
            .find(|r| r.index == CONFIG_REGION && r.size >= 4)
    }

    /// One line: flags, region and IRQ counts, the sized regions.
    pub fn summary(&self) -> String {
        let sized: Vec<String> = self
            .regions
            .iter()
            .filter(|r| r.size > 0)
            .map(|r| format!("{} {}", r.name, human(r.size)))
            .collect();
        format!(
            "flags {} ({}), {} regions [{}], {} irq indexes",
            self.flags,
            self.flag_names.join(","),
            self.num_regions,
            sized.join(", "),
            self.num_irqs
        )
    }
}

fn human(n: u64) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_vfio_pci_indexes() {
        assert_eq!(region_name(0), "bar0");
        assert_eq!(region_name(7), "config");
        assert_eq!(region_name(9), "region9");
        assert_eq!(irq_name(2), "msix");
        assert_eq!(flag_names(3), vec!["reset", "pci"]);
        assert_eq!(human(256), "256 B");
        assert_eq!(human(16 << 20), "16 MiB");
    }
}
