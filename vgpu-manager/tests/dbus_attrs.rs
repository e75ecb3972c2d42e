//! mdev attributes through D-Bus on `--sim demo`: option `attrs` (a(ss)) of Create/Define, kept by a
//! definition (Instance1.Attributes) across a restart of vgpud, and a refused attribute write undoing
//! the create, as mdevctl's start does (mdevctl src/mdev.rs: the device is removed again).
//!
//! The simulated kernel's mdevs have no attribute besides `remove` (mdev-types/sim/src/mdev.rs
//! `render`), so a write to any other name fails with `ENOENT`, as the kernel answers for a name the
//! vendor driver does not have: that is the refused write here, with no hook in the simulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::Path;

use dbus_common::Daemon;
use vgpu_client::{BusAddress, Client, ClientError, NewInstance};

const U: &str = "6c1a2f0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";

/// A GPU of the demo host and one of its types with room left, and that room.
async fn a_type(c: &Client) -> (String, String, u32) {
    c.list_gpus()
        .await
        .unwrap()
        .into_iter()
        .find_map(|g| {
            let t = g.types.iter().find(|t| t.available >= 1)?;
            Some((g.id.clone(), t.type_id.clone(), t.available))
        })
        .expect("the demo host has a type with room")
}

async fn available(c: &Client, gpu: &str, type_id: &str) -> u32 {
    let g = c.list_gpus().await.unwrap();
    let g = g.iter().find(|g| g.id == gpu).unwrap();
    g.types
        .iter()
        .find(|t| t.type_id == type_id)
        .unwrap()
        .available
}

fn request(gpu: &str, type_id: &str, attrs: &[(&str, &str)]) -> NewInstance {
    NewInstance {
        gpu: Some(gpu.to_string()),
        uuid: Some(U.to_string()),
        attrs: attrs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect(),
        ..NewInstance::of_type(type_id)
    }
}

/// vgpud on its embedded bus with its state in `dir/state`, and a client of it.
async fn started(dir: &Path) -> (Daemon, Client) {
    let daemon = Daemon::embedded(dir, &dir.join("state")).await;
    let c = Client::connect(&daemon.bus.parse::<BusAddress>().unwrap())
        .await
        .unwrap();
    (daemon, c)
}

fn daemon_error(e: ClientError) -> (String, String) {
    match e {
        ClientError::Daemon { kind, message } => (kind, message),
        other => panic!("not the daemon's refusal: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_attribute_write_removes_the_new_device_again() {
    let tmp = tempfile::tempdir().unwrap();
    let (daemon, c) = started(tmp.path()).await;
    let (gpu, ty, room) = a_type(&c).await;

    let e = c
        .create(&request(&gpu, &ty, &[("no_such_attribute", "42")]))
        .await
        .expect_err("the kernel refuses the attribute");
    let (kind, message) = daemon_error(e);
    assert_eq!(kind, "Kernel", "{message}");
    for needle in [U, "no_such_attribute", "\"42\"", "ENOENT"] {
        assert!(message.contains(needle), "{needle} not in {message}");
    }
    assert!(
        c.find_instance(U).await.unwrap().is_none(),
        "the device is gone again (a foreign one would be listed)"
    );
    assert_eq!(available(&c, &gpu, &ty).await, room, "its room is back");

    // A definition keeps its attributes; Start writes them, and a refused one leaves it stopped.
    c.define(&request(&gpu, &ty, &[("no_such_attribute", "42")]), false)
        .await
        .unwrap();
    let attrs = c.instance_attrs(U).await.unwrap();
    assert_eq!(attrs, [("no_such_attribute".into(), "42".into())]);
    let (_, message) = daemon_error(c.start(U).await.expect_err("refused again"));
    assert!(message.contains("no_such_attribute"), "{message}");
    let i = c.find_instance(U).await.unwrap().expect("still defined");
    assert_eq!((i.state.as_str(), i.defined), ("stopped", true));
    assert_eq!(available(&c, &gpu, &ty).await, room);
    drop(daemon);

    // The attributes are in the state directory: a new vgpud shows them.
    let (_daemon, c) = started(tmp.path()).await;
    assert_eq!(
        c.instance_attrs(U).await.unwrap(),
        [("no_such_attribute".into(), "42".into())]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn attribute_names_that_are_not_one_file_name_are_refused_before_anything_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let (_daemon, c) = started(tmp.path()).await;
    let (gpu, ty, room) = a_type(&c).await;
    let long = "n".repeat(256);
    for name in ["../remove", "a/b", ".", "..", "", long.as_str()] {
        let e = c
            .create(&request(&gpu, &ty, &[(name, "1")]))
            .await
            .expect_err(name);
        let (kind, message) = daemon_error(e);
        assert_eq!(kind, "Invalid", "{name:?}: {message}");
        assert!(message.contains("not a file name"), "{message}");
    }
    assert!(c.find_instance(U).await.unwrap().is_none());
    assert_eq!(available(&c, &gpu, &ty).await, room);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_attrs_option_of_another_type_is_refused_with_its_type() {
    let tmp = tempfile::tempdir().unwrap();
    let (daemon, c) = started(tmp.path()).await;
    let (gpu, ty, _) = a_type(&c).await;
    let conn = dbus_common::client(&daemon.bus).await;
    let m = vgpu_client::Manager1Proxy::new(&conn).await.unwrap();
    let mut options = std::collections::HashMap::new();
    options.insert("attrs", zbus::Variant::from(vec!["assign_adapter", "5"]));
    let e = m
        .create("type", &ty, &gpu, U, options)
        .await
        .expect_err("attrs must be a(ss)");
    let text = e.to_string();
    assert!(
        text.contains("'attrs' has type 'as'") && text.contains("attrs (a(ss))"),
        "{text}"
    );
    assert!(c.find_instance(U).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_define_takes_attributes_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let (daemon, c) = started(tmp.path()).await;
    let (gpu, ty, _) = a_type(&c).await;
    let args = [
        "define", "--type", &ty, "--gpu", &gpu, "--uuid", U, "--attr", "b=2", "--attr", "a=x=y",
    ];
    dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &args).await);
    assert_eq!(
        c.instance_attrs(U).await.unwrap(),
        [("b".into(), "2".into()), ("a".into(), "x=y".into())]
    );
    let refused = dbus_common::vgpuctl(
        &daemon.bus,
        &["create", "--type", &ty, "--attr", "noequals"],
    )
    .await;
    assert!(!refused.status.success());
}
