//! A PCI function's identity (vendor, device, subsystem, class) and driver, read from its `uevent`
//! file in one read where the tree has one, else attribute by attribute.
//!
//! The kernel prints the same `struct pci_dev` fields in both places: `uevent` holds `PCI_CLASS`,
//! `PCI_ID` and `PCI_SUBSYS_ID` (drivers/pci/pci-driver.c `pci_uevent`, each `%04X`, vendor and
//! device as `VVVV:DDDD`) and, while a driver is bound, `DRIVER` (drivers/base/core.c `dev_uevent`,
//! the driver's name, which is also the last component of the `driver` link); the `vendor`,
//! `device`, `subsystem_vendor`, `subsystem_device` and `class` attributes print them one per file
//! (drivers/pci/pci-sysfs.c). One read instead of five reads and a readlink matters where every
//! system call is dear (an emulated machine) and discovery reads every function of the host.

use std::path::{Path, PathBuf};

use super::DiscoverError;
use super::pci::{attr, attr_opt, pci_id};
use crate::{Host, HostExt, paths};
use mdev_types::ids::{PciAddress, PciId};
use mdev_types::parse;

/// What identifies a PCI function, and its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// The vendor id.
    pub vendor: PciId,
    /// The device id.
    pub device: PciId,
    /// The subsystem vendor id (absent from a tree that lacks the attribute).
    pub subsystem_vendor: Option<PciId>,
    /// The subsystem device id (absent from a tree that lacks the attribute).
    pub subsystem_device: Option<PciId>,
    /// The 24-bit class code.
    pub class: u32,
    /// The bound driver's name.
    pub driver: Option<String>,
    /// The file the vendor id was read from (`uevent` or `vendor`), for a fault about it.
    pub vendor_path: PathBuf,
}

/// Reads the identity of `addr`: from its `uevent` when the file exists and holds `PCI_ID`, else
/// from the separate attributes (a captured or hand-made tree without `uevent`).
pub(super) fn read_identity(host: &dyn Host, addr: &PciAddress) -> Result<Identity, DiscoverError> {
    let path = paths::pci_attr(addr, "uevent");
    if let Some(text) = host.read_optional(&path)?
        && let Some(id) = from_uevent(&path, &text)?
    {
        return Ok(id);
    }
    from_attributes(host, addr)
}

/// The identity a `uevent` text holds; `None` when it has no `PCI_ID` (not a PCI function's).
fn from_uevent(path: &Path, text: &str) -> Result<Option<Identity>, DiscoverError> {
    let mut pci_id_line = None;
    let mut class = None;
    let mut subsys = None;
    let mut driver = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        match key {
            "PCI_ID" => pci_id_line = Some(value),
            "PCI_CLASS" => class = Some(value),
            "PCI_SUBSYS_ID" => subsys = Some(value),
            "DRIVER" => driver = Some(value),
            _ => {}
        }
    }
    let Some(ids) = pci_id_line else {
        return Ok(None);
    };
    let malformed =
        |what: &'static str, text: &str, expected: &'static str| DiscoverError::Malformed {
            path: path.to_path_buf(),
            source: parse::ParseError::Invalid {
                what,
                text: text.chars().take(40).collect(),
                expected,
            },
        };
    const PAIR: &str = "two 16-bit hex ids joined by ':', such as 10DE:2335";
    let (vendor, device) = id_pair(ids).ok_or_else(|| malformed("PCI_ID of uevent", ids, PAIR))?;
    let (subsystem_vendor, subsystem_device) = match subsys {
        None => (None, None),
        Some(s) => {
            let (v, d) = id_pair(s).ok_or_else(|| malformed("PCI_SUBSYS_ID of uevent", s, PAIR))?;
            (Some(v), Some(d))
        }
    };
    let class_text = class.unwrap_or("");
    let class = parse::parse_class(class_text).map_err(|_| {
        malformed(
            "PCI_CLASS of uevent",
            class_text,
            "a 24-bit hex class code, such as 30200",
        )
    })?;
    Ok(Some(Identity {
        vendor,
        device,
        subsystem_vendor,
        subsystem_device,
        class,
        driver: driver.filter(|d| !d.is_empty()).map(str::to_string),
        vendor_path: path.to_path_buf(),
    }))
}

/// `VVVV:DDDD` as two ids.
fn id_pair(text: &str) -> Option<(PciId, PciId)> {
    let (v, d) = text.split_once(':')?;
    Some((v.parse().ok()?, d.parse().ok()?))
}

/// The identity read one attribute at a time.
fn from_attributes(host: &dyn Host, addr: &PciAddress) -> Result<Identity, DiscoverError> {
    let a = |name: &str| paths::pci_attr(addr, name);
    let vendor_path = a("vendor");
    Ok(Identity {
        vendor: attr(host, &vendor_path, pci_id)?,
        device: attr(host, &a("device"), pci_id)?,
        subsystem_vendor: attr_opt(host, &a("subsystem_vendor"), pci_id)?,
        subsystem_device: attr_opt(host, &a("subsystem_device"), pci_id)?,
        class: attr(host, &a("class"), parse::parse_class)?,
        driver: host.link_name(&a("driver"))?,
        vendor_path,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const CAPTURED: &str = "DRIVER=nvidia\nPCI_CLASS=30200\nPCI_ID=10DE:2335\nPCI_SUBSYS_ID=10DE:18BF\nPCI_SLOT_NAME=0000:00:06.0\nMODALIAS=pci:v000010DEd00002335sv000010DEsd000018BFbc03sc02i00\n";

    #[test]
    fn a_captured_uevent_gives_the_identity_and_driver() {
        let p = Path::new("/sys/bus/pci/devices/0000:00:06.0/uevent");
        let id = from_uevent(p, CAPTURED).unwrap().unwrap();
        assert_eq!(id.vendor, PciId(0x10de));
        assert_eq!(id.device, PciId(0x2335));
        assert_eq!(id.subsystem_vendor, Some(PciId(0x10de)));
        assert_eq!(id.subsystem_device, Some(PciId(0x18bf)));
        assert_eq!(id.class, 0x030200);
        assert_eq!(id.driver.as_deref(), Some("nvidia"));
        assert_eq!(id.vendor_path, p);
    }

    #[test]
    fn without_a_driver_line_no_driver_is_bound() {
        let text = CAPTURED.replace("DRIVER=nvidia\n", "");
        let id = from_uevent(Path::new("uevent"), &text).unwrap().unwrap();
        assert_eq!(id.driver, None);
    }

    #[test]
    fn a_uevent_without_pci_id_is_not_used() {
        assert_eq!(from_uevent(Path::new("uevent"), "").unwrap(), None);
        assert_eq!(
            from_uevent(Path::new("uevent"), "MDEV_TYPE=x\n").unwrap(),
            None
        );
    }

    #[test]
    fn malformed_fields_name_the_file_and_the_field() {
        for (bad, field) in [
            (
                CAPTURED.replace("PCI_ID=10DE:2335", "PCI_ID=10DE"),
                "PCI_ID",
            ),
            (
                CAPTURED.replace("PCI_ID=10DE:2335", "PCI_ID=zz:2335"),
                "PCI_ID",
            ),
            (
                CAPTURED.replace("PCI_SUBSYS_ID=10DE:18BF", "PCI_SUBSYS_ID=:"),
                "PCI_SUBSYS_ID",
            ),
            (CAPTURED.replace("PCI_CLASS=30200\n", ""), "PCI_CLASS"),
            (
                CAPTURED.replace("PCI_CLASS=30200", "PCI_CLASS=3020000"),
                "PCI_CLASS",
            ),
        ] {
            let e = from_uevent(Path::new("/x/uevent"), &bad).unwrap_err();
            let text = e.to_string();
            assert!(text.contains("/x/uevent") && text.contains(field), "{text}");
        }
    }
}
