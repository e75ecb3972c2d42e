//! Binding a PCI device to a chosen driver and restoring its original one.
//!
//! Mechanism (Documentation/ABI/testing/sysfs-bus-pci `driver_override`): set `driver_override`, unbind
//! from the current driver, then write the address to `/sys/bus/pci/drivers_probe`; the kernel binds the
//! device to the overriding driver only. Restoring clears the override and probes again.

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use super::LifecycleError;
use crate::host::{Host, HostError, HostExt, paths};
use crate::ids::PciAddress;

/// What a device was bound to before [`bind_driver`], so [`restore_driver`] can put it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindRecord {
    /// The device.
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

fn current_driver(host: &dyn Host, addr: &PciAddress) -> Result<Option<String>, LifecycleError> {
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

/// Puts a device back the way [`bind_driver`] found it: restores `driver_override` and re-probes so the
/// original driver takes it again (or leaves it without a driver if it had none).
pub fn restore_driver(host: &dyn Host, record: &BindRecord) -> Result<(), LifecycleError> {
    let addr = &record.addr;
    if current_driver(host, addr)? == record.previous_driver {
        return Ok(());
    }
    unbind_current(host, addr)?;
    // Writing a newline clears the override (drivers/base/driver.c driver_set_override).
    let override_value = record.previous_override.as_deref().unwrap_or("\n");
    host.write(&paths::pci_attr(addr, "driver_override"), override_value)
        .map_err(|e| gone_or(host, addr, e))?;
    if let Some(drv) = &record.previous_driver {
        // Bind explicitly: drivers_probe would pick any matching driver, not necessarily the original.
        let bind = paths::pci_driver(drv).join("bind");
        host.write(&bind, &addr.to_string())
            .map_err(|e| gone_or(host, addr, e))?;
        let actual = current_driver(host, addr)?;
        if actual.as_deref() != Some(drv.as_str()) {
            return Err(LifecycleError::BindFailed {
                addr: *addr,
                expected: drv.clone(),
                actual,
            });
        }
    }
    Ok(())
}
