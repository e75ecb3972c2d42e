//! The offline `vgpuctl` commands, run as the real binary: output, `--json`, exit codes and error lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Output};

fn vgpuctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(args)
        .env_remove("VGPU_SYSFS_ROOT")
        .output()
        .expect("run vgpuctl")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A refused request: exit code 2, exactly one line on stderr, no panic or backtrace.
fn assert_refused(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {err}",
        stdout(o)
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "one line expected: {err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "{n:?} not in {err:?}");
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn discover_demo_shows_every_gpu_and_why_some_are_not_assignable() {
    let o = vgpuctl(&["--sim", "demo", "discover"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for needle in [
        "NVIDIA T4",
        "NVIDIA L40S",
        "Flex 170",
        "MI300X",
        "UHD Graphics 630",
        "boot VGA",
        "driver igb",
    ] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }
}

#[test]
fn discover_json_is_the_inventory() {
    let o = vgpuctl(&["--sim", "demo", "discover", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 6);
    let numa: std::collections::BTreeSet<u64> = gpus
        .iter()
        .filter_map(|g| g["numa_node"].as_u64())
        .collect();
    assert_eq!(numa.into_iter().collect::<Vec<_>>(), vec![0, 1]);
    assert!(gpus.iter().any(|g| g["boot_vga"] == true));
    assert!(v["mdev_parents"].as_array().unwrap().len() >= 3);
}

#[test]
fn discover_reads_the_h200_capture_by_flag_and_by_environment() {
    let root = repo().join("tests/fixtures/h200-passthrough");
    let o = vgpuctl(&["--sysfs-root", root.to_str().unwrap(), "discover"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("NVIDIA H200") && out.contains("no IOMMU group"),
        "{out}"
    );
    let o = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(["discover", "--json"])
        .env("VGPU_SYSFS_ROOT", &root)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["gpus"][0]["driver"], "nvidia");
    assert_eq!(v["gpus"][0]["passthrough"]["assignable"], "no");
}

#[test]
fn types_of_one_gpu_accepts_a_short_address() {
    let o = vgpuctl(&["--sim", "demo", "types", "--gpu", "01:00.0"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("nvidia-231") && out.contains("GRID T4-2Q"),
        "{out}"
    );
    assert!(!out.contains("i915-GVTg"), "{out}");
    let o = vgpuctl(&["--sim", "demo", "types", "--gpu", "0000:01:00.0", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 1);
}

#[test]
fn match_picks_an_option_that_satisfies_the_profile() {
    let o = vgpuctl(&["--sim", "demo", "match", "vdi-2g", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let servable: Vec<&serde_json::Value> = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["best"].is_null())
        .collect();
    assert!(servable.len() >= 4);
    for g in servable {
        assert!(
            g["best"]["framebuffer_mib"].as_u64().unwrap() >= 2048,
            "{g}"
        );
    }
    let o = vgpuctl(&["--sim", "samples", "match", "sample-display-16m"]);
    assert!(stdout(&o).contains("mbochs-medium"), "{}", stdout(&o));
}

#[test]
fn shipped_profiles_check_clean() {
    let mut files: Vec<String> = std::fs::read_dir(repo().join("profiles"))
        .unwrap()
        .map(|e| e.unwrap().path().to_string_lossy().into_owned())
        .filter(|p| p.ends_with(".toml"))
        .collect();
    files.sort();
    let mut args = vec!["profiles", "check"];
    args.extend(files.iter().map(String::as_str));
    let o = vgpuctl(&args);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        stdout(&o).lines().filter(|l| l.starts_with("ok")).count(),
        files.len()
    );
}

#[test]
fn bad_input_is_one_clear_line_with_exit_code_2() {
    assert_refused(
        &vgpuctl(&["--sim", "nosuch", "discover"]),
        &["nosuch", "demo"],
    );
    assert_refused(
        &vgpuctl(&["--sysfs-root", "/definitely/missing", "discover"]),
        &["/definitely/missing"],
    );
    assert_refused(
        &vgpuctl(&["--sim", "demo", "types", "--gpu", "zz:00.0"]),
        &["zz:00.0", "PCI address"],
    );
    assert_refused(
        &vgpuctl(&["--sim", "demo", "types", "--gpu", "0000:3b:00.0"]),
        &["0000:3b:00.0", "discover"],
    );
    assert_refused(
        &vgpuctl(&["--sim", "demo", "match", "no-such-profile"]),
        &["no-such-profile", "vdi-2g"],
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"bad\"\ndescription = \"x\"\nclass = \"vdi\"\nframebuffer = \"lots\"\nheads = 0\nweight = 10\nvendors = [\"nvidia\"]\nbackends = [\"mdev\"]\n").unwrap();
    let o = vgpuctl(&["profiles", "check", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let out = stdout(&o);
    assert!(
        out.contains("bad.toml") && out.contains("bad.toml:4") && out.contains("framebuffer"),
        "{out}"
    );
    assert_refused(
        &vgpuctl(&["--sim", "demo", "match", bad.to_str().unwrap()]),
        &["bad.toml", "framebuffer"],
    );
}
