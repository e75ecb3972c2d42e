//! The test guest: which kernel and topology scripts/vm-test booted, and helpers over the live sysfs.
//!
//! scripts/vm-test passes `vmtest.kernel=<name> vmtest.topology=<name>` on the kernel command line; a
//! machine without them is not the throw-away guest, and the suite refuses to touch its sysfs. A run of
//! several boots adds `vmtest.one-boot=<kernel>/<topology>`: the boot that runs the user-space
//! integration tests ([`Scope::OneBoot`](super::runner::Scope::OneBoot)).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mdev_types::ids::PciAddress;
use thiserror::Error;
use vgpu_host::{Host, HostError, HostExt, SysfsHost, paths};

use super::runner::{Boots, TestError};

/// Which kernel the guest runs (scripts/vm-test `--kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelKind {
    /// Debian's linux-image-6.12.*+deb12-amd64 with the samples built out of tree.
    Stock612,
    /// Debian's linux-image-6.1.0-*-amd64 with the samples built out of tree.
    Stock61,
    /// The prebuilt kernel from ../shared/vm (IOMMUFD, VFIO device cdev, samples in tree).
    Custom,
}

impl KernelKind {
    /// The kernel scripts/vm-test calls `name` (`--kernel`), if it is one.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "stock-6.12" => Some(Self::Stock612),
            "stock-6.1" => Some(Self::Stock61),
            "custom" => Some(Self::Custom),
            _ => None,
        }
    }
}

/// Which PCI topology the guest has (scripts/vm/topologies.sh).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// igb and nvme SR-IOV PFs, each behind its own root port.
    Default,
    /// The default devices plus two `edu` devices behind a PCIe-to-PCI bridge (one IOMMU group).
    SharedGroup,
}

impl Topology {
    /// The topology scripts/vm-test calls `name` (`--topology`), if it is one.
    pub fn named(name: &str) -> Option<Self> {
        match name {
            "default" => Some(Self::Default),
            "shared-group" => Some(Self::SharedGroup),
            _ => None,
        }
    }
}

/// Why the suite cannot run here.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum GuestError {
    /// The kernel command line lacks the markers scripts/vm-test sets.
    #[error(
        "this is not the vm-test guest (no vmtest.kernel=/vmtest.topology= on the kernel command line); the suite changes sysfs, run it with scripts/vm-test"
    )]
    NotTheGuest,
    /// A marker has a value this suite does not know.
    #[error(
        "unknown {key}={value} on the kernel command line: scripts/vm-test and the suite disagree"
    )]
    UnknownValue {
        /// `vmtest.kernel` or `vmtest.topology`.
        key: &'static str,
        /// The value found.
        value: String,
    },
}

/// The running guest.
#[derive(Debug)]
pub struct Guest {
    /// The live sysfs, through our host layer.
    pub host: SysfsHost,
    /// The kernel scripts/vm-test booted.
    pub kernel: KernelKind,
    /// The PCI topology scripts/vm-test built.
    pub topology: Topology,
    /// Whether this boot runs the user-space integration tests or another boot of the run does.
    pub boots: Boots,
}

impl Guest {
    /// Reads the markers from a kernel command line (the text of `/proc/cmdline`).
    pub fn from_cmdline(cmdline: &str, host: SysfsHost) -> Result<Self, GuestError> {
        let value = |key: &str| {
            cmdline
                .split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_string)
        };
        let (Some(kernel), Some(topology)) = (value("vmtest.kernel"), value("vmtest.topology"))
        else {
            return Err(GuestError::NotTheGuest);
        };
        let unknown = |key: &'static str, value: &str| GuestError::UnknownValue {
            key,
            value: value.to_string(),
        };
        let kernel_of =
            |name: &str| KernelKind::named(name).ok_or_else(|| unknown("vmtest.kernel", name));
        let topology_of =
            |name: &str| Topology::named(name).ok_or_else(|| unknown("vmtest.topology", name));
        let (kernel, topology) = (kernel_of(&kernel)?, topology_of(&topology)?);
        let boots = match value("vmtest.one-boot") {
            None => Boots::All,
            Some(there) => {
                let boot = there
                    .split_once('/')
                    .and_then(|(k, t)| Some((KernelKind::named(k)?, Topology::named(t)?)))
                    .ok_or_else(|| unknown("vmtest.one-boot", &there))?;
                if boot == (kernel, topology) {
                    Boots::All
                } else {
                    Boots::OneBootTestsOn(there)
                }
            }
        };
        Ok(Self {
            host,
            kernel,
            topology,
            boots,
        })
    }

    /// Every PCI function with this vendor and device id, sorted by address.
    pub fn pci_by_id(&self, vendor: u16, device: u16) -> Result<Vec<PciAddress>, TestError> {
        pci_by_id(&self.host, vendor, device)
    }

    /// The one PCI function with this id; fails naming `what` when there is none or several.
    pub fn one_pci(&self, what: &str, vendor: u16, device: u16) -> Result<PciAddress, TestError> {
        one_pci(&self.host, what, vendor, device)
    }

    /// The driver bound to `addr`, if any.
    pub fn driver_of(&self, addr: &PciAddress) -> Result<Option<String>, HostError> {
        driver_of(&self.host, addr)
    }

    /// The IOMMU group number of a device directory (its `iommu_group` link).
    pub fn iommu_group_of(&self, device_dir: &Path) -> Result<u32, TestError> {
        iommu_group_of(&self.host, device_dir)
    }

    /// The members of IOMMU group `group`, sorted.
    pub fn iommu_group_members(&self, group: u32) -> Result<Vec<String>, HostError> {
        self.host.list(&paths::iommu_group_devices(group))
    }

    /// See [`wait_for`].
    pub fn wait_for(&self, path: &Path, present: bool) -> Result<(), TestError> {
        wait_for(&self.host, path, present)
    }

    /// True when the kernel has IOMMUFD (`/dev/iommu`, drivers/iommu/iommufd/main.c).
    pub fn has_iommufd(&self) -> bool {
        self.host.exists(Path::new("/dev/iommu"))
    }
}

/// Every PCI function of `host` with this vendor and device id, sorted by address.
pub fn pci_by_id(host: &dyn Host, vendor: u16, device: u16) -> Result<Vec<PciAddress>, TestError> {
    let mut found = Vec::new();
    for name in host.list(Path::new(paths::PCI_DEVICES))? {
        let Ok(addr) = name.parse::<PciAddress>() else {
            continue;
        };
        let v = host.read_trimmed(&paths::pci_attr(&addr, "vendor"))?;
        let d = host.read_trimmed(&paths::pci_attr(&addr, "device"))?;
        if parse_hex(&v) == Some(vendor) && parse_hex(&d) == Some(device) {
            found.push(addr);
        }
    }
    found.sort();
    Ok(found)
}

/// The one PCI function of `host` with this id; fails naming `what` when there is none or several.
pub fn one_pci(
    host: &dyn Host,
    what: &str,
    vendor: u16,
    device: u16,
) -> Result<PciAddress, TestError> {
    match pci_by_id(host, vendor, device)?.as_slice() {
        [one] => Ok(*one),
        other => Err(TestError::Check(format!(
            "expected one {what} ({vendor:04x}:{device:04x}) on {}, found {other:?}",
            host.describe()
        ))),
    }
}

/// The driver bound to `addr`, if any.
pub fn driver_of(host: &dyn Host, addr: &PciAddress) -> Result<Option<String>, HostError> {
    host.link_name(&paths::pci_attr(addr, "driver"))
}

/// The IOMMU group number of a device directory (its `iommu_group` link).
pub fn iommu_group_of(host: &dyn Host, device_dir: &Path) -> Result<u32, TestError> {
    let link = host.read_link(&device_dir.join("iommu_group"))?;
    let name = link
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.parse().map_err(|_| {
        TestError::Check(format!(
            "{}/iommu_group points to {}, not a group number",
            device_dir.display(),
            link.display()
        ))
    })
}

/// Waits up to 5 s for `path` to appear (or, with `present == false`, to disappear): device
/// registration after a sysfs write can finish asynchronously (driver probing, uevents).
pub fn wait_for(host: &dyn Host, path: &Path, present: bool) -> Result<(), TestError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while host.exists(path) != present {
        if Instant::now() > deadline {
            return Err(TestError::Check(format!(
                "{} did not {} within 5 s",
                path.display(),
                if present { "appear" } else { "disappear" }
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// Parses sysfs hex ids such as `0x8086`.
pub fn parse_hex(s: &str) -> Option<u16> {
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// `/sys/bus/pci/devices/<addr>/virtfn<n>` resolved to the VF's address.
pub fn vf_address(host: &dyn Host, pf: &PciAddress, n: u32) -> Result<PciAddress, TestError> {
    let link = paths::pci_attr(pf, &format!("virtfn{n}"));
    let target: PathBuf = host.read_link(&link)?;
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    name.parse().map_err(|_| {
        TestError::Check(format!(
            "{} points to {}, not a PCI address",
            link.display(),
            target.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> SysfsHost {
        SysfsHost::new("/").unwrap()
    }

    #[test]
    fn markers_select_kernel_and_topology() {
        let g = Guest::from_cmdline(
            "console=ttyS0 vmtest.kernel=stock-6.1 vmtest.topology=shared-group panic=-1",
            host(),
        )
        .unwrap();
        assert_eq!(g.kernel, KernelKind::Stock61);
        assert_eq!(g.topology, Topology::SharedGroup);
        assert_eq!(g.boots, Boots::All);
    }

    #[test]
    fn the_one_boot_marker_names_where_integration_tests_run() {
        let line =
            "vmtest.kernel=stock-6.1 vmtest.topology=default vmtest.one-boot=stock-6.12/default";
        let g = Guest::from_cmdline(line, host()).unwrap();
        assert_eq!(g.boots, Boots::OneBootTestsOn("stock-6.12/default".into()));
        let line =
            "vmtest.kernel=stock-6.12 vmtest.topology=default vmtest.one-boot=stock-6.12/default";
        assert_eq!(Guest::from_cmdline(line, host()).unwrap().boots, Boots::All);
        let line = "vmtest.kernel=custom vmtest.topology=default vmtest.one-boot=stock-6.12";
        assert!(matches!(
            Guest::from_cmdline(line, host()).unwrap_err(),
            GuestError::UnknownValue {
                key: "vmtest.one-boot",
                ..
            }
        ));
    }

    #[test]
    fn a_normal_machine_is_refused() {
        let e = Guest::from_cmdline("BOOT_IMAGE=/vmlinuz root=/dev/vda ro", host()).unwrap_err();
        assert_eq!(e, GuestError::NotTheGuest);
        let e = Guest::from_cmdline("vmtest.kernel=stock-5.10 vmtest.topology=default", host())
            .unwrap_err();
        assert!(matches!(
            e,
            GuestError::UnknownValue {
                key: "vmtest.kernel",
                ..
            }
        ));
    }

    #[test]
    fn hex_ids() {
        assert_eq!(parse_hex("0x10ca\n"), Some(0x10ca));
        assert_eq!(parse_hex("zz"), None);
    }
}
