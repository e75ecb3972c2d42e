//! Daemon tests about kernel events (see [`super::daemon`] for how the daemon is run and checked):
//! devices made behind the daemon's back are foreign and never touched, and a parent whose driver
//! loads after the daemon started gets its autostart instances from the module's uevent.

use std::path::Path;
use std::process::Command;

use mdev_types::ids::MdevUuid;
use vgpu_host::{Host, HostExt, paths};

use super::daemon::{
    EVENT_WITHIN, availability, daemon, device_exists, device_type, ensure_entry, ensure_refused,
    ensure_restored, listed, not_listed,
};
use super::guest::{Guest, wait_for};
use super::runner::{Outcome, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, available, test_uuid};
use super::vgpud::{TargetKind, Vgpud, Workdir, find};

/// Devices made through sysfs (before and after the daemon started) are listed as foreign; a start
/// or a create with their UUID is refused; the daemon notices their removal; an explicit Stop naming
/// one adopts it, then removes it from the kernel.
pub(super) fn foreign_untouched(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let early = test_uuid("daemon_foreign_devices_untouched", 0);
    let late = test_uuid("daemon_foreign_devices_untouched", 1);
    mdevs.create("mtty", "mtty-1", early)?;
    let (_work, d) = daemon("foreign")?;
    mdevs.create("mdpy", "mdpy-vga", late)?;
    let mid = availability(g)?;
    // `early` is seen at start-up; `late` through its uevent.
    d.wait_until("both foreign devices listed", EVENT_WITHIN, |d| {
        let list = d.list_instances()?;
        Ok(find(&list, &early).is_some() && find(&list, &late).is_some())
    })?;
    for (uuid, parent, ty) in [(early, "mtty", "mtty-1"), (late, "mdpy", "mdpy-vga")] {
        let i = listed(&d, &uuid)?;
        ensure_entry(&i, "running", "foreign", false)?;
        ensure_eq(
            format_args!("{uuid} (parent, type)"),
            (i.parent.as_str(), i.type_id.as_str()),
            (parent, ty),
        )?;
        let u = uuid.to_string();
        ensure_refused(
            "Start of a foreign device",
            d.start(&uuid),
            &["Foreign"],
            &[&u],
        )?;
        ensure_refused(
            "Create with a foreign device's UUID",
            d.create(TargetKind::Type, ty, parent, Some(&uuid)),
            &["Exists"],
            &[&u],
        )?;
        ensure(device_exists(g, &uuid), || {
            format!("foreign {uuid} vanished after refused calls")
        })?;
    }
    ensure_eq("availability after refused calls", availability(g)?, mid)?;
    // The GPU object follows devices made and removed behind the daemon's back (re-reading that one
    // parent, without a discovery of the whole host).
    gpu_object_follows(g, &d, "mdpy", "mdpy-vga")?;
    mdevs.remove(&late)?;
    d.wait_until("a removed foreign device is unlisted", EVENT_WITHIN, |d| {
        not_listed(d, &late)
    })?;
    gpu_object_follows(g, &d, "mdpy", "mdpy-vga")?;
    // An explicit, authorized request naming a foreign device may act on it: adopted, then removed.
    d.stop_instance(&early)
        .map_err(|e| TestError::Check(format!("explicit Stop of foreign {early} failed: {e}")))?;
    mdevs.forget(&early);
    ensure(!device_exists(g, &early), || {
        format!("foreign {early} still in sysfs after an explicit Stop")
    })?;
    d.wait_until("a stopped foreign device is unlisted", EVENT_WITHIN, |d| {
        not_listed(d, &early)
    })?;
    d.stop()?;
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Waits until the `Gpu1` object of `parent` shows the `available_instances` sysfs has for `ty`.
fn gpu_object_follows(g: &Guest, d: &Vgpud, parent: &str, ty: &str) -> Result<(), TestError> {
    let want = available(&g.host, parent, ty)?;
    let mut seen = None;
    d.wait_until(
        &format!("Gpu1 {parent} Types shows {ty} with {want} available (as sysfs)"),
        EVENT_WITHIN,
        |d| {
            let types = d.gpu_object_types(parent)?;
            seen = types.iter().find(|t| t.type_id == ty).map(|t| t.available);
            Ok(seen == Some(want))
        },
    )
    .map_err(|e| TestError::Check(format!("{e}\n  last seen: {seen:?}")))?;
    Ok(())
}

/// Runs a busybox module tool (`modprobe`, as the guest's /init loads modules, or `rmmod`).
pub(super) fn module_tool(tool: &str, args: &[&str]) -> Result<(), TestError> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| TestError::Check(format!("cannot run {tool} {args:?}: {e}")))?;
    ensure(out.status.success(), || {
        format!(
            "{tool} {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// Loads mbochs again when dropped, if its parent is missing, so a failing test leaves the guest whole.
struct MbochsBack<'h>(&'h dyn Host);

impl Drop for MbochsBack<'_> {
    fn drop(&mut self) {
        if !self.0.exists(&paths::mdev_parent("mbochs")) {
            let _ = module_tool("modprobe", &["mbochs"]);
        }
    }
}

/// A definition for a parent whose driver is not loaded waits for it; when the driver loads (after the
/// daemon started), the daemon creates the autostart instance, driven by the module's uevent. A
/// daemon restart keeps both definitions.
pub(super) fn late_parent_autostart(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let parent_dir = paths::mdev_parent("mbochs");
    let mut mdevs = Mdevs::new(&g.host);
    let _back = MbochsBack(&g.host);
    let busy = g
        .host
        .list_optional(Path::new(paths::MDEV_DEVICES))?
        .into_iter()
        .filter(|u| {
            u.parse()
                .ok()
                .and_then(|u: MdevUuid| device_type(g, &u).ok())
                .is_some_and(|(p, _)| p == "mbochs")
        })
        .collect::<Vec<_>>();
    ensure(busy.is_empty(), || {
        format!("mbochs has devices before the test: {busy:?}")
    })?;
    // rmmod, not `modprobe -r`: busybox's `modprobe -r` removes the module's stack (modutils/modprobe.c,
    // "-r Remove MODULE (stacks)") and exits 1 when vfio and mdev are still used by mtty and mdpy.
    module_tool("rmmod", &["mbochs"])?;
    wait_for(&g.host, &parent_dir, false)?;

    let work = Workdir::new("late-parent")?;
    let state = work.path().join("state");
    let mut d = Vgpud::spawn(work.path(), &state)?;
    let auto = test_uuid("daemon_late_parent_autostart", 0);
    let manual = test_uuid("daemon_late_parent_autostart", 1);
    d.define(TargetKind::Type, "mbochs-medium", "mbochs", &auto, true)?;
    d.define(TargetKind::Type, "mbochs-small", "mbochs", &manual, false)?;
    ensure_entry(&listed(&d, &auto)?, "waiting-for-parent", "daemon", true)?;
    ensure_entry(&listed(&d, &manual)?, "stopped", "daemon", true)?;

    module_tool("modprobe", &["mbochs"])?;
    mdevs.adopt(auto);
    let took = d.wait_until(
        "the autostart instance runs after modprobe mbochs",
        EVENT_WITHIN,
        |d| Ok(d.get_instance(&auto)?.state == "running" && device_exists(g, &auto)),
    )?;
    ensure_eq(
        format_args!("{auto}'s parent and type"),
        device_type(g, &auto)?,
        ("mbochs".to_string(), "mbochs-medium".to_string()),
    )?;
    ensure_entry(&listed(&d, &auto)?, "running", "daemon", true)?;
    ensure_entry(&listed(&d, &manual)?, "stopped", "daemon", true)?;
    ensure(!device_exists(g, &manual), || {
        format!("{manual} (no autostart) was started when mbochs loaded")
    })?;
    println!("  (the autostart instance ran {took:?} after modprobe returned)");

    d.stop()?;
    d = Vgpud::spawn(work.path(), &state)?;
    let a = listed(&d, &auto)?;
    ensure_entry(&a, "running", "daemon", true)?;
    ensure(a.autostart, || {
        format!("{auto} lost autostart across a restart")
    })?;
    ensure_entry(&listed(&d, &manual)?, "stopped", "daemon", true)?;
    ensure(device_exists(g, &auto), || {
        format!("{auto} vanished across a daemon restart")
    })?;

    d.destroy(&auto)?;
    mdevs.forget(&auto);
    d.destroy(&manual)?;
    ensure(!device_exists(g, &auto), || {
        format!("{auto} still in sysfs after Destroy")
    })?;
    ensure(d.list_instances()?.is_empty(), || {
        "the daemon still lists instances after destroying both".to_string()
    })?;
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}
