//! SR-IOV virtual function count and driver autoprobe.

use nix::errno::Errno;

use super::LifecycleError;
use crate::{Host, HostExt, paths};
use mdev_types::ids::PciAddress;

/// Sets `sriov_numvfs` of `pf` to `num_vfs` (0 disables every VF).
///
/// Kernel source: drivers/pci/iov.c `sriov_numvfs_store`: ERANGE above `sriov_totalvfs`; writing the
/// current value is a no-op; ENOENT when no driver (or one without `sriov_configure`) is bound; EBUSY when
/// changing one non-zero count to another.
pub fn set_sriov_numvfs(
    host: &dyn Host,
    pf: &PciAddress,
    num_vfs: u32,
) -> Result<(), LifecycleError> {
    let dev = paths::pci_device(pf);
    if !host.exists(&dev) {
        return Err(LifecycleError::DeviceGone { addr: *pf });
    }
    let total_path = dev.join("sriov_totalvfs");
    if !host.exists(&total_path) {
        return Err(LifecycleError::NoSriov { pf: *pf });
    }
    let err = match host.write(&dev.join("sriov_numvfs"), &num_vfs.to_string()) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let read_u32 = |attr: &str| {
        host.read_trimmed(&dev.join(attr))
            .ok()
            .and_then(|s| s.parse::<u32>().ok())
    };
    match err.errno {
        Errno::ERANGE => Err(LifecycleError::AboveTotalVfs {
            pf: *pf,
            requested: num_vfs,
            total: read_u32("sriov_totalvfs").unwrap_or(0),
        }),
        Errno::EBUSY => Err(LifecycleError::VfsAlreadyEnabled {
            pf: *pf,
            current: read_u32("sriov_numvfs").unwrap_or(0),
            requested: num_vfs,
        }),
        Errno::ENOENT if !host.exists(&dev) => Err(LifecycleError::DeviceGone { addr: *pf }),
        Errno::ENOENT => Err(LifecycleError::NoPfDriver {
            pf: *pf,
            driver: host.link_name(&dev.join("driver")).ok().flatten(),
        }),
        _ => Err(err.into()),
    }
}

/// Sets `sriov_drivers_autoprobe` of `pf`: with `false`, new VFs are left without a driver so they can be
/// bound to vfio-pci (Documentation/ABI/testing/sysfs-bus-pci).
pub fn set_sriov_autoprobe(
    host: &dyn Host,
    pf: &PciAddress,
    autoprobe: bool,
) -> Result<(), LifecycleError> {
    let path = paths::pci_attr(pf, "sriov_drivers_autoprobe");
    match host.write(&path, if autoprobe { "1" } else { "0" }) {
        Ok(()) => Ok(()),
        Err(e) if e.errno == Errno::ENOENT && !host.exists(&paths::pci_device(pf)) => {
            Err(LifecycleError::DeviceGone { addr: *pf })
        }
        Err(e) if e.errno == Errno::ENOENT => Err(LifecycleError::NoSriov { pf: *pf }),
        Err(e) => Err(e.into()),
    }
}
