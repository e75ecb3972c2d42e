//! `vgpuctl migration fingerprint` and `check` on sysfs trees (the simulated `samples` host written
//! out, with the module and kernel files of a real host): the source's fingerprint is taken by a
//! matching target (exit 0) and refused with every reason by one with another driver build and kernel
//! (exit 1); `migration info` refuses a tree (it needs the live kernel's VFIO).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use vgpu_host::ops::create_mdev;
use vgpu_sim::SimHost;

const U: &str = "5a1c9e2b-7d3f-4b6a-8c0e-1f2a3b4c5d6e";

fn vgpuctl(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .arg("--sysfs-root")
        .arg(root)
        .args(args)
        .env_remove("VGPU_SYSFS_ROOT")
        .output()
        .expect("run vgpuctl")
}

/// The samples host below `dir` with an mtty-1 device `U`, mtty at `srcversion`, kernel `release`.
fn host(dir: &Path, srcversion: &str, release: &str) {
    let sim = SimHost::builtin("samples").unwrap();
    create_mdev(
        &sim,
        "mtty",
        &"mtty-1".parse().unwrap(),
        &U.parse().unwrap(),
    )
    .unwrap();
    sim.materialize(dir).unwrap();
    std::fs::create_dir_all(dir.join("sys/module/mtty")).unwrap();
    std::fs::write(
        dir.join("sys/module/mtty/srcversion"),
        format!("{srcversion}\n"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
    std::fs::write(
        dir.join("proc/sys/kernel/osrelease"),
        format!("{release}\n"),
    )
    .unwrap();
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn fingerprint_then_check_on_a_matching_and_a_differing_target() {
    let src = tempfile::tempdir().unwrap();
    host(src.path(), "A1B2C3", "6.12.38+deb13-amd64");
    let o = vgpuctl(src.path(), &["migration", "fingerprint", U]);
    let (fp, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(&fp).unwrap();
    assert_eq!(v["type_id"], "mtty-1");
    assert_eq!(v["driver"], "mtty");
    assert_eq!(v["driver_version"], "A1B2C3");
    assert_eq!(v["kernel_release"], "6.12.38+deb13-amd64");
    let file = src.path().join("fp.json");
    std::fs::write(&file, &fp).unwrap();
    let file = file.to_str().unwrap();

    // The same build: it fits (exit 0), and says where.
    let same = tempfile::tempdir().unwrap();
    host(same.path(), "A1B2C3", "6.12.38+deb13-amd64");
    let o = vgpuctl(same.path(), &["migration", "check", "--target", file]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("this host can take it") && out.contains("mtty: fits"),
        "{out}"
    );

    // Another driver build and kernel: exit 1, every reason.
    let other = tempfile::tempdir().unwrap();
    host(other.path(), "Z9Y8X7", "6.1.0-40-amd64");
    let o = vgpuctl(
        other.path(),
        &["migration", "check", "--target", file, "--json"],
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["fits"], false);
    let all = out.to_string();
    assert!(all.contains("kernel release differs"), "{all}");
    assert!(
        all.contains("version Z9Y8X7 here, A1B2C3 on the source"),
        "{all}"
    );

    // A file that is not a fingerprint: a clear refusal naming it (exit 2).
    let bad = src.path().join("bad.json");
    std::fs::write(&bad, "{}").unwrap();
    let o = vgpuctl(
        other.path(),
        &["migration", "check", "--target", bad.to_str().unwrap()],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("is not a fingerprint"), "{err}");
}

#[test]
fn info_needs_the_live_kernel_and_a_missing_instance_is_named() {
    let src = tempfile::tempdir().unwrap();
    host(src.path(), "A1B2C3", "6.12.38");
    let o = vgpuctl(src.path(), &["migration", "info", U]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("runs only on the live kernel"), "{err}");
    let o = vgpuctl(
        src.path(),
        &[
            "migration",
            "fingerprint",
            "00000000-0000-4000-8000-0000000000ff",
        ],
    );
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("does not exist"), "{err}");
}
