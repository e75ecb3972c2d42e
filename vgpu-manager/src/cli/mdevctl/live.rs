//! `modify --live`: a running device is changed by its call-out script, as mdevctl changes it
//! (mdevctl src/main.rs modify_command and src/callouts.rs invoke_modify_live): the device must run
//! with the JSON file's type, its versioned call-out script must list the `live` event, and with
//! `--defined` the definition (of the same type) is rewritten too, between the `pre` and `post`
//! call-outs of `modify`. vgpud itself changes nothing of a running device: the script does.

use vgpu_client::blocking::ManagerCalls;

use super::callouts::Callouts;
use super::callouts::protocol::{Action, Device};
use super::ops::{check_uuid, find, read_config, replace_definition};
use super::{ModifyArgs, bad};
use crate::cli::CliError;

pub(super) fn modify(
    daemon: &mut dyn ManagerCalls,
    m: &ModifyArgs,
    co: &mut Callouts,
) -> Result<(), CliError> {
    let u = check_uuid(&m.uuid)?;
    // What cannot change on a running device is named first, in mdevctl's words.
    for (given, what) in [(m.auto, "auto"), (m.manual, "manual")] {
        if given {
            return Err(bad(format!("'{what}' cannot be changed on active mdev")));
        }
    }
    let running = find(daemon, &u, m.parent.as_deref())?
        .filter(|i| i.state == "running")
        .ok_or_else(|| {
            let which = m.parent.as_ref().map_or(u.clone(), |p| format!("{p}/{u}"));
            bad(format!(
                "Mediated device {which} is not active: --live changes a running device; change a stopped one's definition without --live"
            ))
        })?;
    let Some(file) = &m.jsonfile else {
        return Err(bad("'live' option must be used with 'jsonfile' option"));
    };
    let config = read_config(file)?;
    if config.mdev_type.as_str() != running.type_id {
        return Err(bad("'type' cannot be changed on active mdev"));
    }
    let dev = Device {
        start: config.start,
        attrs: config.attrs.clone(),
        ..Device::of_instance(&running, Vec::new())
    };
    if !m.defined {
        return Ok(co.modify_live(&dev)?);
    }
    let defined = find(daemon, &u, Some(&dev.parent))?
        .filter(|i| i.defined)
        .ok_or_else(|| bad(format!("Mediated device {}/{u} is not defined", dev.parent)))?;
    if defined.type_id != dev.mdev_type {
        return Err(bad("'type' of active and defined mdev does not match"));
    }
    if defined.owner != "foreign" {
        // Its definition would be replaced by undefining and defining again, and vgpud does not
        // define the UUID of a running instance of its own: both steps, and the restore, would fail.
        return Err(bad(format!(
            "mdev {u} runs as vgpud's own instance, whose definition vgpud rewrites only while it is stopped: change it with --live alone, and its definition (--defined) after stopping it"
        )));
    }
    let old_attrs = daemon.instance_attrs(&u)?;
    co.modify_live(&dev)?;
    co.invoke(Action::Modify, &dev, m.force, |_| {
        if dev.attrs == old_attrs && config.start.is_auto() == defined.autostart {
            return Ok(());
        }
        replace_definition(
            daemon,
            &defined,
            &old_attrs,
            &dev.mdev_type,
            config.start.is_auto(),
            &dev.attrs,
        )
    })
}
