//! `RemovePool` and the VF-backed offers through the real `vgpud` on `--sim demo`: a one-slot pool
//! pinned to a VF-backed GPU (an xe VF of the Flex 170, an NVIDIA vendor-VFIO vGPU on the L40S, what
//! the DRA plugin applies per claim) takes a VF, reports the VF and its IOMMU group, and lowers the
//! GPU's free VFs in `ListOffers`; removing the pool gives the VF back (record dropped, offers back
//! up), removing it again or removing a pool vgpud never had changes nothing, and a name no pool can
//! have is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::Path;

use dbus_common::{Daemon, client};
use vgpu_client::{GpuOffers, Manager1Proxy, PoolRemoval, PoolStatus, PoolSummary};

const L40S: &str = "0000:85:00.0";
const FLEX: &str = "0000:03:00.0";
const T4: &str = "0000:01:00.0";

fn one_slot(name: &str, gpu: &str) -> String {
    format!(
        "name = \"{name}\"\nautostart = false\n[profiles]\nvdi-2g = 1\n[select]\ngpus = [\"{gpu}\"]\n"
    )
}

async fn offers(m: &Manager1Proxy<'_>, gpu: &str) -> GpuOffers {
    let all: Vec<GpuOffers> = serde_json::from_str(&m.list_offers().await.unwrap()).unwrap();
    all.into_iter().find(|g| g.gpu == gpu).unwrap()
}

async fn status(m: &Manager1Proxy<'_>) -> Vec<PoolStatus> {
    serde_json::from_str(&m.pool_status().await.unwrap()).unwrap()
}

fn records(state: &Path) -> usize {
    std::fs::read_dir(state.join("vf-slots"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_one_slot_vf_pool_takes_a_vf_and_removing_it_gives_the_vf_back() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let conn = client(&daemon.bus).await;
    let m = Manager1Proxy::new(&conn).await.unwrap();

    assert_eq!(offers(&m, L40S).await.vfs.unwrap().free, 32);
    assert_eq!(offers(&m, FLEX).await.vfs.unwrap().enabled, 0);
    let mut vfs = Vec::new();
    for (name, gpu) in [("dra-a", L40S), ("dra-b", FLEX), ("dra-c", T4)] {
        let s: PoolSummary =
            serde_json::from_str(&m.apply(&one_slot(name, gpu)).await.unwrap()).unwrap();
        assert_eq!(s.created.len(), 1, "{s:?}");
        let row = &s.slots[0];
        assert_eq!(row.gpu.as_deref(), Some(gpu));
        assert_eq!(row.state, "running");
        assert!(row.iommu_group.is_some(), "{row:?}");
        if gpu == T4 {
            assert_eq!(row.vf, None);
        } else {
            vfs.push(row.vf.clone().unwrap());
        }
    }
    assert_eq!(records(&state), 2);
    let l40s = offers(&m, L40S).await;
    assert_eq!(l40s.vfs.unwrap().free, 31);
    let vdi = l40s.options.iter().find(|o| o.profile == "vdi-2g").unwrap();
    assert_eq!((vdi.available, vdi.in_use), (23, 1));
    let flex = offers(&m, FLEX).await.vfs.unwrap();
    assert_eq!(
        (flex.enabled, flex.free),
        (8, 7),
        "the apply enabled the 2 GiB split"
    );

    let r: PoolRemoval = serde_json::from_str(&m.remove_pool("dra-a").await.unwrap()).unwrap();
    assert!(r.applied, "{r:?}");
    assert_eq!(r.removed, ["vdi-2g/0"]);
    assert_eq!(offers(&m, L40S).await.vfs.unwrap().free, 32);
    assert_eq!(records(&state), 1);
    let r: PoolRemoval = serde_json::from_str(&m.remove_pool("dra-b").await.unwrap()).unwrap();
    assert_eq!(r.removed, ["vdi-2g/0"]);
    let flex = offers(&m, FLEX).await.vfs.unwrap();
    assert_eq!(
        (flex.enabled, flex.free),
        (8, 8),
        "the VFs stay enabled, all free"
    );
    let r: PoolRemoval = serde_json::from_str(&m.remove_pool("dra-c").await.unwrap()).unwrap();
    assert_eq!(r.removed, ["vdi-2g/0"]);
    assert_eq!(records(&state), 0);
    assert!(status(&m).await.is_empty());
    let instances: serde_json::Value = serde_json::from_str(&dbus_common::ok(
        &dbus_common::vgpuctl(&daemon.bus, &["list", "--json"]).await,
    ))
    .unwrap();
    assert_eq!(
        instances.as_array().unwrap().len(),
        1,
        "only the foreign instance: {instances}"
    );

    // Again, and a pool never applied: nothing to do, no error.
    for name in ["dra-a", "never-applied"] {
        let r: PoolRemoval = serde_json::from_str(&m.remove_pool(name).await.unwrap()).unwrap();
        assert!(!r.applied && r.removed.is_empty(), "{r:?}");
    }
    let e = m.remove_pool("Not A Pool").await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains("is not a pool name"), "{text}");
    // vgpuctl's front end: the same call.
    let out =
        dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["pool", "remove", "dra-c"]).await);
    assert_eq!(out, "vgpud has no pool dra-c: nothing to remove\n");
    // A VF given back can be taken again.
    let s: PoolSummary =
        serde_json::from_str(&m.apply(&one_slot("dra-a", L40S)).await.unwrap()).unwrap();
    assert_eq!(s.created.len(), 1);
    let out =
        dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["pool", "remove", "dra-a"]).await);
    assert_eq!(out, "pool dra-a removed: 1 slot(s) given back (vdi-2g/0)\n");
    assert_eq!(records(&state), 0);
    drop(daemon);
}
