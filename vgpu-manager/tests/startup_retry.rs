//! The startup reconcile of a vgpud that started while the host could not be read at all is owed, not
//! left undone: it runs once the host reads, on the next kernel event or on a back-off retry.
//!
//! The daemon test runs the real vgpud on a fake sysfs root whose `create` attributes are FUSE files;
//! it needs root and /dev/fuse, and fails without them (or prints SKIPPED under
//! `VGPU_TESTS_ALLOW_SKIP=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dbus_common::mdevctl::{FakeKernel, FakeRoot};
use dbus_common::{Daemon, ok, vgpuctl};
use vgpu_host::uevent::Uevent;
use vgpu_host::{Host, SysfsHost};
use vgpu_manager::daemon::api::ListInstances;
use vgpu_manager::daemon::engine::{Core, GpuImpact};
use vgpu_manager::profile::Catalog;

const GPU: &str = "0000:00:04.0";
const UUID: &str = "3d1b7f20-5c8e-4a1f-8b6d-2e9f0a4c7b11";

/// Makes listing `/sys/bus/pci/devices` fail (ENOTDIR): no device can be read at all. Returns what
/// puts it back.
fn break_pci(root: &Path) -> impl FnOnce() {
    let pci = root.join("sys/bus/pci/devices");
    let aside: PathBuf = root.join("sys/bus/pci/devices.aside");
    std::fs::rename(&pci, &aside).unwrap();
    std::fs::write(&pci, "").unwrap();
    move || {
        std::fs::remove_file(&pci).unwrap();
        std::fs::rename(&aside, &pci).unwrap();
    }
}

#[test]
fn a_kernel_event_runs_the_owed_startup_reconcile_once_the_host_reads() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = FakeRoot::new(&root);
    fake.active(UUID, GPU, "mtty-2");
    let restore = break_pci(&root);
    let host: Arc<dyn Host> = Arc::new(SysfsHost::new(&root).unwrap());
    let core = Core::open(host, &dir.path().join("state"), Catalog::builtin().unwrap())
        .expect("the core opens on an unreadable host");
    assert!(core.startup_owed());
    assert!(core.execute(ListInstances).unwrap().is_empty());
    let ev = Uevent::new("bind", "/devices/pci0000:00/0000:00:04.0", Some("pci"));
    // Still unreadable: still owed.
    core.handle_uevent(&ev);
    assert!(core.startup_owed());
    restore();
    assert_eq!(core.handle_uevent(&ev), GpuImpact::All);
    assert!(!core.startup_owed(), "the startup reconcile ran");
    let listed: Vec<String> = core
        .execute(ListInstances)
        .unwrap()
        .iter()
        .map(|v| v.uuid.to_string())
        .collect();
    assert_eq!(listed, [UUID], "the instances are known once it ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_back_off_starts_an_autostart_definition_once_the_host_reads() {
    if !dbus_common::fuse_attr::require_fuse("startup_retry") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = FakeRoot::new(&root);
    fake.parent(GPU, "mtty-2", 2, "vfio-pci", "Dual port serial", None);
    let kernel = FakeKernel::start(&fake.root);
    let d = Daemon::on_sysfs_root(dir.path(), &root).await.unwrap();
    ok(&vgpuctl(
        &d.bus,
        &[
            "define",
            "--type",
            "mtty-2",
            "--gpu",
            GPU,
            "--uuid",
            UUID,
            "--autostart",
        ],
    )
    .await);
    assert!(d.terminate().success());
    let device = root.join("sys/bus/mdev/devices").join(UUID);
    assert!(!device.exists(), "define does not start it");

    // vgpud starts on a host it cannot read: no startup reconcile now, so the definition waits.
    let restore = break_pci(&root);
    let mut d = Daemon::on_sysfs_root(dir.path(), &root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused to start on an unreadable host:\n{log}"));
    assert!(d.log().contains("cannot read the host"), "{}", d.log());
    assert!(!device.exists());
    // The host reads again, with no kernel event (this fake host sends none): the back-off's next
    // retry runs the startup reconcile, which starts the autostart definition.
    restore();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !device.exists() {
        assert!(
            Instant::now() < deadline,
            "the owed startup reconcile never ran:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = d.log();
    assert!(log.contains("the owed startup reconcile ran"), "{log}");
    let out = ok(&vgpuctl(&d.bus, &["status"]).await);
    assert!(out.contains(GPU), "the GPU is listed: {out}");
    d.assert_running("after the owed startup reconcile");
    drop(kernel);
}
