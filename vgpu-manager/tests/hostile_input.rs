//! vgpud against hostile input, where no bus policy filters it (the embedded bus, a permissive
//! `dbus-daemon`): attackers run as uid 65534 (through [`dbus_common::name::attack_as`]), oversized
//! texts come from root (only an authorized caller gets past the check of the caller).
//! * `Properties.Set` of a read-only property answers `PropertyReadOnly` (an unknown one still
//!   `UnknownProperty`), and nothing changes;
//! * arguments wrapped in one structure in place of the argument list answer `InvalidArgs` naming the
//!   expected signature;
//! * a label past 256 bytes or with a control character, a pool text or scheduling requests past
//!   512 KiB are refused with `Error.Invalid` naming the limit, nothing is made, the error messages stay
//!   short, and vgpud's log does not grow with the input (client text is logged clipped, with its
//!   length).
//!
//! vgpud runs with `RLIMIT_NOFILE` 1024 (systemd's default soft limit) and is never to exit.
//!
//! Needs root (to run the attacker as uid 65534) and the Debian package `dbus` (dbus-daemon); not run
//! as root, each test fails, unless `VGPU_TESTS_ALLOW_SKIP=1` is set (then it prints `SKIPPED`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::HashMap;

use dbus_common::name::{Attack, Outcome, attack_as, attacker_main};
use dbus_common::system_bus::{NOBODY, PERMISSIVE, open_tempdir, require_root, start_dbus_daemon};
use dbus_common::{Daemon, client, ok_json, vgpuctl, vgpuctl_as};
use vgpu_client::{MANAGER_PATH, SERVICE};
use zbus::{Connection, OwnedVariant, Variant};

/// The attacker's side of [`attack_as`] (does nothing in a normal run).
#[test]
fn attacker_process() {
    attacker_main();
}

const MANAGER: &str = "org.vgpumanager.Manager1";

/// The resident memory vgpud stays under after the oversized requests (generous: it idles at a few
/// tens of MiB, and each refused 16 MiB message is freed once answered).
const RSS_BOUND_KIB: u64 = 256 << 10;

/// The path of the first GPU object.
async fn a_gpu_path(conn: &Connection) -> String {
    let om = zbus::fdo::ObjectManagerProxy::builder(conn)
        .destination(SERVICE)
        .path(MANAGER_PATH)
        .build()
        .await
        .unwrap();
    let objects = om.get_managed_objects().await.unwrap();
    objects
        .keys()
        .map(|p| p.to_string())
        .find(|p| p.contains("/gpu/"))
        .expect("a GPU object")
}

fn error_of(o: &Outcome) -> (&str, &str) {
    match o {
        Outcome::Error { name, message } => (name, message),
        other => panic!("expected an error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_of_a_read_only_property_answers_property_read_only() {
    if !require_root("set_of_a_read_only_property_answers_property_read_only") {
        return;
    }
    let tmp = open_tempdir();
    let daemon = Daemon::embedded_hostile(tmp.path()).await;
    let bus = daemon.bus.clone();
    let made = ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await);
    let uuid = made["uuid"].as_str().unwrap().to_string();
    let instance = vgpu_client::instance_path(&uuid).to_string();
    let gpu = a_gpu_path(&client(&bus).await).await;
    for (path, interface, property) in [
        (MANAGER_PATH.to_string(), MANAGER, "Version"),
        (instance.clone(), "org.vgpumanager.Instance1", "Label"),
        (instance.clone(), "org.vgpumanager.Instance1", "State"),
        (gpu.clone(), "org.vgpumanager.Gpu1", "Vendor"),
    ] {
        let set = Attack::SetProperty {
            path: path.clone(),
            interface: interface.into(),
            property: property.into(),
            value: "hijacked".into(),
        };
        let got = attack_as(NOBODY, &bus, &set).await;
        let (name, message) = error_of(&got);
        assert_eq!(
            name, "org.freedesktop.DBus.Error.PropertyReadOnly",
            "Set {interface}.{property}: {got:?}"
        );
        assert!(message.contains(property), "{message}");
        // A property that does not exist is still unknown.
        let unknown = Attack::SetProperty {
            path,
            interface: interface.into(),
            property: "NoSuchProperty".into(),
            value: "x".into(),
        };
        let got = attack_as(NOBODY, &bus, &unknown).await;
        assert_eq!(
            error_of(&got).0,
            "org.freedesktop.DBus.Error.UnknownProperty",
            "{got:?}"
        );
    }
    let list = ok_json(&vgpuctl_as(Some(NOBODY), &bus, &["list", "--json"]).await);
    let row = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["uuid"] == uuid.as_str())
        .unwrap();
    assert_eq!(row["state"], "running", "{row}");
    assert_ne!(row["label"], "hijacked", "{row}");
    assert!(daemon.terminate().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_wrapped_in_a_structure_are_refused() {
    if !require_root("arguments_wrapped_in_a_structure_are_refused") {
        return;
    }
    let tmp = open_tempdir();
    let daemon = Daemon::embedded_hostile(tmp.path()).await;
    let bus = daemon.bus.clone();
    let made = ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await);
    let uuid = made["uuid"].as_str().unwrap().to_string();
    for (member, args, want) in [
        ("GetInstance", vec![uuid.clone()], "'s', not '(s)'"),
        ("Destroy", vec![uuid.clone()], "'s', not '(s)'"),
        (
            "PlanScheduling",
            vec!["0000:01:00.0".into(), String::new()],
            "'ss', not '(ss)'",
        ),
    ] {
        let call = Attack::WrappedCall {
            path: MANAGER_PATH.into(),
            interface: MANAGER.into(),
            member: member.into(),
            args,
        };
        let got = attack_as(NOBODY, &bus, &call).await;
        let (name, message) = error_of(&got);
        assert_eq!(
            name, "org.freedesktop.DBus.Error.InvalidArgs",
            "{member}: {got:?}"
        );
        assert!(
            message.contains(&format!(
                "{MANAGER}.{member} takes arguments of signature {want}"
            )),
            "{message}"
        );
    }
    // The instance is untouched, and calls with their arguments are answered as before.
    let list = ok_json(&vgpuctl_as(Some(NOBODY), &bus, &["list", "--json"]).await);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .any(|i| i["uuid"] == uuid.as_str()),
        "{list}"
    );
    assert!(daemon.terminate().success());
}

/// Calls a Manager1 method as root and returns the error (name, message) it must answer.
async fn refused(
    conn: &Connection,
    member: &str,
    body: &(impl serde::Serialize + zbus::DynamicType),
) -> (String, String) {
    let r = conn
        .call_method(Some(SERVICE), MANAGER_PATH, Some(MANAGER), member, body)
        .await;
    match r {
        Err(zbus::Error::MethodError(name, message, _)) => {
            (name.to_string(), message.unwrap_or_default())
        }
        other => panic!("{member} was not refused: {other:?}"),
    }
}

fn assert_invalid(what: &str, (name, message): (String, String), needle: &str) {
    assert_eq!(name, "org.vgpumanager.Error.Invalid", "{what}: {message}");
    assert!(
        message.contains(needle),
        "{what}: {needle:?} not in {message:?}"
    );
    assert!(
        message.len() < 1024,
        "{what}: a {} byte message",
        message.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_input_is_refused_naming_the_limit_and_logged_bounded() {
    if !require_root("oversized_input_is_refused_naming_the_limit_and_logged_bounded") {
        return;
    }
    let tmp = open_tempdir();
    let bus = start_dbus_daemon(tmp.path(), PERMISSIVE, None);
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    daemon.limit_fds();
    let conn = client(&bus.address).await;
    let log_before = daemon.log().len();

    let label = |text: &str| -> HashMap<String, OwnedVariant> {
        HashMap::from([(
            "label".to_string(),
            OwnedVariant::try_from(Variant::from(text)).unwrap(),
        )])
    };
    let huge = "L".repeat(16 << 20);
    for method in ["Create", "Define"] {
        let body = ("profile", "vdi-2g", "", "", label(&huge));
        assert_invalid(
            method,
            refused(&conn, method, &body).await,
            "the label is 16777216 bytes long, more than the limit of 256 bytes",
        );
        let body = ("profile", "vdi-2g", "", "", label("vm\n1"));
        assert_invalid(
            method,
            refused(&conn, method, &body).await,
            "control character at byte 2",
        );
    }
    let toml = format!("name = \"p\"\n#{}\n", "c".repeat(512 << 10));
    for method in ["Plan", "Apply"] {
        assert_invalid(
            method,
            refused(&conn, method, &(toml.as_str(),)).await,
            &format!(
                "the pool text is {} bytes long, more than the limit of 524288 bytes",
                toml.len()
            ),
        );
    }
    let requests = format!("[{}{{\"weight\":1}}]", "{\"weight\":1},".repeat(45_000));
    for method in ["PlanScheduling", "ApplyScheduling"] {
        assert_invalid(
            method,
            refused(&conn, method, &("0000:01:00.0", requests.as_str())).await,
            &format!(
                "the scheduling requests text is {} bytes long, more than the limit of 524288 bytes",
                requests.len()
            ),
        );
    }
    let long_label = format!("[{{\"weight\":1,\"label\":\"{}\"}}]", "l".repeat(300));
    assert_invalid(
        "ApplyScheduling",
        refused(
            &conn,
            "ApplyScheduling",
            &("0000:01:00.0", long_label.as_str()),
        )
        .await,
        "a scheduling request's label is 300 bytes long, more than the limit of 256 bytes",
    );
    // Names and the number of scheduling requests have limits of their own.
    let long_name = "n".repeat(300);
    for method in ["Create", "Define"] {
        let body = ("profile", long_name.as_str(), "", "", label("vm-1"));
        assert_invalid(
            method,
            refused(&conn, method, &body).await,
            "the profile name is 300 bytes long, more than the limit of 255 bytes",
        );
        let body = ("profile", "vdi-2g", long_name.as_str(), "", label("vm-1"));
        assert_invalid(
            method,
            refused(&conn, method, &body).await,
            "the GPU id is 300 bytes long, more than the limit of 255 bytes",
        );
        let body = ("type", long_name.as_str(), "", "", label("vm-1"));
        assert_invalid(
            method,
            refused(&conn, method, &body).await,
            "the mdev type id is 300 bytes long, more than the limit of 64 bytes",
        );
    }
    let too_many = format!("[{}{{\"weight\":1}}]", "{\"weight\":1},".repeat(256));
    for method in ["PlanScheduling", "ApplyScheduling"] {
        assert_invalid(
            method,
            refused(&conn, method, &(long_name.as_str(), "")).await,
            "the GPU id is 300 bytes long, more than the limit of 255 bytes",
        );
        assert_invalid(
            method,
            refused(&conn, method, &("0000:01:00.0", too_many.as_str())).await,
            "the scheduling requests: 257 of them, more than the limit of 256",
        );
    }
    let long_slot = format!("[{{\"weight\":1,\"slot\":\"{long_name}\"}}]");
    assert_invalid(
        "PlanScheduling",
        refused(
            &conn,
            "PlanScheduling",
            &("0000:01:00.0", long_slot.as_str()),
        )
        .await,
        "a scheduling request's slot is 300 bytes long, more than the limit of 255 bytes",
    );
    // An unknown field's name is echoed clipped.
    let odd = format!("[{{\"{}\":1}}]", "f".repeat(100_000));
    assert_invalid(
        "PlanScheduling",
        refused(&conn, "PlanScheduling", &("0000:01:00.0", odd.as_str())).await,
        "bytes, first 256 shown",
    );
    // Nothing was made.
    let list = ok_json(&vgpuctl(&bus.address, &["list", "--json"]).await);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|i| i["label"] != "vm\n1" && i["label"].as_str().unwrap_or("").len() < 300),
        "{list}"
    );

    // Accepted input is logged clipped: the most requests allowed, each with the longest label and
    // slot (0.13 MiB), of a GPU that has no room for them.
    let one = format!(
        "{{\"weight\":1,\"slot\":\"{}\",\"label\":\"{}\"}}",
        "s".repeat(255),
        "l".repeat(256)
    );
    let many = format!("[{}]", vec![one; 256].join(","));
    let r = conn
        .call_method(
            Some(SERVICE),
            MANAGER_PATH,
            Some(MANAGER),
            "ApplyScheduling",
            &("0000:01:00.0", many.as_str()),
        )
        .await;
    if let Err(zbus::Error::MethodError(_, Some(message), _)) = &r {
        assert!(
            message.len() <= 4200,
            "a {} byte error message",
            message.len()
        );
    }
    // Every refusal above and this call are in the log, each line bounded: far less than the input.
    let grown = daemon.log().len() - log_before;
    let rss = daemon.rss_kib();
    eprintln!(
        "vgpud's log grew by {grown} bytes for ~40 MiB of oversized input; its RSS is {rss} KiB"
    );
    // Nothing of the refused input is kept: the daemon stays far below the bound.
    assert!(rss < RSS_BOUND_KIB, "vgpud's RSS is {rss} KiB");
    assert!(
        grown < 64 << 10,
        "vgpud's log grew by {grown} bytes for the oversized requests:\n{}",
        &daemon.log()[log_before..log_before + 4096.min(grown)]
    );
    assert!(daemon.terminate().success());

    // The embedded bus carries messages up to 1 MiB: a text past vgpud's limit but under the bus's is
    // answered with vgpud's limit there too (not a closed connection).
    let embedded = Daemon::embedded(tmp.path(), &tmp.path().join("state-embedded")).await;
    embedded.limit_fds();
    let conn = client(&embedded.bus).await;
    assert_invalid(
        "Plan on the embedded bus",
        refused(&conn, "Plan", &(toml.as_str(),)).await,
        "more than the limit of 524288 bytes",
    );
    assert!(embedded.terminate().success());
}
