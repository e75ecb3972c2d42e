//! Who may use the pool methods, with a real unprivileged caller (`setpriv` to uid 65534):
//! * on a real `dbus-daemon` with the shipped policy (`data/org.vgpumanager.Manager1.conf`), `pool
//!   status` and `Plan` (read-only) work for anyone and `pool apply` is refused by the bus;
//! * on the embedded bus (no policy), vgpud refuses `Apply` itself and nothing is created.
//!
//! Needs root (to switch users) and the Debian packages `dbus` and `util-linux`. Not run as root, each
//! test fails, unless `VGPU_TESTS_ALLOW_SKIP=1` is set: then it prints `SKIPPED: <reason>` to stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use dbus_common::system_bus::{NOBODY, open_tempdir, repo, require_root, shipped_system_bus};
use dbus_common::{Daemon, assert_refused, ok, ok_json, vgpuctl, vgpuctl_as};

fn pool_file() -> String {
    repo()
        .join("vgpu-manager/tests/fixtures/pools/vdi-mixed.toml")
        .display()
        .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn shipped_policy_lets_anyone_read_pools_and_only_admins_apply() {
    if !require_root("shipped_policy_lets_anyone_read_pools_and_only_admins_apply") {
        return;
    }
    let tmp = open_tempdir();
    let bus = shipped_system_bus(tmp.path());
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    let file = pool_file();

    let o = vgpuctl_as(Some(NOBODY), &daemon.bus, &["pool", "apply", &file]).await;
    assert_refused(
        &o,
        &[
            "Apply refused by the D-Bus policy",
            "usermod -aG vgpu-admin",
        ],
    );
    assert_eq!(
        ok_json(&vgpuctl(&daemon.bus, &["pool", "status", "--json"]).await),
        serde_json::json!([])
    );

    // Root applies; then anyone reads the status.
    ok(&vgpuctl(&daemon.bus, &["pool", "apply", &file]).await);
    let out = ok(&vgpuctl_as(Some(NOBODY), &daemon.bus, &["pool", "status"]).await);
    assert!(out.contains("12 of 12 slots running"), "{out}");
    drop(daemon);
    drop(bus);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_bus_policy_vgpud_refuses_apply_itself() {
    if !require_root("without_a_bus_policy_vgpud_refuses_apply_itself") {
        return;
    }
    let tmp = open_tempdir();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let before = ok_json(&vgpuctl(&daemon.bus, &["list", "--json"]).await);
    let o = vgpuctl_as(Some(NOBODY), &daemon.bus, &["pool", "apply", &pool_file()]).await;
    assert_refused(&o, &["uid 65534", "vgpu-admin"]);
    assert_eq!(
        ok_json(&vgpuctl(&daemon.bus, &["list", "--json"]).await),
        before
    );
    // Read-only: fine for anyone.
    ok(&vgpuctl_as(Some(NOBODY), &daemon.bus, &["pool", "status"]).await);
    drop(daemon);
}
