//! Binding a PCI device to a chosen driver and restoring its original one.
//!
//! Mechanism (Documentation/ABI/testing/sysfs-bus-pci `driver_override`): set `driver_override`, unbind
//! from the current driver, then write the address to `/sys/bus/pci/drivers_probe`; the kernel binds the
//! device to the overriding driver only. Restoring clears the override and probes again.

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::LifecycleError;
use crate::viability::ViabilityError;
use crate::{Host, HostError, HostExt, paths};
use mdev_types::ids::PciAddress;

/// What a device was bound to before [`bind_driver`], so [`restore_driver`] can put it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindRecord {
    /// The PCI address of the device that was rebound.
    pub addr: PciAddress,
    /// Its driver before, if any.
    pub previous_driver: Option<String>,
    /// Its `driver_override` before, if any.
    pub previous_override: Option<String>,
}

/// Maps "the device is not there" errnos (ENOENT on its attributes, ENODEV from `drivers_probe`,
/// drivers/base/bus.c) to [`LifecycleError::DeviceGone`].
fn gone_or(host: &dyn Host, addr: &PciAddress, e: HostError) -> LifecycleError {
    if matches!(e.errno, Errno::ENOENT | Errno::ENODEV) && !host.exists(&paths::pci_device(addr)) {
        LifecycleError::DeviceGone { addr: *addr }
    } else {
        e.into()
    }
}

/// The driver bound to the PCI function `addr` now (the name its `driver` link points to), `None` when
/// it has none.
pub fn current_driver(
    host: &dyn Host,
    addr: &PciAddress,
) -> Result<Option<String>, LifecycleError> {
    host.link_name(&paths::pci_attr(addr, "driver"))
        .map_err(|e| gone_or(host, addr, e))
}

fn unbind_current(host: &dyn Host, addr: &PciAddress) -> Result<(), LifecycleError> {
    if let Some(drv) = current_driver(host, addr)? {
        let unbind = paths::pci_driver(&drv).join("unbind");
        host.write(&unbind, &addr.to_string())
            .map_err(|e| gone_or(host, addr, e))?;
    }
    Ok(())
}

fn probe(host: &dyn Host, addr: &PciAddress) -> Result<(), LifecycleError> {
    host.write(
        std::path::Path::new(paths::PCI_DRIVERS_PROBE),
        &addr.to_string(),
    )
    .map_err(|e| gone_or(host, addr, e))
}

/// Binds `addr` to `driver` (e.g. `vfio-pci`) through `driver_override`, returning what to restore later.
/// Binding a device already on `driver` changes nothing.
pub fn bind_driver(
    host: &dyn Host,
    addr: &PciAddress,
    driver: &str,
) -> Result<BindRecord, LifecycleError> {
    if !host.exists(&paths::pci_device(addr)) {
        return Err(LifecycleError::DeviceGone { addr: *addr });
    }
    let previous_driver = current_driver(host, addr)?;
    let override_path = paths::pci_attr(addr, "driver_override");
    let previous_override = host
        .read_optional(&override_path)
        .map_err(|e| gone_or(host, addr, e))?
        .filter(|s| s != "(null)" && !s.is_empty());
    let record = BindRecord {
        addr: *addr,
        previous_driver: previous_driver.clone(),
        previous_override,
    };
    if previous_driver.as_deref() == Some(driver) {
        return Ok(record);
    }
    host.write(&override_path, driver)
        .map_err(|e| gone_or(host, addr, e))?;
    unbind_current(host, addr)?;
    probe(host, addr)?;
    let actual = current_driver(host, addr)?;
    if actual.as_deref() != Some(driver) {
        return Err(LifecycleError::BindFailed {
            addr: *addr,
            expected: driver.to_string(),
            actual,
        });
    }
    Ok(record)
}

/// True when `addr` is an SR-IOV VF whose PF has `sriov_drivers_autoprobe` 0: such a VF probes only
/// with a `driver_override` (drivers/pci/pci-driver.c `pci_device_can_probe`), even through an explicit
/// `bind`.
pub fn vf_without_autoprobe(host: &dyn Host, addr: &PciAddress) -> Result<bool, LifecycleError> {
    let Some(pf) = host
        .link_name(&paths::pci_attr(addr, "physfn"))
        .map_err(|e| gone_or(host, addr, e))?
    else {
        return Ok(false);
    };
    let Ok(pf) = pf.parse::<PciAddress>() else {
        return Ok(false);
    };
    let autoprobe = host
        .read_optional(&paths::pci_attr(&pf, "sriov_drivers_autoprobe"))
        .map_err(|e| gone_or(host, addr, e))?;
    Ok(autoprobe.as_deref() == Some("0"))
}

/// Puts a device back the way [`bind_driver`] found it: restores `driver_override` and binds the
/// original driver again (or leaves it without a driver if it had none). A VF of a PF with
/// `sriov_drivers_autoprobe` 0 is bound with a temporary override naming its original driver, since
/// it cannot probe otherwise.
pub fn restore_driver(host: &dyn Host, record: &BindRecord) -> Result<(), LifecycleError> {
    let addr = &record.addr;
    if current_driver(host, addr)? == record.previous_driver {
        return Ok(());
    }
    unbind_current(host, addr)?;
    let override_path = paths::pci_attr(addr, "driver_override");
    // Writing a newline clears the override (drivers/base/driver.c driver_set_override).
    let override_value = record.previous_override.as_deref().unwrap_or("\n");
    if let Some(drv) = &record.previous_driver {
        let temporary = record.previous_override.is_none() && vf_without_autoprobe(host, addr)?;
        let during = if temporary {
            drv.as_str()
        } else {
            override_value
        };
        host.write(&override_path, during)
            .map_err(|e| gone_or(host, addr, e))?;
        // Bind explicitly: drivers_probe would pick any matching driver, not necessarily the original.
        let bind = paths::pci_driver(drv).join("bind");
        let bound = host
            .write(&bind, &addr.to_string())
            .map_err(|e| gone_or(host, addr, e));
        if temporary {
            host.write(&override_path, override_value)
                .map_err(|e| gone_or(host, addr, e))?;
        }
        bound?;
        let actual = current_driver(host, addr)?;
        if actual.as_deref() != Some(drv.as_str()) {
            return Err(LifecycleError::BindFailed {
                addr: *addr,
                expected: drv.clone(),
                actual,
            });
        }
    } else {
        host.write(&override_path, override_value)
            .map_err(|e| gone_or(host, addr, e))?;
    }
    Ok(())
}

/// Why [`bind_vfio`] did not bind a device.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VfioBindError {
    /// The viability check refused the device (boot VGA, shared group, PF with VFs, no IOMMU); the
    /// message names the group, each member with its driver, and what to do.
    #[error("not binding {addr} to vfio-pci: {reason}")]
    Refused {
        /// The PCI address of the device that was not bound.
        addr: PciAddress,
        /// Why the viability check refused it (names the group's members and their drivers).
        reason: ViabilityError,
    },
    /// The host is using the device itself (a network interface on it is up).
    #[error("not binding {addr} to vfio-pci: the host is using it ({what}); stop using it first")]
    InUse {
        /// The PCI address of the device the host is using.
        addr: PciAddress,
        /// What uses it.
        what: String,
    },
    /// The kernel refused a step of the rebinding.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
}

/// Network interfaces of the device that are up (`<dev>/net/<if>/operstate` reads `up`,
/// Documentation/ABI/testing/sysfs-class-net).
fn interfaces_up(host: &dyn Host, addr: &PciAddress) -> Result<Vec<String>, LifecycleError> {
    let mut up = Vec::new();
    let net = paths::pci_attr(addr, "net");
    for ifname in host
        .list_optional(&net)
        .map_err(|e| gone_or(host, addr, e))?
    {
        let state = host
            .read_optional(&net.join(&ifname).join("operstate"))
            .map_err(|e| gone_or(host, addr, e))?;
        if state.as_deref() == Some("up") {
            up.push(ifname);
        }
    }
    Ok(up)
}

/// Binds a VF or a whole GPU to vfio-pci for a guest, refusing what must not be handed over: the boot VGA
/// device, a device whose IOMMU group holds devices on host drivers, a PF with enabled VFs, a device
/// with a network interface up. Returns the record [`restore_driver`] needs to put the original driver
/// back. A device already on vfio-pci is left as it is (its record says so).
pub fn bind_vfio(host: &dyn Host, addr: &PciAddress) -> Result<BindRecord, VfioBindError> {
    let refused = |reason| VfioBindError::Refused {
        addr: *addr,
        reason,
    };
    let report = match crate::viability::check(host, addr) {
        Ok(r) => r,
        Err(ViabilityError::NoSuchDevice(a)) => {
            return Err(LifecycleError::DeviceGone { addr: a }.into());
        }
        Err(e) => return Err(refused(e)),
    };
    if let Some(e) = report.refusal() {
        return Err(refused(e));
    }
    let up = interfaces_up(host, addr)?;
    if !up.is_empty() {
        return Err(VfioBindError::InUse {
            addr: *addr,
            what: format!("network interface {} is up", up.join(", ")),
        });
    }
    Ok(bind_driver(host, addr, crate::viability::VFIO_PCI)?)
}
