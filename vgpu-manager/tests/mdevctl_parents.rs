//! One UUID defined on several parents, as mdevctl keys definitions (by parent and UUID; one of them
//! runs at a time: mdevctl src/environment.rs `get_defined_device`, mdevctl.rst "define"/"start"):
//! through `vgpuctl` as `mdevctl` and through D-Bus, on `vgpud --sim demo --mdevctl-dir DIR`. vgpud
//! keeps each definition (its state directory and DIR/<parent>/<uuid>), acts on the one a request
//! names, refuses a start without `--parent` as mdevctl does, and keeps both across a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use dbus_common::Daemon;
use vgpu_client::{BusAddress, Client, DefinitionInfo, NewInstance};

const U: &str = "7d2b1c4e-5f60-4a71-8b92-a3b4c5d6e7f8";

/// vgpud with its state in `dir/state` and mdevctl directory `dir/mdevctl.d`, and a client of it.
async fn started(dir: &Path) -> (Daemon, Client) {
    let m = dir.join("mdevctl.d");
    let daemon = Daemon::embedded_with(
        dir,
        &dir.join("state"),
        &["--mdevctl-dir", m.to_str().unwrap()],
    )
    .await;
    let c = Client::connect(&daemon.bus.parse::<BusAddress>().unwrap())
        .await
        .unwrap();
    (daemon, c)
}

/// Two GPUs of the demo host, each with a type that has room: (gpu, type) twice.
async fn two_parents(c: &Client) -> [(String, String); 2] {
    let found: Vec<(String, String)> = c
        .list_gpus()
        .await
        .unwrap()
        .into_iter()
        .filter_map(|g| {
            let t = g.types.iter().find(|t| t.available >= 1)?;
            Some((g.id.clone(), t.type_id.clone()))
        })
        .collect();
    assert!(
        found.len() >= 2,
        "the demo host has two GPUs with room: {found:?}"
    );
    [found[0].clone(), found[1].clone()]
}

/// `mdevctl ARGS` (a link to vgpuctl named mdevctl) against vgpud's bus.
fn mdevctl(dir: &Path, bus: &str, args: &[&str]) -> Output {
    let link = dir.join("bin/mdevctl");
    if !link.exists() {
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &link).unwrap();
    }
    Command::new(&link)
        .args(args)
        .env("VGPU_BUS", bus)
        .env("VGPU_SYSFS_ROOT", dir.join("bin"))
        .output()
        .unwrap()
}

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "mdevctl failed ({}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn file(dir: &Path, parent: &str) -> PathBuf {
    dir.join("mdevctl.d").join(parent).join(U)
}

/// A definition of U on `gpu` of type `ty`.
fn on(gpu: &str, ty: &str) -> NewInstance {
    NewInstance {
        gpu: Some(gpu.to_string()),
        uuid: Some(U.into()),
        ..NewInstance::of_type(ty)
    }
}

/// The definitions of U: (parent, owner, autostart), by parent.
async fn defs_of_u(c: &Client) -> Vec<(String, String, bool)> {
    let mut v: Vec<(String, String, bool)> = c
        .list_definitions()
        .await
        .unwrap()
        .into_iter()
        .filter(|d: &DefinitionInfo| d.uuid == U)
        .map(|d| (d.parent, d.owner, d.autostart))
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn one_uuid_on_two_parents_through_the_mdevctl_front_end() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (daemon, c) = started(dir).await;
    let [(a, ta), (b, tb)] = two_parents(&c).await;
    let bus = daemon.bus.clone();

    ok(&mdevctl(
        dir,
        &bus,
        &["define", "-u", U, "-p", &a, "-t", &ta],
    ));
    // The same UUID on a second parent is a second definition, not a refusal.
    ok(&mdevctl(
        dir,
        &bus,
        &["define", "-u", U, "-p", &b, "-t", &tb, "--auto"],
    ));
    assert!(file(dir, &a).is_file() && file(dir, &b).is_file());
    assert_eq!(defs_of_u(&c).await, {
        let mut w = vec![
            (a.clone(), "daemon".to_string(), false),
            (b.clone(), "daemon".to_string(), true),
        ];
        w.sort();
        w
    });
    // Defined twice on one parent: mdevctl's refusal.
    let again = mdevctl(dir, &bus, &["define", "-u", U, "-p", &b, "-t", &tb]);
    assert_eq!(again.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&again.stderr)
            .contains(&format!("Device {U} on {b} already defined")),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let listed = ok(&mdevctl(dir, &bus, &["list", "--defined"]));
    assert!(
        listed.contains(&format!("{U} {a} {ta} manual"))
            && listed.contains(&format!("{U} {b} {tb} auto")),
        "{listed}"
    );

    // Without --parent a start is ambiguous (mdevctl src/main.rs start_command_helper).
    let amb = mdevctl(dir, &bus, &["start", "-u", U]);
    assert_eq!(amb.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&amb.stderr).contains(&format!(
            "Multiple definitions found for device {U}. Please specify a parent."
        )),
        "{}",
        String::from_utf8_lossy(&amb.stderr)
    );
    assert!(
        c.find_instance(U)
            .await
            .unwrap()
            .is_none_or(|i| i.state != "running")
    );

    // Named: the definition on that parent runs.
    ok(&mdevctl(dir, &bus, &["start", "-u", U, "-p", &b]));
    let i = c.get_instance(U).await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.parent.as_str(), i.type_id.as_str()),
        ("running", b.as_str(), tb.as_str())
    );
    let listed = ok(&mdevctl(dir, &bus, &["list", "--defined"]));
    assert!(
        listed.contains(&format!("{U} {b} {tb} auto (active)")),
        "{listed}"
    );
    assert!(
        !listed.contains(&format!("{U} {a} {ta} manual (active)")),
        "{listed}"
    );
    // The other parent's definition cannot be made the one vgpud acts on while this one runs.
    let e = c.adopt_definition(&a, U).await.unwrap_err().to_string();
    assert!(
        e.contains(&format!("runs on {b}")) && e.contains("stop it first"),
        "{e}"
    );

    ok(&mdevctl(dir, &bus, &["stop", "-u", U]));
    ok(&mdevctl(dir, &bus, &["start", "-u", U, "-p", &a]));
    let i = c.get_instance(U).await.unwrap();
    assert_eq!(
        (i.parent.as_str(), i.type_id.as_str()),
        (a.as_str(), ta.as_str())
    );
    ok(&mdevctl(dir, &bus, &["stop", "-u", U]));

    // Undefine with --parent removes that one only; without, every one (mdevctl undefine_command).
    ok(&mdevctl(dir, &bus, &["undefine", "-u", U, "-p", &a]));
    assert!(!file(dir, &a).exists() && file(dir, &b).is_file());
    assert_eq!(
        defs_of_u(&c).await,
        vec![(b.clone(), "daemon".into(), true)]
    );
    ok(&mdevctl(
        dir,
        &bus,
        &["define", "-u", U, "-p", &a, "-t", &ta],
    ));
    ok(&mdevctl(dir, &bus, &["undefine", "-u", U]));
    assert!(defs_of_u(&c).await.is_empty());
    assert!(!file(dir, &a).exists() && !file(dir, &b).exists());
    assert!(c.find_instance(U).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn both_definitions_survive_a_restart_and_the_autostart_one_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (a, b) = {
        let (_daemon, c) = started(dir).await;
        let [(a, ta), (b, tb)] = two_parents(&c).await;
        // The first (manual) is the one a plain `vgpuctl` call acts on; the second autostarts.
        c.define(&on(&a, &ta), false).await.unwrap();
        let second = c.define(&on(&b, &tb), true).await.unwrap();
        assert_eq!(
            second.parent, a,
            "the instance stays the first definition's: {second:?}"
        );
        // Same UUID, same parent again: refused, nothing changed.
        assert!(c.define(&on(&b, &tb), true).await.is_err());
        assert_eq!(defs_of_u(&c).await.len(), 2);
        (a, b)
    };
    // vgpud restarts (a host reboot): both definitions are back, and the autostart one runs.
    let (_daemon, c) = started(dir).await;
    let defs = defs_of_u(&c).await;
    let mut want = vec![
        (a.clone(), "daemon".to_string(), false),
        (b.clone(), "daemon".to_string(), true),
    ];
    want.sort();
    assert_eq!(defs, want);
    let i = c.get_instance(U).await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.parent.as_str()),
        ("running", b.as_str()),
        "{i:?}"
    );
    assert!(file(dir, &a).is_file() && file(dir, &b).is_file());
    // Undefine through D-Bus removes the running one's definition; the other one remains.
    c.stop(U).await.unwrap();
    c.undefine(U).await.unwrap();
    assert_eq!(
        defs_of_u(&c).await,
        vec![(a.clone(), "daemon".into(), false)]
    );
    assert!(!file(dir, &b).exists() && file(dir, &a).is_file());
}

/// `StartDefinition`: the one definition of a UUID, on the parent named; none, or several without a
/// parent, refused with nothing started; a foreign file taken over and started in the same call.
#[tokio::test(flavor = "multi_thread")]
async fn start_definition_starts_the_one_definition_and_refuses_none_or_several() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_daemon, c) = started(dir).await;
    let [(a, ta), (b, tb)] = two_parents(&c).await;

    // No definition at all.
    let e = c.start_definition(U, None).await.unwrap_err();
    assert!(
        matches!(&e, vgpu_client::ClientError::Daemon { kind, message } if kind == "State" && message.contains(U) && message.contains("no definition")),
        "{e}"
    );

    // One of vgpud's: started.
    c.define(&on(&a, &ta), false).await.unwrap();
    c.start_definition(U, None).await.unwrap();
    assert_eq!(c.get_instance(U).await.unwrap().state, "running");
    c.stop(U).await.unwrap();

    // Two parents: refused without a parent, naming both; with one, that one runs.
    c.define(&on(&b, &tb), false).await.unwrap();
    let e = c.start_definition(U, None).await.unwrap_err().to_string();
    assert!(
        e.contains("several parents") && e.contains(&a) && e.contains(&b),
        "{e}"
    );
    assert_eq!(c.get_instance(U).await.unwrap().state, "stopped");
    let e = c
        .start_definition(U, Some("0000:ff:1f.7"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("0000:ff:1f.7"), "{e}");
    c.start_definition(U, Some(&b)).await.unwrap();
    let i = c.get_instance(U).await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.parent.as_str(), i.type_id.as_str()),
        ("running", b.as_str(), tb.as_str())
    );
    // Destroy removes the running one's definition; the other parent's stays, and goes with its own
    // undefine once it is the one vgpud acts on.
    c.destroy(U).await.unwrap();
    assert_eq!(
        defs_of_u(&c).await,
        vec![(a.clone(), "daemon".to_string(), false)]
    );
    c.adopt_definition(&a, U).await.unwrap();
    c.undefine(U).await.unwrap();
    assert!(defs_of_u(&c).await.is_empty(), "{:?}", defs_of_u(&c).await);

    // A foreign file (the real mdevctl's, or an administrator's): taken over and started at once.
    let f = file(dir, &a);
    std::fs::create_dir_all(f.parent().unwrap()).unwrap();
    std::fs::write(
        &f,
        format!(r#"{{"mdev_type": "{ta}", "start": "manual", "attrs": []}}"#),
    )
    .unwrap();
    assert_eq!(
        defs_of_u(&c).await,
        vec![(a.clone(), "foreign".to_string(), false)]
    );
    c.start_definition(U, None).await.unwrap();
    let i = c.get_instance(U).await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.parent.as_str(), i.owner.as_str()),
        ("running", a.as_str(), "daemon")
    );
    assert_eq!(
        defs_of_u(&c).await,
        vec![(a.clone(), "daemon".to_string(), false)]
    );
    c.destroy(U).await.unwrap();
}
