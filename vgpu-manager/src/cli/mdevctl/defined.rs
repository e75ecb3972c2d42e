//! Definitions as mdevctl keys them, by parent and UUID (vgpud's `ListDefinitions`: its own and the
//! foreign files of `/etc/mdevctl.d`), and the lookups mdevctl's commands make among them, with
//! mdevctl's messages (mdevctl src/environment.rs `get_defined_device`, src/main.rs
//! `start_command_helper`, `undefine_command`, `define_command_helper`). A foreign definition a
//! command names is taken over by vgpud first (`AdoptDefinition`), then acted on.

use std::io::Write;

use qemu_glue::mdevctl::{MdevctlConfig, MdevctlDevice, StartMode};
use vgpu_client::DefinitionInfo;
use vgpu_client::blocking::ManagerCalls;

use super::{ListArgs, bad, print_list, same_uuid};
use crate::cli::CliError;

/// The definitions of `uuid` that match: on `parent` when given.
pub(super) struct Matching {
    /// The definitions that match.
    pub(super) found: Vec<DefinitionInfo>,
    /// Whether `uuid` is defined on several parents (whichever matched).
    pub(super) several: bool,
}

/// The definitions of `uuid`, on `parent` when given.
pub(super) fn matching(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: Option<&str>,
) -> Result<Matching, CliError> {
    let all: Vec<DefinitionInfo> = daemon
        .list_definitions()?
        .into_iter()
        .filter(|d| same_uuid(&d.uuid, uuid))
        .collect();
    let several = all.len() > 1;
    Ok(Matching {
        found: all
            .into_iter()
            .filter(|d| parent.is_none_or(|p| p == d.parent))
            .collect(),
        several,
    })
}

/// Makes `d` the definition vgpud acts on for its UUID: a foreign one is adopted, and when the UUID
/// is defined on `several` parents the one on `d`'s parent is selected (`AdoptDefinition` does
/// both).
pub(super) fn own(
    daemon: &mut dyn ManagerCalls,
    d: &DefinitionInfo,
    several: bool,
) -> Result<(), CliError> {
    if d.is_foreign() || several {
        daemon.adopt_definition(&d.parent, &d.uuid)?;
    }
    Ok(())
}

/// The one definition of `uuid` (on `parent`), with mdevctl's messages when there is none or several
/// (mdevctl src/environment.rs `get_defined_device`), made vgpud's.
pub(super) fn the_definition(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: Option<&str>,
) -> Result<DefinitionInfo, CliError> {
    let Matching { mut found, several } = matching(daemon, uuid, parent)?;
    match (found.len(), parent) {
        (0, None) => Err(bad(format!("Mediated device {uuid} is not defined"))),
        (0, Some(p)) => Err(bad(format!("Mediated device {p}/{uuid} is not defined"))),
        (1, _) => {
            let d = found.remove(0);
            own(daemon, &d, several)?;
            Ok(d)
        }
        (_, None) => Err(bad(format!(
            "Multiple definitions found for {uuid}, specify a parent"
        ))),
        (_, Some(p)) => Err(bad(format!("Multiple definitions found for {p}/{uuid}"))),
    }
}

/// Before `start --uuid U` without a JSON file: a UUID defined on several parents needs `--parent`
/// (mdevctl src/main.rs `start_command_helper`), a type that differs from the one definition's is
/// refused, and that definition is made vgpud's. True when `uuid` has that one definition.
pub(super) fn before_start(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: Option<&str>,
    mdev_type: Option<&str>,
) -> Result<bool, CliError> {
    let Matching { found, several } = matching(daemon, uuid, parent)?;
    match found.as_slice() {
        [] => Ok(false),
        [d] => {
            if let Some(t) = mdev_type
                && t != d.type_id
            {
                return Err(bad(format!(
                    "Device {uuid} already exists on parent {} with type {}",
                    d.parent, d.type_id
                )));
            }
            own(daemon, d, several)?;
            Ok(true)
        }
        _ => Err(bad(format!(
            "Multiple definitions found for device {uuid}. Please specify a parent."
        ))),
    }
}

/// `undefine --uuid U [--parent P]`: every matching definition is removed by `undefine_one`, foreign
/// ones taken over first (mdevctl src/main.rs `undefine_command`).
pub(super) fn undefine(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: Option<&str>,
    mut undefine_one: impl FnMut(&mut dyn ManagerCalls, &str) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let Matching { found, several } = matching(daemon, uuid, parent)?;
    if found.is_empty() {
        return Err(bad("No devices match the specified uuid"));
    }
    for d in &found {
        own(daemon, d, several)?;
        undefine_one(daemon, &d.uuid)?;
    }
    Ok(())
}

/// `define` of a definition that exists already: refused with mdevctl's words (src/main.rs
/// `define_command_helper`).
pub(super) fn refuse_existing(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: &str,
    jsonfile: bool,
) -> Result<(), CliError> {
    if matching(daemon, uuid, Some(parent))?.found.is_empty() {
        return Ok(());
    }
    Err(bad(if jsonfile {
        format!("Cowardly refusing to overwrite existing config for {parent}/{uuid}")
    } else {
        format!("Device {uuid} on {parent} already defined")
    }))
}

/// `list --defined`: every definition (vgpud's and foreign), marked `(active)` when a device of its
/// UUID runs on its parent.
pub(super) fn list(
    daemon: &mut dyn ManagerCalls,
    a: &ListArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let running: Vec<(String, String)> = daemon
        .list_instances()?
        .into_iter()
        .filter(|i| i.state == "running")
        .map(|i| (i.uuid, i.parent))
        .collect();
    let mut chosen = Vec::new();
    for d in daemon.list_definitions()? {
        if a.uuid.as_deref().is_some_and(|u| !same_uuid(u, &d.uuid))
            || a.parent.as_deref().is_some_and(|p| p != d.parent)
        {
            continue;
        }
        let (Ok(uuid), Ok(mdev_type)) = (d.uuid.parse(), d.type_id.parse()) else {
            continue;
        };
        let active = running
            .iter()
            .any(|(u, p)| same_uuid(u, &d.uuid) && *p == d.parent);
        let device = MdevctlDevice {
            parent: d.parent,
            uuid,
            config: MdevctlConfig {
                mdev_type,
                start: StartMode::from_autostart(d.autostart),
                attrs: d.attrs,
            },
        };
        chosen.push((device, if active { " (active)" } else { "" }));
    }
    print_list(chosen, a, out)
}

/// `start-parent-mdevs PARENT`: the parent's stopped definitions marked auto, vgpud's and foreign
/// (this is the administrator's configured mdevctl autostart, run by mdevctl's udev rule), each with
/// whether its UUID is defined on several parents (see [`own`]).
pub(super) fn due_on(
    daemon: &mut dyn ManagerCalls,
    parent: &str,
) -> Result<Vec<(DefinitionInfo, bool)>, CliError> {
    let running: Vec<String> = daemon
        .list_instances()?
        .into_iter()
        .filter(|i| i.state == "running")
        .map(|i| i.uuid)
        .collect();
    let all = daemon.list_definitions()?;
    Ok(all
        .iter()
        .filter(|d| d.parent == parent && d.autostart)
        .filter(|d| !running.iter().any(|u| same_uuid(u, &d.uuid)))
        .map(|d| {
            let several = all.iter().filter(|o| same_uuid(&o.uuid, &d.uuid)).count() > 1;
            (d.clone(), several)
        })
        .collect())
}
