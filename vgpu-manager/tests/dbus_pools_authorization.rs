//! Who may use the pool methods, with a real unprivileged caller (`setpriv` to uid 65534):
//! * on a real `dbus-daemon` with the shipped policy (`data/org.vgpumanager.Manager1.conf`), `pool
//!   status` and `Plan` (read-only) work for anyone and `pool apply` is refused by the bus;
//! * on the embedded bus (no policy), vgpud refuses `Apply` itself and nothing is created.
//!
//! Needs root (to switch users) and the Debian packages `dbus` and `util-linux`; skipped, with a
//! message, when not run as root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use dbus_common::{Daemon, assert_refused, ok, ok_json, vgpuctl, vgpuctl_as};
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, geteuid};

/// The unprivileged caller: nobody/nogroup on Debian.
const NOBODY: u32 = 65534;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn pool_file() -> String {
    repo()
        .join("vgpu-manager/tests/fixtures/pools/vdi-mixed.toml")
        .display()
        .to_string()
}

fn as_root() -> bool {
    if geteuid().is_root() {
        return true;
    }
    eprintln!("SKIPPED: these tests switch to an unprivileged uid with setpriv, which needs root");
    false
}

/// A temporary directory every user can traverse (the caller must reach the sockets).
fn open_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

/// A private system-type `dbus-daemon` with dbus's own default system policy plus the shipped file;
/// killed by pid when dropped.
struct SystemBus {
    child: Child,
    address: String,
}

impl Drop for SystemBus {
    fn drop(&mut self) {
        let _ = kill(Pid::from_raw(self.child.id() as i32), Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn system_bus(dir: &Path) -> SystemBus {
    // The default context of dbus's shipped system.conf: nobody owns names or calls methods unless a
    // service's policy file allows it.
    let conf = format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path={}</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
  </policy>
  <include>{}</include>
</busconfig>
"#,
        dir.join("system_bus_socket").display(),
        repo().join("data/org.vgpumanager.Manager1.conf").display()
    );
    let conf_path = dir.join("bus.conf");
    std::fs::write(&conf_path, conf).unwrap();
    let mut child = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", conf_path.display()))
        .args(["--nofork", "--print-address=1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("dbus-daemon.log")).unwrap())
        .spawn()
        .expect("dbus-daemon (Debian package `dbus`) must be installed");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.starts_with("unix:"),
        "dbus-daemon did not start: {line:?}"
    );
    SystemBus {
        child,
        address: line.trim().to_string(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn shipped_policy_lets_anyone_read_pools_and_only_admins_apply() {
    if !as_root() {
        return;
    }
    let tmp = open_tempdir();
    let bus = system_bus(tmp.path());
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
    if !as_root() {
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
