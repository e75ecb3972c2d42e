//! mdevctl's definition directory as the definitions vgpud shares with mdevctl and libvirt, on
//! `--sim demo --mdevctl-dir DIR`: a definition made through D-Bus is in DIR when the call returns; a
//! file written there by hand (before vgpud starts, or while it runs) is listed as a foreign
//! definition, never started on its own, and taken over by an explicit AdoptDefinition; an edit of
//! vgpud's own file while it runs is taken in; a malformed file never stops vgpud.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dbus_common::{Daemon, PATIENCE};
use vgpu_client::{BusAddress, Client, DefinitionInfo, NewInstance};

const OWN: &str = "6c1a2f0e-3b4d-4e5f-8a9b-0c1d2e3f4a5b";
const FOREIGN: &str = "976d8cc2-4bfc-43b9-b9f9-f4af2de91ab9";
const BROKEN: &str = "59e8b599-afdd-4766-a59e-415ef4f5a492";

/// vgpud with its state in `dir/state` and its mdevctl directory `mdevctl`, and a client of it.
async fn started(dir: &Path, mdevctl: &Path) -> (Daemon, Client) {
    let m = mdevctl.to_str().unwrap();
    let daemon = Daemon::embedded_with(dir, &dir.join("state"), &["--mdevctl-dir", m]).await;
    let c = Client::connect(&daemon.bus.parse::<BusAddress>().unwrap())
        .await
        .unwrap();
    (daemon, c)
}

/// A GPU of the demo host and one of its types with room for two.
async fn a_type(c: &Client) -> (String, String) {
    c.list_gpus()
        .await
        .unwrap()
        .into_iter()
        .find_map(|g| {
            let t = g.types.iter().find(|t| t.available >= 2)?;
            Some((g.id.clone(), t.type_id.clone()))
        })
        .expect("the demo host has a type with room")
}

fn file(mdevctl: &Path, parent: &str, uuid: &str) -> PathBuf {
    mdevctl.join(parent).join(uuid)
}

fn find<'a>(defs: &'a [DefinitionInfo], parent: &str, uuid: &str) -> Option<&'a DefinitionInfo> {
    defs.iter().find(|d| d.parent == parent && d.uuid == uuid)
}

/// Waits (up to [`PATIENCE`]) until `check` holds for vgpud's definitions.
async fn eventually(c: &Client, what: &str, check: impl Fn(&[DefinitionInfo]) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let defs = c.list_definitions().await.unwrap();
        if check(&defs) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: not seen; {defs:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_definition_made_through_dbus_is_in_the_directory_when_the_call_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let mdevctl = tmp.path().join("mdevctl.d");
    let (_daemon, c) = started(tmp.path(), &mdevctl).await;
    let (gpu, ty) = a_type(&c).await;
    let req = NewInstance {
        gpu: Some(gpu.clone()),
        uuid: Some(OWN.into()),
        attrs: vec![("assign_adapter".into(), "5".into())],
        ..NewInstance::of_type(&ty)
    };
    let t0 = Instant::now();
    let made = c.define(&req, true).await.unwrap();
    let path = file(&mdevctl, &made.parent, OWN);
    // Written before the reply: no waiting at all.
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{} not written by the time Define returned: {e}",
            path.display()
        )
    });
    println!("Define to file: {:?}", t0.elapsed());
    let want = format!(
        "{{\n  \"mdev_type\": \"{ty}\",\n  \"start\": \"auto\",\n  \"attrs\": [\n    {{\n      \"assign_adapter\": \"5\"\n    }}\n  ]\n}}"
    );
    assert_eq!(text, want, "mdevctl's format");
    let defs = c.list_definitions().await.unwrap();
    assert_eq!(find(&defs, &made.parent, OWN).unwrap().owner, "daemon");

    c.set_autostart(OWN, false).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains("\"start\": \"manual\""), "{text}");

    // Redefine changes the definition in place, of a running instance too (the device stays). The
    // simulated kernel's devices have no attributes to write, so it starts without any.
    c.redefine(OWN, &ty, false, &[]).await.unwrap();
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("\"attrs\": []")
    );
    c.start(OWN).await.unwrap();
    let attrs = [("assign_domain".to_string(), "0xab".to_string())];
    c.redefine(OWN, &ty, true, &attrs).await.unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"assign_domain\": \"0xab\"") && text.contains("\"start\": \"auto\""),
        "{text}"
    );
    let i = c.find_instance(OWN).await.unwrap().unwrap();
    assert_eq!((i.state.as_str(), i.autostart), ("running", true));
    assert_eq!(c.instance_attrs(OWN).await.unwrap(), attrs);
    // A Redefine that changes nothing writes nothing (each write renames a new file into place).
    let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = inode(&path);
    c.redefine(OWN, &ty, true, &attrs).await.unwrap();
    assert_eq!(
        inode(&path),
        before,
        "an unchanged Redefine rewrote {}",
        path.display()
    );
    c.stop(OWN).await.unwrap();

    c.undefine(OWN).await.unwrap();
    assert!(
        !path.exists(),
        "undefine removes the file before it returns"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn files_written_by_others_are_listed_never_started_and_adopted_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let mdevctl = tmp.path().join("mdevctl.d");
    // A first run only to learn the demo host's GPU and type.
    let (gpu, ty) = {
        let probe = tmp.path().join("probe");
        std::fs::create_dir_all(&probe).unwrap();
        let (_d, c) = started(&probe, &probe.join("mdevctl.d")).await;
        a_type(&c).await
    };
    // Before vgpud starts: a foreign definition marked auto, a malformed file, a call-out directory.
    std::fs::create_dir_all(mdevctl.join(&gpu)).unwrap();
    std::fs::create_dir_all(mdevctl.join("scripts.d/callouts")).unwrap();
    let foreign = format!(r#"{{"mdev_type": "{ty}", "start": "auto", "attrs": []}}"#);
    std::fs::write(file(&mdevctl, &gpu, FOREIGN), &foreign).unwrap();
    std::fs::write(file(&mdevctl, &gpu, BROKEN), "{ not json").unwrap();

    let (daemon, c) = started(tmp.path(), &mdevctl).await;
    let defs = c.list_definitions().await.unwrap();
    let f = find(&defs, &gpu, FOREIGN).expect("the foreign definition is listed");
    assert_eq!((f.owner.as_str(), f.autostart), ("foreign", true));
    assert!(
        find(&defs, &gpu, BROKEN).is_none(),
        "a malformed file is not listed"
    );
    assert!(
        daemon.log().contains(BROKEN),
        "the malformed file is reported by its path"
    );
    // Never started by vgpud on its own, though it says auto and its parent exists.
    assert!(c.find_instance(FOREIGN).await.unwrap().is_none());
    // Nor shadowed by a transient device of its UUID: Create refuses, naming the definition.
    let mut req = NewInstance::of_type(&ty);
    req.gpu = Some(gpu.clone());
    req.uuid = Some(FOREIGN.into());
    let e = c.create(&req).await.unwrap_err();
    assert_eq!(e.kind(), Some("State"), "{e}");
    assert!(
        e.to_string().contains("mdevctl start -u") && e.to_string().contains(&gpu),
        "{e}"
    );
    assert!(c.find_instance(FOREIGN).await.unwrap().is_none());
    assert_eq!(
        std::fs::read_to_string(file(&mdevctl, &gpu, BROKEN)).unwrap(),
        "{ not json",
        "left as it is"
    );

    // `vgpuctl list` shows it beside the instances.
    let listed = dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["list"]).await);
    assert!(
        listed.contains("foreign definitions") && listed.contains(FOREIGN),
        "{listed}"
    );
    // And `--json`: a row of the instance keys, owner foreign, no object path yet.
    let rows = dbus_common::ok_json(&dbus_common::vgpuctl(&daemon.bus, &["list", "--json"]).await);
    let row = rows
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["uuid"] == FOREIGN)
        .unwrap_or_else(|| panic!("the foreign definition is in list --json: {rows}"));
    assert_eq!(row["owner"], "foreign", "{row}");
    assert_eq!(row["parent"], gpu.as_str(), "{row}");
    assert_eq!(row["type"], ty.as_str(), "{row}");
    assert_eq!(
        (
            &row["state"],
            &row["defined"],
            &row["autostart"],
            &row["path"]
        ),
        (
            &"stopped".into(),
            &true.into(),
            &true.into(),
            &serde_json::Value::Null
        ),
        "{row}"
    );

    // Written while vgpud runs: listed too.
    let later = "3eee6cd9-35ad-43bd-9be1-14ee2b7389c9";
    std::fs::write(
        file(&mdevctl, &gpu, later),
        format!(r#"{{"mdev_type": "{ty}", "start": "manual"}}"#),
    )
    .unwrap();
    eventually(&c, "a file written while vgpud runs", |d| {
        find(d, &gpu, later).is_some_and(|x| x.owner == "foreign")
    })
    .await;

    // An explicit request adopts it; then it is vgpud's and can be started.
    let i = c.adopt_definition(&gpu, FOREIGN).await.unwrap();
    assert!(i.defined && i.autostart, "{i:?}");
    let defs = c.list_definitions().await.unwrap();
    assert_eq!(find(&defs, &gpu, FOREIGN).unwrap().owner, "daemon");
    c.start(FOREIGN).await.unwrap();
    assert_eq!(
        c.find_instance(FOREIGN).await.unwrap().unwrap().state,
        "running"
    );

    // An edit of vgpud's own file by someone else (mdevctl writes in place) is taken in.
    std::fs::write(
        file(&mdevctl, &gpu, FOREIGN),
        format!(r#"{{"mdev_type": "{ty}", "start": "manual", "attrs": []}}"#),
    )
    .unwrap();
    eventually(&c, "an edit of vgpud's own file", |d| {
        find(d, &gpu, FOREIGN).is_some_and(|x| x.owner == "daemon" && !x.autostart)
    })
    .await;
    assert!(!c.find_instance(FOREIGN).await.unwrap().unwrap().autostart);

    // A removed file of vgpud's own definition is written again (undefine goes through vgpud).
    std::fs::remove_file(file(&mdevctl, &gpu, FOREIGN)).unwrap();
    let deadline = Instant::now() + PATIENCE;
    while !file(&mdevctl, &gpu, FOREIGN).exists() {
        assert!(
            Instant::now() < deadline,
            "the removed file is not written again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(c.find_instance(FOREIGN).await.unwrap().unwrap().defined);
}

/// The unprivileged user of the attack tests (nobody).
const NOBODY: u32 = 65534;

#[tokio::test(flavor = "multi_thread")]
async fn an_unprivileged_caller_lists_but_cannot_adopt_or_redefine() {
    let tmp = tempfile::tempdir().unwrap();
    let mdevctl = tmp.path().join("mdevctl.d");
    let (daemon, c) = started(tmp.path(), &mdevctl).await;
    let (gpu, ty) = a_type(&c).await;
    let req = NewInstance {
        gpu: Some(gpu.clone()),
        uuid: Some(OWN.into()),
        ..NewInstance::of_type(&ty)
    };
    c.define(&req, false).await.unwrap();
    let foreign = format!(r#"{{"mdev_type": "{ty}", "start": "manual", "attrs": []}}"#);
    std::fs::write(file(&mdevctl, &gpu, FOREIGN), &foreign).unwrap();
    let own_file = std::fs::read_to_string(file(&mdevctl, &gpu, OWN)).unwrap();

    let bus = daemon.bus.clone();
    let listed =
        dbus_common::vgpuctl_as(Some(NOBODY), &bus, &["mdevctl", "list", "--defined"]).await;
    let text = dbus_common::ok(&listed);
    assert!(text.contains(OWN) && text.contains(FOREIGN), "{text}");

    // AdoptDefinition (modify of a foreign definition) and Redefine (modify of vgpud's) are changes.
    for args in [
        &["mdevctl", "modify", "-u", FOREIGN, "--auto"][..],
        &[
            "mdevctl",
            "modify",
            "-u",
            OWN,
            "--addattr",
            "a",
            "--value",
            "1",
        ][..],
    ] {
        let o = dbus_common::vgpuctl_as(Some(NOBODY), &bus, args).await;
        assert!(!o.status.success(), "{args:?} succeeded as nobody");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("vgpu-admin"), "{args:?}: {err}");
    }
    let defs = c.list_definitions().await.unwrap();
    assert_eq!(find(&defs, &gpu, FOREIGN).unwrap().owner, "foreign");
    assert_eq!(
        std::fs::read_to_string(file(&mdevctl, &gpu, FOREIGN)).unwrap(),
        foreign
    );
    assert_eq!(
        std::fs::read_to_string(file(&mdevctl, &gpu, OWN)).unwrap(),
        own_file
    );
    assert!(c.instance_attrs(OWN).await.unwrap().is_empty());
}
