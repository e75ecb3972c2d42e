//! The compatibility fingerprint of an mdev instance.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Host, HostError, HostExt, paths};

/// The `schema` of a fingerprint this build writes and reads.
pub const FINGERPRINT_SCHEMA: &str = "vgpu-manager/migration-fingerprint/1";

/// Vendor attributes of an mdev device that its migration state depends on, when present
/// (`/sys/bus/mdev/devices/UUID/<path>`): NVIDIA's per-vGPU parameters (NVIDIA vGPU guide,
/// "Modifying a vGPU's configuration": `nvidia/vgpu_params`).
const VENDOR_PARAMS: &[&str] = &["nvidia/vgpu_params"];

/// What must match between source and target for an instance's migration state to load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    /// [`FINGERPRINT_SCHEMA`].
    pub schema: String,
    /// The source instance.
    pub uuid: MdevUuid,
    /// Its mdev type (`mdev_type` link).
    pub type_id: MdevTypeId,
    /// The type's `name`, when the driver gives one (for people; not compared).
    pub type_name: Option<String>,
    /// The source parent (for people; the target may use any parent that matches).
    pub parent: String,
    /// The kernel module behind the parent (its driver's module, or the module of a virtual parent:
    /// see `parent_module`).
    pub driver: String,
    /// The driver module's `version`, or its `srcversion` where it has no version
    /// (`/sys/module/<driver>/`); `None` for a built-in driver without either.
    pub driver_version: Option<String>,
    /// The kernel release (`/proc/sys/kernel/osrelease`), which pins the build of in-tree drivers.
    pub kernel_release: Option<String>,
    /// Vendor parameters set on the device (path below the device → value).
    pub vendor_params: BTreeMap<String, String>,
    /// The NUMA node of the source's parent (its `numa_node`), when the kernel knows it; for people
    /// and orchestrators choosing the target's node (`PrepareIncoming`'s `numa_node` option). Absent
    /// in fingerprints of earlier versions and for virtual parents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
}

/// Why a fingerprint cannot be read.
#[derive(Debug, Error)]
pub enum MigrationError {
    /// No such mdev device.
    #[error(
        "mdev {uuid} does not exist (`vgpuctl list` shows the instances; migration needs a running one)"
    )]
    NoDevice {
        /// The UUID.
        uuid: MdevUuid,
    },
    /// A sysfs attribute of the device or its parent could not be read.
    #[error("cannot read {} for the migration fingerprint of {uuid}: {source}", path.display())]
    Read {
        /// The instance.
        uuid: MdevUuid,
        /// The attribute.
        path: PathBuf,
        /// What failed.
        #[source]
        source: HostError,
    },
    /// The device's links do not name a parent, type or driver.
    #[error("mdev {uuid}: {what} (its sysfs entry is not as the kernel makes it)")]
    Malformed {
        /// The instance.
        uuid: MdevUuid,
        /// What is wrong.
        what: String,
    },
}

/// The last component of a link's target, as text.
fn last(p: &Path) -> Option<String> {
    p.file_name()?.to_str().map(str::to_string)
}

/// The version of driver module `driver`: `version`, else `srcversion`, else `None`.
pub(super) fn driver_version(host: &dyn Host, driver: &str) -> Result<Option<String>, HostError> {
    let module = Path::new("/sys/module").join(driver);
    for attr in ["version", "srcversion"] {
        if let Some(v) = host.read_optional(&module.join(attr))? {
            let v = v.trim();
            if !v.is_empty() {
                return Ok(Some(v.to_string()));
            }
        }
    }
    Ok(None)
}

/// The kernel release, `None` where `/proc/sys/kernel/osrelease` is not readable (a simulated host).
pub(super) fn kernel_release(host: &dyn Host) -> Option<String> {
    host.read_optional(Path::new("/proc/sys/kernel/osrelease"))
        .ok()
        .flatten()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// The kernel module whose build the state of `parent`'s devices depends on: the module of the
/// parent's driver (`driver/module`, e.g. `nvidia`, `i915`), else the driver's name, else, for a
/// virtual parent a sample or vendor module registered (no driver: `/sys/devices/virtual/mtty/mtty`),
/// its class name when a module of that name is loaded (`mtty`, `mdpy`, `mbochs`).
pub(super) fn parent_module(host: &dyn Host, parent: &str) -> Result<Option<String>, HostError> {
    let dir = paths::mdev_parent(parent);
    if let Some(m) = host.link_name(&dir.join("driver/module"))? {
        return Ok(Some(m));
    }
    if let Some(d) = host.link_name(&dir.join("driver"))? {
        return Ok(Some(d));
    }
    if let Some(class) = host.link_name(&dir.join("subsystem"))?
        && host.exists(&Path::new("/sys/module").join(&class))
    {
        return Ok(Some(class));
    }
    Ok(None)
}

/// The NUMA node of mdev parent `parent` (`/sys/class/mdev_bus/<parent>/numa_node`, the PCI device's
/// attribute); `None` when the kernel reports -1 or the parent has none (a virtual parent).
pub(super) fn parent_numa(host: &dyn Host, parent: &str) -> Option<u32> {
    host.read_optional(&paths::mdev_parent(parent).join("numa_node"))
        .ok()
        .flatten()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok())
}

/// Reads the fingerprint of running instance `uuid`.
pub fn fingerprint(host: &dyn Host, uuid: &MdevUuid) -> Result<Fingerprint, MigrationError> {
    let dev = paths::mdev_device(uuid);
    let read_err = |path: PathBuf| {
        move |source: HostError| MigrationError::Read {
            uuid: *uuid,
            path,
            source,
        }
    };
    let malformed = |what: &str| MigrationError::Malformed {
        uuid: *uuid,
        what: what.to_string(),
    };
    let place = match host.read_link(&dev) {
        Ok(p) => p,
        Err(e) if e.is_not_found() => return Err(MigrationError::NoDevice { uuid: *uuid }),
        Err(e) => return Err(read_err(dev.clone())(e)),
    };
    let parent = place
        .parent()
        .and_then(last)
        .ok_or_else(|| malformed("its device link names no parent"))?;
    let type_link = dev.join("mdev_type");
    let type_id: MdevTypeId = host
        .read_link(&type_link)
        .map_err(read_err(type_link.clone()))?
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| malformed("its mdev_type link names no type"))?;
    let type_name = host
        .read_optional(&paths::mdev_type_dir(&parent, &type_id).join("name"))
        .map_err(read_err(
            paths::mdev_type_dir(&parent, &type_id).join("name"),
        ))?
        .map(|s| s.trim().to_string());
    let driver = parent_module(host, &parent)
        .map_err(read_err(paths::mdev_parent(&parent).join("driver")))?
        .ok_or_else(|| malformed("no driver or module of its parent could be found"))?;
    let driver_version =
        driver_version(host, &driver).map_err(read_err(Path::new("/sys/module").join(&driver)))?;
    let mut vendor_params = BTreeMap::new();
    for p in VENDOR_PARAMS {
        if let Some(v) = host
            .read_optional(&dev.join(p))
            .map_err(read_err(dev.join(p)))?
        {
            vendor_params.insert((*p).to_string(), v.trim().to_string());
        }
    }
    let numa_node = parent_numa(host, &parent);
    Ok(Fingerprint {
        schema: FINGERPRINT_SCHEMA.to_string(),
        uuid: *uuid,
        type_id,
        type_name,
        parent,
        driver,
        driver_version,
        kernel_release: kernel_release(host),
        vendor_params,
        numa_node,
    })
}
