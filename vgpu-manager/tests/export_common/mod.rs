//! Shared by the `vgpuctl export` tests: vgpud on the demo host with the shipped VDI floor applied, the
//! test-only Python of `scripts/nova-venv` (Nova, oslo.config, PyYAML), and golden files.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

use crate::dbus_common::{Daemon, ok, vgpuctl};

/// The repository's root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The shipped pool file `name` (`data/pools.d/`).
pub fn pool_file(name: &str) -> String {
    repo().join("data/pools.d").join(name).display().to_string()
}

/// vgpud on a fresh simulated demo host below `dir`, with `data/pools.d/vdi-floor.toml` applied
/// through `vgpuctl pool apply` (40 × vdi-2g, 4 × workstation-4g: mdevs on both T4s and the UHD 630,
/// NVIDIA vendor-VFIO VFs on the L40S, xe VFs on the Flex 170).
pub async fn floor_daemon(dir: &Path) -> Daemon {
    let daemon = Daemon::embedded(dir, &dir.join("state")).await;
    let floor = pool_file("vdi-floor.toml");
    ok(&vgpuctl(&daemon.bus, &["pool", "apply", &floor, "--json"]).await);
    daemon
}

/// The Python of the test virtualenv `.cache/nova-venv` (made by `scripts/nova-venv`). Without it the
/// test fails naming the script, unless `VGPU_TESTS_ALLOW_SKIP=1` (never under CI): then `None` after a
/// SKIPPED line on stderr.
pub fn test_python(test: &str) -> Option<PathBuf> {
    let python = repo().join(".cache/nova-venv/bin/python");
    let runs = std::process::Command::new(&python)
        .args(["-c", "import nova.conf, oslo_config, yaml"])
        .status()
        .is_ok_and(|s| s.success());
    if runs {
        return Some(python);
    }
    let why = format!(
        "{} cannot import nova.conf, oslo_config and yaml (create the virtualenv with scripts/nova-venv; .ci/run does)",
        python.display()
    );
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if !ci && std::env::var("VGPU_TESTS_ALLOW_SKIP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {test}: {why}; VGPU_TESTS_ALLOW_SKIP=1 allowed the skip");
        return None;
    }
    panic!("{test}: {why}. Run scripts/nova-venv, or set VGPU_TESTS_ALLOW_SKIP=1 outside CI");
}

/// Compares `actual` with the golden file `tests/data/golden/NAME`; `VGPU_BLESS=1` writes it instead
/// (review the diff before committing it).
pub fn golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/golden")
        .join(name);
    if std::env::var_os("VGPU_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (create it with VGPU_BLESS=1 cargo test -p vgpu-manager --test {})",
            path.display(),
            module_path!().split("::").next().unwrap_or_default()
        )
    });
    assert!(
        expected == actual,
        "{} differs from the output (VGPU_BLESS=1 regenerates it; review the diff):\n--- expected\n{expected}\n--- actual\n{actual}",
        path.display()
    );
}
