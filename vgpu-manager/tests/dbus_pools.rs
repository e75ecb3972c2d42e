//! Pools and scheduling through the real `vgpud` on `--sim demo` over its embedded bus: Manager1
//! `Plan`/`Apply`/`PoolStatus` with `PoolProgress` signals, `vgpuctl pool apply|status`, refusals that
//! change nothing, rollback of a failed apply, persistence over a restart, and the Gpu1 `Scheduling`
//! property with `PlanScheduling`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use dbus_common::{Daemon, PATIENCE, client, ok, ok_json, vgpuctl};
use futures_util::StreamExt;
use serde_json::Value;
use vgpu_client::{
    ClientError, Gpu1Proxy, Manager1Proxy, PoolStatus, PoolSummary, SchedulingView, gpu_path,
};
use vgpu_manager::pool::SlotId;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pools")
        .join(name)
}

fn mixed() -> String {
    std::fs::read_to_string(fixture("vdi-mixed.toml")).unwrap()
}

/// Every instance as `uuid → (state, gpu, type, label, created_at)`.
async fn instances(bus: &str) -> BTreeMap<String, (String, String, String, Value, u64)> {
    let list = ok_json(&vgpuctl(bus, &["list", "--json"]).await);
    list.as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["uuid"].as_str().unwrap().to_string(),
                (
                    i["state"].as_str().unwrap().to_string(),
                    i["gpu"].as_str().unwrap().to_string(),
                    i["type"].as_str().unwrap().to_string(),
                    i["label"].clone(),
                    i["created_at"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

/// The daemon's refusal of a call: (kind, message).
fn refusal(e: zbus::Error) -> (String, String) {
    match ClientError::from_call("Apply", "test bus", e) {
        ClientError::Daemon { kind, message } => (kind, message),
        other => panic!("not a daemon refusal: {other}"),
    }
}

/// Applies `text` and collects the steps its PoolProgress signals report (`done`, `total`, `step`):
/// one step per line of a signal's `step`, the last of them step `done`.
async fn apply_watching(
    m: &Manager1Proxy<'_>,
    text: &str,
) -> (zbus::Result<String>, Vec<(u32, u32, String)>) {
    let mut stream = m.receive_pool_progress().await.unwrap();
    let result = tokio::time::timeout(PATIENCE, m.apply(text))
        .await
        .expect("Apply hung");
    let (mut seen, mut signals) = (Vec::new(), Vec::new());
    // Every signal is sent before the reply; give the client's dispatcher a moment to hand them over.
    while let Ok(Some(s)) = tokio::time::timeout(Duration::from_millis(200), stream.next()).await {
        let a = s.args().unwrap();
        assert_eq!(a.pool, "vdi-mixed");
        let lines: Vec<&str> = a.step.lines().collect();
        assert!(!lines.is_empty(), "a PoolProgress without a step");
        let first = a.done + 1 - lines.len() as u32;
        for (n, line) in (first..).zip(lines) {
            seen.push((n, a.total, line.to_string()));
        }
        signals.push((first, a.done, a.total));
    }
    // Steps may be sent together, but the apply's first step and its last each go out at once:
    // the first alone, the last ending the last signal.
    if let (Some(first), Some(last)) = (signals.first(), signals.last()) {
        assert_eq!((first.0, first.1), (1, 1), "{signals:?}");
        assert_eq!(last.1, last.2, "{signals:?}");
    }
    (result, seen)
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_stable_slots_with_progress_is_idempotent_and_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    let before = instances(&daemon.bus).await;

    // Plan changes nothing and names every create.
    let plan: Value = serde_json::from_str(&m.plan(&mixed()).await.unwrap()).unwrap();
    assert_eq!(plan["pool"], "vdi-mixed");
    assert_eq!(plan["steps"].as_array().unwrap().len(), 12, "{plan}");
    assert_eq!(instances(&daemon.bus).await, before);

    let (result, progress) = apply_watching(&m, &mixed()).await;
    let summary: PoolSummary = serde_json::from_str(&result.unwrap()).unwrap();
    assert!(summary.changed);
    assert_eq!((summary.created.len(), summary.removed.len()), (12, 0));
    let done: Vec<u32> = progress.iter().map(|p| p.0).collect();
    assert_eq!(done, (1..=12).collect::<Vec<_>>(), "{progress:?}");
    assert!(progress.iter().all(|p| p.1 == 12));
    assert!(
        progress[0].2.starts_with("create vdi-2g/"),
        "{:?}",
        progress[0]
    );

    // Every slot runs under its UUIDv5 (one pinned literally, so the identity never drifts), defined
    // with autostart and labelled with its slot; placement per GPU as the pool file describes.
    assert_eq!(
        SlotId::new("vdi-mixed", "vdi-2g", 0).uuid.to_string(),
        "e1c3d5b5-851c-52a3-be68-1c6a6edad9d6"
    );
    let after = instances(&daemon.bus).await;
    assert_eq!(after.len(), before.len() + 12);
    let mut per_gpu: BTreeMap<String, usize> = BTreeMap::new();
    for (profile, n) in [("vdi-2g", 8), ("workstation-4g", 4)] {
        for i in 0..n {
            let uuid = SlotId::new("vdi-mixed", profile, i).uuid.to_string();
            let (st, gpu, _, label, _) = after
                .get(&uuid)
                .unwrap_or_else(|| panic!("slot {profile}/{i} ({uuid}) missing"));
            assert_eq!(st, "running");
            assert_eq!(label, &format!("pool:vdi-mixed/{profile}/{i}"));
            *per_gpu.entry(gpu.clone()).or_default() += 1;
            let one = ok_json(&vgpuctl(&daemon.bus, &["status", &uuid, "--json"]).await);
            assert_eq!(
                (one["defined"].clone(), one["autostart"].clone()),
                (Value::Bool(true), Value::Bool(true))
            );
            assert_eq!(one["profile"], profile);
        }
    }
    assert_eq!(
        per_gpu,
        BTreeMap::from([
            ("0000:00:02.0".to_string(), 1),
            ("0000:01:00.0".to_string(), 4),
            ("0000:83:00.0".to_string(), 7),
        ])
    );
    let loads: Vec<(String, Option<u32>)> = summary
        .gpus
        .iter()
        .map(|g| (g.gpu.clone(), g.numa_node))
        .collect();
    assert_eq!(
        loads,
        [
            ("0000:00:02.0".to_string(), Some(0)),
            ("0000:01:00.0".to_string(), Some(0)),
            ("0000:83:00.0".to_string(), Some(1)),
        ]
    );

    // Twice: nothing changes, no progress, the same instances (same creation times).
    let (result, progress) = apply_watching(&m, &mixed()).await;
    let again: PoolSummary = serde_json::from_str(&result.unwrap()).unwrap();
    assert!(
        !again.changed && again.steps == 0 && again.kept == 12,
        "{again:?}"
    );
    assert!(progress.is_empty(), "{progress:?}");
    assert_eq!(instances(&daemon.bus).await, after);

    // vgpuctl pool status over the bus.
    let status: Vec<PoolStatus> = serde_json::from_value(ok_json(
        &vgpuctl(&daemon.bus, &["pool", "status", "--json"]).await,
    ))
    .unwrap();
    assert_eq!(status.len(), 1);
    assert!(status[0].in_sync && status[0].autostart);
    assert_eq!(status[0].slots.len(), 12);

    // A restart on a fresh simulated kernel (a host reboot): autostart brings every slot back under
    // the same UUID, status is in sync, and applying again changes nothing.
    assert!(daemon.terminate().success());
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let rebooted = instances(&daemon.bus).await;
    for (uuid, (st, gpu, ty, label, _)) in &after {
        if label.is_string() {
            let (st2, gpu2, ty2, _, _) = rebooted.get(uuid).expect("slot back after restart");
            assert_eq!((st2, gpu2, ty2), (st, gpu, ty));
        }
    }
    let out = ok(&vgpuctl(&daemon.bus, &["pool", "status"]).await);
    assert!(out.contains("12 of 12 slots running"), "{out}");
    let out = ok(&vgpuctl(
        &daemon.bus,
        &["pool", "apply", fixture("vdi-mixed.toml").to_str().unwrap()],
    )
    .await);
    assert!(
        out.contains("already applied, nothing changed (12 slots kept)"),
        "{out}"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_change_nothing_and_a_failed_step_is_rolled_back() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    let before = instances(&daemon.bus).await;

    // More workstations than the T4s hold: the exact shortfall, nothing created.
    let big =
        "name = \"cad\"\n[profiles]\nworkstation-4g = 12\n[select]\nmodels = [\"NVIDIA T4\"]\n";
    let (kind, msg) = refusal(m.apply(big).await.unwrap_err());
    assert_eq!(kind, "Shortfall");
    assert!(
        msg.contains("workstation-4g: 4 of 12 placed, 8 missing")
            && msg.contains("nothing was changed"),
        "{msg}"
    );
    assert_eq!(instances(&daemon.bus).await, before);

    // A definition in the way of the last slot: the apply fails there and undoes its 11 creates.
    let plan: Value = serde_json::from_str(&m.plan(&mixed()).await.unwrap()).unwrap();
    let steps = plan["steps"].as_array().unwrap();
    let last = steps.last().unwrap();
    let uuid = last["slot"]["uuid"].as_str().unwrap().to_string();
    let gpu = last["gpu"].as_str().unwrap();
    let other_gpu = if gpu == "0000:01:00.0" {
        "0000:83:00.0"
    } else {
        "0000:01:00.0"
    };
    ok(&vgpuctl(
        &daemon.bus,
        &[
            "define",
            "--type",
            "nvidia-231",
            "--gpu",
            other_gpu,
            "--uuid",
            &uuid,
        ],
    )
    .await);
    let with_blocker = instances(&daemon.bus).await;
    let (kind, msg) = refusal(m.apply(&mixed()).await.unwrap_err());
    assert_eq!(kind, "State", "{msg}");
    assert!(
        msg.contains(&format!("step {}/{}", steps.len(), steps.len()))
            && msg.contains(&format!(
                "{uuid}) is already defined as nvidia-231 on {other_gpu}"
            ))
            && msg.contains(&format!(
                "the {} change(s) this apply made were undone",
                steps.len() - 1
            )),
        "{msg}"
    );
    assert_eq!(instances(&daemon.bus).await, with_blocker);
    let status = ok_json(&vgpuctl(&daemon.bus, &["pool", "status", "--json"]).await);
    assert_eq!(
        status,
        Value::Array(vec![]),
        "a failed apply is not recorded"
    );

    // Once the blocker is gone the same pool applies.
    ok(&vgpuctl(&daemon.bus, &["destroy", &uuid]).await);
    let summary: PoolSummary = serde_json::from_str(&m.apply(&mixed()).await.unwrap()).unwrap();
    assert_eq!(summary.created.len(), 12);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn scheduling_is_readable_and_plannable_per_gpu() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let conn = client(&daemon.bus).await;
    let read = |id: &'static str| {
        let conn = conn.clone();
        async move {
            let g = Gpu1Proxy::builder(&conn)
                .path(gpu_path(id))
                .build()
                .await
                .unwrap();
            let v: SchedulingView = serde_json::from_str(&g.scheduling().await.unwrap()).unwrap();
            v
        }
    };
    let flex = read("0000:03:00.0").await;
    assert_eq!(flex.backend.as_deref(), Some("intel-xe-sriov"));
    assert_eq!(flex.state.as_ref().unwrap().gpu, "0000:03:00.0");
    let t4 = read("0000:83:00.0").await;
    assert_eq!(t4.backend.as_deref(), Some("nvidia-mdev"));
    // The foreign instance on this T4 is a vGPU the scheduler shares time with.
    assert!(!t4.state.unwrap().slots.is_empty());

    let m = Manager1Proxy::new(&conn).await.unwrap();
    let plan: Value = serde_json::from_str(
        &m.plan_scheduling("0000:03:00.0", r#"[{"weight":10},{"weight":30}]"#)
            .await
            .unwrap(),
    )
    .unwrap();
    assert_eq!(plan["backend"], "intel-xe-sriov");
    let q: Vec<u64> = plan["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["quantum_ms"].as_u64().unwrap())
        .collect();
    assert_eq!(q[1], 3 * q[0], "quanta proportional to the weights: {plan}");
    let (kind, msg) = refusal(
        m.plan_scheduling("0000:03:00.0", "[{\"wieght\":1}]")
            .await
            .unwrap_err(),
    );
    assert_eq!(kind, "Invalid");
    assert!(msg.contains("wieght"), "{msg}");
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn reapply_starts_stopped_slots_and_shrinking_removes_the_extra_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    let full: PoolSummary = serde_json::from_str(&m.apply(&mixed()).await.unwrap()).unwrap();
    assert_eq!(full.created.len(), 12);

    // A slot stopped by hand is started again, from its own definition (same creation time).
    let one = SlotId::new("vdi-mixed", "vdi-2g", 1).uuid.to_string();
    let before = instances(&daemon.bus).await[&one].clone();
    ok(&vgpuctl(&daemon.bus, &["stop", &one]).await);
    assert_eq!(instances(&daemon.bus).await[&one].0, "stopped");
    let again: PoolSummary = serde_json::from_str(&m.apply(&mixed()).await.unwrap()).unwrap();
    assert_eq!(
        (again.created.clone(), again.kept),
        (vec!["vdi-2g/1".to_string()], 11)
    );
    assert_eq!(instances(&daemon.bus).await[&one], before);

    // Fewer desktops: the slots past the new count are destroyed (device and definition), the rest
    // stay; one of them stopped by hand (so only its definition exists) goes too.
    let six = SlotId::new("vdi-mixed", "vdi-2g", 6).uuid.to_string();
    ok(&vgpuctl(&daemon.bus, &["stop", &six]).await);
    let smaller = mixed().replace("vdi-2g = 8", "vdi-2g = 4");
    let (result, progress) = apply_watching(&m, &smaller).await;
    let shrunk: PoolSummary = serde_json::from_str(&result.unwrap()).unwrap();
    let mut removed = shrunk.removed.clone();
    removed.sort();
    assert_eq!(removed, ["vdi-2g/4", "vdi-2g/5", "vdi-2g/6", "vdi-2g/7"]);
    assert_eq!((shrunk.created.len(), shrunk.kept), (0, 8));
    assert_eq!(progress.len(), 4);
    assert!(
        progress.iter().all(|p| p.2.starts_with("remove vdi-2g/")),
        "{progress:?}"
    );
    let now = instances(&daemon.bus).await;
    for i in 0..8 {
        let uuid = SlotId::new("vdi-mixed", "vdi-2g", i).uuid.to_string();
        assert_eq!(now.contains_key(&uuid), i < 4, "vdi-2g/{i}");
    }
    let status: Vec<PoolStatus> = serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
    assert_eq!(status[0].wanted["vdi-2g"], 4);
    assert_eq!(status[0].slots.len(), 8);
    assert!(status[0].in_sync);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_step_brings_back_what_the_apply_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    m.apply(&mixed()).await.unwrap();

    // Slot vdi-2g/3 destroyed, and its UUID defined by hand as something else (no slot label).
    let three = SlotId::new("vdi-mixed", "vdi-2g", 3).uuid.to_string();
    ok(&vgpuctl(&daemon.bus, &["destroy", &three]).await);
    ok(&vgpuctl(
        &daemon.bus,
        &[
            "define",
            "--type",
            "nvidia-232",
            "--gpu",
            "0000:01:00.0",
            "--uuid",
            &three,
        ],
    )
    .await);
    let before = instances(&daemon.bus).await;
    let seven = SlotId::new("vdi-mixed", "vdi-2g", 7).uuid.to_string();
    let seven_before = ok_json(&vgpuctl(&daemon.bus, &["status", &seven, "--json"]).await);

    // One desktop fewer: the apply removes vdi-2g/7, then fails to create vdi-2g/3 and so brings
    // vdi-2g/7 back as it was (defined, autostart, running, same profile and label).
    let smaller = mixed().replace("vdi-2g = 8", "vdi-2g = 7");
    let (kind, msg) = refusal(m.apply(&smaller).await.unwrap_err());
    assert_eq!(kind, "State", "{msg}");
    assert!(msg.contains("step 2/2 (create vdi-2g/3"), "{msg}");
    assert!(
        msg.contains("the 1 change(s) this apply made were undone"),
        "{msg}"
    );
    let mut seven_after = ok_json(&vgpuctl(&daemon.bus, &["status", &seven, "--json"]).await);
    // A new definition and device: only its creation time and IOMMU group may differ.
    for k in ["created_at", "iommu_group"] {
        seven_after[k] = seven_before[k].clone();
    }
    assert_eq!(seven_after, seven_before);
    let after = instances(&daemon.bus).await;
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    drop(daemon);
}

/// Polls `PoolStatus` until `pred` holds for pool `name` (pool files are applied in the background).
async fn eventually_status(m: &Manager1Proxy<'_>, name: &str, pred: impl Fn(&PoolStatus) -> bool) {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        let status: Vec<PoolStatus> =
            serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
        if status.iter().any(|p| p.pool == name && pred(p)) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pool {name} never reached the expected state: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `vgpud --pools-dir DIR` applies the pool files there once it is ready and again on SIGHUP; a file
/// that does not load or repeats a pool name is reported and skipped, the others still apply.
#[tokio::test(flavor = "multi_thread")]
async fn pool_files_apply_at_start_and_on_sighup() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("pools.d");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("10-vdi-mixed.toml"), mixed()).unwrap();
    std::fs::write(
        dir.join("20-broken.toml"),
        "name = \"broken\"\n[profiles]\nno-such-profile = 2\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("30-again.toml"),
        "name = \"vdi-mixed\"\n[profiles]\nvdi-2g = 1\n",
    )
    .unwrap();
    let daemon = Daemon::embedded_with(
        tmp.path(),
        &tmp.path().join("state"),
        &["--pools-dir", dir.to_str().unwrap()],
    )
    .await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    eventually_status(&m, "vdi-mixed", |p| p.in_sync && p.slots.len() == 12).await;
    let status: Vec<PoolStatus> = serde_json::from_str(&m.pool_status().await.unwrap()).unwrap();
    assert_eq!(status.len(), 1, "{status:?}");
    let log = daemon.log();
    assert!(
        log.contains("pool file not applied")
            && log.contains("20-broken.toml")
            && log.contains("no-such-profile"),
        "{log}"
    );
    assert!(
        log.contains("30-again.toml") && log.contains("already defined by"),
        "{log}"
    );

    // Four desktops fewer in the file, then SIGHUP: the pool shrinks.
    std::fs::write(
        dir.join("10-vdi-mixed.toml"),
        mixed().replace("vdi-2g = 8", "vdi-2g = 4"),
    )
    .unwrap();
    daemon.hangup();
    eventually_status(&m, "vdi-mixed", |p| p.in_sync && p.slots.len() == 8).await;
    let now = instances(&daemon.bus).await;
    for i in 0..8 {
        let uuid = SlotId::new("vdi-mixed", "vdi-2g", i).uuid.to_string();
        assert_eq!(now.contains_key(&uuid), i < 4, "vdi-2g/{i}");
    }
    drop(daemon);
}

/// `vgpuctl pool apply` shows every step of the apply, in order: its subscription to `PoolProgress`
/// is sent ahead of its call without waiting for the bus, and still misses none; a shrink alike.
#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_pool_apply_shows_every_step_in_order() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    every_step_shown(tmp.path(), daemon).await;
}

/// The same on `dbus-daemon`, whose handling of a connection's messages in order the subscription
/// relies on.
#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_pool_apply_shows_every_step_in_order_on_dbus_daemon() {
    let tmp = tempfile::tempdir().unwrap();
    let bus = dbus_common::system_bus::start_dbus_daemon(
        tmp.path(),
        dbus_common::system_bus::PERMISSIVE,
        None,
    );
    let daemon = Daemon::on_bus(&bus.address, tmp.path(), &tmp.path().join("state"), &[]).await;
    every_step_shown(tmp.path(), daemon).await;
}

async fn every_step_shown(dir: &std::path::Path, daemon: Daemon) {
    let file = fixture("vdi-mixed.toml");
    let steps = |out: &str| -> Vec<(u32, u32)> {
        out.lines()
            .filter_map(|l| {
                let (n, rest) = l.strip_prefix('[')?.split_once('/')?;
                let (total, _) = rest.split_once(']')?;
                Some((n.parse().ok()?, total.parse().ok()?))
            })
            .collect()
    };
    let out = ok(&vgpuctl(&daemon.bus, &["pool", "apply", file.to_str().unwrap()]).await);
    let seen = steps(&out);
    assert_eq!(seen, (1..=12).map(|n| (n, 12)).collect::<Vec<_>>(), "{out}");
    // The pool's file, shrunk: each removal shown once.
    let smaller = mixed().replace("vdi-2g = 8", "vdi-2g = 3");
    assert_ne!(smaller, mixed(), "the fixture's vdi-2g count changed");
    let small = dir.join("small.toml");
    std::fs::write(&small, smaller).unwrap();
    let out = ok(&vgpuctl(&daemon.bus, &["pool", "apply", small.to_str().unwrap()]).await);
    assert_eq!(
        steps(&out),
        (1..=5).map(|n| (n, 5)).collect::<Vec<_>>(),
        "{out}"
    );
    drop(daemon);
}

/// A client whose step handler fails drops its `PoolProgress` subscription all the same: a later
/// apply by someone else sends it no signal.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_step_handler_leaves_no_subscription_behind() {
    #[derive(Debug)]
    struct Stop;
    impl From<vgpu_client::ClientError> for Stop {
        fn from(_: vgpu_client::ClientError) -> Self {
            Stop
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let address: vgpu_client::BusAddress = daemon.bus.parse().unwrap();
    let conn = client(&daemon.bus).await;
    let a = vgpu_client::Client::with_connection(conn.clone(), &address)
        .await
        .unwrap();
    let small = mixed().replace("vdi-2g = 8", "vdi-2g = 3");
    let e = a.apply_pool(&small, |_| Err(Stop)).await;
    assert!(e.is_err(), "the handler's error is returned");
    let mut seen = zbus::MessageStream::from(&conn);
    // Someone else's apply: its signals go out before its reply.
    let b = vgpu_client::Client::connect(&address).await.unwrap();
    b.apply_pool(&mixed(), |_| Ok::<(), vgpu_client::ClientError>(()))
        .await
        .unwrap();
    // A round trip of the first connection to the bus: what was routed to it before is queued now.
    zbus::fdo::DBusProxy::new(&conn)
        .await
        .unwrap()
        .get_id()
        .await
        .unwrap();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::ZERO, seen.next()).await {
        let m = m.unwrap();
        assert_ne!(
            m.header().member().map(|n| n.to_string()).as_deref(),
            Some("PoolProgress"),
            "a PoolProgress signal reached the client whose apply ended"
        );
    }
    drop(daemon);
}
