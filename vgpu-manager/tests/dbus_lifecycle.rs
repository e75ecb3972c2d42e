//! The whole lifecycle over the embedded bus on `--sim demo`: the real `vgpud` driven by the real
//! `vgpuctl`, with the daemon's signals, properties and objects checked from a D-Bus client.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::HashMap;
use std::time::Duration;

use dbus_common::{Daemon, PATIENCE, Sig, Signals, assert_refused, client, ok, ok_json, vgpuctl};
use futures_util::StreamExt;
use serde_json::Value;
use vgpu_client::{
    Gpu1Proxy, INSTANCE_INTERFACE, Instance1Proxy, MANAGER_PATH, SERVICE, instance_path,
};

fn s(v: &Value, k: &str) -> String {
    v[k].as_str()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
        .to_string()
}

/// An uncached proxy: each property read asks the daemon. A cached proxy learns of a change from a
/// `PropertiesChanged` signal that may still be queued on this connection when another process's
/// call has already returned, so its reads right after a `vgpuctl` call could be stale.
async fn instance_proxy<'a>(conn: &zbus::Connection, path: &'a str) -> Instance1Proxy<'a> {
    Instance1Proxy::builder(conn)
        .path(path)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap()
}

/// Polls `f` until it is true (GPU objects are refreshed in the background after changes).
async fn eventually<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never happened: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_through_vgpuctl_with_signals_and_properties() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let conn = client(&bus).await;
    let mut sig = Signals::watch(&conn).await;

    // Create by profile.
    let a = ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await);
    let (a_uuid, a_path) = (s(&a, "uuid"), s(&a, "path"));
    assert_eq!(
        (s(&a, "state"), s(&a, "profile"), s(&a, "owner")),
        ("running".into(), "vdi-2g".into(), "daemon".into())
    );
    assert_eq!(a["defined"], false);
    sig.expect(Sig::Added(a_path.clone(), a_uuid.clone())).await;

    // Create by type, on a GPU that has no instance yet, with a label.
    let status = ok_json(&vgpuctl(&bus, &["status", "--json"]).await);
    let (gpu, gpu_path, type_id, avail) = status["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["instances"].as_array().unwrap().is_empty())
        .find_map(|g| {
            let t = g["types"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["available"].as_u64().unwrap() >= 1)?;
            Some((
                s(g, "id"),
                s(g, "path"),
                s(t, "type"),
                t["available"].as_u64().unwrap(),
            ))
        })
        .expect("the demo host has an idle GPU with a free type");
    let b = ok_json(
        &vgpuctl(
            &bus,
            &[
                "create", "--type", &type_id, "--gpu", &gpu, "--label", "vm-b", "--json",
            ],
        )
        .await,
    );
    let (b_uuid, b_path) = (s(&b, "uuid"), s(&b, "path"));
    assert_eq!(
        (s(&b, "type"), s(&b, "gpu"), s(&b, "label")),
        (type_id.clone(), gpu.clone(), "vm-b".into())
    );
    assert!(b["profile"].is_null(), "{b}");
    sig.expect(Sig::Added(b_path.clone(), b_uuid.clone())).await;

    // Its object's properties.
    let p = instance_proxy(&conn, &b_path).await;
    assert_eq!(p.uuid().await.unwrap(), b_uuid);
    assert_eq!(p.gpu().await.unwrap(), gpu);
    assert_eq!(p.type_id().await.unwrap(), type_id);
    assert_eq!(p.profile().await.unwrap(), "");
    assert_eq!(p.state().await.unwrap(), "running");
    assert_eq!(p.owner().await.unwrap(), "daemon");
    assert_eq!(p.label().await.unwrap(), "vm-b");
    assert!(!p.defined().await.unwrap() && !p.autostart().await.unwrap());
    assert!(p.created_at().await.unwrap() > 1_600_000_000);
    assert_eq!(
        i64::from(p.iommu_group().await.unwrap()),
        b["iommu_group"].as_i64().unwrap_or(-1)
    );

    // The GPU object follows: its Instances lists the new instance and the type has one slot less.
    // Uncached: the GPU object changes in the background, possibly while a caching proxy is built,
    // and zbus drops a PropertiesChanged that comes before its GetAll's reply even when that reply
    // was read before the change (zbus 6 src/proxy/mod.rs, `PropertiesCache::init`: "discard
    // updates prior to the initial population").
    let g = Gpu1Proxy::builder(&conn)
        .path(gpu_path.as_str())
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .unwrap();
    assert_eq!(g.id().await.unwrap(), gpu);
    eventually("Gpu1.Instances lists the new instance", || async {
        g.instances()
            .await
            .unwrap()
            .iter()
            .any(|o| o.as_str() == b_path)
    })
    .await;
    let slots = g.types().await.unwrap();
    let slot = slots.iter().find(|t| t.type_id == type_id).unwrap();
    assert!(u64::from(slot.available) < avail, "{slots:?}");

    // Fill the type: the request that no longer fits is refused as full, in one line.
    let mut extra = Vec::new();
    loop {
        let o = vgpuctl(
            &bus,
            &["create", "--type", &type_id, "--gpu", &gpu, "--json"],
        )
        .await;
        if o.status.success() {
            extra.push(s(&ok_json(&o), "uuid"));
            assert!(
                extra.len() <= avail as usize,
                "more instances than {type_id} offered ({avail})"
            );
            continue;
        }
        assert_refused(&o, &["is full", &type_id, &gpu]);
        break;
    }
    assert_eq!(
        extra.len() + 1,
        avail as usize,
        "capacity of {type_id} on {gpu}"
    );

    // Define (not started), with autostart.
    let d = ok_json(
        &vgpuctl(
            &bus,
            &["define", "--profile", "vdi-1g", "--autostart", "--json"],
        )
        .await,
    );
    let (d_uuid, d_path) = (s(&d, "uuid"), s(&d, "path"));
    assert_eq!(s(&d, "state"), "stopped");
    assert_eq!(
        (d["defined"].clone(), d["autostart"].clone()),
        (Value::Bool(true), Value::Bool(true))
    );
    sig.expect(Sig::Added(d_path.clone(), d_uuid.clone())).await;

    // The ObjectManager knows every instance object.
    let om = zbus::fdo::ObjectManagerProxy::builder(&conn)
        .destination(SERVICE)
        .path(MANAGER_PATH)
        .build()
        .await
        .unwrap();
    let managed = om.get_managed_objects().await.unwrap();
    for path in [&a_path, &b_path, &d_path] {
        let ifaces = managed
            .keys()
            .find(|k| k.as_str() == path)
            .map(|k| &managed[k])
            .expect("managed object");
        assert!(
            ifaces.keys().any(|i| i.as_str() == INSTANCE_INTERFACE),
            "{path}: {ifaces:?}"
        );
    }

    // Start and stop the defined instance: state signals, and PropertiesChanged on its object.
    let dp = instance_proxy(&conn, &d_path).await;
    let props = zbus::fdo::PropertiesProxy::builder(&conn)
        .destination(SERVICE)
        .path(d_path.as_str())
        .build()
        .await
        .unwrap();
    let mut changes = props.receive_properties_changed().await.unwrap();
    assert_eq!(
        ok(&vgpuctl(&bus, &["start", &d_uuid]).await).trim(),
        format!("started {d_uuid}")
    );
    sig.expect(Sig::State(d_path.clone(), d_uuid.clone(), "running".into()))
        .await;
    assert_eq!(dp.state().await.unwrap(), "running");
    let change = tokio::time::timeout(PATIENCE, changes.next())
        .await
        .unwrap()
        .unwrap();
    let args = change.args().unwrap();
    assert_eq!(args.interface_name.as_str(), INSTANCE_INTERFACE);
    assert_eq!(
        args.changed_properties.get("State").map(|v| v.to_string()),
        Some("\"running\"".to_string()),
        "{:?}",
        args.changed_properties
    );
    ok(&vgpuctl(&bus, &["stop", &d_uuid]).await);
    sig.expect(Sig::State(d_path.clone(), d_uuid.clone(), "stopped".into()))
        .await;
    assert_eq!(dp.state().await.unwrap(), "stopped");
    assert_refused(
        &vgpuctl(&bus, &["stop", &d_uuid]).await,
        &[&d_uuid, "not running"],
    );
    ok(&vgpuctl(&bus, &["start", &d_uuid]).await);
    sig.expect(Sig::State(d_path.clone(), d_uuid.clone(), "running".into()))
        .await;

    // Autostart off, then on again.
    assert!(dp.autostart().await.unwrap());
    ok(&vgpuctl(&bus, &["autostart", &d_uuid, "--disable"]).await);
    assert!(!dp.autostart().await.unwrap());
    ok(&vgpuctl(&bus, &["autostart", &d_uuid]).await);
    assert!(dp.autostart().await.unwrap());

    // List shows all of them, with the human table too.
    let list = ok_json(&vgpuctl(&bus, &["list", "--json"]).await);
    let uuids: Vec<String> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| s(i, "uuid"))
        .collect();
    for u in [&a_uuid, &b_uuid, &d_uuid] {
        assert!(uuids.contains(u), "{u} not listed: {uuids:?}");
    }
    let table = ok(&vgpuctl(&bus, &["list"]).await);
    assert!(
        table.starts_with("UUID") && table.contains(&d_uuid) && table.contains("vm-b"),
        "{table}"
    );

    // Undefine a running definition: it stays, transient. Then destroy removes it entirely.
    ok(&vgpuctl(&bus, &["undefine", &d_uuid]).await);
    assert!(!dp.defined().await.unwrap());
    assert_eq!(dp.state().await.unwrap(), "running");
    ok(&vgpuctl(&bus, &["destroy", &d_uuid]).await);
    sig.expect(Sig::Removed(d_path.clone(), d_uuid.clone()))
        .await;
    assert_refused(
        &vgpuctl(&bus, &["status", &d_uuid]).await,
        &["no instance", &d_uuid],
    );

    // Destroy the others.
    for (u, path) in [(&a_uuid, &a_path), (&b_uuid, &b_path)] {
        assert_eq!(
            ok(&vgpuctl(&bus, &["destroy", u]).await).trim(),
            format!("destroyed {u}")
        );
        sig.expect(Sig::Removed(path.clone(), u.clone())).await;
    }
    for u in &extra {
        ok(&vgpuctl(&bus, &["destroy", u]).await);
    }
    let list = ok_json(&vgpuctl(&bus, &["list", "--json"]).await);
    assert!(
        list.as_array()
            .unwrap()
            .iter()
            .all(|i| s(i, "owner") != "daemon"),
        "{list}"
    );
    eventually("Gpu1.Instances is empty again", || async {
        g.instances().await.unwrap().is_empty()
    })
    .await;

    // No state signal for something that did not change state; no stray Added/Removed.
    let rest: Vec<Sig> = sig
        .drain()
        .into_iter()
        .filter(|s| {
            !extra
                .iter()
                .any(|u| matches!(s, Sig::Added(_, x) | Sig::Removed(_, x) if x == u))
        })
        .collect();
    assert!(rest.is_empty(), "unexpected signals: {rest:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_are_one_clear_line_with_exit_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    assert_refused(
        &vgpuctl(&bus, &["destroy", "not-a-uuid"]).await,
        &["'not-a-uuid' is not an mdev UUID"],
    );
    assert_refused(
        &vgpuctl(&bus, &["create", "--profile", "no-such-profile"]).await,
        &["no-such-profile"],
    );
    assert_refused(
        &vgpuctl(
            &bus,
            &["create", "--type", "no-such-type", "--gpu", "0000:00:02.0"],
        )
        .await,
        &["no-such-type"],
    );
    let stranger = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    assert_refused(
        &vgpuctl(&bus, &["start", stranger]).await,
        &["no instance", stranger],
    );
    assert_refused(
        &vgpuctl(&bus, &["undefine", stranger]).await,
        &["no instance", stranger],
    );
    // Foreign instances (made outside vgpu-manager) are listed and changed only by a request that
    // names them: autostart has no definition to change; a stop adopts the device, then removes it.
    let list = ok_json(&vgpuctl(&bus, &["list", "--json"]).await);
    if let Some(f) = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| s(i, "owner") == "foreign")
    {
        let u = s(f, "uuid");
        assert_refused(
            &vgpuctl(&bus, &["autostart", &u]).await,
            &[&u, "not created by vgpu-manager"],
        );
        ok(&vgpuctl(&bus, &["stop", &u]).await);
        assert_refused(&vgpuctl(&bus, &["destroy", &u]).await, &["no instance", &u]);
    }
    // A UUID already in use.
    let a = ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await);
    let u = s(&a, "uuid");
    assert_refused(
        &vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--uuid", &u]).await,
        &[&u, "already exists"],
    );
    // Nothing listening: a clear line too, still exit code 2.
    let nowhere = format!("unix:path={}", tmp.path().join("nobody.sock").display());
    assert_refused(
        &vgpuctl(&nowhere, &["list"]).await,
        &["cannot connect", "nobody.sock"],
    );
    assert_refused(
        &vgpuctl("tcp-nonsense", &["list"]).await,
        &["'tcp-nonsense' is not a bus"],
    );
}

/// `OpenDevice` refusals on a simulated host: each names the instance and the way out. (The hand-off
/// itself needs real VFIO devices: tests/src/kernel/handoff.rs runs it in the real-kernel guest.)
#[tokio::test(flavor = "multi_thread")]
async fn open_device_refusals_name_the_instance_and_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let running = s(
        &ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await),
        "uuid",
    );
    let defined = s(
        &ok_json(&vgpuctl(&bus, &["define", "--profile", "vdi-1g", "--json"]).await),
        "uuid",
    );
    assert_refused(
        &vgpuctl(&bus, &["open-device", &running]).await,
        &[&running, "live kernel"],
    );
    assert_refused(
        &vgpuctl(&bus, &["open-device", &defined]).await,
        &[&defined, "not running", "Start it first"],
    );
    let stranger = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    assert_refused(
        &vgpuctl(&bus, &["open-device", stranger]).await,
        &["no instance", stranger],
    );
    let list = ok_json(&vgpuctl(&bus, &["list", "--json"]).await);
    if let Some(f) = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| s(i, "owner") == "foreign")
    {
        let u = s(f, "uuid");
        assert_refused(
            &vgpuctl(&bus, &["open-device", &u]).await,
            &[&u, "not created by vgpu-manager"],
        );
    }
    // Options are checked before anything is opened.
    let conn = client(&bus).await;
    let path = instance_path(&running);
    let proxy = instance_proxy(&conn, path.as_str()).await;
    for (key, value, expect) in [
        (
            "backend",
            zbus::Variant::from("vfio-v3"),
            "backend 'vfio-v3' is none of",
        ),
        (
            "backend",
            zbus::Variant::from(7u32),
            "unknown option 'backend' of type 'u'",
        ),
        (
            "colour",
            zbus::Variant::from("red"),
            "unknown option 'colour'",
        ),
        (
            "bind",
            zbus::Variant::from("yes"),
            "unknown option 'bind' of type 's'",
        ),
    ] {
        let mut options = HashMap::new();
        options.insert(key, value);
        let e = proxy.open_device(options).await.unwrap_err().to_string();
        assert!(e.contains(expect) && e.contains("Invalid"), "{e}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn definitions_persist_across_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let bus = daemon.bus.clone();
    let auto = s(
        &ok_json(
            &vgpuctl(
                &bus,
                &[
                    "define",
                    "--profile",
                    "vdi-1g",
                    "--autostart",
                    "--label",
                    "pool-1",
                    "--json",
                ],
            )
            .await,
        ),
        "uuid",
    );
    let manual = s(
        &ok_json(&vgpuctl(&bus, &["define", "--profile", "vdi-2g", "--json"]).await),
        "uuid",
    );
    let transient = s(
        &ok_json(&vgpuctl(&bus, &["create", "--profile", "vdi-2g", "--json"]).await),
        "uuid",
    );
    let status = daemon.terminate();
    assert!(
        status.success(),
        "vgpud did not shut down cleanly: {status}"
    );
    assert!(
        !tmp.path().join("bus.sock").exists(),
        "the embedded bus socket was left behind"
    );

    // A fresh simulated host (as after a reboot) with the same state directory.
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let list = ok_json(&vgpuctl(&daemon.bus, &["list", "--json"]).await);
    let find = |u: &str| {
        list.as_array()
            .unwrap()
            .iter()
            .find(|i| s(i, "uuid") == u)
            .cloned()
    };
    let a = find(&auto).unwrap_or_else(|| panic!("autostart definition lost: {list}"));
    assert_eq!(
        (s(&a, "state"), s(&a, "label")),
        ("running".into(), "pool-1".into()),
        "autostart starts it: {a}"
    );
    assert_eq!(a["defined"], true);
    let m = find(&manual).unwrap_or_else(|| panic!("definition lost: {list}"));
    assert_eq!(s(&m, "state"), "stopped");
    assert!(
        find(&transient).is_none(),
        "a transient instance outlived the host: {list}"
    );
    drop(daemon);
}

/// `define --type` of a type the GPU does not list (yet) is kept, as mdevctl keeps it, with a warning
/// that names the parent, the type and what to do; a listed type defines without one.
#[tokio::test(flavor = "multi_thread")]
async fn defining_a_type_the_gpu_does_not_list_warns_and_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(dir.path(), &dir.path().join("state")).await;
    let bus = daemon.bus.clone();
    let listed = ok_json(&vgpuctl(&bus, &["status", "--json"]).await);
    let g = &listed["gpus"][0];
    let gpu = s(g, "id");
    let ty = s(&g["types"][0], "type");
    let u = "2f0c6d1e-8a9b-4c3d-9e2f-1a2b3c4d5e6f";
    let o = vgpuctl(
        &bus,
        &[
            "define",
            "--type",
            "nosuch-type",
            "--gpu",
            &gpu,
            "--uuid",
            u,
        ],
    )
    .await;
    let out = ok(&o);
    assert!(out.contains(&format!("defined {u}")), "{out}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("does not list mdev type nosuch-type")
            && err.contains("starting it fails until the parent offers that type"),
        "{err}"
    );
    let o = vgpuctl(&bus, &["define", "--type", &ty, "--gpu", &gpu]).await;
    ok(&o);
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("does not list"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `vgpuctl offers`: every profile each GPU serves when it has room, with the kernel's occupancy; a
/// create on a homogeneous GPU narrows that GPU to the created type, the destroy widens it again.
#[tokio::test(flavor = "multi_thread")]
async fn offers_follow_what_a_gpu_holds() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let offers = ok_json(&vgpuctl(&bus, &["offers", "--json"]).await);
    let t4 = |v: &Value| -> Vec<Value> {
        v.as_array()
            .unwrap()
            .iter()
            .find(|g| g["gpu"] == "0000:01:00.0")
            .unwrap()["options"]
            .as_array()
            .unwrap()
            .clone()
    };
    let types = |opts: &[Value]| -> Vec<String> {
        let mut t: Vec<String> = opts.iter().map(|o| s(o, "type")).collect();
        t.sort();
        t.dedup();
        t
    };
    assert!(types(&t4(&offers)).len() > 1, "{offers:#}");
    let vdi = t4(&offers)
        .into_iter()
        .find(|o| o["profile"] == "vdi-2g")
        .unwrap();
    assert_eq!(vdi["available"], vdi["max_instances"]);
    assert_eq!(vdi["in_use"], 0);

    let made = ok_json(
        &vgpuctl(
            &bus,
            &[
                "create",
                "--profile",
                "vdi-2g",
                "--gpu",
                "0000:01:00.0",
                "--json",
            ],
        )
        .await,
    );
    let after = ok_json(&vgpuctl(&bus, &["offers", "--json"]).await);
    assert_eq!(types(&t4(&after)), vec![s(&vdi, "type")], "{after:#}");
    let vdi_after = t4(&after)
        .into_iter()
        .find(|o| o["profile"] == "vdi-2g")
        .unwrap();
    assert_eq!(vdi_after["in_use"], 1);
    assert_eq!(
        vdi_after["available"].as_u64().unwrap() + 1,
        vdi_after["max_instances"].as_u64().unwrap()
    );
    let table = ok(&vgpuctl(&bus, &["offers"]).await);
    assert!(
        table.starts_with("GPU") && table.contains("vdi-2g") && table.contains("0000:01:00.0"),
        "{table}"
    );

    ok(&vgpuctl(&bus, &["destroy", &s(&made, "uuid")]).await);
    let again = ok_json(&vgpuctl(&bus, &["offers", "--json"]).await);
    assert_eq!(t4(&again), t4(&offers));
}
