//! Live-migration capability on the real kernel, through the shipped `vgpuctl migration`:
//! - `info` of an mtty instance opens it through VFIO and reads the migration uAPI v2 features. mtty
//!   implements stop-copy and pre-copy since Linux 6.7 (samples/vfio-mdev/mtty.c, "mtty: add migration
//!   support"; `migration_flags = VFIO_MIGRATION_STOP_COPY | VFIO_MIGRATION_PRE_COPY`), reports a
//!   stop-copy size, and has `log_ops` (dirty-page logging is offered). Before 6.7 (stock 6.1) it has no
//!   migration support: then `info` says so with the reason, exit 1.
//!   Its dirty log starts but cannot be read (mtty's `log_read_and_clear` returns -EOPNOTSUPP):
//!   `info` reports that and warns that QEMU needs `x-device-dirty-page-tracking=off`.
//! - `info` of an mdpy instance (no migration support in any kernel) refuses with the reason, exit 1.
//! - `fingerprint` names the mtty module, its `srcversion` and the running kernel's release, and
//!   `check --target` of it on the same host fits (exit 0).

use std::path::PathBuf;
use std::process::Command;

use super::daemon::daemon;
use super::guest::Guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, test_uuid};
use super::vfio::check_err;
use super::vgpud::TargetKind;

/// The tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![Test::new(
        "migration_info_fingerprint_and_check_on_mtty_and_mdpy",
        info_fingerprint_check,
    )]
}

fn vgpuctl_bin() -> Result<PathBuf, TestError> {
    let exe = std::env::current_exe().map_err(check_err)?;
    let bin = exe.with_file_name("vgpuctl");
    ensure(bin.is_file(), || {
        format!(
            "{} is missing: scripts/vm-test ships it next to kernel-tests",
            bin.display()
        )
    })?;
    Ok(bin)
}

/// Runs `vgpuctl ARGS` on the live kernel: (exit code, stdout, stderr).
fn vgpuctl(args: &[&str]) -> Result<(i32, String, String), TestError> {
    let out = Command::new(vgpuctl_bin()?)
        .args(args)
        .env_remove("VGPU_SYSFS_ROOT")
        .output()
        .map_err(check_err)?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

fn json(args: &[&str], text: &str, err: &str) -> Result<serde_json::Value, TestError> {
    serde_json::from_str(text).map_err(|e| {
        TestError::Check(format!(
            "vgpuctl {args:?}: {e}; stdout {text:?}, stderr {err:?}"
        ))
    })
}

/// (major, minor) of a kernel release text (`6.12.117+deb12-amd64` → (6, 12)).
pub(super) fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn info_fingerprint_check(g: &Guest) -> TestResult {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_err(check_err)?
        .trim()
        .to_string();
    let migrates = kernel_version(&release).is_some_and(|v| v >= (6, 7));
    let mut mdevs = Mdevs::new(&g.host);
    let mtty = test_uuid("migration", 0);
    let mdpy = test_uuid("migration", 1);
    mdevs.create("mtty", "mtty-1", mtty).map_err(check_err)?;
    mdevs.create("mdpy", "mdpy-vga", mdpy).map_err(check_err)?;
    let (mtty_s, mdpy_s) = (mtty.to_string(), mdpy.to_string());

    let args = ["migration", "info", mtty_s.as_str(), "--json"];
    let (code, out, err) = vgpuctl(&args)?;
    let v = json(&args, &out, &err)?;
    if migrates {
        ensure_eq("mtty info exit code", code, 0)?;
        ensure_eq("mtty migratable", &v["migratable"], &true.into())?;
        ensure_eq("mtty stop-copy", &v["caps"]["stop_copy"], &true.into())?;
        ensure_eq("mtty pre-copy", &v["caps"]["pre_copy"], &true.into())?;
        ensure_eq(
            "mtty dirty logging",
            &v["caps"]["dirty_logging"],
            &true.into(),
        )?;
        ensure(
            v["caps"]["stop_copy_bytes"].as_u64().is_some_and(|n| n > 0),
            || format!("mtty reports its stop-copy size: {v}"),
        )?;
        // Where mtty's log starts but its report fails (mtty_log_read_and_clear: -EOPNOTSUPP, stock
        // 6.12), QEMU meets that only once a migration starts: info says so, with the QEMU
        // properties to use. A kernel whose mtty reports (the custom test kernel) gets no warning.
        let reports = v["caps"]["dirty_log_reports"].as_bool().ok_or_else(|| {
            TestError::Check(format!("mtty info has no caps.dirty_log_reports: {v}"))
        })?;
        let warns =
            |w: &serde_json::Value| w.to_string().contains("x-device-dirty-page-tracking=off");
        if reports {
            ensure(!warns(&v["warnings"]), || {
                format!("mtty's log reports, yet info warns: {v}")
            })?;
        } else {
            ensure(
                v["caps"]["dirty_log_detail"].as_str().is_some_and(|d| {
                    d.contains("DMA_LOGGING_REPORT") && d.contains("not supported")
                }),
                || format!("mtty's dirty log detail names the failing REPORT: {v}"),
            )?;
            ensure(warns(&v["warnings"]), || {
                format!("mtty's info warns that QEMU needs x-device-dirty-page-tracking=off: {v}")
            })?;
            // The probe stopped the log again and closed the device: info runs again the same,
            // and the text form shows the warning.
            let (code, text, err) = vgpuctl(&["migration", "info", mtty_s.as_str()])?;
            ensure_eq("mtty info (text) exit code", code, 0)?;
            ensure(
                text.contains("dirty log read: no")
                    && text.contains("warning:")
                    && text.contains("x-device-dirty-page-tracking=off"),
                || format!("mtty's info text shows the dirty-log warning: {text}{err}"),
            )?;
        }
        // The same answer over D-Bus, from vgpud (Instance1.MigrationInfo) for an instance it made.
        let (_work, d) = daemon("migration-info")?;
        let managed = test_uuid("migration", 2);
        mdevs.adopt(managed);
        d.create(TargetKind::Type, "mtty-1", "mtty", Some(&managed))?;
        let answer = d.migration_info(&managed)?;
        let m = json(&["Instance1.MigrationInfo"], &answer, "")?;
        ensure_eq("MigrationInfo migratable", &m["migratable"], &true.into())?;
        ensure_eq(
            "MigrationInfo dirty log read",
            &m["caps"]["dirty_log_reports"],
            &reports.into(),
        )?;
        ensure(warns(&m["warnings"]) != reports, || {
            format!("Instance1.MigrationInfo warns as vgpuctl does: {m}")
        })?;
        d.destroy(&managed)?;
        mdevs.forget(&managed);
        d.stop()?;
    } else {
        ensure_eq("mtty info exit code before 6.7", code, 1)?;
        ensure_eq(
            "mtty migratable before 6.7",
            &v["migratable"],
            &false.into(),
        )?;
        ensure(
            v["reason"]
                .as_str()
                .is_some_and(|r| r.contains("does not implement VFIO migration")),
            || format!("the reason on {release}: {v}"),
        )?;
    }

    let args = ["migration", "info", mdpy_s.as_str(), "--json"];
    let (code, out, err) = vgpuctl(&args)?;
    let v = json(&args, &out, &err)?;
    ensure_eq("mdpy info exit code", code, 1)?;
    ensure_eq("mdpy migratable", &v["migratable"], &false.into())?;
    ensure(
        v["reason"]
            .as_str()
            .is_some_and(|r| r.contains("does not implement VFIO migration")),
        || format!("mdpy's reason: {v}"),
    )?;

    let args = ["migration", "fingerprint", mtty_s.as_str()];
    let (code, out, err) = vgpuctl(&args)?;
    ensure_eq("fingerprint exit code", code, 0)?;
    let fp = json(&args, &out, &err)?;
    ensure_eq("fingerprint type", &fp["type_id"], &"mtty-1".into())?;
    ensure_eq("fingerprint driver", &fp["driver"], &"mtty".into())?;
    ensure_eq(
        "fingerprint kernel",
        &fp["kernel_release"],
        &release.as_str().into(),
    )?;
    let srcversion = std::fs::read_to_string("/sys/module/mtty/srcversion")
        .ok()
        .map(|s| s.trim().to_string());
    let version = std::fs::read_to_string("/sys/module/mtty/version")
        .ok()
        .map(|s| s.trim().to_string());
    ensure_eq(
        "fingerprint driver version",
        &fp["driver_version"],
        &version
            .or(srcversion)
            .map_or(serde_json::Value::Null, Into::into),
    )?;
    let file = std::env::temp_dir().join("migration-fingerprint.json");
    std::fs::write(&file, &out).map_err(check_err)?;
    let file_s = file.display().to_string();
    let (code, out, err) = vgpuctl(&["migration", "check", "--target", &file_s])?;
    ensure_eq("check on the same host", code, 0)?;
    ensure(out.contains("this host can take it"), || {
        format!("{out}{err}")
    })?;
    mdevs.remove_all().map_err(check_err)?;
    Ok(Outcome::Passed)
}
