//! The mdevctl commands that change something: define, undefine, start, stop, modify, and the
//! export/import extensions. mdevctl's rules are kept where vgpud can honour them (src/main.rs of
//! mdevctl: `start` with the UUID of a definition starts it, and a conflicting type is an error; a new
//! device needs a parent and a type or JSON file; a generated UUID is printed).

use std::io::{Read, Write};
use std::path::Path;

use mdev_types::ids::MdevUuid;
use qemu_glue::mdevctl::{MdevctlConfig, MdevctlDevice, StartMode, read_config_dir, write_config};
use vgpu_client::blocking::ManagerCalls;
use vgpu_client::{InstanceInfo, NewInstance};

use super::callouts::Callouts;
use super::callouts::protocol::{Action, Device};
use super::foreign::running_request;
use super::{DeviceSpec, ModifyArgs, UuidSpec, as_device, bad, same_uuid};
use crate::cli::CliError;

pub(super) fn check_uuid(u: &str) -> Result<String, CliError> {
    u.parse::<MdevUuid>()
        .map(|u| u.to_string())
        .map_err(|_| bad(format!("'{u}' is not a UUID")))
}

/// Reads a JSON configuration from `path` (`-` or `/dev/stdin` for standard input).
pub(super) fn read_config(path: &Path) -> Result<MdevctlConfig, CliError> {
    let mut text = String::new();
    let origin = path.display().to_string();
    let read = if origin == "-" {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|e| bad(format!("cannot read {origin}: {e}")))?;
    MdevctlConfig::from_json(&text, &origin).map_err(|e| bad(e.to_string()))
}

/// The instance `uuid`, checking `parent` when given.
pub(super) fn find(
    daemon: &mut dyn ManagerCalls,
    uuid: &str,
    parent: Option<&str>,
) -> Result<Option<InstanceInfo>, CliError> {
    let found = daemon.get_instance(uuid)?;
    Ok(found.filter(|i| parent.is_none_or(|p| p == i.parent || p == i.gpu)))
}

/// What `define`/`start` should make, from --type or --jsonfile.
struct Wanted {
    type_id: String,
    start: StartMode,
    /// mdev attributes in write order (only a JSON file has them).
    attrs: Attrs,
}

/// mdev attributes (name, value) in write order.
type Attrs = Vec<(String, String)>;

fn wanted(spec: &DeviceSpec) -> Result<Option<Wanted>, CliError> {
    match (&spec.mdev_type, &spec.jsonfile) {
        (Some(t), _) => Ok(Some(Wanted {
            type_id: t.clone(),
            start: StartMode::from_autostart(spec.auto),
            attrs: Vec::new(),
        })),
        (None, Some(f)) => {
            let c = read_config(f)?;
            Ok(Some(Wanted {
                type_id: c.mdev_type.to_string(),
                start: c.start,
                attrs: c.attrs,
            }))
        }
        (None, None) => Ok(None),
    }
}

pub(super) fn new_instance(
    type_id: &str,
    parent: &str,
    uuid: Option<&String>,
    attrs: &[(String, String)],
) -> NewInstance {
    NewInstance {
        gpu: Some(parent.to_string()),
        uuid: uuid.cloned(),
        attrs: attrs.to_vec(),
        ..NewInstance::of_type(type_id)
    }
}

/// A new UUID when none is given: mdevctl makes it before its call-outs, so the scripts see the
/// device that is made (mdevctl src/main.rs define_command_helper, start_command_helper).
fn uuid_or_new(uuid: Option<&String>) -> String {
    uuid.cloned()
        .unwrap_or_else(|| uuid::Uuid::new_v4().hyphenated().to_string())
}

pub(super) fn define(
    daemon: &mut dyn ManagerCalls,
    spec: &DeviceSpec,
    co: &mut Callouts,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let uuid = spec.uuid.as_deref().map(check_uuid).transpose()?;
    if let (Some(u), Some(p)) = (&uuid, &spec.parent) {
        super::defined::refuse_existing(daemon, u, p, spec.jsonfile.is_some())?;
    }
    let (req, autostart, running) = define_request(daemon, spec, uuid.as_ref())?;
    let parent = req.gpu.clone().unwrap_or_default();
    let dev = Device::of_request(&req, &parent, autostart);
    let made = co.invoke(Action::Define, &dev, spec.force, |co| {
        let mut req = req;
        // A running device's call-out script reports its attributes, which the definition keeps
        // (mdevctl src/main.rs define_command).
        if running && let Some(attrs) = co.attributes(&dev)? {
            req.attrs.extend(attrs);
        }
        daemon.define(&req, autostart).map_err(CliError::from)
    })?;
    if uuid.is_none() {
        writeln!(out, "{}", made.uuid)?;
    }
    Ok(())
}

/// What `define` asks vgpud for: the request, whether it starts automatically, and whether a device
/// of that UUID runs (mdevctl looks at sysfs when a UUID is given without a JSON file).
fn define_request(
    daemon: &mut dyn ManagerCalls,
    spec: &DeviceSpec,
    uuid: Option<&String>,
) -> Result<(NewInstance, bool, bool), CliError> {
    let running = |daemon: &mut dyn ManagerCalls, u: &str| -> Result<bool, CliError> {
        Ok(daemon
            .get_instance(u)?
            .is_some_and(|i| i.state == "running"))
    };
    let made = match (wanted(spec)?, &spec.parent, uuid) {
        (Some(w), Some(p), _) => {
            super::foreign::warn_unlisted_type(daemon, p, &w.type_id);
            let active = match uuid {
                Some(u) if spec.jsonfile.is_none() => running(daemon, u)?,
                _ => false,
            };
            let new = uuid_or_new(uuid);
            (
                new_instance(&w.type_id, p, Some(&new), &w.attrs),
                w.start.is_auto(),
                active,
            )
        }
        (Some(_), None, _) => return Err(bad("can't provide type without parent: give --parent")),
        // `define --uuid U`: keep a running device across reboots (mdevctl(8) "define").
        (None, _, Some(u)) => running_request(daemon, u, spec)?,
        (None, _, None) => {
            return Err(bad(
                "device is insufficiently specified: give --parent and --type (or --jsonfile), or --uuid of a running device",
            ));
        }
    };
    Ok(made)
}

/// `start` of a new device. A parent vgpud does not list is refused with mdevctl's words (mdevctl
/// src/mdev.rs, the parent lookup of `start`: "Unable to find parent device '…'", with "Did you mean '…'?"
/// when only the letter case differs, as for an upper-case PCI address).
pub(super) fn start(
    daemon: &mut dyn ManagerCalls,
    spec: &DeviceSpec,
    co: &mut Callouts,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let uuid = spec.uuid.as_deref().map(check_uuid).transpose()?;
    let wanted = wanted(spec)?;
    // A new device named by parent and type, with no call-out script to run around it: one Create.
    // Whatever it refuses (the UUID is running or defined, the parent is unknown) takes the full
    // path below, which finds out why and says it in mdevctl's words.
    if let (Some(w), Some(p)) = (&wanted, &spec.parent)
        && co.is_empty()
        && is_canonical_parent(p)
    {
        let req = new_instance(&w.type_id, p, Some(&uuid_or_new(uuid.as_ref())), &w.attrs);
        match daemon.create_uuid(&req) {
            Ok(made) => {
                if uuid.is_none() {
                    writeln!(out, "{made}")?;
                }
                return Ok(());
            }
            Err(e) => tracing::debug!(error = %e, "one-call start refused; taking the full path"),
        }
    }
    // A definition named by its UUID (and parent), with no call-out script to run around it: one
    // StartDefinition, which takes a foreign definition over and refuses none or several as mdevctl
    // does. A refusal takes the full path below, which finds out why and says it in mdevctl's words.
    let mut one_call_tried = false;
    if let Some(u) = &uuid
        && spec.jsonfile.is_none()
        && spec.mdev_type.is_none()
        && co.is_empty()
    {
        match daemon.start_definition(u, spec.parent.as_deref()) {
            Ok(()) => return Ok(()),
            Err(e) => tracing::debug!(error = %e, "one-call start refused; taking the full path"),
        }
        one_call_tried = true;
    }
    if let Some(u) = &uuid
        && spec.jsonfile.is_none()
    {
        let (parent, ty) = (spec.parent.as_deref(), spec.mdev_type.as_deref());
        let defined = super::defined::before_start(daemon, u, parent, ty)?;
        // The one definition of `u` (checked above, and now vgpud's), with no call-out script to run
        // around it: one Start. A refusal (it is running, its parent is gone) takes the full path
        // below, which finds out why and says it in mdevctl's words.
        if defined && co.is_empty() && !one_call_tried {
            match daemon.start(u) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::debug!(error = %e, "one-call start refused; taking the full path")
                }
            }
        }
    }
    if let Some(u) = &uuid
        && let Some(i) = find(daemon, u, spec.parent.as_deref())?
    {
        if let Some(w) = &wanted
            && w.type_id != i.type_id
        {
            return Err(bad(format!(
                "device {u} already exists on parent {} with type {}",
                i.parent, i.type_id
            )));
        }
        if i.state == "running" {
            return Err(bad(format!("mdev {u} is already running on {}", i.parent)));
        }
        if !i.defined {
            return Err(bad(format!("mdev {u} is neither running nor defined")));
        }
        let dev = Device::of_instance(&i, daemon.instance_attrs(u)?);
        return co.invoke(Action::Start, &dev, spec.force, |_| {
            daemon.start(u).map_err(CliError::from)
        });
    }
    let (Some(w), Some(p)) = (wanted, &spec.parent) else {
        return Err(bad(
            "device is insufficiently specified: give --parent and --type (or --jsonfile), or the --uuid of a definition",
        ));
    };
    let parents: Vec<String> = daemon.list_gpus()?.into_iter().map(|g| g.id).collect();
    let known = parents.iter().any(|k| k == p);
    if !known && let Some(k) = parents.iter().find(|k| k.eq_ignore_ascii_case(p)) {
        return Err(bad(format!(
            "Unable to find parent device '{p}'. Did you mean '{k}'?"
        )));
    }
    let req = new_instance(&w.type_id, p, Some(&uuid_or_new(uuid.as_ref())), &w.attrs);
    let dev = Device::of_request(&req, p, w.start.is_auto());
    let made = co.invoke(Action::Start, &dev, spec.force, |_| {
        daemon.create(&req).map_err(|e| match known {
            true => CliError::from(e),
            false => bad(format!("Unable to find parent device '{p}' ({e})")),
        })
    })?;
    if uuid.is_none() {
        writeln!(out, "{}", made.uuid)?;
    }
    Ok(())
}

/// Whether `parent` is spelled as the kernel names it: mdevctl looks the name up as it is given
/// (a PCI address in upper case is not found), where vgpud also accepts other spellings of an
/// address.
fn is_canonical_parent(parent: &str) -> bool {
    parent
        .parse::<mdev_types::ids::PciAddress>()
        .map_or(true, |a| a.to_string() == parent)
}

pub(super) fn stop(
    daemon: &mut dyn ManagerCalls,
    spec: &UuidSpec,
    co: &mut Callouts,
) -> Result<(), CliError> {
    let u = check_uuid(&spec.uuid)?;
    // Without --parent and call-out scripts, `stop` is one Stop; a refusal takes the full path for
    // mdevctl's message.
    if spec.parent.is_none() && co.is_empty() && daemon.stop(&u).is_ok() {
        return Ok(());
    }
    match find(daemon, &u, spec.parent.as_deref())? {
        Some(i) if i.state == "running" => {
            // mdevctl describes the device to stop from sysfs alone: manual, no attributes.
            let dev = Device {
                start: StartMode::Manual,
                ..Device::of_instance(&i, Vec::new())
            };
            co.invoke(Action::Stop, &dev, spec.force, |_| {
                daemon.stop(&u).map_err(CliError::from)
            })
        }
        _ => Err(bad(format!("mdev {u} is not running"))),
    }
}

pub(super) fn undefine(
    daemon: &mut dyn ManagerCalls,
    spec: &UuidSpec,
    co: &mut Callouts,
) -> Result<(), CliError> {
    let u = check_uuid(&spec.uuid)?;
    super::defined::undefine(daemon, &u, spec.parent.as_deref(), |daemon, u| {
        let i = find(daemon, u, None)?
            .filter(|i| i.defined)
            .ok_or_else(|| bad(format!("no definition of mdev {u}")))?;
        let dev = Device::of_instance(&i, daemon.instance_attrs(u)?);
        co.invoke(Action::Undefine, &dev, spec.force, |_| {
            daemon.undefine(u).map_err(CliError::from)
        })
    })
}

pub(super) fn modify(
    daemon: &mut dyn ManagerCalls,
    m: &ModifyArgs,
    co: &mut Callouts,
) -> Result<(), CliError> {
    let u = check_uuid(&m.uuid)?;
    if m.jsonfile.is_some() && m.parent.is_none() {
        return Err(bad("Parent device required to modify device via json file"));
    }
    super::defined::the_definition(daemon, &u, m.parent.as_deref())?;
    let i = find(daemon, &u, m.parent.as_deref())?
        .filter(|i| i.defined)
        .ok_or_else(|| bad(format!("no definition of mdev {u}")))?;
    let old_attrs = daemon.instance_attrs(&u)?;
    let (new_type, start, attrs) = if let Some(f) = &m.jsonfile {
        let c = read_config(f)?;
        (Some(c.mdev_type.to_string()), Some(c.start), c.attrs)
    } else {
        let start = (m.auto || m.manual).then(|| StartMode::from_autostart(m.auto));
        let attrs = changed_attrs(m, &u, &old_attrs)?;
        (m.mdev_type.clone(), start, attrs)
    };
    let autostart = start.map_or(i.autostart, StartMode::is_auto);
    let new_type = new_type.filter(|t| *t != i.type_id);
    // The call-outs see the definition as it will be (mdevctl src/main.rs modify_command).
    let dev = Device {
        mdev_type: new_type.clone().unwrap_or_else(|| i.type_id.clone()),
        start: StartMode::from_autostart(autostart),
        ..Device::of_instance(&i, attrs.clone())
    };
    co.invoke(Action::Modify, &dev, m.force, |_| {
        if new_type.is_some() || attrs != old_attrs {
            let t = new_type.unwrap_or_else(|| i.type_id.clone());
            return redefine(daemon, &i, &old_attrs, &t, autostart, &attrs);
        }
        if autostart != i.autostart {
            daemon.set_autostart(&u, autostart)?;
        }
        Ok(())
    })
}

/// The attributes after `--addattr NAME --value V [--index N]` (inserted at N, else appended) or
/// `--delattr [--index N]` (the one at N removed, else the last; none is no change), as mdevctl's
/// modify does, counting from 0 (mdevctl src/main.rs modify_command, src/mdev.rs `add_attribute`,
/// `delete_attribute`; its tests' expected files modify/addattr*.expected, delattr*.expected).
fn changed_attrs(m: &ModifyArgs, u: &str, old: &[(String, String)]) -> Result<Attrs, CliError> {
    let mut attrs = old.to_vec();
    let index = m.index.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    if let (Some(name), Some(value)) = (&m.addattr, &m.value) {
        let at = index.unwrap_or(attrs.len());
        if at > attrs.len() {
            return Err(bad(format!(
                "mdev {u}: attribute index {at} is past the end (the definition has {} attributes)",
                attrs.len()
            )));
        }
        attrs.insert(at, (name.clone(), value.clone()));
    } else if m.delattr {
        match index {
            // The last one; none left is no change (mdevctl src/mdev.rs `delete_attribute` pops).
            None => {
                attrs.pop();
            }
            Some(at) if at < attrs.len() => {
                attrs.remove(at);
            }
            // mdevctl 1.2.0 refuses an index past the end, and panics at the end itself.
            Some(at) => {
                return Err(bad(format!(
                    "mdev {u}: no attribute at index {at} (the definition has {} attributes)",
                    attrs.len()
                )));
            }
        }
    }
    Ok(attrs)
}

/// `start-parent-mdevs PARENT`: starts every stopped definition of `parent` marked auto (foreign ones
/// taken over by vgpud first), as mdevctl's udev rule asks when the parent appears (mdevctl src/main.rs start_parent_mdevs_command). A device that
/// fails to start is reported and the others still start; the command itself succeeds, as mdevctl's.
pub(super) fn start_parent_mdevs(
    daemon: &mut dyn ManagerCalls,
    parent: &str,
    co: &mut Callouts,
) -> Result<(), CliError> {
    for (d, several) in super::defined::due_on(daemon, parent)? {
        // A foreign definition is taken over first; each start runs its call-outs, without --force
        // (mdevctl src/main.rs start_parent_mdevs_command).
        let started = super::defined::own(daemon, &d, several)
            .and_then(|()| {
                find(daemon, &d.uuid, None)?.ok_or_else(|| bad(format!("mdev {} vanished", d.uuid)))
            })
            .and_then(|i| {
                let attrs = daemon.instance_attrs(&i.uuid)?;
                let dev = Device::of_instance(&i, attrs);
                co.invoke(Action::Start, &dev, false, |_| {
                    daemon.start(&i.uuid).map_err(CliError::from)
                })
            });
        if let Err(e) = started {
            tracing::warn!(uuid = %d.uuid, %parent, error = %e, "autostart of a definition failed");
        }
    }
    Ok(())
}

/// Gives instance `i`'s definition type `t`, start mode `autostart` and `attrs`: in place
/// (`Redefine`, running or not), or, with a daemon without it, by [`replace_definition`] of a
/// stopped instance.
pub(super) fn redefine(
    daemon: &mut dyn ManagerCalls,
    i: &InstanceInfo,
    old_attrs: &[(String, String)],
    t: &str,
    autostart: bool,
    attrs: &[(String, String)],
) -> Result<(), CliError> {
    // In place where vgpud can (one atomic replace of the definition and its /etc/mdevctl.d file; a
    // running device stays as it is until its next start, as with mdevctl's modify).
    match daemon.redefine(&i.uuid, t, autostart, attrs) {
        Err(vgpu_client::ClientError::Daemon { kind, .. }) if kind == "NotSupported" => {}
        done => return Ok(done?),
    }
    if i.state == "running" {
        return Err(bad(format!(
            "mdev {} is running: stop it before changing its type or attributes (vgpud changes the definition of a stopped device only)",
            i.uuid
        )));
    }
    replace_definition(daemon, i, old_attrs, t, autostart, attrs)
}

/// Replaces the definition of instance `i` (with attributes `old_attrs`) by one of type `t` with
/// `attrs`, the same UUID and parent, restoring the old one if the new one is refused.
pub(super) fn replace_definition(
    daemon: &mut dyn ManagerCalls,
    i: &InstanceInfo,
    old_attrs: &[(String, String)],
    t: &str,
    autostart: bool,
    attrs: &[(String, String)],
) -> Result<(), CliError> {
    daemon.undefine(&i.uuid)?;
    if let Err(e) = daemon.define(&new_instance(t, &i.parent, Some(&i.uuid), attrs), autostart) {
        let restored = daemon.define(
            &new_instance(&i.type_id, &i.parent, Some(&i.uuid), old_attrs),
            i.autostart,
        );
        let note = match restored {
            Ok(_) => "the old definition is back".to_string(),
            Err(r) => format!("restoring the old definition also failed: {r}"),
        };
        return Err(bad(format!(
            "mdev {}: the new definition (type {t}) was refused ({e}); {note}",
            i.uuid
        )));
    }
    Ok(())
}

pub(super) fn export(
    daemon: &mut dyn ManagerCalls,
    dir: &Path,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    for i in daemon.list_instances()?.iter().filter(|i| i.defined) {
        let attrs = daemon.instance_attrs(&i.uuid)?;
        let Some(d) = as_device(i, attrs) else {
            continue;
        };
        let path = write_config(dir, &d).map_err(|e| bad(e.to_string()))?;
        writeln!(out, "{}", path.display())?;
    }
    Ok(())
}

pub(super) fn import(
    daemon: &mut dyn ManagerCalls,
    dir: &Path,
    dry_run: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let files = read_config_dir(dir).map_err(|e| bad(e.to_string()))?;
    let known = daemon.list_instances()?;
    let mut failed = Vec::new();
    for MdevctlDevice {
        parent,
        uuid,
        config,
    } in &files
    {
        let u = uuid.to_string();
        let origin = dir.join(parent).join(&u);
        let existing = known.iter().find(|i| same_uuid(&i.uuid, &u));
        let line = match existing {
            Some(i)
                if i.defined && i.type_id == config.mdev_type.as_str() && i.parent == *parent =>
            {
                Ok(format!("{u}: already defined"))
            }
            Some(i) if i.defined => Err(format!(
                "{u}: vgpud already defines it as {} on {}; {} says {} on {parent}",
                i.type_id,
                i.parent,
                origin.display(),
                config.mdev_type
            )),
            _ if dry_run => Ok(format!(
                "{u}: would define {} on {parent}, start {}",
                config.mdev_type,
                config.start.as_str()
            )),
            _ => daemon
                .define(
                    &new_instance(config.mdev_type.as_str(), parent, Some(&u), &config.attrs),
                    config.start.is_auto(),
                )
                .map(|_| format!("{u}: defined {} on {parent}", config.mdev_type))
                .map_err(|e| format!("{u}: {e}")),
        };
        match line {
            Ok(l) => writeln!(out, "{l}")?,
            Err(e) => failed.push(e),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(bad(format!(
            "{} of {} definitions not imported: {}",
            failed.len(),
            files.len(),
            failed.join("; ")
        )))
    }
}
