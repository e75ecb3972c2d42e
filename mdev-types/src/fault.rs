//! Devices discovery could not read: which device, which file, what went wrong and what to do.
//!
//! Discovery reads every device on its own. One whose attributes cannot be read or parsed is reported as
//! a [`DeviceFault`] in the inventory instead of failing the whole host, so every other device is still
//! managed (a GPU that fell off the bus, a driver in a bad state, a broken link in sysfs).

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What kind of device a fault belongs to, which also says where its id comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultScope {
    /// A PCI function (`/sys/bus/pci/devices/<address>`); the id is its address.
    PciDevice,
    /// A registered mdev parent (`/sys/class/mdev_bus/<name>`); the id is its name.
    MdevParent,
    /// An mdev instance (`/sys/bus/mdev/devices/<uuid>`); the id is its UUID.
    MdevInstance,
    /// An IOMMU group (`/sys/kernel/iommu_groups/<n>`); the id is its number.
    IommuGroup,
}

impl FaultScope {
    /// A short human name ("PCI device", "mdev parent", …).
    pub fn as_str(self) -> &'static str {
        match self {
            FaultScope::PciDevice => "PCI device",
            FaultScope::MdevParent => "mdev parent",
            FaultScope::MdevInstance => "mdev instance",
            FaultScope::IommuGroup => "IOMMU group",
        }
    }
}

/// Why a device's attribute could not be used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum FaultCause {
    /// The kernel refused the read, listing or link resolution.
    Errno {
        /// What was attempted ("reading", "listing", "resolving", …).
        op: String,
        /// The errno's symbolic name (`EIO`, `ELOOP`, `ENOENT`).
        errno: String,
        /// The errno's number.
        code: i32,
    },
    /// The attribute was read but holds text the kernel would never print there.
    Malformed {
        /// The rejected text (possibly shortened), when the parser kept it apart.
        text: Option<String>,
        /// The parser's sentence: what was parsed, the text and what was expected.
        problem: String,
    },
    /// The attribute reads back as all ones: the device no longer answers on the bus.
    AllOnes {
        /// The text read (`0xffff`).
        text: String,
    },
}

impl fmt::Display for FaultCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FaultCause::Errno { op, errno, .. } => write!(f, "{op} failed: {errno}"),
            FaultCause::Malformed { problem, .. } => write!(f, "it is malformed: {problem}"),
            FaultCause::AllOnes { text } => write!(
                f,
                "it reads back {text:?} (all ones): the device no longer answers on the bus"
            ),
        }
    }
}

/// One device discovery could not read. The device is left out of the inventory's other lists
/// (or, for an mdev parent whose PCI function reads fine, listed from what could be read) and named here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceFault {
    /// What kind of device.
    pub scope: FaultScope,
    /// Its id: a PCI address, a parent name, an mdev UUID or a group number. For a PCI device or an
    /// mdev parent this is also the id of the GPU it would be.
    pub device: String,
    /// The kernel path whose read failed (as the kernel names it).
    pub path: PathBuf,
    /// What went wrong.
    pub cause: FaultCause,
    /// What to do about it, when that is known.
    pub fix: Option<String>,
}

impl fmt::Display for DeviceFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} is faulted: {}: {}",
            self.scope.as_str(),
            self.device,
            self.path.display(),
            self.cause
        )?;
        if let Some(fix) = &self.fix {
            write!(f, " ({fix})")?;
        }
        Ok(())
    }
}
