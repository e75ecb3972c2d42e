//! The Debian package `scripts/package` builds, installed with dpkg into a scratch root (dpkg
//! `--root` with `--force-script-chrootless`, so the maintainer scripts run here with DPKG_ROOT set)
//! beside Debian's real mdevctl 1.2.0 package: vgpuctl takes the place of /usr/bin/mdevctl and lsmdev
//! through dpkg-divert, whichever package comes first; upgrading keeps that; removing vgpu-manager
//! gives the real mdevctl back; the installed unit passes `systemd-analyze verify`.
//!
//! Needs dpkg, dpkg-deb and Debian's mdevctl .deb in `.cache/debs/` (`scripts/install-tools` fetches
//! it); without them the test fails, naming what is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Runs `cmd`, failing the test with its output when it fails; returns stdout.
fn run(cmd: &mut Command) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e} (install dpkg)"));
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Debian's mdevctl package, as `scripts/install-tools` downloads it.
fn mdevctl_deb() -> PathBuf {
    let dir = repo().join(".cache/debs");
    std::fs::read_dir(&dir)
        .ok()
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("mdevctl_1.2.0") && n.ends_with(".deb"))
        })
        .unwrap_or_else(|| {
            panic!(
                "Debian's mdevctl 1.2.0 package is not in {} (scripts/install-tools downloads it with apt-get download mdevctl)",
                dir.display()
            )
        })
}

/// A scratch root with an empty dpkg database.
fn scratch_root(dir: &Path) -> PathBuf {
    let r = dir.join("root");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(r.join("var/lib/dpkg").join(d)).unwrap();
    }
    std::fs::write(r.join("var/lib/dpkg/status"), "").unwrap();
    r
}

/// `dpkg --root=R ARGS` as an image builder runs it (no chroot; dependencies outside the scratch
/// root are not there).
fn dpkg(root: &Path, args: &[&str]) -> String {
    run(Command::new("dpkg")
        .arg(format!("--root={}", root.display()))
        .args(["--force-script-chrootless", "--force-depends"])
        .args(args))
}

fn diversions(root: &Path) -> String {
    run(Command::new("dpkg-divert")
        .arg("--root")
        .arg(root)
        .arg("--list"))
}

fn link(root: &Path, path: &str) -> Option<String> {
    std::fs::read_link(root.join(path.trim_start_matches('/')))
        .ok()
        .map(|t| t.display().to_string())
}

/// The real mdevctl binary (not a link) at `path`, byte for byte as in its package.
fn is_real_mdevctl(root: &Path, path: &str, pkg_tree: &Path) -> bool {
    let p = root.join(path.trim_start_matches('/'));
    std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file())
        && std::fs::read(&p).ok() == std::fs::read(pkg_tree.join("usr/bin/mdevctl")).ok()
}

fn build_package(dir: &Path) -> PathBuf {
    let bins = Path::new(env!("CARGO_BIN_EXE_vgpud")).parent().unwrap();
    for b in [
        env!("CARGO_BIN_EXE_vgpuctl"),
        env!("CARGO_BIN_EXE_vgpu-libvirt-hook"),
    ] {
        assert_eq!(
            Path::new(b).parent().unwrap(),
            bins,
            "the binaries share a directory"
        );
    }
    let deb = dir.join("vgpu-manager.deb");
    run(Command::new(repo().join("scripts/package"))
        .arg("--bin-dir")
        .arg(bins)
        .arg("--out")
        .arg(&deb)
        .arg("--no-compress"));
    deb
}

#[test]
fn the_package_diverts_mdevctl_and_gives_it_back_on_removal() {
    let tmp = tempfile::tempdir().unwrap();
    let real = mdevctl_deb();
    let deb = build_package(tmp.path());
    let deb = deb.to_str().unwrap();
    let real_s = real.to_str().unwrap();
    let pkg_tree = tmp.path().join("mdevctl-tree");
    run(Command::new("dpkg-deb").arg("-x").arg(&real).arg(&pkg_tree));

    // Contents: every shipped data file at its place, identical to data/.
    let listed = run(Command::new("dpkg-deb").args(["-c", deb]));
    for (src, dest) in [
        ("vgpud.service", "./usr/lib/systemd/system/vgpud.service"),
        (
            "org.vgpumanager.Manager1.conf",
            "./usr/share/dbus-1/system.d/org.vgpumanager.Manager1.conf",
        ),
        (
            "org.vgpumanager.Manager1.service",
            "./usr/share/dbus-1/system-services/org.vgpumanager.Manager1.service",
        ),
        (
            "org.vgpumanager.policy",
            "./usr/share/polkit-1/actions/org.vgpumanager.policy",
        ),
        (
            "90-vgpu-manager.rules",
            "./usr/lib/udev/rules.d/90-vgpu-manager.rules",
        ),
    ] {
        assert!(
            listed.contains(dest),
            "{dest} not in the package:\n{listed}"
        );
        let _ = src;
    }

    // mdevctl first, then vgpu-manager.
    let root = scratch_root(tmp.path());
    dpkg(&root, &["-i", real_s]);
    assert!(is_real_mdevctl(&root, "/usr/bin/mdevctl", &pkg_tree));
    dpkg(&root, &["-i", deb]);
    let d = diversions(&root);
    for f in ["/usr/bin/mdevctl", "/usr/bin/lsmdev"] {
        assert!(
            d.contains(&format!("diversion of {f} to {f}.distrib by vgpu-manager")),
            "{d}"
        );
    }
    assert_eq!(link(&root, "/usr/bin/mdevctl").as_deref(), Some("vgpuctl"));
    assert_eq!(link(&root, "/usr/bin/lsmdev").as_deref(), Some("vgpuctl"));
    assert_eq!(
        link(&root, "/usr/sbin/mdevctl").as_deref(),
        Some("../bin/vgpuctl")
    );
    assert!(is_real_mdevctl(
        &root,
        "/usr/bin/mdevctl.distrib",
        &pkg_tree
    ));
    // The installed front end answers as mdevctl.
    let v = run(Command::new(root.join("usr/bin/mdevctl")).arg("--version"));
    assert!(v.starts_with("mdevctl "), "{v}");
    for (src, dest) in [
        ("vgpud.service", "usr/lib/systemd/system/vgpud.service"),
        (
            "org.vgpumanager.Manager1.conf",
            "usr/share/dbus-1/system.d/org.vgpumanager.Manager1.conf",
        ),
        (
            "org.vgpumanager.rules",
            "usr/share/polkit-1/rules.d/50-org.vgpumanager.rules",
        ),
    ] {
        assert_eq!(
            std::fs::read(root.join(dest)).unwrap(),
            std::fs::read(repo().join("data").join(src)).unwrap(),
            "{dest}"
        );
    }
    let analyze = Command::new("systemd-analyze")
        .arg(format!("--root={}", root.display()))
        .arg("verify")
        .arg(root.join("usr/lib/systemd/system/vgpud.service"))
        .output()
        .expect("systemd-analyze (package systemd) runs");
    // The scratch root has neither dbus (dbus.service, dbus.socket) nor systemd's own units nor /bin/kill (packages vgpu-manager
    // depends on or every systemd host has: the unit's default dependencies pull in sysinit.target,
    // basic.target and shutdown.target, which systemd-analyze 252.39 reports missing below --root);
    // anything else systemd says about the unit is a fault.
    const ELSEWHERE: &[&str] = &[
        "dbus.service",
        "dbus.socket",
        "sysinit.target",
        "basic.target",
        "shutdown.target",
        "multi-user.target",
    ];
    let said = String::from_utf8_lossy(&analyze.stderr);
    let faults: Vec<&str> = said
        .lines()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| {
            !ELSEWHERE
                .iter()
                .any(|u| l.contains(&format!("Unit {u} not found")))
        })
        .filter(|l| !l.contains("Command /bin/kill is not executable"))
        .collect();
    assert!(
        faults.is_empty(),
        "systemd-analyze verify finds fault with the unit: {faults:#?}"
    );

    // An upgrade (the same package again) keeps everything in place.
    dpkg(&root, &["-i", deb]);
    assert_eq!(diversions(&root), d);
    assert_eq!(link(&root, "/usr/bin/mdevctl").as_deref(), Some("vgpuctl"));

    // Removal gives the real mdevctl back and leaves no diversion.
    dpkg(&root, &["-r", "vgpu-manager"]);
    assert!(is_real_mdevctl(&root, "/usr/bin/mdevctl", &pkg_tree));
    assert_eq!(link(&root, "/usr/bin/lsmdev").as_deref(), Some("mdevctl"));
    assert!(!root.join("usr/bin/mdevctl.distrib").exists());
    assert!(link(&root, "/usr/sbin/mdevctl").is_none());
    assert_eq!(diversions(&root).trim(), "");

    // The other order: vgpu-manager first, then mdevctl (its files land diverted), then purge.
    let root = scratch_root(&tmp.path().join("second"));
    dpkg(&root, &["-i", deb]);
    dpkg(&root, &["-i", real_s]);
    assert_eq!(link(&root, "/usr/bin/mdevctl").as_deref(), Some("vgpuctl"));
    assert!(is_real_mdevctl(
        &root,
        "/usr/bin/mdevctl.distrib",
        &pkg_tree
    ));
    std::fs::write(root.join("var/lib/vgpu-manager/lock"), "").unwrap();
    dpkg(&root, &["-P", "vgpu-manager"]);
    assert!(is_real_mdevctl(&root, "/usr/bin/mdevctl", &pkg_tree));
    assert!(
        !root.join("var/lib/vgpu-manager").exists(),
        "purge removes the state directory"
    );
    assert_eq!(diversions(&root).trim(), "");
}
