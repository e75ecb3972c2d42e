//! Authorization, with real unprivileged callers (`setpriv` to uid 65534):
//! * on a real `dbus-daemon` started with the shipped policy (`data/org.vgpumanager.Manager1.conf`):
//!   reads succeed, every mutating call is refused with a clear message, root may do everything;
//! * with no bus policy at all (a permissive `dbus-daemon`, and the embedded bus): vgpud refuses the
//!   same calls itself, naming the caller and how to get access;
//! * where polkit runs, vgpud asks it about the caller's bus name (a stand-in polkit records what it
//!   is asked).
//!
//! Needs root (to switch users) and the Debian packages `dbus` (dbus-daemon, dbus-send) and
//! `util-linux` (setpriv). Not run as root, each test fails, unless `VGPU_TESTS_ALLOW_SKIP=1` is set: then it
//! prints `SKIPPED: <reason>` to stderr and returns (cargo still counts it as passed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::HashMap;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use dbus_common::system_bus::{
    NOBODY, PERMISSIVE, SYSTEM_DEFAULTS, open_tempdir, repo, require_root, start_dbus_daemon,
};
use dbus_common::{
    Daemon, PATIENCE, assert_refused, client, ok, ok_json, stderr, vgpuctl, vgpuctl_as,
};
use nix::unistd::{Gid, Group};
use zbus::{Connection, OwnedVariant};

/// Calls `Manager1.Reconcile` (no vgpuctl command makes it) with `dbus-send`, optionally as `uid`.
async fn reconcile_as(uid: Option<u32>, bus: &str) -> Output {
    dbus_send_as(
        uid,
        bus,
        "/org/vgpumanager/Manager1",
        "org.vgpumanager.Manager1.Reconcile",
    )
    .await
}

/// Calls `Instance1.Preflight` of `uuid` (vgpuctl's preflight runs locally, not over D-Bus) with
/// `dbus-send`, optionally as `uid`.
async fn preflight_as(uid: Option<u32>, bus: &str, uuid: &str) -> Output {
    let path = vgpu_client::instance_path(uuid);
    dbus_send_as(
        uid,
        bus,
        path.as_str(),
        "org.vgpumanager.Instance1.Preflight",
    )
    .await
}

/// `dbus-send --print-reply` of the argument-less method `member` on `path`, optionally as `uid`.
async fn dbus_send_as(uid: Option<u32>, bus: &str, path: &str, member: &str) -> Output {
    let mut cmd = match uid {
        Some(u) => {
            let mut c = tokio::process::Command::new("setpriv");
            c.arg(format!("--reuid={u}"))
                .arg(format!("--regid={u}"))
                .arg("--clear-groups")
                .arg("dbus-send");
            c
        }
        None => tokio::process::Command::new("dbus-send"),
    };
    cmd.arg(format!("--bus={bus}")).args([
        "--print-reply",
        "--dest=org.vgpumanager.Manager1",
        path,
        member,
    ]);
    tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("dbus-send hung")
        .expect("dbus-send (Debian package `dbus`) must be installed")
}

fn uuid_of(v: &serde_json::Value) -> String {
    v["uuid"].as_str().unwrap().to_string()
}

/// Root's instances for the checks: a running transient one and a stopped definition.
async fn root_setup(bus: &str) -> (String, String) {
    let running = uuid_of(&ok_json(
        &vgpuctl(bus, &["create", "--profile", "vdi-2g", "--json"]).await,
    ));
    let defined = uuid_of(&ok_json(
        &vgpuctl(bus, &["define", "--profile", "vdi-1g", "--json"]).await,
    ));
    (running, defined)
}

/// Every vgpuctl command that changes something, against root's instances.
fn mutating_commands<'a>(running: &'a str, defined: &'a str) -> Vec<Vec<&'a str>> {
    vec![
        vec!["create", "--profile", "vdi-2g"],
        vec!["create", "--type", "nvidia-231", "--gpu", "0000:01:00.0"],
        vec!["define", "--profile", "vdi-1g", "--autostart"],
        vec!["destroy", running],
        vec!["stop", running],
        vec!["start", defined],
        vec!["undefine", defined],
        vec!["autostart", defined],
        vec!["autostart", defined, "--disable"],
        vec!["open-device", running],
    ]
}

/// The unprivileged caller can read everything.
async fn nobody_reads(bus: &str, running: &str) {
    let list = ok_json(&vgpuctl_as(Some(NOBODY), bus, &["list", "--json"]).await);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|i| i["uuid"] == running),
        "{list}"
    );
    let status = ok(&vgpuctl_as(Some(NOBODY), bus, &["status"]).await);
    assert!(status.starts_with("vgpud "), "{status}");
    let one = ok_json(&vgpuctl_as(Some(NOBODY), bus, &["status", running, "--json"]).await);
    assert_eq!(one["state"], "running");
}

/// Nothing the unprivileged caller tried changed anything.
async fn unchanged(bus: &str, running: &str, defined: &str, count: usize) {
    let list = ok_json(&vgpuctl(bus, &["list", "--json"]).await);
    let all = list.as_array().unwrap();
    assert_eq!(all.len(), count, "instances appeared or vanished: {list}");
    let find = |u: &str| all.iter().find(|i| i["uuid"] == u).cloned().unwrap();
    assert_eq!(find(running)["state"], "running");
    let d = find(defined);
    assert_eq!(
        (
            d["state"].as_str(),
            d["defined"].as_bool(),
            d["autostart"].as_bool()
        ),
        (Some("stopped"), Some(true), Some(false))
    );
}

/// Root may do everything.
async fn root_may_change(bus: &str, running: &str, defined: &str) {
    ok(&vgpuctl(bus, &["start", defined]).await);
    ok(&vgpuctl(bus, &["autostart", defined]).await);
    ok(&vgpuctl(bus, &["stop", defined]).await);
    ok(&vgpuctl(bus, &["undefine", defined]).await);
    ok(&vgpuctl(bus, &["destroy", running]).await);
    let r = reconcile_as(None, bus).await;
    assert!(r.status.success(), "{}", stderr(&r));
}

#[tokio::test(flavor = "multi_thread")]
async fn shipped_policy_on_a_real_dbus_daemon() {
    if !require_root("shipped_policy_on_a_real_dbus_daemon") {
        return;
    }
    let tmp = open_tempdir();
    let policy = repo().join("data/org.vgpumanager.Manager1.conf");
    let bus = start_dbus_daemon(tmp.path(), SYSTEM_DEFAULTS, Some(&policy));
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    let (running, defined) = root_setup(&daemon.bus).await;
    let count = ok_json(&vgpuctl(&daemon.bus, &["list", "--json"]).await)
        .as_array()
        .unwrap()
        .len();

    nobody_reads(&daemon.bus, &running).await;
    for args in mutating_commands(&running, &defined) {
        let o = vgpuctl_as(Some(NOBODY), &daemon.bus, &args).await;
        let line = assert_refused(
            &o,
            &[
                "refused by the D-Bus policy",
                "vgpu-admin",
                "usermod -aG vgpu-admin",
            ],
        );
        assert!(!line.contains(&running), "{line}");
    }
    for r in [
        reconcile_as(Some(NOBODY), &daemon.bus).await,
        preflight_as(Some(NOBODY), &daemon.bus, &running).await,
    ] {
        assert!(!r.status.success());
        assert!(
            stderr(&r).contains("org.freedesktop.DBus.Error.AccessDenied"),
            "{}",
            stderr(&r)
        );
    }
    unchanged(&daemon.bus, &running, &defined, count).await;

    // Only root may own the name: an unprivileged vgpud cannot take it.
    let nobody_state = tmp.path().join("nobody-state");
    std::fs::create_dir(&nobody_state).unwrap();
    nix::unistd::chown(
        &nobody_state,
        Some(nix::unistd::Uid::from_raw(NOBODY)),
        Some(Gid::from_raw(NOBODY)),
    )
    .unwrap();
    let o = Command::new("setpriv")
        .args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".into(),
        ])
        .arg(env!("CARGO_BIN_EXE_vgpud"))
        .args(["--bus", &daemon.bus, "--sim", "demo", "--state-dir"])
        .arg(&nobody_state)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot request org.vgpumanager.Manager1"),
        "{err}"
    );

    root_may_change(&daemon.bus, &running, &defined).await;
    drop(daemon);
    drop(bus);
}

/// With no bus policy in the way, vgpud refuses the unprivileged caller itself.
async fn daemon_refuses_by_itself(bus: &str) {
    let (running, defined) = root_setup(bus).await;
    let count = ok_json(&vgpuctl(bus, &["list", "--json"]).await)
        .as_array()
        .unwrap()
        .len();
    nobody_reads(bus, &running).await;
    let methods = [
        "Create",
        "Create",
        "Define",
        "Destroy",
        "Stop",
        "Start",
        "Undefine",
        "SetAutostart",
        "SetAutostart",
        "OpenDevice",
    ];
    for (args, method) in mutating_commands(&running, &defined)
        .into_iter()
        .zip(methods)
    {
        let o = vgpuctl_as(Some(NOBODY), bus, &args).await;
        assert_refused(
            &o,
            &[
                &format!("uid {NOBODY} (nobody)"),
                &format!("may not call {method}"),
                "root or membership in group vgpu-admin",
                "nobody",
            ],
        );
    }
    let r = reconcile_as(Some(NOBODY), bus).await;
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(
        err.contains("org.vgpumanager.Error.AccessDenied")
            && err.contains("may not call Reconcile"),
        "{err}"
    );
    let r = preflight_as(Some(NOBODY), bus, &running).await;
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(
        err.contains("org.vgpumanager.Error.AccessDenied")
            && err.contains("may not call Preflight"),
        "{err}"
    );
    // MigrationInfo opens the device as Preflight does: the same rights.
    let path = vgpu_client::instance_path(&running);
    let r = dbus_send_as(
        Some(NOBODY),
        bus,
        path.as_str(),
        "org.vgpumanager.Instance1.MigrationInfo",
    )
    .await;
    assert!(!r.status.success());
    let err = stderr(&r);
    assert!(
        err.contains("org.vgpumanager.Error.AccessDenied")
            && err.contains("may not call MigrationInfo"),
        "{err}"
    );
    unchanged(bus, &running, &defined, count).await;
    root_may_change(bus, &running, &defined).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpud_checks_callers_itself_on_a_permissive_dbus_daemon() {
    if !require_root("vgpud_checks_callers_itself_on_a_permissive_dbus_daemon") {
        return;
    }
    let tmp = open_tempdir();
    let bus = start_dbus_daemon(tmp.path(), PERMISSIVE, None);
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    daemon_refuses_by_itself(&daemon.bus).await;
    drop(daemon);
    drop(bus);
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpud_checks_callers_itself_on_the_embedded_bus() {
    if !require_root("vgpud_checks_callers_itself_on_the_embedded_bus") {
        return;
    }
    let tmp = open_tempdir();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    daemon_refuses_by_itself(&daemon.bus).await;
    drop(daemon);
}

/// What the stand-in polkit was asked.
#[derive(Debug, Clone)]
struct Asked {
    subject_kind: String,
    subject_name: String,
    /// The uid the bus reports for that name, looked up while the call is in flight.
    subject_uid: u32,
    action: String,
}

/// A stand-in for polkit's authority: records each question and answers with `allow`.
struct FakeAuthority {
    allow: Arc<AtomicBool>,
    asked: Arc<Mutex<Vec<Asked>>>,
}

#[zbus::interface(name = "org.freedesktop.PolicyKit1.Authority")]
impl FakeAuthority {
    async fn check_authorization(
        &self,
        subject: (String, HashMap<String, OwnedVariant>),
        action_id: String,
        _details: HashMap<String, String>,
        _flags: u32,
        _cancellation_id: String,
        #[zbus(connection)] conn: &Connection,
    ) -> ((bool, bool, HashMap<String, String>),) {
        let name = subject
            .1
            .get("name")
            .and_then(|v| String::try_from(v.clone()).ok())
            .unwrap_or_default();
        let dbus = zbus::fdo::DBusProxy::new(conn).await.unwrap();
        let uid = match zbus::names::BusName::try_from(name.as_str()) {
            Ok(n) => dbus.get_connection_unix_user(n).await.unwrap_or(u32::MAX),
            Err(_) => u32::MAX,
        };
        self.asked.lock().unwrap().push(Asked {
            subject_kind: subject.0,
            subject_name: name,
            subject_uid: uid,
            action: action_id,
        });
        ((self.allow.load(Ordering::SeqCst), false, HashMap::new()),)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn polkit_is_asked_about_the_callers_bus_name() {
    if !require_root("polkit_is_asked_about_the_callers_bus_name") {
        return;
    }
    // The unprivileged caller's own group stands in for vgpu-admin, so that it passes the group check
    // and polkit decides.
    let group = Group::from_gid(Gid::from_raw(NOBODY))
        .unwrap()
        .expect("group 65534")
        .name;
    let tmp = open_tempdir();
    let bus = start_dbus_daemon(tmp.path(), PERMISSIVE, None);
    let allow = Arc::new(AtomicBool::new(false));
    let asked = Arc::new(Mutex::new(Vec::new()));
    let _polkit = zbus::connection::Builder::address(bus.address.as_str())
        .serve_at(
            "/org/freedesktop/PolicyKit1/Authority",
            FakeAuthority {
                allow: Arc::clone(&allow),
                asked: Arc::clone(&asked),
            },
        )
        .name("org.freedesktop.PolicyKit1")
        .build()
        .await
        .unwrap();
    let daemon = Daemon::on_bus(
        &bus.address,
        tmp.path(),
        &tmp.path().join("state"),
        &["--admin-group", &group],
    )
    .await;
    let conn = client(&daemon.bus).await;
    let vgpud_name = zbus::fdo::DBusProxy::new(&conn)
        .await
        .unwrap()
        .get_name_owner("org.vgpumanager.Manager1".try_into().unwrap())
        .await
        .unwrap()
        .to_string();

    // polkit says no: refused, and it was asked about the caller, not about vgpud.
    let o = vgpuctl_as(
        Some(NOBODY),
        &daemon.bus,
        &["create", "--profile", "vdi-2g"],
    )
    .await;
    assert_refused(
        &o,
        &[
            "polkit refused action org.vgpumanager.manage",
            &format!("uid {NOBODY}"),
        ],
    );
    let q = asked.lock().unwrap().clone();
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0].subject_kind, "system-bus-name");
    assert_eq!(q[0].action, "org.vgpumanager.manage");
    assert!(
        q[0].subject_name.starts_with(':') && q[0].subject_name != vgpud_name,
        "{q:?}"
    );
    assert_eq!(
        q[0].subject_uid, NOBODY,
        "polkit must be asked about the caller: {q:?}"
    );

    // polkit says yes: allowed.
    allow.store(true, Ordering::SeqCst);
    let made = ok_json(
        &vgpuctl_as(
            Some(NOBODY),
            &daemon.bus,
            &["create", "--profile", "vdi-2g", "--json"],
        )
        .await,
    );
    assert_eq!(made["state"], "running");
    assert_eq!(asked.lock().unwrap().len(), 2);

    // Root is not asked about (polkit always authorizes uid 0).
    allow.store(false, Ordering::SeqCst);
    ok(&vgpuctl(&daemon.bus, &["destroy", made["uuid"].as_str().unwrap()]).await);
    assert_eq!(asked.lock().unwrap().len(), 2);
    drop(daemon);
    drop(bus);
}
