//! Identifiers: PCI addresses, mdev UUIDs, mdev type ids, PCI vendor/device ids, IOMMU groups.
//!
//! Every identifier parses from the text the kernel prints (and users type), displays in the kernel's
//! canonical form, and (de)serializes as that same string.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use thiserror::Error;

/// Why an identifier could not be parsed. Each variant names the rejected text and the expected form.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdError {
    /// Not a PCI address.
    #[error(
        "'{0}' is not a PCI address: expected DDDD:BB:DD.F or BB:DD.F in hex, e.g. 0000:3b:00.0"
    )]
    PciAddress(String),
    /// Not a UUID.
    #[error(
        "'{0}' is not an mdev UUID: expected 8-4-4-4-12 hex digits, e.g. 4b20d080-1b54-4048-85b3-a6a62d165c01"
    )]
    Uuid(String),
    /// Not a usable mdev type id.
    #[error(
        "'{0}' is not an mdev type id: expected 1-64 characters of letters, digits, '-', '_', '.' or ':', e.g. nvidia-231"
    )]
    MdevType(String),
    /// Not a 16-bit PCI id.
    #[error(
        "'{0}' is not a PCI vendor/device id: expected 4 hex digits with optional 0x, e.g. 0x10de"
    )]
    PciId(String),
    /// Not an IOMMU group number.
    #[error("'{0}' is not an IOMMU group number: expected a decimal number, e.g. 42")]
    IommuGroup(String),
}

/// Implements `Serialize`/`Deserialize` through `Display`/`FromStr`.
macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A PCI address (`domain:bus:device.function`), e.g. `0000:3b:00.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI segment (domain).
    pub domain: u16,
    /// Bus number.
    pub bus: u8,
    /// Device number (0–31).
    pub device: u8,
    /// Function number (0–7).
    pub function: u8,
}

impl PciAddress {
    /// Builds an address, checking device (≤ 31) and function (≤ 7).
    pub fn new(domain: u16, bus: u8, device: u8, function: u8) -> Option<Self> {
        (device < 32 && function < 8).then_some(Self {
            domain,
            bus,
            device,
            function,
        })
    }
}

impl FromStr for PciAddress {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || IdError::PciAddress(s.to_string());
        let t = s.trim();
        let hex = |p: &str, max: usize| -> Result<u32, IdError> {
            if p.is_empty() || p.len() > max || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(p, 16).map_err(|_| bad())
        };
        let (rest, function) = t.rsplit_once('.').ok_or_else(bad)?;
        let function = hex(function, 1)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [d, b, dev] => (hex(d, 4)?, hex(b, 2)?, hex(dev, 2)?),
            [b, dev] => (0, hex(b, 2)?, hex(dev, 2)?),
            _ => return Err(bad()),
        };
        let narrow = |v: u32| u8::try_from(v).map_err(|_| bad());
        PciAddress::new(
            u16::try_from(domain).map_err(|_| bad())?,
            narrow(bus)?,
            narrow(device)?,
            narrow(function)?,
        )
        .ok_or_else(bad)
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}
serde_via_str!(PciAddress);

/// The UUID that names an mdev instance (`/sys/bus/mdev/devices/<uuid>`), always shown in lower case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MdevUuid(uuid::Uuid);

impl MdevUuid {
    /// Wraps a UUID.
    pub fn from_uuid(u: uuid::Uuid) -> Self {
        Self(u)
    }

    /// A fresh random (version 4) UUID.
    pub fn new_random() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// A UUID derived from a name (version 5), stable for the same namespace and name.
    pub fn derived(namespace: &MdevUuid, name: &str) -> Self {
        Self(uuid::Uuid::new_v5(&namespace.0, name.as_bytes()))
    }

    /// Borrows the wrapped `uuid::Uuid`.
    pub fn as_uuid(&self) -> &uuid::Uuid {
        &self.0
    }
}

impl FromStr for MdevUuid {
    type Err = IdError;

    /// Accepts only the hyphenated 36-character form the kernel's `create` attribute takes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad = || IdError::Uuid(s.to_string());
        if t.len() != 36 {
            return Err(bad());
        }
        for (i, b) in t.bytes().enumerate() {
            let ok = if matches!(i, 8 | 13 | 18 | 23) {
                b == b'-'
            } else {
                b.is_ascii_hexdigit()
            };
            if !ok {
                return Err(bad());
            }
        }
        uuid::Uuid::parse_str(t).map(Self).map_err(|_| bad())
    }
}

impl fmt::Display for MdevUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.hyphenated())
    }
}
serde_via_str!(MdevUuid);

/// An mdev type id: the directory name under `mdev_supported_types/`, e.g. `nvidia-231`,
/// `i915-GVTg_V5_4`, `mbochs-medium`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MdevTypeId(String);

impl MdevTypeId {
    /// The type id as sysfs names it under `mdev_supported_types/`, e.g. `mbochs-medium`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl MdevTypeId {
    /// The longest type id accepted, in bytes.
    pub const MAX_BYTES: usize = 64;
}

impl FromStr for MdevTypeId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let ok = !t.is_empty()
            && t.len() <= 64
            && t != "."
            && t != ".."
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
        if ok {
            Ok(Self(t.to_string()))
        } else {
            Err(IdError::MdevType(s.to_string()))
        }
    }
}

impl fmt::Display for MdevTypeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
serde_via_str!(MdevTypeId);

/// A 16-bit PCI id (vendor, device, subsystem vendor or subsystem device), shown as `0x10de`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciId(pub u16);

impl PciId {
    /// NVIDIA Corporation.
    pub const NVIDIA: PciId = PciId(0x10de);
    /// Intel Corporation.
    pub const INTEL: PciId = PciId(0x8086);
    /// Advanced Micro Devices (ATI).
    pub const AMD: PciId = PciId(0x1002);
    /// Red Hat / QEMU virtual devices (used by the kernel's sample mdev drivers).
    pub const REDHAT_QEMU: PciId = PciId(0x1234);
}

impl FromStr for PciId {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let digits = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        if digits.is_empty() || digits.len() > 4 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(IdError::PciId(s.to_string()));
        }
        u16::from_str_radix(digits, 16)
            .map(PciId)
            .map_err(|_| IdError::PciId(s.to_string()))
    }
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}
serde_via_str!(PciId);

/// An IOMMU group number (`/sys/kernel/iommu_groups/<n>`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct IommuGroup(pub u32);

impl FromStr for IommuGroup {
    type Err = IdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(IdError::IommuGroup(s.to_string()));
        }
        t.parse()
            .map(IommuGroup)
            .map_err(|_| IdError::IommuGroup(s.to_string()))
    }
}

impl fmt::Display for IommuGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn pci_address_forms() {
        let a: PciAddress = "0000:3b:00.0".parse().unwrap();
        assert_eq!(a, PciAddress::new(0, 0x3b, 0, 0).unwrap());
        assert_eq!("3b:00.0".parse::<PciAddress>().unwrap(), a);
        assert_eq!(a.to_string(), "0000:3b:00.0");
        assert_eq!(
            "10000:3b:00.0".parse::<PciAddress>(),
            Err(IdError::PciAddress("10000:3b:00.0".into()))
        );
        for bad in [
            "",
            "3b:00",
            "3b:20.0",
            "3b:00.8",
            "zz:00.0",
            "0:0:0:0.0",
            "3b:00.",
            ":00.0",
            "+1:00.0",
        ] {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
        assert_eq!(
            "0001:ff:1f.7".parse::<PciAddress>().unwrap().to_string(),
            "0001:ff:1f.7"
        );
    }

    #[test]
    fn uuid_is_strict_and_lowercase() {
        let u: MdevUuid = "4B20D080-1B54-4048-85B3-A6A62D165C01".parse().unwrap();
        assert_eq!(u.to_string(), "4b20d080-1b54-4048-85b3-a6a62d165c01");
        for bad in [
            "4b20d0801b54404885b3a6a62d165c01",
            "{4b20d080-1b54-4048-85b3-a6a62d165c01}",
            "4b20d080-1b54-4048-85b3-a6a62d165c0g",
            "4b20d080-1b54-4048-85b3a-6a62d165c01",
        ] {
            assert!(bad.parse::<MdevUuid>().is_err(), "{bad}");
        }
        let ns = MdevUuid::new_random();
        assert_eq!(
            MdevUuid::derived(&ns, "pool/1"),
            MdevUuid::derived(&ns, "pool/1")
        );
        assert_ne!(
            MdevUuid::derived(&ns, "pool/1"),
            MdevUuid::derived(&ns, "pool/2")
        );
    }

    #[test]
    fn type_ids_and_pci_ids() {
        for ok in ["nvidia-231", "i915-GVTg_V5_4", "mbochs-medium", "mtty-1"] {
            assert_eq!(ok.parse::<MdevTypeId>().unwrap().as_str(), ok);
        }
        for bad in ["", "a/b", "..", "has space", &"x".repeat(65)] {
            assert!(bad.parse::<MdevTypeId>().is_err());
        }
        assert_eq!("0x10de\n".parse::<PciId>().unwrap(), PciId::NVIDIA);
        assert_eq!("8086".parse::<PciId>().unwrap(), PciId::INTEL);
        assert!("0x10dee".parse::<PciId>().is_err());
        assert_eq!(PciId(0x1af4).to_string(), "0x1af4");
        assert_eq!("17\n".parse::<IommuGroup>().unwrap(), IommuGroup(17));
        assert!("-1".parse::<IommuGroup>().is_err());
    }

    #[test]
    fn serde_round_trip() {
        let a: PciAddress = "3b:00.0".parse().unwrap();
        let j = serde_json::to_string(&a).unwrap();
        assert_eq!(j, "\"0000:3b:00.0\"");
        assert_eq!(serde_json::from_str::<PciAddress>(&j).unwrap(), a);
        assert!(serde_json::from_str::<PciAddress>("\"nope\"").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "\\PC*") {
            let _ = s.parse::<PciAddress>();
            let _ = s.parse::<MdevUuid>();
            let _ = s.parse::<MdevTypeId>();
            let _ = s.parse::<PciId>();
            let _ = s.parse::<IommuGroup>();
        }

        #[test]
        fn pci_address_round_trips(d in any::<u16>(), b in any::<u8>(), dev in 0u8..32, f in 0u8..8) {
            let a = PciAddress::new(d, b, dev, f).unwrap();
            prop_assert_eq!(a.to_string().parse::<PciAddress>().unwrap(), a);
        }
    }
}
