//! IOMMU-group viability: may a PCI device be handed to a guest through VFIO?
//!
//! The rule is VFIO's own (Documentation/driver-api/vfio.rst, "Groups, Devices, and IOMMUs"): the IOMMU
//! isolates groups, not devices, so a group is usable by userspace only when every device in it is bound
//! to a VFIO bus driver, to pci-stub, or to no driver. Since Linux 5.19 the kernel enforces it through DMA
//! ownership (drivers/iommu/iommu.c `iommu_device_use_default_domain`): a bound driver blocks the group
//! unless it sets `driver_managed_dma`, which vfio-pci, pci-stub and the PCIe port driver
//! (drivers/pci/pcie/portdrv.c) do — so bridges never block a group.
//!
//! On top of that vgpu-manager refuses devices the host itself needs: the boot VGA device (firmware
//! console) and a physical function whose SR-IOV VFs are enabled (vfio-pci refuses it: vfio_pci_core.c
//! `vfio_pci_core_register_device` returns -EBUSY for a PF with VFs).
//!
//! [`evaluate`] is pure logic over an [`Inventory`]; [`check`] reads the inventory (including the
//! group membership in `/sys/kernel/iommu_groups`) through a [`Host`] first.

use std::fmt;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::Host;
use crate::discover::{DiscoverError, discover};
use mdev_types::ids::{IommuGroup, PciAddress};
use mdev_types::model::{Inventory, PciDevice};

/// Drivers that leave a device unused by the host (Documentation/driver-api/vfio.rst: "bound to a VFIO
/// bus driver or pci-stub").
pub const SAFE_DRIVERS: &[&str] = &["vfio-pci", "pci-stub"];

/// The driver VFIO uses for whole PCI devices and SR-IOV VFs.
pub const VFIO_PCI: &str = "vfio-pci";

/// Where another member of the target's IOMMU group stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemberState {
    /// Bound to vfio-pci: the guest may share the group.
    Vfio,
    /// Bound to pci-stub: held away from the host.
    Stub,
    /// No driver.
    Unbound,
    /// A PCI bridge (class 0x06): allowed in a viable group.
    Bridge,
    /// Bound to a host driver: the host is using it, which makes the group unusable.
    HostDriver,
}

impl MemberState {
    /// True when this member does not block the group.
    pub fn is_ok(self) -> bool {
        !matches!(self, MemberState::HostDriver)
    }
}

/// Another device in the target's IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupMember {
    /// The member's PCI address, as in `/sys/kernel/iommu_groups/<n>/devices/`.
    pub address: PciAddress,
    /// Its driver, if any.
    pub driver: Option<String>,
    /// Its class code (24 bits).
    pub class: u32,
    /// What it means for the group.
    pub state: MemberState,
}

/// One reason the device cannot be handed to a guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Problem {
    /// The device has no IOMMU group: the kernel runs without an IOMMU.
    NoIommuGroup,
    /// The firmware console runs on it.
    BootVga,
    /// It is a PCI bridge; bridges are never assigned.
    Bridge,
    /// It is an SR-IOV PF with enabled VFs.
    PfWithVfs {
        /// `sriov_numvfs`.
        num_vfs: u32,
    },
    /// Another member of its group is bound to a host driver.
    MemberInUse {
        /// The PCI address of the member bound to a host driver.
        address: PciAddress,
        /// The name of the host driver that member is bound to.
        driver: String,
    },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::NoIommuGroup => f.write_str(
                "it has no IOMMU group: the kernel runs without an IOMMU (enable VT-d/AMD-Vi in firmware and boot with intel_iommu=on or amd_iommu=on)",
            ),
            Problem::BootVga => f.write_str(
                "it is the boot VGA device: the host console runs on it (vgpu-manager never takes it)",
            ),
            Problem::Bridge => f.write_str("it is a PCI bridge: bridges are not assigned to guests"),
            Problem::PfWithVfs { num_vfs } => write!(
                f,
                "it is an SR-IOV PF with {num_vfs} VFs enabled and vfio-pci does not take such a PF: set sriov_numvfs to 0 first"
            ),
            Problem::MemberInUse { address, driver } => write!(
                f,
                "{address} in the same IOMMU group is in use by the host (driver {driver}): a guest would get DMA access to it too; unbind it (or bind it to vfio-pci) or move the device to a slot with its own group"
            ),
        }
    }
}

/// The viability report of one device (`vgpuctl viability ADDR`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Viability {
    /// The PCI address of the device the report is about.
    pub device: PciAddress,
    /// The driver bound to it at the time of the check, or `None` when unbound.
    pub driver: Option<String>,
    /// Its IOMMU group, if it has one.
    pub iommu_group: Option<IommuGroup>,
    /// The other devices in its group, sorted by address.
    pub members: Vec<GroupMember>,
    /// Why it cannot be handed to a guest; empty when it can.
    pub problems: Vec<Problem>,
}

impl Viability {
    /// True when the device may be bound to vfio-pci and handed to a guest.
    pub fn is_viable(&self) -> bool {
        self.problems.is_empty()
    }

    /// The refusal as an error, or `None` when the device is viable.
    pub fn refusal(&self) -> Option<ViabilityError> {
        (!self.is_viable()).then(|| ViabilityError::Refused(Box::new(self.clone())))
    }

    /// One line per group member (`0000:00:1c.0 pcieport (bridge)`), for refusals and the CLI.
    pub fn member_lines(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| {
                let state = match m.state {
                    MemberState::Vfio => "ok",
                    MemberState::Stub => "ok, pci-stub",
                    MemberState::Unbound => "ok, no driver",
                    MemberState::Bridge => "ok, bridge",
                    MemberState::HostDriver => "IN USE by the host",
                };
                format!(
                    "{} {} ({state})",
                    m.address,
                    m.driver.as_deref().unwrap_or("no driver")
                )
            })
            .collect()
    }
}

impl fmt::Display for Viability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = self.iommu_group.map_or_else(
            || "no IOMMU group".to_string(),
            |g| format!("IOMMU group {g}"),
        );
        if self.is_viable() {
            write!(f, "{} ({group}) can be handed to a guest", self.device)?;
        } else {
            write!(f, "{} ({group}) cannot be handed to a guest: ", self.device)?;
            let reasons: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
            f.write_str(&reasons.join("; "))?;
        }
        if !self.members.is_empty() {
            write!(f, "; group members: {}", self.member_lines().join(", "))?;
        }
        Ok(())
    }
}

/// Why a viability check failed or refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ViabilityError {
    /// No PCI device has this address.
    #[error(
        "PCI device {0} does not exist (a wrong address, or it was removed): `vgpuctl discover` lists devices"
    )]
    NoSuchDevice(PciAddress),
    /// Reading the host failed.
    #[error("reading the host for the viability check failed: {0}")]
    Discover(#[from] DiscoverError),
    /// The device must not be handed to a guest; the report says why and what to do.
    #[error("{0}")]
    Refused(Box<Viability>),
}

fn member_state(d: &PciDevice) -> MemberState {
    if d.is_bridge() {
        return MemberState::Bridge;
    }
    match d.driver.as_deref() {
        None => MemberState::Unbound,
        Some(VFIO_PCI) => MemberState::Vfio,
        Some("pci-stub") => MemberState::Stub,
        Some(_) => MemberState::HostDriver,
    }
}

/// Judges `addr` from an inventory (pure; see the module docs for the rules).
pub fn evaluate(inv: &Inventory, addr: &PciAddress) -> Result<Viability, ViabilityError> {
    let dev = inv
        .pci_devices
        .iter()
        .find(|d| d.address == *addr)
        .ok_or(ViabilityError::NoSuchDevice(*addr))?;
    let mut problems = Vec::new();
    if dev.iommu_group.is_none() {
        problems.push(Problem::NoIommuGroup);
    }
    if dev.boot_vga {
        problems.push(Problem::BootVga);
    }
    if dev.is_bridge() {
        problems.push(Problem::Bridge);
    }
    if let Some(s) = dev.sriov.as_ref().filter(|s| s.num_vfs > 0) {
        problems.push(Problem::PfWithVfs { num_vfs: s.num_vfs });
    }
    let mut members = Vec::new();
    if let Some(group) = dev.iommu_group {
        // Membership from /sys/kernel/iommu_groups/N/devices, falling back to the devices' own links.
        let listed = inv.iommu_groups.iter().find(|g| g.group == group);
        let addrs: Vec<PciAddress> = match listed {
            Some(g) => g.pci_devices.clone(),
            None => inv
                .pci_devices
                .iter()
                .filter(|d| d.iommu_group == Some(group))
                .map(|d| d.address)
                .collect(),
        };
        for a in addrs.into_iter().filter(|a| a != addr) {
            let Some(d) = inv.pci_devices.iter().find(|d| d.address == a) else {
                continue;
            };
            let state = member_state(d);
            if state == MemberState::HostDriver {
                problems.push(Problem::MemberInUse {
                    address: a,
                    driver: d.driver.clone().unwrap_or_default(),
                });
            }
            members.push(GroupMember {
                address: a,
                driver: d.driver.clone(),
                class: d.class,
                state,
            });
        }
        members.sort_by_key(|m| m.address);
    }
    Ok(Viability {
        device: *addr,
        driver: dev.driver.clone(),
        iommu_group: dev.iommu_group,
        members,
        problems,
    })
}

/// Reads `host` and judges `addr`; changes nothing.
pub fn check(host: &dyn Host, addr: &PciAddress) -> Result<Viability, ViabilityError> {
    evaluate(&discover(host)?, addr)
}

/// Like [`check`], but a non-viable device is an error ([`ViabilityError::Refused`]).
pub fn ensure_viable(host: &dyn Host, addr: &PciAddress) -> Result<Viability, ViabilityError> {
    let v = check(host, addr)?;
    match v.refusal() {
        Some(e) => Err(e),
        None => Ok(v),
    }
}
