//! vgpud on a host where one GPU cannot be read: it starts, serves the healthy GPU and creates on it,
//! and a startup that really fails says what failed.
//!
//! Runs the real vgpud on a fake sysfs root whose `create` attributes are FUSE files (as the mdevctl
//! conformance suite does); needs root and /dev/fuse, and fails without them (or prints SKIPPED under
//! `VGPU_TESTS_ALLOW_SKIP=1`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use dbus_common::mdevctl::{FakeKernel, FakeRoot};
use dbus_common::{Daemon, ok, ok_json, vgpuctl};

const FAULTY: &str = "0000:00:03.0";
const HEALTHY: &str = "0000:00:04.0";
const UUID: &str = "6a2f6c5e-2b5f-4f7e-9a57-1f0c3a6d9b01";
const UUID2: &str = "6a2f6c5e-2b5f-4f7e-9a57-1f0c3a6d9b02";

/// Two PCI GPUs with an mdev parent each; the first one's `vendor` is empty (what the kernel never prints,
/// and what a driver in a bad state has been seen to leave).
fn two_gpus_one_faulty(root: &std::path::Path) -> FakeRoot {
    let r = FakeRoot::new(root);
    for p in [FAULTY, HEALTHY] {
        r.parent(p, "mtty-2", 2, "vfio-pci", "Dual port serial", None);
    }
    std::fs::write(r.parent_dir(FAULTY).join("vendor"), "").unwrap();
    r
}

/// vgpud on a fake root (`<dir>/root`) with one readable GPU, `HEALTHY`, an mdev parent of `mtty-2`,
/// and the FUSE kernel behind its `create` files.
async fn one_gpu_daemon(dir: &std::path::Path) -> (FakeRoot, FakeKernel, Daemon) {
    let fake = FakeRoot::new(&dir.join("root"));
    fake.parent(HEALTHY, "mtty-2", 2, "vfio-pci", "Dual port serial", None);
    let kernel = FakeKernel::start(&fake.root);
    let d = Daemon::on_sysfs_root(dir, &fake.root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused the host:\n{log}"));
    (fake, kernel, d)
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpud_starts_with_one_faulty_gpu_and_creates_on_the_healthy_one() {
    if !dbus_common::fuse_attr::require_fuse("daemon_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = two_gpus_one_faulty(&root);
    let kernel = FakeKernel::start(&fake.root);
    let d = Daemon::on_sysfs_root(dir.path(), &fake.root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused a host with one faulty GPU:\n{log}"));
    let status = ok_json(&vgpuctl(&d.bus, &["status", "--json"]).await);
    let gpus: Vec<&str> = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|g| g["id"].as_str())
        .collect();
    assert!(
        gpus.contains(&HEALTHY),
        "the healthy GPU is served: {status}"
    );
    let out = ok(&vgpuctl(
        &d.bus,
        &[
            "create", "--type", "mtty-2", "--gpu", HEALTHY, "--uuid", UUID,
        ],
    )
    .await);
    assert!(out.contains(UUID), "{out}");
    assert!(
        root.join("sys/bus/mdev/devices").join(UUID).exists(),
        "the device was made on the healthy GPU"
    );
    // Without --gpu the faulted GPU is skipped, though it offers the type with as much room (and
    // comes first by name).
    let o = ok_json(
        &vgpuctl(
            &d.bus,
            &["create", "--type", "mtty-2", "--uuid", UUID2, "--json"],
        )
        .await,
    );
    assert_eq!(o["gpu"], HEALTHY, "{o}");
    // Gpu1.Health: the faulted GPU's object stays and says why; once it reads again (and the GPUs are
    // re-read: Manager1.Reconcile here, as this fake host sends no uevents) it is ok, announced with
    // PropertiesChanged (the proxy caches properties and only learns of changes from that signal).
    let conn = dbus_common::client(&d.bus).await;
    let gpu = |id: &str| {
        let path = vgpu_client::gpu_path(id);
        let conn = conn.clone();
        async move {
            vgpu_client::Gpu1Proxy::builder(&conn)
                .path(path)
                .build()
                .await
                .unwrap()
        }
    };
    let healthy = gpu(HEALTHY).await;
    assert_eq!(healthy.health().await.unwrap(), "ok");
    let faulty = gpu(FAULTY).await;
    let h = faulty.health().await.unwrap();
    assert!(h.starts_with("faulted: ") && h.contains("vendor"), "{h}");
    std::fs::write(fake.parent_dir(FAULTY).join("vendor"), "0x1234\n").unwrap();
    vgpu_client::Manager1Proxy::new(&conn)
        .await
        .unwrap()
        .reconcile()
        .await
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if faulty.health().await.unwrap() == "ok" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "Health of a recovered GPU never became ok"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        d.log().contains(FAULTY),
        "the log names the faulted GPU: {}",
        d.log()
    );
    drop(kernel);
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpud_starts_when_the_host_cannot_be_read_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = FakeRoot::new(&root);
    fake.parent(HEALTHY, "mtty-2", 2, "vfio-pci", "Dual port serial", None);
    // Listing /sys/bus/pci/devices fails (ENOTDIR): no device can be read at all.
    let pci = root.join("sys/bus/pci/devices");
    std::fs::remove_dir_all(&pci).unwrap();
    std::fs::write(&pci, "").unwrap();
    let mut d = Daemon::on_sysfs_root(dir.path(), &fake.root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused to start on an unreadable host:\n{log}"));
    let log = d.log();
    assert!(
        log.contains("cannot read the host") && !log.contains("cannot open state directory"),
        "{log}"
    );
    // A request that needs the host says what failed; the daemon keeps serving.
    let o = vgpuctl(&d.bus, &["status"]).await;
    assert!(!o.status.success());
    let err = dbus_common::stderr(&o);
    assert!(
        err.contains("cannot read the host") && err.contains("/sys/bus/pci/devices"),
        "{err}"
    );
    d.assert_running("after a request on an unreadable host");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unusable_state_directory_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = FakeRoot::new(&root);
    fake.parent(HEALTHY, "mtty-2", 2, "vfio-pci", "Dual port serial", None);
    // The state directory is a regular file.
    std::fs::write(dir.path().join("state"), "").unwrap();
    let log = match Daemon::on_sysfs_root(dir.path(), &fake.root).await {
        Ok(_) => panic!("vgpud started without a usable state directory"),
        Err(log) => log,
    };
    assert!(log.contains("cannot open state directory"), "{log}");
    assert!(!log.contains("cannot read the host"), "{log}");
}

#[tokio::test(flavor = "multi_thread")]
async fn status_shows_a_faulted_gpu_plainly_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let _fake = two_gpus_one_faulty(&root);
    let d = Daemon::on_sysfs_root(dir.path(), &root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused a host with one faulty GPU:\n{log}"));
    let out = ok(&vgpuctl(&d.bus, &["status"]).await);
    assert!(out.contains("FAULTED"), "{out}");
    assert!(
        out.contains(&format!("{FAULTY}/vendor")) && out.contains("malformed"),
        "the table names the file and the problem: {out}"
    );
    assert!(out.contains(HEALTHY), "{out}");
    let v = ok_json(&vgpuctl(&d.bus, &["status", "--json"]).await);
    let faults = v["faults"].as_array().expect("a faults list");
    assert_eq!(faults.len(), 1, "{v}");
    assert_eq!(faults[0]["device"], FAULTY, "{v}");
    assert_eq!(faults[0]["scope"], "pci-device", "{v}");
    assert!(
        faults[0]["path"].as_str().unwrap().ends_with("/vendor"),
        "{v}"
    );
    assert!(faults[0]["problem"].as_str().unwrap().contains("malformed"));
    // A healthy host: an empty list, no table.
    std::fs::write(_fake.parent_dir(FAULTY).join("vendor"), "0x1234\n").unwrap();
    let v = ok_json(&vgpuctl(&d.bus, &["status", "--json"]).await);
    assert_eq!(v["faults"], serde_json::json!([]), "{v}");
    let out = ok(&vgpuctl(&d.bus, &["status"]).await);
    assert!(!out.contains("FAULTED"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn create_of_a_type_on_a_faulted_gpu_is_refused_naming_its_fault() {
    if !dbus_common::fuse_attr::require_fuse("daemon_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let fake = two_gpus_one_faulty(&root);
    let kernel = FakeKernel::start(&fake.root);
    let d = Daemon::on_sysfs_root(dir.path(), &fake.root)
        .await
        .unwrap_or_else(|log| panic!("vgpud refused a host with one faulty GPU:\n{log}"));
    for cmd in ["create", "define"] {
        let o = vgpuctl(
            &d.bus,
            &[cmd, "--type", "mtty-2", "--gpu", FAULTY, "--uuid", UUID],
        )
        .await;
        dbus_common::assert_refused(
            &o,
            &[
                FAULTY,
                "is faulted",
                "/vendor",
                "malformed",
                "dmesg",
                "nothing was changed",
            ],
        );
    }
    // The D-Bus error is its own kind.
    let conn = dbus_common::client(&d.bus).await;
    let err = vgpu_client::Manager1Proxy::new(&conn)
        .await
        .unwrap()
        .create(
            vgpu_client::TARGET_TYPE,
            "mtty-2",
            FAULTY,
            UUID,
            std::collections::HashMap::new(),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("org.vgpumanager.Error.Faulted"),
        "{err}"
    );
    // Nothing changed: no device, no definition, no instance, nothing written to the kernel.
    assert!(!root.join("sys/bus/mdev/devices").join(UUID).exists());
    let list = ok_json(&vgpuctl(&d.bus, &["list", "--json"]).await);
    assert_eq!(list, serde_json::json!([]), "{list}");
    assert!(
        !fake.config_base().join(FAULTY).join(UUID).exists(),
        "no /etc/mdevctl.d file"
    );
    assert!(kernel.finish().is_empty(), "nothing written to the kernel");
}

/// A GPU found readable by a create is read again for a later one after a second (the reuse time of
/// vgpud's health check, `engine/health.rs`): one that faults in between is then refused.
#[tokio::test(flavor = "multi_thread")]
async fn a_gpu_that_faults_after_a_create_is_refused_once_its_check_is_read_again() {
    if !dbus_common::fuse_attr::require_fuse("daemon_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (fake, kernel, d) = one_gpu_daemon(dir.path()).await;
    let create = |uuid: &'static str| {
        let bus = d.bus.clone();
        async move {
            vgpuctl(
                &bus,
                &[
                    "create", "--type", "mtty-2", "--gpu", HEALTHY, "--uuid", uuid,
                ],
            )
            .await
        }
    };
    let out = ok(&create(UUID).await);
    assert!(out.contains(UUID), "{out}");
    std::fs::write(fake.parent_dir(HEALTHY).join("vendor"), "").unwrap();
    // Past the reuse time (one second) the GPU is read again, whatever happened meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let o = create(UUID2).await;
    dbus_common::assert_refused(
        &o,
        &[HEALTHY, "is faulted", "/vendor", "nothing was changed"],
    );
    assert!(!root.join("sys/bus/mdev/devices").join(UUID2).exists());
    // Readable again: served at once (a fault is never reused).
    std::fs::write(fake.parent_dir(HEALTHY).join("vendor"), "0x1234\n").unwrap();
    let out = ok(&create(UUID2).await);
    assert!(out.contains(UUID2), "{out}");
    drop(kernel);
}

/// Starting a defined instance on a GPU that faulted since it was defined is refused as a create
/// there is, before anything reaches the kernel; once the GPU reads again it starts.
#[tokio::test(flavor = "multi_thread")]
async fn start_of_a_definition_on_a_faulted_gpu_is_refused_naming_its_fault() {
    if !dbus_common::fuse_attr::require_fuse("daemon_faults") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let (fake, kernel, d) = one_gpu_daemon(dir.path()).await;
    ok(&vgpuctl(
        &d.bus,
        &[
            "define", "--type", "mtty-2", "--gpu", HEALTHY, "--uuid", UUID,
        ],
    )
    .await);
    std::fs::write(fake.parent_dir(HEALTHY).join("vendor"), "").unwrap();
    // Past the reuse time of the define's check (one second), the GPU is read again.
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    let o = vgpuctl(&d.bus, &["start", UUID]).await;
    dbus_common::assert_refused(
        &o,
        &[HEALTHY, "is faulted", "/vendor", "nothing was changed"],
    );
    assert!(!root.join("sys/bus/mdev/devices").join(UUID).exists());
    // Readable again: started (a fault is never reused).
    std::fs::write(fake.parent_dir(HEALTHY).join("vendor"), "0x1234\n").unwrap();
    ok(&vgpuctl(&d.bus, &["start", UUID]).await);
    assert!(root.join("sys/bus/mdev/devices").join(UUID).exists());
    drop(kernel);
}
