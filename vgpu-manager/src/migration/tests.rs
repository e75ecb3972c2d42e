//! Fingerprints and checks on the simulated `samples` host written out as a sysfs tree, with the
//! module and kernel files a real host has.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use mdev_types::ids::MdevUuid;
use vgpu_host::SysfsHost;
use vgpu_host::discover::discover;
use vgpu_host::ops::create_mdev;
use vgpu_sim::SimHost;

use super::*;

const U: &str = "0b8d6b2e-4c1a-4f7e-9a3d-5e6f7a8b9c0d";

/// The samples host with one mtty device, as a tree below `dir`, with mtty at `version` and the
/// kernel at `release`.
fn tree(dir: &Path, version: Option<&str>, release: &str) -> SysfsHost {
    let sim = SimHost::builtin("samples").unwrap();
    create_mdev(
        &sim,
        "mtty",
        &"mtty-2".parse().unwrap(),
        &U.parse().unwrap(),
    )
    .unwrap();
    sim.materialize(dir).unwrap();
    let module = dir.join("sys/module/mtty");
    std::fs::create_dir_all(&module).unwrap();
    if let Some(v) = version {
        std::fs::write(module.join("srcversion"), format!("{v}\n")).unwrap();
    }
    std::fs::create_dir_all(dir.join("proc/sys/kernel")).unwrap();
    std::fs::write(
        dir.join("proc/sys/kernel/osrelease"),
        format!("{release}\n"),
    )
    .unwrap();
    SysfsHost::new(dir).unwrap()
}

#[test]
fn a_fingerprint_names_type_driver_version_and_kernel() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tree(tmp.path(), Some("ABC123"), "6.12.38+deb13-amd64");
    let fp = fingerprint(&host, &U.parse().unwrap()).unwrap();
    assert_eq!(fp.schema, FINGERPRINT_SCHEMA);
    assert_eq!(fp.type_id.to_string(), "mtty-2");
    assert_eq!(fp.parent, "mtty");
    assert_eq!(fp.driver, "mtty");
    assert_eq!(fp.driver_version.as_deref(), Some("ABC123"));
    assert_eq!(fp.kernel_release.as_deref(), Some("6.12.38+deb13-amd64"));
    // It round-trips through JSON, the form `vgpuctl migration fingerprint` prints.
    let text = serde_json::to_string(&fp).unwrap();
    assert_eq!(serde_json::from_str::<Fingerprint>(&text).unwrap(), fp);

    let missing: MdevUuid = "ffffffff-0000-4000-8000-000000000000".parse().unwrap();
    let e = fingerprint(&host, &missing).unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
}

#[test]
fn the_same_host_takes_its_own_instance() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tree(tmp.path(), Some("ABC123"), "6.12.38");
    let fp = fingerprint(&host, &U.parse().unwrap()).unwrap();
    let v = check(&host, &discover(&host).unwrap(), &fp);
    assert!(v.fits, "{v:#?}");
    assert_eq!(v.candidates[0].parent, "mtty");
    assert!(v.candidates[0].problems.is_empty());
}

#[test]
fn every_reason_is_given_when_the_state_cannot_load() {
    let src = tempfile::tempdir().unwrap();
    let fp = fingerprint(
        &tree(src.path(), Some("ABC123"), "6.12.38"),
        &U.parse().unwrap(),
    )
    .unwrap();
    // Another driver build and another kernel on the target.
    let dst = tempfile::tempdir().unwrap();
    let host = tree(dst.path(), Some("DEF456"), "6.1.0-40");
    let v = check(&host, &discover(&host).unwrap(), &fp);
    assert!(!v.fits, "{v:#?}");
    assert!(
        v.reasons
            .iter()
            .any(|r| r.contains("kernel release differs") && r.contains("6.1.0-40")),
        "{v:#?}"
    );
    let c = &v.candidates[0];
    assert!(
        c.problems
            .iter()
            .any(|p| p.contains("version DEF456 here, ABC123 on the source")),
        "{v:#?}"
    );

    // A type no parent offers, and a driver nothing here runs.
    let mut other = fp.clone();
    other.type_id = "nvidia-231".parse().unwrap();
    other.driver = "nvidia".into();
    other.kernel_release = Some("6.1.0-40".into());
    let v = check(&host, &discover(&host).unwrap(), &other);
    assert!(!v.fits && v.candidates.is_empty(), "{v:#?}");
    assert!(
        v.reasons
            .iter()
            .any(|r| r.contains("no mdev parent here offers type nvidia-231")
                && r.contains("none is driven by nvidia")),
        "{v:#?}"
    );

    // Another schema is refused before anything else is trusted.
    let mut future = fp.clone();
    future.schema = "vgpu-manager/migration-fingerprint/9".into();
    future.kernel_release = Some("6.1.0-40".into());
    future.driver_version = Some("DEF456".into());
    let v = check(&host, &discover(&host).unwrap(), &future);
    assert!(
        !v.fits && v.reasons.iter().any(|r| r.contains("schema")),
        "{v:#?}"
    );

    // Vendor parameters are for the target to set: a note, not a refusal.
    let mut params = fp;
    params.kernel_release = Some("6.1.0-40".into());
    params.driver_version = Some("DEF456".into());
    params
        .vendor_params
        .insert("nvidia/vgpu_params".into(), "frame_rate_limiter=0".into());
    let v = check(&host, &discover(&host).unwrap(), &params);
    assert!(v.fits, "{v:#?}");
    assert!(
        v.notes.iter().any(|n| n.contains("frame_rate_limiter=0")),
        "{v:#?}"
    );
}

#[test]
fn a_full_parent_is_a_candidate_with_its_problem() {
    let tmp = tempfile::tempdir().unwrap();
    let host = tree(tmp.path(), None, "6.12.38");
    let fp = fingerprint(&host, &U.parse().unwrap()).unwrap();
    assert_eq!(fp.driver_version, None, "no version file: none");
    let mut inv = discover(&host).unwrap();
    for p in &mut inv.mdev_parents {
        for t in &mut p.types {
            t.available_instances = 0;
        }
    }
    let v = check(&host, &inv, &fp);
    assert!(!v.fits);
    assert!(
        v.candidates[0]
            .problems
            .iter()
            .any(|p| p.contains("no room")),
        "{v:#?}"
    );
}
