//! What the kernel's sample mdev drivers offer, and a guard that removes the mdevs a test created.
//!
//! Source of every fact here: the kernel's samples/vfio-mdev/ (identical in 6.1 and 6.12):
//! * mtty.c: parent `mtty`, types `mtty-1` "Single port serial" (1 port) and `mtty-2` "Dual port serial"
//!   (2 ports) drawing on one pool of `MAX_MTTYS` = 24 ports; no description attribute; counts itself
//!   (`get_available`), so a full type fails `create` in its `init_dev` with ENOSPC.
//! * mdpy.c: parent `mdpy`, types `mdpy-vga` 640x480, `mdpy-xga` 1024x768, `mdpy-hd` 1920x1080, sharing
//!   the parent's `count` = 4 instances counted by the mdev core (drivers/vfio/mdev/mdev_core.c), which
//!   refuses a full parent with EUSERS.
//! * mbochs.c: parent `mbochs`, types `mbochs-small` 4 MB, `mbochs-medium` 16 MB, `mbochs-large` 64 MB
//!   drawing on one pool of `count` = 256 MB; counts itself and fails with ENOSPC when full.
//!
//! All three report `device_api` `vfio-pci` (VFIO_DEVICE_API_PCI_STRING).

use std::path::{Path, PathBuf};

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Errno, Host, HostError, HostExt, paths};

use super::runner::TestError;

/// One sample type as its driver defines it.
#[derive(Debug, Clone, Copy)]
pub struct SampleType {
    /// Parent device name under /sys/class/mdev_bus.
    pub parent: &'static str,
    /// Type directory name.
    pub id: &'static str,
    /// The `name` attribute.
    pub name: &'static str,
    /// The `description` attribute (trimmed), when the driver has one.
    pub description: Option<&'static str>,
    /// `available_instances` with no instance of any type of this parent.
    pub initial: u32,
    /// The errno `create` fails with once the type is full (see the module docs).
    pub full_errno: Errno,
}

/// Every type of the three sample parents.
pub const SAMPLE_TYPES: &[SampleType] = &[
    SampleType {
        parent: "mtty",
        id: "mtty-1",
        name: "Single port serial",
        description: None,
        initial: 24,
        full_errno: Errno::ENOSPC,
    },
    SampleType {
        parent: "mtty",
        id: "mtty-2",
        name: "Dual port serial",
        description: None,
        initial: 12,
        full_errno: Errno::ENOSPC,
    },
    SampleType {
        parent: "mdpy",
        id: "mdpy-vga",
        name: "mdpy-vga",
        description: Some("virtual display, 640x480 framebuffer"),
        initial: 4,
        full_errno: Errno::EUSERS,
    },
    SampleType {
        parent: "mdpy",
        id: "mdpy-xga",
        name: "mdpy-xga",
        description: Some("virtual display, 1024x768 framebuffer"),
        initial: 4,
        full_errno: Errno::EUSERS,
    },
    SampleType {
        parent: "mdpy",
        id: "mdpy-hd",
        name: "mdpy-hd",
        description: Some("virtual display, 1920x1080 framebuffer"),
        initial: 4,
        full_errno: Errno::EUSERS,
    },
    SampleType {
        parent: "mbochs",
        id: "mbochs-small",
        name: "mbochs-small",
        description: Some("virtual display, 4 MB video memory"),
        initial: 64,
        full_errno: Errno::ENOSPC,
    },
    SampleType {
        parent: "mbochs",
        id: "mbochs-medium",
        name: "mbochs-medium",
        description: Some("virtual display, 16 MB video memory"),
        initial: 16,
        full_errno: Errno::ENOSPC,
    },
    SampleType {
        parent: "mbochs",
        id: "mbochs-large",
        name: "mbochs-large",
        description: Some("virtual display, 64 MB video memory"),
        initial: 4,
        full_errno: Errno::ENOSPC,
    },
];

/// The sample parents.
pub const SAMPLE_PARENTS: &[&str] = &["mbochs", "mdpy", "mtty"];

/// The sample type `id`.
pub fn sample(id: &str) -> Result<&'static SampleType, TestError> {
    SAMPLE_TYPES
        .iter()
        .find(|t| t.id == id)
        .ok_or_else(|| TestError::Check(format!("{id} is not a sample type")))
}

/// A type id known to be valid.
pub fn type_id(id: &str) -> Result<MdevTypeId, TestError> {
    id.parse()
        .map_err(|e| TestError::Check(format!("bad type id {id}: {e}")))
}

/// `/sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/create`.
pub fn create_path(parent: &str, ty: &str) -> Result<PathBuf, TestError> {
    Ok(paths::mdev_type_dir(parent, &type_id(ty)?).join("create"))
}

/// Reads `available_instances` of a type.
pub fn available(host: &dyn Host, parent: &str, ty: &str) -> Result<u32, TestError> {
    let path = paths::mdev_type_dir(parent, &type_id(ty)?).join("available_instances");
    let text = host.read_trimmed(&path)?;
    text.parse()
        .map_err(|_| TestError::Check(format!("{} reads {text:?}, not a count", path.display())))
}

/// A stable UUID for the `n`th mdev of test `test` (version 5, so the suite needs no entropy).
pub fn test_uuid(test: &str, n: u32) -> MdevUuid {
    // An arbitrary fixed namespace for the suite's UUIDs.
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6d0c_5a4e_7b1f_4c1e_9a55_7667_7075_7465);
    MdevUuid::derived(&MdevUuid::from_uuid(NAMESPACE), &format!("{test}/{n}"))
}

/// The mdevs a test created; dropping it removes those still present, so a failing test leaves the
/// sample parents empty for the next one.
pub struct Mdevs<'h> {
    host: &'h dyn Host,
    uuids: Vec<MdevUuid>,
}

impl<'h> Mdevs<'h> {
    /// No mdevs yet on `host`.
    pub fn new(host: &'h dyn Host) -> Self {
        Self {
            host,
            uuids: Vec::new(),
        }
    }

    /// Remembers an mdev created by other means (e.g. `vgpu_host::ops::create_mdev`) for removal.
    pub fn adopt(&mut self, uuid: MdevUuid) {
        self.uuids.push(uuid);
    }

    /// Forgets an mdev removed by other means.
    pub fn forget(&mut self, uuid: &MdevUuid) {
        self.uuids.retain(|u| u != uuid);
    }

    /// Writes `uuid` to the type's `create` through the host layer, remembering it on success.
    pub fn create(&mut self, parent: &str, ty: &str, uuid: MdevUuid) -> Result<(), HostError> {
        let path = paths::mdev_type_dir(parent, &ty.parse().map_err(|_| bad_type(parent, ty))?)
            .join("create");
        self.host.write(&path, &uuid.to_string())?;
        self.uuids.push(uuid);
        Ok(())
    }

    /// Writes `1` to the mdev's `remove`.
    pub fn remove(&mut self, uuid: &MdevUuid) -> Result<(), HostError> {
        self.host
            .write(&paths::mdev_device(uuid).join("remove"), "1")?;
        self.uuids.retain(|u| u != uuid);
        Ok(())
    }

    /// Removes every remembered mdev, failing on the first that cannot be removed.
    pub fn remove_all(&mut self) -> Result<(), HostError> {
        while let Some(u) = self.uuids.last().copied() {
            self.remove(&u)?;
        }
        Ok(())
    }

    /// The remembered UUIDs.
    pub fn uuids(&self) -> &[MdevUuid] {
        &self.uuids
    }
}

fn bad_type(parent: &str, ty: &str) -> HostError {
    HostError::write(
        Path::new(paths::MDEV_BUS_CLASS).join(parent).join(ty),
        "",
        Errno::EINVAL,
    )
}

impl Drop for Mdevs<'_> {
    fn drop(&mut self) {
        for u in std::mem::take(&mut self.uuids) {
            let remove = paths::mdev_device(&u).join("remove");
            if self.host.exists(&remove) {
                // Best effort: the test already failed or is finishing; a leftover shows up in the
                // next test's accounting checks.
                let _ = self.host.write(&remove, "1");
            }
        }
    }
}
