//! `define` of a running device and of a type its parent does not list, as mdevctl does them
//! (mdevctl src/main.rs `define_command_helper`).

use vgpu_client::NewInstance;
use vgpu_client::blocking::ManagerCalls;

use super::ops::{find, new_instance};
use super::{DeviceSpec, bad};
use crate::cli::CliError;

/// `define --uuid U [--parent P]` without a type: the request that persists running device `u` with
/// its type, on `P` when given, else on its own parent (mdevctl loads the device from sysfs, then lets
/// `--parent` replace the parent), whether it starts automatically, and that it runs. vgpud leaves the
/// device as it is.
pub(super) fn running_request(
    daemon: &mut dyn ManagerCalls,
    u: &str,
    spec: &DeviceSpec,
) -> Result<(NewInstance, bool, bool), CliError> {
    let i = find(daemon, u, None)?.ok_or_else(|| {
        bad(format!(
            "no mdev {u} exists: give --parent and --type (or --jsonfile)"
        ))
    })?;
    if i.defined {
        return Err(bad(format!("mdev {u} is already defined on {}", i.parent)));
    }
    if i.state != "running" {
        return Err(bad(format!(
            "mdev {u} is not running: give --parent and --type (or --jsonfile)"
        )));
    }
    let parent = spec.parent.as_deref().unwrap_or(&i.parent);
    let owned = u.to_string();
    Ok((
        new_instance(&i.type_id, parent, Some(&owned), &[]),
        spec.auto,
        true,
    ))
}

/// Logs a warning when `parent` is present and does not list `type_id`: vgpud defines it all the
/// same (as mdevctl does, which checks nothing at define), and starting it fails with the kernel's
/// error until the parent offers the type. Logged to standard error, where mdevctl's warnings go.
pub(super) fn warn_unlisted_type(daemon: &mut dyn ManagerCalls, parent: &str, type_id: &str) {
    let Ok(gpus) = daemon.list_gpus() else {
        return;
    };
    let Some(gpu) = gpus.iter().find(|g| g.id == parent) else {
        return;
    };
    if !gpu.types.iter().any(|t| t.type_id == type_id) {
        tracing::warn!(
            %parent,
            type_id,
            "the parent does not list this mdev type: the definition is kept, and starting it fails until the parent offers the type"
        );
    }
}
