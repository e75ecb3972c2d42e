//! Pools with SR-IOV VF slots through the real `vgpud` on `--sim demo`: the shipped VDI floor
//! (`data/pools.d/vdi-floor.toml`: 40 × vdi-2g + 4 × workstation-4g, of which 24 are NVIDIA vendor-VFIO
//! vGPUs on the L40S and 8 are xe VFs of the Flex 170 that the apply enables) applies, re-applies as
//! a no-op, renders its VF slots as `<hostdev type='pci' managed='no'>`, comes back after a host reboot
//! (a fresh simulated kernel, every VF disabled and every vGPU type cleared), shrinks, and a failed apply
//! gives back every VF it took and disables the VFs it enabled.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use dbus_common::{Daemon, client, ok, ok_json, vgpuctl};
use serde_json::Value;
use vgpu_client::{Gpu1Proxy, Manager1Proxy, PoolStatus, PoolSummary, gpu_path};
use vgpu_manager::pool::SlotId;

const L40S: &str = "0000:85:00.0";
const FLEX: &str = "0000:03:00.0";

fn floor() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/pools.d/vdi-floor.toml");
    std::fs::read_to_string(p).unwrap()
}

/// vgpud on a fresh simulated demo host with the state directory `state`, a client connection and
/// the manager proxy.
async fn start(dir: &Path, state: &Path) -> (Daemon, zbus::Connection, Manager1Proxy<'static>) {
    let daemon = Daemon::embedded(dir, state).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    (daemon, conn, m)
}

async fn status(m: &Manager1Proxy<'_>) -> Vec<PoolStatus> {
    serde_json::from_str(&m.pool_status().await.unwrap()).unwrap()
}

/// The VF slots of the pool's status: slot → (GPU, VF, what it holds, state).
fn vf_slots(s: &PoolStatus) -> BTreeMap<String, (String, String, String, String)> {
    s.slots
        .iter()
        .filter_map(|r| {
            Some((
                format!("{}/{}", r.profile, r.index),
                (
                    r.gpu.clone()?,
                    r.vf.clone()?,
                    r.type_id.clone().unwrap_or_default(),
                    r.state.clone(),
                ),
            ))
        })
        .collect()
}

/// How many VF slots are recorded in the state directory.
fn records(state: &Path) -> usize {
    std::fs::read_dir(state.join("vf-slots"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
                .count()
        })
        .unwrap_or(0)
}

/// The number of VFs the Flex 170's backend reads back (its scheduling slots `vf1`…; `pf` is the PF).
async fn flex_vfs(conn: &zbus::Connection) -> usize {
    let g = Gpu1Proxy::builder(conn)
        .path(gpu_path(FLEX))
        .build()
        .await
        .unwrap();
    let v: Value = serde_json::from_str(&g.scheduling().await.unwrap()).unwrap();
    v["state"]["slots"].as_array().map_or(0, |a| {
        a.iter()
            .filter(|s| s["slot"].as_str().is_some_and(|n| n.starts_with("vf")))
            .count()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn the_vdi_floor_takes_vf_slots_and_keeps_them_across_a_reboot() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let (daemon, conn, m) = start(tmp.path(), &state).await;
    assert_eq!(
        flex_vfs(&conn).await,
        0,
        "the demo's Flex 170 boots without VFs"
    );
    // Outside a pool, a VF-backed GPU is refused with the way to get one.
    let o = vgpuctl(
        &daemon.bus,
        &["create", "--profile", "vdi-2g", "--gpu", L40S],
    )
    .await;
    dbus_common::assert_refused(&o, &[L40S, "pool slots", "vgpuctl pool apply"]);

    let summary: PoolSummary = serde_json::from_str(&m.apply(&floor()).await.unwrap()).unwrap();
    // 44 creates and the one enable of the Flex's VFs.
    assert_eq!(
        (summary.created.len(), summary.steps),
        (44, 45),
        "{summary:?}"
    );
    let st = status(&m).await;
    assert_eq!(st.len(), 1);
    assert!(st[0].in_sync, "{:?}", st[0]);
    assert_eq!(st[0].slots.len(), 44);
    // The summary shows the host after the apply, VFs it enabled included, as the status does.
    assert_eq!(summary.slots, st[0].slots);
    assert_eq!(summary.gpus, st[0].gpus);
    let vfs = vf_slots(&st[0]);
    assert_eq!(vfs.len(), 32, "{vfs:?}");
    let on = |gpu: &str| vfs.values().filter(|v| v.0 == gpu).count();
    assert_eq!((on(L40S), on(FLEX)), (24, 8));
    let distinct: BTreeSet<&String> = vfs.values().map(|v| &v.1).collect();
    assert_eq!(distinct.len(), 32, "two slots share a VF: {vfs:?}");
    for (slot, (gpu, vf, holds, state)) in &vfs {
        assert_eq!(state, "running", "{slot}");
        if gpu == L40S {
            assert_eq!(holds, &format!("NVIDIA L40S-2B on VF {vf}"), "{slot}");
        } else {
            assert_eq!(holds, &format!("VF {vf}"), "{slot}");
        }
    }
    assert_eq!(records(&state), 32);
    assert_eq!(flex_vfs(&conn).await, 8);

    // Twice: nothing changes.
    let again: PoolSummary = serde_json::from_str(&m.apply(&floor()).await.unwrap()).unwrap();
    assert!(!again.changed && again.kept == 44, "{again:?}");
    assert_eq!(vf_slots(&status(&m).await[0]), vfs);

    // libvirt XML: the VF slots as PCI hostdevs vgpud keeps bound, the mdev slots by UUID.
    let xml = ok(&vgpuctl(&daemon.bus, &["xml", "vdi-floor"]).await);
    assert_eq!(
        xml.matches("<hostdev mode='subsystem' type='pci' managed='no'>")
            .count(),
        32,
        "{xml}"
    );
    assert_eq!(xml.matches("type='mdev'").count(), 12, "{xml}");
    let one = SlotId::new("vdi-floor", "vdi-2g", 1);
    let (_, vf, _, _) = &vfs["vdi-2g/1"];
    let (bus, rest) = vf[5..].split_once(':').unwrap();
    let (slot, func) = rest.split_once('.').unwrap();
    assert!(
        xml.contains(&format!(
            "<!-- slot vdi-floor/vdi-2g/1 ({}, VF {vf}) -->\n<hostdev mode='subsystem' type='pci' managed='no'>\n  <source>\n    <address domain='0x0000' bus='0x{bus}' slot='0x{slot}' function='0x{func}'/>",
            one.uuid
        )),
        "{xml}"
    );
    let qemu = ok(&vgpuctl(&daemon.bus, &["xml", "vdi-floor", "--qemu"]).await);
    assert!(qemu.contains(&format!("host={vf}")), "{qemu}");

    // A host reboot: every VF is gone and every vGPU type cleared; autostart brings each slot back
    // on the same VF.
    assert!(daemon.terminate().success());
    let (daemon, conn, m) = start(tmp.path(), &state).await;
    let st = status(&m).await;
    assert!(st[0].in_sync, "{:?}", st[0]);
    assert_eq!(vf_slots(&st[0]), vfs);
    assert_eq!(flex_vfs(&conn).await, 8);
    let again: PoolSummary = serde_json::from_str(&m.apply(&floor()).await.unwrap()).unwrap();
    assert!(!again.changed, "{again:?}");

    // Ten desktops: the VF slots go (records dropped, VFs given back), the kept ones stay put.
    let ten = floor().replace("vdi-2g = 40", "vdi-2g = 10");
    let shrunk: PoolSummary = serde_json::from_str(&m.apply(&ten).await.unwrap()).unwrap();
    assert_eq!(shrunk.removed.len(), 30, "{shrunk:?}");
    let st = status(&m).await;
    assert!(st[0].in_sync);
    let left = vf_slots(&st[0]);
    assert_eq!(records(&state), left.len());
    for (slot, v) in &left {
        assert_eq!(Some(v), vfs.get(slot), "{slot} moved");
    }
    // And back to forty: the released VFs are taken again.
    let full: PoolSummary = serde_json::from_str(&m.apply(&floor()).await.unwrap()).unwrap();
    assert_eq!(full.created.len(), 30, "{full:?}");
    assert_eq!(vf_slots(&status(&m).await[0]).len(), 32);
    assert_eq!(records(&state), 32);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_apply_gives_back_the_vfs_it_took() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let (daemon, conn, m) = start(tmp.path(), &state).await;

    // The last step creates workstation-4g/3 on the first T4; its UUID defined by hand as something
    // else (no slot label) makes that step fail after every VF slot was made.
    let plan: Value = serde_json::from_str(&m.plan(&floor()).await.unwrap()).unwrap();
    let last = plan["steps"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["target"]["backend"], "mdev", "{last}");
    let uuid = last["slot"]["uuid"].as_str().unwrap().to_string();
    ok(&vgpuctl(
        &daemon.bus,
        &[
            "define",
            "--type",
            "nvidia-232",
            "--gpu",
            "0000:83:00.0",
            "--uuid",
            &uuid,
        ],
    )
    .await);
    let e = m.apply(&floor()).await.unwrap_err().to_string();
    assert!(
        e.contains("step 45/45") && e.contains("were undone") && e.contains(&uuid),
        "{e}"
    );
    assert_eq!(records(&state), 0, "VF slot records left behind");
    assert_eq!(
        flex_vfs(&conn).await,
        0,
        "the VFs the apply enabled are still on"
    );
    assert!(
        status(&m).await.is_empty(),
        "a failed apply is not recorded"
    );

    // With the obstacle gone the same apply succeeds: every VF was free again.
    ok(&vgpuctl(&daemon.bus, &["undefine", &uuid]).await);
    let list = ok_json(&vgpuctl(&daemon.bus, &["list", "--json"]).await);
    assert!(
        !list
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i["uuid"] == uuid.as_str()),
        "{list}"
    );
    let summary: PoolSummary = serde_json::from_str(&m.apply(&floor()).await.unwrap()).unwrap();
    assert_eq!(summary.created.len(), 44);
    assert_eq!(vf_slots(&status(&m).await[0]).len(), 32);
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_autostart_a_reboot_leaves_vf_slots_stopped_until_the_next_apply() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let manual = floor().replace("autostart = true", "autostart = false");
    let (daemon, _conn, m) = start(tmp.path(), &state).await;
    m.apply(&manual).await.unwrap();
    let vfs = vf_slots(&status(&m).await[0]);
    assert_eq!(vfs.len(), 32);

    // A reboot: nothing is made again by itself; the slots are stopped, the records kept.
    assert!(daemon.terminate().success());
    let (daemon, conn, m) = start(tmp.path(), &state).await;
    let st = status(&m).await;
    assert!(!st[0].in_sync);
    let stopped = vf_slots(&st[0]);
    assert!(stopped.values().all(|v| v.3 == "stopped"), "{stopped:?}");
    assert_eq!(records(&state), 32);
    assert_eq!(flex_vfs(&conn).await, 0);

    // The next apply makes them again, each on its recorded VF (and starts the 12 mdev slots, whose
    // definitions have no autostart either).
    let again: PoolSummary = serde_json::from_str(&m.apply(&manual).await.unwrap()).unwrap();
    assert_eq!((again.created.len(), again.kept), (44, 0), "{again:?}");
    let st = status(&m).await;
    assert!(st[0].in_sync, "{:?}", st[0]);
    assert_eq!(vf_slots(&st[0]), vfs);
    assert_eq!(flex_vfs(&conn).await, 8);
    drop(daemon);
}

/// A crash between writing a slot's record and completing it leaves a pending record (no `[created]`).
/// At the next start, a pending record of a pool that is not applied with autostart is undone and
/// dropped; complete records stay (their slots stopped until the next apply).
#[tokio::test(flavor = "multi_thread")]
async fn a_pending_record_left_by_a_crash_is_undone_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let manual = floor().replace("autostart = true", "autostart = false");
    let (daemon, _conn, m) = start(tmp.path(), &state).await;
    m.apply(&manual).await.unwrap();
    assert!(daemon.terminate().success());

    // One xe VF slot and one NVIDIA vGPU slot are left pending.
    let dir = state.join("vf-slots");
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    let mut victims = Vec::new();
    for gpu in [FLEX, L40S] {
        let victim = files
            .iter()
            .find(|p| {
                std::fs::read_to_string(p)
                    .unwrap()
                    .contains(&format!("gpu = \"{gpu}\""))
            })
            .unwrap()
            .clone();
        let text = std::fs::read_to_string(&victim).unwrap();
        let pending = text.split("\n[created]").next().unwrap().to_string();
        assert_ne!(pending, text, "the record had no [created] table: {text}");
        std::fs::write(&victim, pending).unwrap();
        victims.push(victim);
    }

    let daemon = Daemon::embedded(tmp.path(), &state).await;
    for v in &victims {
        assert!(
            !v.exists(),
            "the pending record {} is still there",
            v.display()
        );
    }
    assert_eq!(records(&state), 30);
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();
    // The next apply makes the dropped slot anew and the others again on their VFs.
    m.apply(&manual).await.unwrap();
    let st = status(&m).await;
    assert!(st[0].in_sync, "{:?}", st[0]);
    assert_eq!(vf_slots(&st[0]).len(), 32);
    drop(daemon);
}
