//! mdev create and remove.

use nix::errno::Errno;

use super::LifecycleError;
use crate::{Host, HostExt, paths};
use mdev_types::ids::{MdevTypeId, MdevUuid};

/// Creates an mdev of `type_id` on `parent` named `uuid` by writing the UUID to the type's `create`.
///
/// Kernel source: drivers/vfio/mdev/mdev_sysfs.c `create_store` (EINVAL for a malformed UUID) and
/// mdev_core.c `mdev_device_create` (EEXIST for a duplicate UUID on any parent; EUSERS when a core-counted
/// type is full; drivers that count themselves fail their probe with their own errno, e.g. ENOSPC).
pub fn create_mdev(
    host: &dyn Host,
    parent: &str,
    type_id: &MdevTypeId,
    uuid: &MdevUuid,
) -> Result<(), LifecycleError> {
    let dir = paths::mdev_type_dir(parent, type_id);
    let err = match host.write(&dir.join("create"), &uuid.to_string()) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    match err.errno {
        Errno::EEXIST => Err(LifecycleError::DuplicateUuid { uuid: *uuid }),
        Errno::ENOENT if !host.exists(&paths::mdev_parent(parent)) => {
            Err(LifecycleError::UnknownParent {
                parent: parent.to_string(),
            })
        }
        Errno::ENOENT => Err(LifecycleError::UnknownType {
            parent: parent.to_string(),
            type_id: type_id.clone(),
        }),
        errno => {
            // Which errno a full type gives depends on who counts instances; the type's own
            // available_instances is the authority.
            let available = host.read_trimmed(&dir.join("available_instances")).ok();
            if available.as_deref() == Some("0") {
                Err(LifecycleError::TypeFull {
                    parent: parent.to_string(),
                    type_id: type_id.clone(),
                    errno,
                })
            } else {
                Err(err.into())
            }
        }
    }
}

/// Writes `value` to attribute `name` of mdev `uuid` (`/sys/bus/mdev/devices/<uuid>/<name>`), as mdevctl
/// does after `create` for each attribute of a definition, in order (mdevctl src/mdev.rs `start`, which
/// also removes the device again when one fails). `name` must be one file name (the caller checks it).
///
/// Kernel source: the attribute's store handler is the vendor driver's (e.g. drivers/s390/crypto/
/// vfio_ap_ops.c `assign_adapter_store`); a name the driver does not have is `ENOENT`.
pub fn write_mdev_attr(
    host: &dyn Host,
    uuid: &MdevUuid,
    name: &str,
    value: &str,
) -> Result<(), LifecycleError> {
    host.write(&paths::mdev_device(uuid).join(name), value)
        .map_err(|source| LifecycleError::AttributeRefused {
            uuid: *uuid,
            name: name.to_string(),
            source: Box::new(source),
        })
}

/// Removes the mdev `uuid` by writing `1` to its `remove` attribute.
///
/// Kernel source: drivers/vfio/mdev/mdev_sysfs.c `remove_store`; once removed the device directory is gone,
/// so a second remove fails with ENOENT.
pub fn remove_mdev(host: &dyn Host, uuid: &MdevUuid) -> Result<(), LifecycleError> {
    match host.write(&paths::mdev_device(uuid).join("remove"), "1") {
        Ok(()) => Ok(()),
        Err(e) if e.errno == Errno::ENOENT => Err(LifecycleError::NoSuchInstance { uuid: *uuid }),
        Err(e) => Err(e.into()),
    }
}
