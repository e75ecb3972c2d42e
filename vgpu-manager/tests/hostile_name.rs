//! vgpud owns `org.vgpumanager.Manager1` exclusively, against a hostile local user (uid 65534):
//! * on a real `dbus-daemon` with the shipped policy (`data/org.vgpumanager.Manager1.conf`, included
//!   in dbus's default system policy, and in a bus that lets anyone own any name): the attacker's
//!   `RequestName(name, ReplaceExisting | DoNotQueue)` is refused by the policy;
//! * where the bus lets anyone own the name (a permissive `dbus-daemon` without the policy, the
//!   embedded bus): vgpud's own flags (no AllowReplacement) keep the name; a `NameLost` signal forged
//!   by the attacker does not make vgpud give up or exit;
//! * a second vgpud (as root) refuses to start while the first owns the name, naming the owner, and
//!   the first is unaffected.
//!
//! In every case vgpud (run with `RLIMIT_NOFILE` 1024, systemd's default soft limit) keeps the name and
//! keeps answering. Needs root (to run the attacker as uid
//! 65534) and the Debian package `dbus` (dbus-daemon); not run as root, each test fails, unless
//! `VGPU_TESTS_ALLOW_SKIP=1` is set (then it prints `SKIPPED: <reason>`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::time::Duration;

use dbus_common::name::{Attack, Outcome, attack_as, attacker_main};
use dbus_common::system_bus::{
    NOBODY, PERMISSIVE, SYSTEM_DEFAULTS, open_tempdir, repo, require_root, start_dbus_daemon,
};
use dbus_common::{Daemon, PATIENCE, client, ok_json, vgpuctl, vgpuctl_as};
use vgpu_client::SERVICE;

/// The attacker's side of [`attack_as`] (does nothing in a normal run).
#[test]
fn attacker_process() {
    attacker_main();
}

/// RequestName flags (D-Bus specification, `org.freedesktop.DBus.RequestName`).
const REPLACE_EXISTING: u32 = 2;
const DO_NOT_QUEUE: u32 = 4;
/// RequestName replies.
const PRIMARY_OWNER: &str = "u 1";

/// The unique name, pid and uid of the owner of vgpud's name, asked by a root client.
async fn owner(bus: &str) -> (String, u32, u32) {
    let conn = client(bus).await;
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
    let unique = dbus
        .get_name_owner(SERVICE.try_into().unwrap())
        .await
        .expect("vgpud's name has an owner");
    let creds = dbus
        .get_connection_credentials(unique.as_ref().into())
        .await
        .unwrap();
    (
        unique.to_string(),
        creds.process_id().unwrap(),
        creds.unix_user_id().unwrap(),
    )
}

/// The name is still vgpud's (same connection, vgpud's pid) and both root and the attacker's uid are
/// answered.
async fn vgpud_still_serves(bus: &str, daemon: &Daemon, first_owner: &str) {
    let (unique, pid, uid) = owner(bus).await;
    assert_eq!(
        unique,
        first_owner,
        "the name changed hands:\n{}",
        daemon.log()
    );
    assert_eq!(pid as i32, daemon.pid().as_raw());
    assert_eq!(uid, 0);
    let list = ok_json(&vgpuctl_as(Some(NOBODY), bus, &["list", "--json"]).await);
    assert!(list.is_array(), "{list}");
    ok_json(&vgpuctl(bus, &["status", "--json"]).await);
}

fn refused_by_policy(o: &Outcome) -> bool {
    o.error_name() == Some("org.freedesktop.DBus.Error.AccessDenied")
}

/// The shipped policy denies the name to uid 65534, on dbus's default system policy and on a bus whose
/// own configuration would let anyone own any name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_policy_keeps_the_name_from_an_unprivileged_user() {
    if !require_root("the_shipped_policy_keeps_the_name_from_an_unprivileged_user") {
        return;
    }
    let policy = repo().join("data/org.vgpumanager.Manager1.conf");
    for (what, defaults) in [
        ("dbus's default system policy", SYSTEM_DEFAULTS),
        ("a bus that lets anyone own names", PERMISSIVE),
    ] {
        let tmp = open_tempdir();
        let bus = start_dbus_daemon(tmp.path(), defaults, Some(&policy));
        let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
        daemon.limit_fds();
        let (first, _, _) = owner(&bus.address).await;
        for flags in [
            REPLACE_EXISTING,
            DO_NOT_QUEUE,
            REPLACE_EXISTING | DO_NOT_QUEUE,
        ] {
            let attack = Attack::RequestName {
                name: SERVICE.into(),
                flags,
            };
            let got = attack_as(NOBODY, &bus.address, &attack).await;
            assert!(
                refused_by_policy(&got),
                "{what}: uid {NOBODY}'s RequestName({SERVICE}, {flags}) got {got:?}"
            );
            vgpud_still_serves(&bus.address, &daemon, &first).await;
        }
        assert!(daemon.terminate().success(), "{what}");
    }
}

/// Where the bus lets anyone own the name (no policy file), vgpud's flags keep it: the attacker is
/// answered "exists" (or queued behind vgpud), and a NameLost forged by the attacker changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vgpud_does_not_let_its_name_be_replaced_on_a_permissive_bus() {
    if !require_root("vgpud_does_not_let_its_name_be_replaced_on_a_permissive_bus") {
        return;
    }
    let tmp = open_tempdir();
    let bus = start_dbus_daemon(tmp.path(), PERMISSIVE, None);
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    daemon.limit_fds();
    hijacks_fail(&bus.address, &daemon, false).await;
    assert!(daemon.terminate().success());
}

/// The same on the embedded bus: whether the bus itself refuses the attacker (an ownership policy) or
/// not, vgpud's flags keep the name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vgpud_does_not_let_its_name_be_replaced_on_the_embedded_bus() {
    if !require_root("vgpud_does_not_let_its_name_be_replaced_on_the_embedded_bus") {
        return;
    }
    let tmp = open_tempdir();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    daemon.limit_fds();
    let bus = daemon.bus.clone();
    hijacks_fail(&bus, &daemon, true).await;
    assert!(daemon.terminate().success());
}

/// Every RequestName of the attacker leaves vgpud the owner, then a forged NameLost is ignored.
async fn hijacks_fail(bus: &str, daemon: &Daemon, policy_may_refuse: bool) {
    let (first, _, _) = owner(bus).await;
    for (flags, want) in [
        (REPLACE_EXISTING | DO_NOT_QUEUE, "u 3"),
        (DO_NOT_QUEUE, "u 3"),
        // Without DoNotQueue the attacker waits in the queue behind vgpud (and leaves it on exit).
        (REPLACE_EXISTING, "u 2"),
    ] {
        let attack = Attack::RequestName {
            name: SERVICE.into(),
            flags,
        };
        let got = attack_as(NOBODY, bus, &attack).await;
        assert_ne!(
            got,
            Outcome::Reply(PRIMARY_OWNER.into()),
            "uid {NOBODY} took {SERVICE} with flags {flags}"
        );
        assert!(
            got == Outcome::Reply(want.into()) || (policy_may_refuse && refused_by_policy(&got)),
            "RequestName({SERVICE}, {flags}) by uid {NOBODY}: {got:?}, expected {want:?}"
        );
        vgpud_still_serves(bus, daemon, &first).await;
    }
    let forged = Attack::ForgeNameLost {
        to: first.clone(),
        name: SERVICE.into(),
    };
    assert_eq!(attack_as(NOBODY, bus, &forged).await, Outcome::Sent);
    // The signal reaches vgpud within moments; give it ample time to act on it (wrongly), then check
    // that it did not: still the owner, still answering, still running.
    tokio::time::sleep(Duration::from_secs(2)).await;
    vgpud_still_serves(bus, daemon, &first).await;
}

/// A second vgpud, even as root, refuses to start while the first owns the name: it exits non-zero
/// with an error naming the owner's connection, pid and uid; the first keeps the name and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_vgpud_refuses_to_start_and_the_first_keeps_its_name() {
    if !require_root("a_second_vgpud_refuses_to_start_and_the_first_keeps_its_name") {
        return;
    }
    let tmp = open_tempdir();
    let policy = repo().join("data/org.vgpumanager.Manager1.conf");
    let bus = start_dbus_daemon(tmp.path(), SYSTEM_DEFAULTS, Some(&policy));
    let first = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    first.limit_fds();
    let (unique, pid, _) = owner(&bus.address).await;
    let second = tokio::process::Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .args(["--bus", &bus.address, "--sim", "demo", "--state-dir"])
        .arg(tmp.path().join("state2"))
        .env("VGPU_LOG", "info")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(PATIENCE, second)
        .await
        .expect("the second vgpud kept running although the name is taken")
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{SERVICE} is already owned on"))
            && stderr.contains(&format!("by connection {unique} (pid {pid}, uid 0)")),
        "{stderr}"
    );
    vgpud_still_serves(&bus.address, &first, &unique).await;
    assert!(first.terminate().success());
}

/// A loss the bus reports (here: the connection gives the name up behind the watch's back, so the bus
/// sends it NameLost) is reported with the owner now (none), which makes vgpud exit non-zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_the_bus_takes_away_is_reported_as_lost() {
    use vgpu_manager::daemon::dbus::bus_name::{self, NameError};
    if !require_root("a_name_the_bus_takes_away_is_reported_as_lost") {
        return;
    }
    let tmp = open_tempdir();
    let bus = start_dbus_daemon(tmp.path(), PERMISSIVE, None);
    let conn = client(&bus.address).await;
    let mut owned = bus_name::own(&conn, SERVICE, &bus.address).await.unwrap();
    // A second owner is refused, naming this one.
    let other = client(&bus.address).await;
    match bus_name::own(&other, SERVICE, &bus.address).await {
        Err(NameError::Taken { owner, .. }) => {
            assert_eq!(
                owner.unique.as_deref(),
                conn.unique_name().map(|u| u.as_str())
            );
            assert_eq!(owner.pid, Some(std::process::id()));
        }
        other => panic!("a second owner was not refused: {other:?}"),
    }
    let dbus = zbus::fdo::DBusProxy::new(&conn).await.unwrap();
    dbus.release_name(SERVICE.try_into().unwrap())
        .await
        .unwrap();
    let lost = tokio::time::timeout(PATIENCE, owned.lost())
        .await
        .expect("the loss was never noticed");
    match lost {
        NameError::Lost { owner, .. } => assert_eq!(owner.unique, None),
        other => panic!("{other:?}"),
    }
}
