//! The real `vgpud` on the real kernel: each test starts the
//! daemon on the guest's sysfs with an embedded bus and a fresh state directory, drives it over D-Bus,
//! and checks every step against sysfs through our host layer — the device appears or disappears,
//! `available_instances` moves — never against the daemon's own word alone.
//!
//! Every test leaves the sample parents as it found them (checked at its end), kills its daemon even
//! when it fails, and removes leftover devices through sysfs ([`Mdevs`]).

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use mdev_types::ids::MdevUuid;
use vgpu_client::{InstanceInfo, instance_path};
use vgpu_host::{Host, paths};

use super::daemon_events;
use super::guest::{Guest, iommu_group_of};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, SAMPLE_TYPES, available, test_uuid};
use super::vgpud::{CallError, TargetKind, Vgpud, Workdir, find};

/// The daemon tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("daemon_create_destroy_by_type", create_destroy_by_type),
        Test::new("daemon_create_by_profile", create_by_profile),
        Test::new(
            "daemon_define_start_stop_restart",
            define_start_stop_restart,
        ),
        Test::new("daemon_full_type_refused", full_type_refused),
        Test::new("daemon_list_follows_each_call", list_follows_each_call),
        Test::new(
            "daemon_foreign_devices_untouched",
            daemon_events::foreign_untouched,
        ),
        Test::new(
            "daemon_late_parent_autostart",
            daemon_events::late_parent_autostart,
        ),
        Test::new("daemon_vgpuctl_on_real_kernel", vgpuctl_on_real_kernel),
    ]
}

/// How long the daemon may take to notice a kernel event (a uevent, handled with no sleeps; this only
/// bounds a failure).
pub(super) const EVENT_WITHIN: Duration = Duration::from_secs(10);

/// `available_instances` of every sample type, to check that a test left the parents as it found them.
pub(super) fn availability(g: &Guest) -> Result<Vec<(&'static str, u32)>, TestError> {
    SAMPLE_TYPES
        .iter()
        .map(|t| Ok((t.id, available(&g.host, t.parent, t.id)?)))
        .collect()
}

pub(super) fn ensure_restored(g: &Guest, before: &[(&'static str, u32)]) -> Result<(), TestError> {
    ensure_eq(
        "available_instances of the sample types after the test",
        availability(g)?,
        before.to_vec(),
    )
}

/// Parent and type of an existing mdev, from its `mdev_type` link
/// (Documentation/driver-api/vfio-mediated-device.rst: `mdev_type` links to the type directory).
pub(super) fn device_type(g: &Guest, uuid: &MdevUuid) -> Result<(String, String), TestError> {
    let link = paths::mdev_device(uuid).join("mdev_type");
    let dir = g.host.canonicalize(&link)?;
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let ty = name(Some(&dir));
    let parent = name(dir.parent().and_then(Path::parent));
    Ok((parent, ty))
}

pub(super) fn device_exists(g: &Guest, uuid: &MdevUuid) -> bool {
    g.host.exists(&paths::mdev_device(uuid))
}

/// The daemon's entry for `uuid`, or a failure naming it.
pub(super) fn listed(d: &Vgpud, uuid: &MdevUuid) -> Result<InstanceInfo, TestError> {
    let list = d.list_instances()?;
    find(&list, uuid).cloned().ok_or_else(|| {
        d.failure(&format!(
            "ListInstances does not list {uuid}; it lists {:?}",
            list.iter().map(|i| &i.uuid).collect::<Vec<_>>()
        ))
    })
}

pub(super) fn not_listed(d: &Vgpud, uuid: &MdevUuid) -> Result<bool, TestError> {
    Ok(find(&d.list_instances()?, uuid).is_none())
}

/// Checks state, owner and whether it is defined.
pub(super) fn ensure_entry(
    i: &InstanceInfo,
    state: &str,
    owner: &str,
    defined: bool,
) -> Result<(), TestError> {
    ensure_eq(
        format_args!("{} (state, owner, defined)", i.uuid),
        (i.state.as_str(), i.owner.as_str(), i.defined),
        (state, owner, defined),
    )
}

/// A refusal by the daemon with one of `kinds`, whose message contains every needle.
pub(super) fn ensure_refused<T: std::fmt::Debug>(
    what: &str,
    result: Result<T, CallError>,
    kinds: &[&str],
    needles: &[&str],
) -> Result<CallError, TestError> {
    let e = match result {
        Ok(v) => {
            return Err(TestError::Check(format!(
                "{what}: expected a refusal, but it succeeded ({v:?})"
            )));
        }
        Err(e) => e,
    };
    ensure(
        e.kind.as_deref().is_some_and(|k| kinds.contains(&k)),
        || {
            format!(
                "{what}: expected error kind {kinds:?}, got {:?}: {e}",
                e.kind
            )
        },
    )?;
    for n in needles {
        ensure(e.message.contains(n), || {
            format!("{what}: the message does not name {n:?}: {}", e.message)
        })?;
    }
    Ok(e)
}

/// A scratch dir, a daemon on a fresh state dir below it.
pub(super) fn daemon(tag: &str) -> Result<(Workdir, Vgpud), TestError> {
    let work = Workdir::new(tag)?;
    let d = Vgpud::spawn(work.path(), &work.path().join("state"))?;
    Ok((work, d))
}

/// Create by type on each sample parent, list, destroy; each step against sysfs.
fn create_destroy_by_type(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (_work, d) = daemon("by-type")?;
    // (parent, type, listed by ListGpus): mtty is a serial-port sample, not a display, and discovery
    // counts only display parents as GPUs (vgpu_host::discover, `is_display_parent`); the daemon still
    // manages its instances.
    let cases = [
        ("mbochs", "mbochs-small", true),
        ("mdpy", "mdpy-vga", true),
        ("mtty", "mtty-1", false),
    ];
    for (n, (parent, ty, is_gpu)) in (0u32..).zip(cases) {
        let uuid = test_uuid("daemon_create_destroy_by_type", n);
        let avail = available(&g.host, parent, ty)?;
        ensure(avail > 0, || format!("{ty} has no room before the test"))?;
        let path = d.create(TargetKind::Type, ty, parent, Some(&uuid))?;
        mdevs.adopt(uuid);
        ensure_eq(
            "Create's object path",
            path,
            instance_path(&uuid.to_string()).to_string(),
        )?;
        // The reply comes after the device exists: no waiting here.
        let i = ensure_created(g, &d, &uuid, (parent, ty), avail)?;
        ensure_eq(
            format_args!("{uuid} (gpu, parent, type, profile)"),
            (
                i.gpu.as_str(),
                i.parent.as_str(),
                i.type_id.as_str(),
                i.profile(),
            ),
            (parent, parent, ty, None),
        )?;
        let group = iommu_group_of(&g.host, &paths::mdev_device(&uuid))?;
        ensure_eq(
            format_args!("{uuid} IommuGroup"),
            i.iommu_group(),
            Some(group),
        )?;
        ensure_eq(
            format_args!("GetInstance {uuid}"),
            d.get_instance(&uuid)?,
            i,
        )?;
        let gpus = d.list_gpus()?;
        let gpu = gpus.iter().find(|x| x.id == parent);
        ensure_eq(
            format_args!("ListGpus lists {parent}"),
            gpu.is_some(),
            is_gpu,
        )?;
        if let Some(gpu) = gpu {
            ensure(gpu.instances.contains(&uuid.to_string()), || {
                format!("ListGpus: {parent} does not list {uuid}: {gpu:?}")
            })?;
            let slot = gpu.types.iter().find(|t| t.type_id == ty);
            ensure_eq(
                format_args!("ListGpus: {parent} {ty} available"),
                slot.map(|t| t.available),
                Some(avail - 1),
            )?;
        }

        d.destroy(&uuid)?;
        mdevs.forget(&uuid);
        ensure(!device_exists(g, &uuid), || {
            format!("{uuid} still in sysfs after Destroy returned")
        })?;
        ensure_eq(
            format_args!("{ty} available_instances after Destroy"),
            available(&g.host, parent, ty)?,
            avail,
        )?;
        ensure(not_listed(&d, &uuid)?, || {
            format!("{uuid} still listed after Destroy")
        })?;
        ensure_refused(
            "Destroy of a destroyed instance",
            d.destroy(&uuid),
            &["NotFound"],
            &[&uuid.to_string()],
        )?;
    }
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// After a Create returned: the device is in sysfs on `parent` with type `ty`, the type has one
/// instance fewer available than `avail`, and the daemon lists it as running and its own.
fn ensure_created(
    g: &Guest,
    d: &Vgpud,
    uuid: &MdevUuid,
    (parent, ty): (&str, &str),
    avail: u32,
) -> Result<InstanceInfo, TestError> {
    ensure_eq(
        format_args!("{uuid}'s parent and type in sysfs"),
        device_type(g, uuid)?,
        (parent.to_string(), ty.to_string()),
    )?;
    ensure_eq(
        format_args!("{ty} available_instances after Create"),
        available(&g.host, parent, ty)?,
        avail - 1,
    )?;
    let i = listed(d, uuid)?;
    ensure_entry(&i, "running", "daemon", false)?;
    Ok(i)
}

/// Create by profile with the daemon choosing the GPU: the shipped sample profiles land on the types
/// their files name (profiles/sample-display-*.toml).
fn create_by_profile(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (_work, d) = daemon("by-profile")?;
    let cases = [
        ("sample-display-16m", "mbochs", "mbochs-medium"),
        ("sample-display-1080p", "mdpy", "mdpy-hd"),
    ];
    for (n, (profile, parent, ty)) in (0u32..).zip(cases) {
        let uuid = test_uuid("daemon_create_by_profile", n);
        let avail = available(&g.host, parent, ty)?;
        d.create(TargetKind::Profile, profile, "", Some(&uuid))?;
        mdevs.adopt(uuid);
        let i = ensure_created(g, &d, &uuid, (parent, ty), avail)?;
        ensure_eq(
            format_args!("{uuid} (gpu, type, profile)"),
            (i.gpu.as_str(), i.type_id.as_str(), i.profile()),
            (parent, ty, Some(profile)),
        )?;
        d.destroy(&uuid)?;
        mdevs.forget(&uuid);
        ensure(!device_exists(g, &uuid), || {
            format!("{uuid} still in sysfs after Destroy returned")
        })?;
    }
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Define → Start → (daemon restart) → Stop → Destroy of a defined instance, and Stop of a transient
/// one; each step against sysfs.
fn define_start_stop_restart(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let work = Workdir::new("define")?;
    let state = work.path().join("state");
    let mut d = Vgpud::spawn(work.path(), &state)?;
    let (parent, ty) = ("mtty", "mtty-2");
    let uuid = test_uuid("daemon_define_start_stop_restart", 0);
    let avail = available(&g.host, parent, ty)?;

    d.define(TargetKind::Type, ty, parent, &uuid, false)?;
    let i = listed(&d, &uuid)?;
    ensure_entry(&i, "stopped", "daemon", true)?;
    ensure(!i.autostart && !device_exists(g, &uuid), || {
        format!("Define made a device or set autostart: {i:?}")
    })?;
    ensure_eq(
        "available after Define",
        available(&g.host, parent, ty)?,
        avail,
    )?;

    d.start(&uuid)?;
    mdevs.adopt(uuid);
    ensure_eq(
        format_args!("{uuid}'s parent and type after Start"),
        device_type(g, &uuid)?,
        (parent.to_string(), ty.to_string()),
    )?;
    ensure_eq(
        "available after Start",
        available(&g.host, parent, ty)?,
        avail - 1,
    )?;
    ensure_entry(&listed(&d, &uuid)?, "running", "daemon", true)?;
    ensure_refused(
        "Start of a running instance",
        d.start(&uuid),
        &["State"],
        &[&uuid.to_string(), "already running"],
    )?;

    // A restart keeps the definition and the device, and still knows the device is its own.
    d.stop()?;
    d = Vgpud::spawn(work.path(), &state)?;
    ensure_entry(&listed(&d, &uuid)?, "running", "daemon", true)?;
    ensure(device_exists(g, &uuid), || {
        format!("{uuid} vanished across a daemon restart")
    })?;

    d.stop_instance(&uuid)?;
    ensure(!device_exists(g, &uuid), || {
        format!("{uuid} still in sysfs after Stop returned")
    })?;
    mdevs.forget(&uuid);
    ensure_eq(
        "available after Stop",
        available(&g.host, parent, ty)?,
        avail,
    )?;
    ensure_entry(&listed(&d, &uuid)?, "stopped", "daemon", true)?;
    ensure_refused(
        "Stop of a stopped instance",
        d.stop_instance(&uuid),
        &["State"],
        &[&uuid.to_string(), "not running"],
    )?;

    d.destroy(&uuid)?;
    ensure(not_listed(&d, &uuid)?, || {
        format!("{uuid} still listed after Destroy")
    })?;
    ensure_refused(
        "GetInstance after Destroy",
        d.get_instance(&uuid),
        &["NotFound"],
        &[&uuid.to_string()],
    )?;

    // Stop of a transient instance removes its device, and with it the instance.
    let t = test_uuid("daemon_define_start_stop_restart", 1);
    d.create(TargetKind::Type, "mtty-1", parent, Some(&t))?;
    mdevs.adopt(t);
    ensure(device_exists(g, &t), || format!("{t} missing after Create"))?;
    d.stop_instance(&t)?;
    mdevs.forget(&t);
    ensure(!device_exists(g, &t), || {
        format!("transient {t} still in sysfs after Stop returned")
    })?;
    ensure(not_listed(&d, &t)?, || {
        format!("transient {t} still listed after Stop")
    })?;
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Fill a type through the daemon; the next Create is refused naming type and GPU, and makes nothing.
/// mdpy's parent count is kept by the mdev core, mbochs counts its memory itself (samples.rs).
fn full_type_refused(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (_work, d) = daemon("full")?;
    let mut n = 0u32;
    for (parent, ty, profile) in [
        ("mdpy", "mdpy-hd", "sample-display-1080p"),
        ("mbochs", "mbochs-large", "sample-display-16m"),
    ] {
        let cap = available(&g.host, parent, ty)?;
        ensure(cap > 0, || format!("{ty} has no room before the test"))?;
        let mut made = Vec::new();
        for k in 0..cap {
            let u = test_uuid("daemon_full_type_refused", n);
            n += 1;
            d.create(TargetKind::Type, ty, parent, Some(&u))?;
            mdevs.adopt(u);
            made.push(u);
            ensure_eq(
                format_args!("{ty} available after {} creates", k + 1),
                available(&g.host, parent, ty)?,
                cap - k - 1,
            )?;
        }
        let extra = test_uuid("daemon_full_type_refused", n);
        n += 1;
        // The daemon refuses up front when available_instances reads 0 ("Invalid"); a kernel refusal
        // in a race would be "TypeFull". Both name the type and the GPU.
        ensure_refused(
            &format!("Create of {ty} on full {parent}"),
            d.create(TargetKind::Type, ty, parent, Some(&extra)),
            &["Invalid", "TypeFull"],
            &[ty, parent, "full"],
        )?;
        ensure_refused(
            &format!("Create of profile {profile} on full {parent}"),
            d.create(TargetKind::Profile, profile, parent, Some(&extra)),
            &["Invalid", "TypeFull"],
            &[profile, parent],
        )?;
        ensure(!device_exists(g, &extra), || {
            format!("a refused Create left {extra} in sysfs")
        })?;
        ensure(not_listed(&d, &extra)?, || {
            format!("a refused Create left {extra} listed")
        })?;
        let ours = d
            .list_instances()?
            .iter()
            .filter(|i| i.type_id == ty)
            .count();
        ensure_eq(format_args!("instances of {ty} listed"), ours, made.len())?;
        for u in &made {
            d.destroy(u)?;
            mdevs.forget(u);
        }
        ensure_eq(
            format_args!("{ty} available after destroying all"),
            available(&g.host, parent, ty)?,
            cap,
        )?;
    }
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Rounds of [`list_follows_each_call`].
const ROUNDS: u32 = 40;

/// Read-your-writes while kernel events arrive: right after each Create/Stop/Destroy returns,
/// ListInstances shows its effect. Every mdev create and remove makes the kernel send uevents (the
/// device's, and its VFIO group's) that the daemon handles on another thread at the same time, so a
/// view computed there from an older sysfs state must never overwrite the newer one.
fn list_follows_each_call(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (_work, d) = daemon("read-your-writes")?;
    for n in 0..ROUNDS {
        let u = test_uuid("daemon_list_follows_each_call", n);
        d.create(TargetKind::Type, "mtty-1", "mtty", Some(&u))?;
        mdevs.adopt(u);
        ensure_entry(&listed(&d, &u)?, "running", "daemon", false)?;
        // Alternate the two ways a transient instance ends.
        if n % 2 == 0 {
            d.stop_instance(&u)?;
        } else {
            d.destroy(&u)?;
        }
        mdevs.forget(&u);
        ensure(!device_exists(g, &u), || format!("{u} still in sysfs"))?;
        let still = find(&d.list_instances()?, &u).cloned();
        ensure(still.is_none(), || {
            format!(
                "round {n}: {u} is still listed right after {} returned: {still:?}",
                if n % 2 == 0 { "Stop" } else { "Destroy" }
            )
        })?;
    }
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Runs the shipped `vgpuctl ARGS --bus <d's bus>`.
/// Runs the shipped `vgpuctl ARGS --bus BUS` against `d` (the guest's environment cleared of
/// `VGPU_BUS`/`VGPU_SYSFS_ROOT`).
pub(super) fn vgpuctl(d: &Vgpud, args: &[&str]) -> Result<Output, TestError> {
    let bin = super::vgpud::binary()?.with_file_name("vgpuctl");
    Command::new(&bin)
        .args(args)
        .args(["--bus", d.bus()])
        .env_remove("VGPU_BUS")
        .env_remove("VGPU_SYSFS_ROOT")
        .output()
        .map_err(|e| TestError::Check(format!("cannot run {}: {e}", bin.display())))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `vgpuctl` against the daemon on the real kernel: create by type prints the instance as JSON and
/// the device exists; `list --json` shows it and a foreign device; starting the foreign one is
/// refused in one line with exit code 2 (README, "vgpud, the daemon"); an explicit destroy of the
/// foreign one adopts and removes it; destroying ours removes it.
fn vgpuctl_on_real_kernel(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let foreign = test_uuid("daemon_vgpuctl_on_real_kernel", 0);
    mdevs.create("mtty", "mtty-1", foreign)?;
    let (_work, d) = daemon("vgpuctl")?;
    let ours = test_uuid("daemon_vgpuctl_on_real_kernel", 1);
    let u = ours.to_string();
    let out = vgpuctl(
        &d,
        &[
            "create", "--type", "mdpy-xga", "--gpu", "mdpy", "--uuid", &u, "--json",
        ],
    )?;
    ensure(out.status.success(), || {
        format!(
            "vgpuctl create failed ({}): {}",
            out.status,
            text(&out.stderr)
        )
    })?;
    mdevs.adopt(ours);
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| {
        TestError::Check(format!(
            "vgpuctl create --json printed no JSON ({e}): {}",
            text(&out.stdout)
        ))
    })?;
    ensure_eq(
        "vgpuctl create --json (uuid, type, state, owner)",
        (
            created["uuid"].as_str(),
            created["type"].as_str(),
            created["state"].as_str(),
            created["owner"].as_str(),
        ),
        (
            Some(u.as_str()),
            Some("mdpy-xga"),
            Some("running"),
            Some("daemon"),
        ),
    )?;
    ensure_eq(
        format_args!("{ours}'s parent and type in sysfs"),
        device_type(g, &ours)?,
        ("mdpy".to_string(), "mdpy-xga".to_string()),
    )?;

    let out = vgpuctl(&d, &["list", "--json"])?;
    ensure(out.status.success(), || {
        format!(
            "vgpuctl list failed ({}): {}",
            out.status,
            text(&out.stderr)
        )
    })?;
    let list: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).map_err(|e| {
        TestError::Check(format!(
            "vgpuctl list --json printed no JSON array ({e}): {}",
            text(&out.stdout)
        ))
    })?;
    let owner = |uuid: &MdevUuid| {
        let u = uuid.to_string();
        list.iter()
            .find(|i| i["uuid"].as_str() == Some(u.as_str()))
            .and_then(|i| i["owner"].as_str().map(str::to_string))
    };
    ensure_eq(
        "owners in vgpuctl list --json (ours, foreign)",
        (owner(&ours), owner(&foreign)),
        (Some("daemon".to_string()), Some("foreign".to_string())),
    )?;

    // A refusal is one line naming the device, exit 2: `start` of a running foreign device.
    let out = vgpuctl(&d, &["start", &foreign.to_string()])?;
    let err = text(&out.stderr);
    ensure(
        out.status.code() == Some(2)
            && err.trim_end().lines().count() == 1
            && err.starts_with("vgpuctl: ")
            && err.contains(&foreign.to_string()),
        || {
            format!(
                "vgpuctl start of a foreign device: expected exit 2 and one line naming it, got {} with {err:?}",
                out.status
            )
        },
    )?;
    ensure(device_exists(g, &foreign), || {
        format!("foreign {foreign} vanished after a refused vgpuctl start")
    })?;
    // An explicit destroy naming the foreign device adopts it, then removes it.
    let out = vgpuctl(&d, &["destroy", &foreign.to_string()])?;
    ensure(out.status.success(), || {
        format!(
            "vgpuctl destroy of foreign {foreign} failed ({}): {}",
            out.status,
            text(&out.stderr)
        )
    })?;
    mdevs.forget(&foreign);
    ensure(!device_exists(g, &foreign), || {
        format!("foreign {foreign} still in sysfs after vgpuctl destroy")
    })?;

    let out = vgpuctl(&d, &["destroy", &u])?;
    ensure(out.status.success(), || {
        format!(
            "vgpuctl destroy {u} failed ({}): {}",
            out.status,
            text(&out.stderr)
        )
    })?;
    mdevs.forget(&ours);
    ensure(!device_exists(g, &ours), || {
        format!("{ours} still in sysfs after vgpuctl destroy")
    })?;
    d.stop()?;
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}
