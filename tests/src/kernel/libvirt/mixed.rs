//! vgpu-manager beside the real mdevctl 1.2.0 (Debian's package, installed first; ours diverts it to
//! [`REAL_MDEVCTL`]): both keep their definitions in the one `/etc/mdevctl.d`, so a device the real
//! mdevctl defines is listed by vgpud (as foreign) and by libvirt (through our `mdevctl`), and one vgpud
//! defines is listed by the real mdevctl. The real mdevctl also starts and stops its own device, which
//! vgpud sees as foreign and libvirt as active. Every step is checked on each side.

use std::time::Duration;

use mdev_types::ids::MdevUuid;

use super::super::daemon::device_exists;
use super::super::guest::Guest;
use super::super::runner::{Outcome, TestError, TestResult, ensure};
use super::super::samples::{Mdevs, test_uuid};
use super::super::vgpud::TargetKind;
use super::nodedev::{listed, mdev_node};
use super::stack::Stack;
use super::sysroot::{Libvirt, REAL_MDEVCTL, kernel_lacks_overlay};

/// How long a change may take to show (the bound only catches one never seen).
const SEEN_WITHIN: Duration = Duration::from_secs(20);

/// `vgpuctl list --json` in the sysroot (on its system bus): (owner, state, defined) of `uuid`.
fn vgpuctl_view(s: &Stack, uuid: &MdevUuid) -> Result<Option<(String, String, bool)>, TestError> {
    let text = s.root.run("vgpuctl", &["list", "--json"])?;
    let list: Vec<serde_json::Value> = serde_json::from_str(&text)
        .map_err(|e| TestError::Check(format!("vgpuctl list --json: {e}: {text}")))?;
    let u = uuid.to_string();
    Ok(list
        .iter()
        .find(|i| i["uuid"].as_str() == Some(u.as_str()))
        .map(|i| {
            (
                i["owner"].as_str().unwrap_or("?").to_string(),
                i["state"].as_str().unwrap_or("?").to_string(),
                i["defined"].as_bool().unwrap_or(false),
            )
        }))
}

/// The real mdevctl's `list --defined --dumpjson`: whether it names `uuid` on parent `mtty` with
/// type `ty`.
fn real_lists_defined(s: &Stack, uuid: &MdevUuid, ty: &str) -> Result<bool, TestError> {
    let text = s
        .root
        .run(REAL_MDEVCTL, &["list", "--defined", "--dumpjson"])?;
    if text.trim().is_empty() {
        return Ok(false);
    }
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        TestError::Check(format!(
            "{REAL_MDEVCTL} list --defined --dumpjson: {e}: {text}"
        ))
    })?;
    // mdevctl's dump: [{"PARENT": [{"UUID": {"mdev_type": …, …}}, …]}, …]
    let u = uuid.to_string();
    Ok(v.as_array().into_iter().flatten().any(|parents| {
        parents["mtty"].as_array().into_iter().flatten().any(|dev| {
            dev.get(&u)
                .is_some_and(|d| d["mdev_type"].as_str() == Some(ty))
        })
    }))
}

/// The test (see the module docs).
pub fn mixed_with_real_mdevctl(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let s = Stack::up("libvirt-mixed", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (a, b) = (test_uuid("libvirt-mixed", 0), test_uuid("libvirt-mixed", 1));
    mdevs.adopt(a);
    mdevs.adopt(b);
    let (a_s, b_s) = (a.to_string(), b.to_string());
    let (na, nb) = (mdev_node(&a), mdev_node(&b));

    // The real mdevctl defines A: its file, vgpud's foreign definition, libvirt's inactive device.
    s.root.run(
        REAL_MDEVCTL,
        &["define", "-u", &a_s, "-p", "mtty", "-t", "mtty-1"],
    )?;
    ensure(
        s.root.path(&format!("/etc/mdevctl.d/mtty/{a}")).is_file(),
        || format!("{REAL_MDEVCTL} define wrote no /etc/mdevctl.d/mtty/{a}"),
    )?;
    s.wait_until(
        "vgpud lists the real mdevctl's definition as foreign",
        SEEN_WITHIN,
        |s| Ok(vgpuctl_view(s, &a)? == Some(("foreign".to_string(), "stopped".to_string(), true))),
    )?;
    s.wait_until(
        "libvirt lists the real mdevctl's definition",
        SEEN_WITHIN,
        |s| listed(s, &["--cap", "mdev", "--inactive"], &na),
    )?;

    // The real mdevctl starts it: in sysfs, running and foreign for vgpud, active for libvirt.
    s.root.run(REAL_MDEVCTL, &["start", "-u", &a_s])?;
    ensure(device_exists(g, &a), || {
        format!("{REAL_MDEVCTL} start made no {a} in sysfs")
    })?;
    s.wait_until(
        "vgpud lists the real mdevctl's device running",
        SEEN_WITHIN,
        |s| {
            Ok(vgpuctl_view(s, &a)?
                .is_some_and(|(owner, state, _)| owner == "foreign" && state == "running"))
        },
    )?;
    s.wait_until(
        "libvirt lists the real mdevctl's device active",
        SEEN_WITHIN,
        |s| listed(s, &["--cap", "mdev"], &na),
    )?;

    // vgpud defines B: the real mdevctl lists it, and so does libvirt.
    s.vgpud()?
        .define(TargetKind::Type, "mtty-1", "mtty", &b, false)?;
    ensure(real_lists_defined(&s, &b, "mtty-1")?, || {
        format!("{REAL_MDEVCTL} list --defined does not name vgpud's definition {b}")
    })?;
    s.wait_until("libvirt lists vgpud's definition", SEEN_WITHIN, |s| {
        listed(s, &["--cap", "mdev", "--inactive"], &nb)
    })?;
    // The real mdevctl starts vgpud's definition too (one directory, one format).
    s.root.run(REAL_MDEVCTL, &["start", "-u", &b_s])?;
    ensure(device_exists(g, &b), || {
        format!("{REAL_MDEVCTL} start of vgpud's definition {b} made no device")
    })?;
    s.root.run(REAL_MDEVCTL, &["stop", "-u", &b_s])?;

    // The real mdevctl stops and undefines A: gone for everyone.
    s.root.run(REAL_MDEVCTL, &["stop", "-u", &a_s])?;
    s.root.run(REAL_MDEVCTL, &["undefine", "-u", &a_s])?;
    s.wait_until(
        "vgpud forgets the real mdevctl's device",
        SEEN_WITHIN,
        |s| Ok(vgpuctl_view(s, &a)?.is_none()),
    )?;
    s.wait_until(
        "libvirt forgets the real mdevctl's device",
        SEEN_WITHIN,
        |s| Ok(!listed(s, &["--cap", "mdev", "--all"], &na)?),
    )?;
    // vgpud undefines B: the real mdevctl no longer lists it.
    s.root.run("vgpuctl", &["undefine", &b_s])?;
    ensure(!real_lists_defined(&s, &b, "mtty-1")?, || {
        format!("{REAL_MDEVCTL} still lists {b} after vgpuctl undefine")
    })?;
    for u in [&a, &b] {
        ensure(!device_exists(g, u), || {
            format!("{u} is still in sysfs at the end")
        })?;
        mdevs.forget(u);
    }
    Ok(Outcome::Passed)
}
