//! Turning a failed read of one device into that device's [`DeviceFault`], or into nothing when the
//! device simply went away while it was read.

use std::path::Path;

use super::DiscoverError;
use crate::{Errno, Host, HostError};
use mdev_types::fault::{DeviceFault, FaultCause, FaultScope};
use mdev_types::parse::ParseError;

/// What one device's read came to.
pub(super) enum Outcome<T> {
    /// Read whole.
    Read(T),
    /// Gone while it was read (hot unplug, VFs disabled, a driver unbinding): absent from this walk.
    Gone,
    /// Present but unreadable.
    Faulted(DeviceFault),
}

/// The errnos of an object that no longer exists: `ENOENT` for a removed sysfs entry, `ENODEV` for an
/// attribute of a device the driver has let go (its `show()` returns -ENODEV).
fn is_gone_errno(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ENODEV)
}

/// Classifies the result of reading the device rooted at `dir`.
pub(super) fn classify<T>(
    host: &dyn Host,
    scope: FaultScope,
    device: &str,
    dir: &Path,
    result: Result<T, DiscoverError>,
) -> Outcome<T> {
    match result {
        Ok(v) => Outcome::Read(v),
        Err(DiscoverError::Host(e)) if is_gone_errno(e.errno) && !host.exists(dir) => Outcome::Gone,
        Err(e) => Outcome::Faulted(fault_of(scope, device, e)),
    }
}

/// The fault a read error makes of `device`.
pub(super) fn fault_of(scope: FaultScope, device: &str, err: DiscoverError) -> DeviceFault {
    let (path, cause, fix) = match err {
        DiscoverError::Host(e) => {
            let fix = errno_fix(&e);
            (
                e.path,
                FaultCause::Errno {
                    op: e.op.to_string(),
                    errno: format!("{:?}", e.errno),
                    code: e.errno as i32,
                },
                fix,
            )
        }
        DiscoverError::Malformed { path, source } => {
            let text = match &source {
                ParseError::Invalid { text, .. } => Some(text.clone()),
                _ => None,
            };
            (
                path,
                FaultCause::Malformed {
                    text,
                    problem: source.to_string(),
                },
                Some(MALFORMED_FIX.to_string()),
            )
        }
        DiscoverError::AllOnes { path, text } => (
            path,
            FaultCause::AllOnes { text },
            Some(ALL_ONES_FIX.to_string()),
        ),
    };
    DeviceFault {
        scope,
        device: device.to_string(),
        path,
        cause,
        fix,
    }
}

const MALFORMED_FIX: &str = "the driver printed text the kernel's own attributes never hold: check \
    `dmesg` for the device and reload its driver (or reset the device); vgpu-manager reads it again on \
    the next uevent or re-read";

const ALL_ONES_FIX: &str = "the device fell off the bus (on NVIDIA GPUs, Xid 79 in `dmesg`): reset it \
    (`echo 1 > /sys/bus/pci/devices/<address>/reset`) or reboot the host; its instances and \
    definitions are kept";

fn errno_fix(e: &HostError) -> Option<String> {
    let fix = match e.errno {
        Errno::ELOOP => {
            "a symbolic link loop in sysfs: the driver registered a broken device; unload and reload \
             the driver"
        }
        Errno::EIO => {
            "the device or its driver does not answer (check `dmesg`; a GPU that fell off the bus \
             needs a reset or a reboot)"
        }
        Errno::ENOENT | Errno::ENODEV => {
            "the driver did not create this attribute (a driver that failed to probe fully, or a \
             version vgpu-manager does not know): check `dmesg` and reload the driver"
        }
        Errno::EACCES | Errno::EPERM => "run vgpud and vgpuctl as root",
        _ => return None,
    };
    Some(fix.to_string())
}
