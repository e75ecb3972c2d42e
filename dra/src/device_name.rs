//! The names of the devices this driver publishes and is allocated: one device per profile option
//! per GPU slot, `gpu-<domain>-<bus>-<slot>-<function>-<profile>-<index>`, such as
//! `gpu-0000-3b-00-0-vdi-2g-0` for the first `vdi-2g` slot of GPU `0000:3b:00.0`; for a virtual mdev
//! parent (one with no PCI address, such as the kernel's `mbochs` sample),
//! `parent-<name>-<profile>-<index>`, the name lowercase letters and digits only.
//!
//! A device name must be a DNS label (RFC 1123: at most 63 characters, lowercase letters, digits and
//! `-`, starting and ending with a letter or digit), as `resource.k8s.io/v1` `Device.name` requires.
//! The PCI address has a fixed width and the index is the last `-` field, so a profile name may
//! itself contain `-` and the name still parses back to the same GPU, profile and index.

use std::fmt;
use std::str::FromStr;

/// What the prefix of a PCI GPU's device name is.
const PREFIX: &str = "gpu-";
/// What the prefix of a virtual parent's device name is.
const VIRTUAL_PREFIX: &str = "parent-";
/// The longest DNS label.
pub const MAX_LEN: usize = 63;

/// One device of this driver: which GPU, which profile, which of that profile's slots on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceName {
    /// The GPU's PCI address, `dddd:bb:dd.f` in lowercase hexadecimal, or a virtual parent's name.
    pub gpu: String,
    /// The vgpud profile name.
    pub profile: String,
    /// Which slot of `profile` on `gpu`, from 0.
    pub index: u32,
}

/// Why a name or its parts cannot form a device name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceNameError {
    /// The name does not start with `gpu-` and a PCI address.
    #[error(
        "device name {name:?} does not start with gpu-<domain>-<bus>-<slot>-<function>-: it is not one of this driver's devices"
    )]
    NoGpu {
        /// The name.
        name: String,
    },
    /// Nothing after the PCI address, or no index.
    #[error("device name {name:?} has no <profile>-<index> after its PCI address")]
    NoProfile {
        /// The name.
        name: String,
    },
    /// The GPU id is neither a PCI address nor a usable virtual parent name.
    #[error(
        "GPU {gpu:?} is neither a PCI address dddd:bb:dd.f nor a virtual mdev parent name of lowercase letters and digits"
    )]
    NotAGpuId {
        /// The GPU id.
        gpu: String,
    },
    /// The profile has a character a DNS label cannot hold.
    #[error(
        "profile {profile:?} cannot be part of a device name: use lowercase letters, digits and '-' only"
    )]
    BadProfile {
        /// The profile.
        profile: String,
    },
    /// The name would be longer than a DNS label.
    #[error(
        "device name {name:?} is longer than {MAX_LEN} characters: shorten profile {profile:?}"
    )]
    TooLong {
        /// The name.
        name: String,
        /// The profile that makes it long.
        profile: String,
    },
}

impl DeviceName {
    /// The device name of slot `index` of `profile` on `gpu`, checked to be a DNS label.
    pub fn new(gpu: &str, profile: &str, index: u32) -> Result<Self, DeviceNameError> {
        let gpu = canonical_pci(gpu)
            .or_else(|| virtual_parent(gpu).then(|| gpu.to_string()))
            .ok_or_else(|| DeviceNameError::NotAGpuId {
                gpu: gpu.to_string(),
            })?;
        if !valid_profile(profile) {
            return Err(DeviceNameError::BadProfile {
                profile: profile.to_string(),
            });
        }
        let d = DeviceName {
            gpu,
            profile: profile.to_string(),
            index,
        };
        let name = d.to_string();
        if name.len() > MAX_LEN {
            return Err(DeviceNameError::TooLong {
                name,
                profile: profile.to_string(),
            });
        }
        Ok(d)
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}-{}",
            gpu_prefix(&self.gpu),
            self.profile,
            self.index
        )
    }
}

impl DeviceName {
    /// Whether the GPU is a PCI device (else a virtual mdev parent).
    pub fn is_pci(&self) -> bool {
        canonical_pci(&self.gpu).is_some()
    }
}

/// The part of a device name that names the GPU: `gpu-0000-3b-00-0` or `parent-mbochs`; also the
/// name of the GPU's counter set in the ResourceSlices.
pub fn gpu_prefix(gpu: &str) -> String {
    match canonical_pci(gpu) {
        Some(pci) => format!("{PREFIX}{}", pci.replace([':', '.'], "-")),
        None => format!("{VIRTUAL_PREFIX}{gpu}"),
    }
}

/// A virtual mdev parent's name fits a device name: 1 to 32 lowercase letters and digits, and not a
/// PCI address.
pub fn virtual_parent(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
}

impl FromStr for DeviceName {
    type Err = DeviceNameError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let no_gpu = || DeviceNameError::NoGpu {
            name: name.to_string(),
        };
        let (gpu, tail) = if let Some(rest) = name.strip_prefix(VIRTUAL_PREFIX) {
            let (parent, tail) = rest.split_once('-').ok_or_else(no_gpu)?;
            if !virtual_parent(parent) {
                return Err(no_gpu());
            }
            (parent.to_string(), tail)
        } else {
            pci_part(name.strip_prefix(PREFIX).ok_or_else(no_gpu)?).ok_or_else(no_gpu)?
        };
        let no_profile = || DeviceNameError::NoProfile {
            name: name.to_string(),
        };
        let (profile, index) = tail.rsplit_once('-').ok_or_else(no_profile)?;
        if profile.is_empty()
            || index.is_empty()
            || !index.bytes().all(|b| b.is_ascii_digit())
            || (index.len() > 1 && index.starts_with('0'))
        {
            return Err(no_profile());
        }
        let index = index.parse().map_err(|_| no_profile())?;
        let d = DeviceName::new(&gpu, profile, index)?;
        if d.to_string() != name {
            return Err(no_profile());
        }
        Ok(d)
    }
}

/// The PCI address at the start of `rest` (`dddd-bb-dd-f-…`) and what follows it.
fn pci_part(rest: &str) -> Option<(String, &str)> {
    {
        // `dddd-bb-dd-f-` is 13 bytes; `get` refuses a split inside a multi-byte character.
        let (pci, tail) = match (rest.get(..12), rest.get(12..13), rest.get(13..)) {
            (Some(pci), Some("-"), Some(tail)) => (pci, tail),
            _ => return None,
        };
        let mut parts = pci.split('-');
        let (Some(dom), Some(bus), Some(slot), Some(func), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return None;
        };
        let gpu = format!("{dom}:{bus}:{slot}.{func}");
        (canonical_pci(&gpu).as_deref() == Some(gpu.as_str())).then_some((gpu, tail))
    }
}

/// `addr` as `dddd:bb:dd.f` in lowercase, if it is a PCI address (domain 4 hex digits, bus 2, slot 2
/// below 0x20, function 0–7: include/uapi/linux/pci.h `PCI_SLOT`/`PCI_FUNC`).
pub fn canonical_pci(addr: &str) -> Option<String> {
    let (dom, rest) = addr.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (slot, func) = rest.split_once('.')?;
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !(hex(dom, 4) && hex(bus, 2) && hex(slot, 2) && func.len() == 1) {
        return None;
    }
    let slot_n = u8::from_str_radix(slot, 16).ok()?;
    let func_n = func.parse::<u8>().ok()?;
    (slot_n < 0x20 && func_n < 8).then(|| format!("{dom}:{bus}:{slot}.{func}").to_ascii_lowercase())
}

/// A profile fits a DNS label: lowercase letters, digits and `-`, starting with a letter or digit
/// (it is followed by `-<index>`, so it may end in `-` only if it is not empty; we refuse that too).
fn valid_profile(p: &str) -> bool {
    !p.is_empty()
        && !p.starts_with('-')
        && !p.ends_with('-')
        && p.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trips() {
        let d = DeviceName::new("0000:3B:00.0", "vdi-2g", 0).unwrap();
        assert_eq!(d.to_string(), "gpu-0000-3b-00-0-vdi-2g-0");
        assert_eq!(
            "gpu-0000-3b-00-0-vdi-2g-0".parse::<DeviceName>().unwrap(),
            d
        );
        let d = DeviceName::new("abcd:ff:1f.7", "x", 12).unwrap();
        assert_eq!(d.to_string().parse::<DeviceName>().unwrap(), d);
    }

    #[test]
    fn virtual_parents_round_trip_by_name() {
        let d = DeviceName::new("mbochs", "sample-display-4m", 1).unwrap();
        assert_eq!(d.to_string(), "parent-mbochs-sample-display-4m-1");
        assert!(!d.is_pci());
        assert_eq!(d.to_string().parse::<DeviceName>().unwrap(), d);
        assert!(DeviceName::new("0000:3b:00.0", "x", 0).unwrap().is_pci());
        for bad in ["Mbochs", "mb-ochs", "", "mdpy_1"] {
            assert!(
                matches!(
                    DeviceName::new(bad, "x", 0),
                    Err(DeviceNameError::NotAGpuId { .. })
                ),
                "{bad}"
            );
        }
        for bad in ["parent-", "parent-mbochs", "parent-MB-x-0", "parent--x-0"] {
            assert!(bad.parse::<DeviceName>().is_err(), "{bad}");
        }
    }

    #[test]
    fn refuses_what_is_not_ours() {
        for bad in [
            "",
            "gpu-",
            "card-0000-3b-00-0-vdi-2g-0",
            "gpu-0000-3b-00-0-",
            "gpu-0000-3b-00-0-vdi",
            "gpu-0000-3b-00-0--1",
            "gpu-0000-3b-00-0-vdi-01",
            "gpu-0000-3b-00-8-vdi-0",
            "gpu-0000-3b-20-0-vdi-0",
            "gpu-0000-3B-00-0-vdi-0",
            "gpu-0000-3b-00-0-VDI-0",
            "gpu-0000-3b-00-0-vdi_2-0",
            "gpu-00é0-3b-00-0-vdi-0",
            "gpu-0000-3b-00-0-vdi-99999999999",
        ] {
            assert!(bad.parse::<DeviceName>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn refuses_names_a_dns_label_cannot_hold() {
        assert!(matches!(
            DeviceName::new("nvidia-parent", "vdi", 0),
            Err(DeviceNameError::NotAGpuId { .. })
        ));
        assert!(matches!(
            DeviceName::new("0000:3b:00.0", "Vdi", 0),
            Err(DeviceNameError::BadProfile { .. })
        ));
        let long = "a".repeat(50);
        assert!(matches!(
            DeviceName::new("0000:3b:00.0", &long, 0),
            Err(DeviceNameError::TooLong { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn every_name_it_makes_parses_back(
            dom in 0u16.., bus in 0u8.., slot in 0u8..0x20, func in 0u8..8,
            profile in "[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", index in 0u32..,
        ) {
            let gpu = format!("{dom:04x}:{bus:02x}:{slot:02x}.{func}");
            let d = DeviceName::new(&gpu, &profile, index).unwrap();
            let name = d.to_string();
            proptest::prop_assert!(name.len() <= MAX_LEN);
            proptest::prop_assert_eq!(name.parse::<DeviceName>(), Ok(d));
        }
    }
}
