//! Lifecycle operations on any [`Host`](crate::Host): mdev create/remove, SR-IOV VF enable/disable,
//! driver binding. Each turns the kernel's errno into a typed [`LifecycleError`] that names the object and
//! the fix, identically for the real kernel and the simulated host.

use nix::errno::Errno;
use thiserror::Error;

use crate::HostError;
use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};

mod bind;
mod mdev;
mod sriov;

pub use bind::{
    BindRecord, VfioBindError, bind_driver, bind_vfio, current_driver, restore_driver,
    vf_without_autoprobe,
};
pub use mdev::{create_mdev, remove_mdev, write_mdev_attr};
pub use sriov::{set_sriov_autoprobe, set_sriov_numvfs};

/// A lifecycle operation the kernel refused, in terms of what the operator asked for.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LifecycleError {
    /// `create` returned `EEXIST`: an mdev with this UUID exists (on any parent).
    #[error(
        "an mdev with UUID {uuid} already exists: choose another UUID or destroy that instance first"
    )]
    DuplicateUuid {
        /// The UUID the create asked for, which an existing mdev already has.
        uuid: MdevUuid,
    },
    /// The type has no instance left (the kernel answered `errno`; `available_instances` reads 0).
    #[error(
        "mdev type {type_id} on {parent} is full (available_instances is 0; the kernel said {errno}): destroy an instance of it or pick another GPU or type"
    )]
    TypeFull {
        /// The mdev parent's sysfs device name, e.g. `0000:3b:00.0`.
        parent: String,
        /// The mdev type whose `available_instances` is 0.
        type_id: MdevTypeId,
        /// The errno the driver used to refuse (EUSERS from the mdev core, ENOSPC/ENOMEM from drivers
        /// that count themselves).
        errno: Errno,
    },
    /// The parent exists but does not offer this type.
    #[error(
        "{parent} offers no mdev type {type_id}: `vgpuctl types --gpu {parent}` lists the types it offers"
    )]
    UnknownType {
        /// The mdev parent's sysfs device name, e.g. `0000:3b:00.0`.
        parent: String,
        /// The mdev type id asked for, absent from the parent's `mdev_supported_types/`.
        type_id: MdevTypeId,
    },
    /// No registered mdev parent has this name.
    #[error(
        "no mdev parent named {parent} (nothing in /sys/class/mdev_bus): check the address with `vgpuctl discover` and that its vGPU driver is loaded"
    )]
    UnknownParent {
        /// The parent device name asked for.
        parent: String,
    },
    /// The mdev does not exist (never created, or already removed).
    #[error(
        "no mdev with UUID {uuid} exists (already removed?): `vgpuctl discover` lists existing instances"
    )]
    NoSuchInstance {
        /// The UUID that has no `/sys/bus/mdev/devices/<uuid>` entry.
        uuid: MdevUuid,
    },
    /// The PCI device is not there (removed, or a wrong address).
    #[error(
        "PCI device {addr} does not exist (removed, or a wrong address): `vgpuctl discover` lists devices"
    )]
    DeviceGone {
        /// The PCI address that has no `/sys/bus/pci/devices/<addr>` entry.
        addr: PciAddress,
    },
    /// The device has no SR-IOV capability.
    #[error(
        "{pf} has no SR-IOV capability (no sriov_totalvfs): it cannot be split into virtual functions"
    )]
    NoSriov {
        /// The PCI address of the device that lacks `sriov_totalvfs`.
        pf: PciAddress,
    },
    /// `sriov_numvfs` returned `ENOENT`: no driver with SR-IOV support is bound to the PF.
    #[error(
        "cannot enable VFs on {pf}: {}; bind the vendor's PF driver first",
        match driver { Some(d) => format!("its driver {d} does not support SR-IOV configuration"), None => "no driver is bound to it".to_string() }
    )]
    NoPfDriver {
        /// The PF whose VF count could not be configured.
        pf: PciAddress,
        /// The bound driver, when one is bound but lacks SR-IOV support.
        driver: Option<String>,
    },
    /// `sriov_numvfs` returned `ERANGE`.
    #[error("{pf} supports at most {total} VFs (sriov_totalvfs), {requested} were asked for")]
    AboveTotalVfs {
        /// The PF whose `sriov_numvfs` write returned `ERANGE`.
        pf: PciAddress,
        /// VFs asked for.
        requested: u32,
        /// `sriov_totalvfs`.
        total: u32,
    },
    /// `sriov_numvfs` returned `EBUSY`: the kernel changes the VF count only through 0.
    #[error(
        "{pf} already has {current} VFs enabled; the kernel cannot change that to {requested} directly: set 0 first (destroys all its VFs)"
    )]
    VfsAlreadyEnabled {
        /// The PF whose `sriov_numvfs` write returned `EBUSY`.
        pf: PciAddress,
        /// VFs enabled now.
        current: u32,
        /// VFs asked for.
        requested: u32,
    },
    /// A driver probe did not leave the device on the expected driver.
    #[error("{addr} is bound to {} after probing, not {expected}: check `dmesg` for the driver's probe error",
        actual.as_deref().unwrap_or("no driver"))]
    BindFailed {
        /// The PCI address of the device that was probed.
        addr: PciAddress,
        /// The driver name the device should have ended up bound to.
        expected: String,
        /// The driver bound after the probe, or `None` when no driver is bound.
        actual: Option<String>,
    },
    /// Writing an attribute of a new mdev (`/sys/bus/mdev/devices/<uuid>/<name>`) failed; the value and
    /// the errno are the source's.
    #[error(
        "mdev {uuid}: writing {:?} to its attribute {name} failed: {} (the attribute is the driver's: check its name and value against the driver's documentation)",
        .source.value.as_deref().unwrap_or_default(),
        .source.errno
    )]
    AttributeRefused {
        /// The device.
        uuid: MdevUuid,
        /// The attribute's file name.
        name: String,
        /// The failed write (value and errno).
        #[source]
        source: Box<HostError>,
    },
    /// Any other kernel refusal, with operation, path and errno.
    #[error(transparent)]
    Host(#[from] HostError),
}

impl LifecycleError {
    /// A short stable name of the variant (`duplicate-uuid`, `type-full`, …) for `--json` output and tests.
    pub fn kind(&self) -> &'static str {
        match self {
            LifecycleError::DuplicateUuid { .. } => "duplicate-uuid",
            LifecycleError::TypeFull { .. } => "type-full",
            LifecycleError::UnknownType { .. } => "unknown-type",
            LifecycleError::UnknownParent { .. } => "unknown-parent",
            LifecycleError::NoSuchInstance { .. } => "no-such-instance",
            LifecycleError::DeviceGone { .. } => "device-gone",
            LifecycleError::NoSriov { .. } => "no-sriov",
            LifecycleError::NoPfDriver { .. } => "no-pf-driver",
            LifecycleError::AboveTotalVfs { .. } => "above-total-vfs",
            LifecycleError::VfsAlreadyEnabled { .. } => "vfs-already-enabled",
            LifecycleError::BindFailed { .. } => "bind-failed",
            LifecycleError::AttributeRefused { .. } => "attribute-refused",
            LifecycleError::Host(_) => "host",
        }
    }
}
