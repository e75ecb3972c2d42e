//! VF-backed devices through the real `vgpu-dra-plugin` and the real `vgpud` on the simulated `demo`
//! host (its simulated kernel kept in a journal the test reads back): the NVIDIA L40S (vendor-VFIO
//! vGPU types on its 32 VFs) and the Intel Flex 170 (xe, SR-IOV off at boot) are published with a
//! `vfs` counter of their free VFs; a claim for a device of each makes a one-slot vgpud pool per
//! device, the VF set up in the simulated sysfs (the vGPU type written, the VF bound to vfio-pci),
//! the CDI spec naming the VF's `/dev/vfio/<group>` and the metadata its PCI address; unprepare gives
//! the VFs back; `kill -9` between the checkpoint's phases is rolled back at the next start; a pool
//! of this driver that no claim holds is removed at start while other pools stay; and the counters
//! follow what happens outside the plugin.
//!
//! Needs `target/debug/vgpud` (`cargo test --workspace` builds it) or `$VGPUD`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use vgpu_dra::pb::dra_v1;
use vgpu_host::HostExt;

const NS: &str = "vms";
const L40S: &str = "0000:85:00.0";
const FLEX: &str = "0000:03:00.0";
const L40S_DEV: &str = "gpu-0000-85-00-0-vdi-2g-0";
const FLEX_DEV: &str = "gpu-0000-03-00-0-vdi-2g-0";

struct World {
    tmp: tempfile::TempDir,
    vgpud: Vgpud,
    api: FakeApi,
    plugin: Plugin,
}

async fn world(failpoint: Option<&str>) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let vgpud = Vgpud::start_journaled(tmp.path()).await;
    let api = FakeApi::start(tmp.path());
    let plugin = Plugin::start(tmp.path(), &vgpud, &api, failpoint).await;
    World {
        tmp,
        vgpud,
        api,
        plugin,
    }
}

fn generation(slices: &[Value]) -> i64 {
    slices
        .iter()
        .map(|s| s["spec"]["pool"]["generation"].as_i64().unwrap())
        .max()
        .unwrap_or(0)
}

/// The pool once a complete generation newer than `after` is published and `want` holds of it.
async fn published(w: &World, after: i64, want: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let s = w.api.slices();
        let g = generation(&s);
        let complete = !s.is_empty()
            && s.iter().all(|x| {
                x["spec"]["pool"]["generation"] == g
                    && x["spec"]["pool"]["resourceSliceCount"] == s.len()
            });
        if g > after && complete && want(&s) {
            assert_eq!(w.api.rejected(), vec![], "the API server refused slices");
            let errors = openapi::pool_rules(&s);
            assert!(errors.is_empty(), "pool rules: {errors:#?}");
            return s;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no such generation after {after}; counters {:#?}\nrefused {:?}\nplugin log:\n{}",
            counters(&s),
            w.api.rejected(),
            w.plugin.proc.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counter set → counter → value.
fn counters(slices: &[Value]) -> BTreeMap<String, BTreeMap<String, String>> {
    slices
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            let values = c["counters"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v["value"].as_str().unwrap().to_string()))
                .collect();
            (c["name"].as_str().unwrap().to_string(), values)
        })
        .collect()
}

fn vfs(slices: &[Value], set: &str) -> Option<String> {
    counters(slices).get(set)?.get("vfs").cloned()
}

fn device<'a>(slices: &'a [Value], name: &str) -> Option<&'a Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .find(|d| d["name"] == name)
}

async fn prepare(w: &World, uid: &str) -> dra_v1::NodePrepareResourcesResponse {
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    k.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
        claims: vec![claim_ref(NS, "vm-a", uid)],
    })
    .await
    .unwrap()
    .into_inner()
}

async fn unprepare(w: &World, uid: &str) -> dra_v1::NodeUnprepareResourcesResponse {
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    k.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
        claims: vec![claim_ref(NS, "vm-a", uid)],
    })
    .await
    .unwrap()
    .into_inner()
}

/// The pools of the plugin (named `dra-…`) in vgpud now: name → (GPU, VF, IOMMU group, state).
async fn dra_pools(w: &World) -> BTreeMap<String, (String, String, u32, String)> {
    w.vgpud
        .client
        .pool_status()
        .await
        .unwrap()
        .into_iter()
        .filter(|p| p.pool.starts_with("dra-"))
        .map(|p| {
            let r = &p.slots[0];
            (
                p.pool.clone(),
                (
                    r.gpu.clone().unwrap_or_default(),
                    r.vf.clone().unwrap_or_default(),
                    r.iommu_group.unwrap_or_default(),
                    r.state.clone(),
                ),
            )
        })
        .collect()
}

/// What the simulated kernel says of VF `vf`: its driver, and its NVIDIA vGPU type where it has one.
fn vf_state(dir: &Path, vf: &str) -> (Option<String>, Option<String>) {
    let sys = Vgpud::sysfs(dir);
    let dev = Path::new("/sys/bus/pci/devices").join(vf);
    let driver = sys.link_name(&dev.join("driver")).ok().flatten();
    let vgpu = sys.read_trimmed(&dev.join("nvidia/current_vgpu_type")).ok();
    (driver, vgpu)
}

fn read_json(p: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vf_backed_devices_are_published_prepared_as_pool_slots_and_given_back() {
    let w = world(None).await;
    let first = published(&w, 0, |_| true).await;
    // Every VF of the L40S is free; the Flex 170 has SR-IOV off: 16 VFs of the 1 GiB split.
    assert_eq!(vfs(&first, "gpu-0000-85-00-0").as_deref(), Some("32"));
    assert_eq!(vfs(&first, "gpu-0000-03-00-0").as_deref(), Some("16"));
    assert_eq!(
        vfs(&first, "gpu-0000-01-00-0"),
        None,
        "an mdev GPU counts no VFs"
    );
    for dev in [L40S_DEV, FLEX_DEV] {
        let d = device(&first, dev).unwrap_or_else(|| panic!("{dev} is not published"));
        assert_eq!(d["consumesCounters"][0]["counters"]["vfs"]["value"], "1");
    }
    assert_eq!(
        device(&first, L40S_DEV).unwrap()["attributes"]["backend"]["string"],
        "nvidia-vendor-vfio"
    );
    assert_eq!(
        device(&first, FLEX_DEV).unwrap()["attributes"]["backend"]["string"],
        "sriov-vf"
    );
    let offers = w.vgpud.client.list_offers().await.unwrap();
    let l40s = offers.iter().find(|g| g.gpu == L40S).unwrap();
    let vdi = l40s.options.iter().find(|o| o.profile == "vdi-2g").unwrap();
    let on_l40s = (0..64)
        .filter(|i| device(&first, &format!("gpu-0000-85-00-0-vdi-2g-{i}")).is_some())
        .count();
    assert_eq!(on_l40s as u32, vdi.max_instances);

    w.api.put(claim(
        NS,
        "vm-a",
        "uid-a",
        &[("vgpu", NODE, L40S_DEV), ("vgpu", NODE, FLEX_DEV)],
    ));
    let g0 = generation(&w.api.slices());
    let r = prepare(&w, "uid-a").await;
    assert_eq!(r.claims["uid-a"].error, "", "{r:?}");
    assert_eq!(r.claims["uid-a"].devices.len(), 2);

    // vgpud holds one running slot per device, each on its own VF of the device's GPU.
    let pools = dra_pools(&w).await;
    assert_eq!(pools.len(), 2, "{pools:?}");
    let on = |gpu: &str| pools.values().find(|p| p.0 == gpu).cloned().unwrap();
    let (_, l40s_vf, l40s_group, state) = on(L40S);
    assert_eq!(state, "running");
    let (_, flex_vf, flex_group, _) = on(FLEX);
    assert!(l40s_vf.starts_with("0000:85:"), "{l40s_vf}");
    assert!(flex_vf.starts_with("0000:03:"), "{flex_vf}");
    // The simulated kernel: the L40S VF has the 2 GiB type, the xe VF is on vfio-pci.
    assert_eq!(vf_state(w.tmp.path(), &l40s_vf).1.as_deref(), Some("1146"));
    assert_eq!(
        vf_state(w.tmp.path(), &flex_vf).0.as_deref(),
        Some("vfio-pci")
    );
    // No mdev was made for them.
    assert!(
        w.vgpud
            .instances()
            .await
            .iter()
            .all(|i| !i.label.starts_with("dra:"))
    );

    // The CDI spec gives each VF's group; the metadata names each VF, and no mdev.
    let spec = read_json(&w.plugin.cdi_spec("uid-a"));
    let nodes: Vec<String> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["containerEdits"]["deviceNodes"][0]["path"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        nodes,
        [
            format!("/dev/vfio/{l40s_group}"),
            format!("/dev/vfio/{flex_group}")
        ]
    );
    let md = read_json(&w.plugin.metadata_file("uid-a", "vgpu"));
    let devs = md["requests"][0]["devices"].as_array().unwrap();
    let bus_ids: Vec<&str> = devs
        .iter()
        .map(|d| {
            assert!(d["attributes"].get("mdevUUID").is_none(), "{d}");
            d["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(bus_ids, [l40s_vf.as_str(), flex_vf.as_str()]);
    let ck = w.plugin.checkpoint();
    let recorded: Vec<&str> = ck["claims"]["uid-a"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["vgpud_pool"].as_str().unwrap())
        .collect();
    assert_eq!(recorded.len(), 2);
    assert!(recorded.iter().all(|p| pools.contains_key(*p)));

    // A retry answers the same, making nothing new.
    let again = prepare(&w, "uid-a").await;
    assert_eq!(again.claims["uid-a"], r.claims["uid-a"]);
    assert_eq!(dra_pools(&w).await, pools);

    // Republished: our slot on the L40S still counts as this driver's (the scheduler counts the
    // allocation), the Flex 170 now has 8 VFs of 2 GiB (the split the slot fixed).
    let after = published(&w, g0, |s| {
        vfs(s, "gpu-0000-03-00-0").as_deref() == Some("8")
    })
    .await;
    assert_eq!(vfs(&after, "gpu-0000-85-00-0").as_deref(), Some("32"));
    assert!(device(&after, "gpu-0000-03-00-0-vdi-2g-7").is_some());
    assert!(
        device(&after, "gpu-0000-03-00-0-vdi-1g-8").is_none(),
        "1 GiB split is gone"
    );

    // A VF slot made outside the plugin (an operator's pool) lowers the counter; removing it
    // raises it again.
    let g1 = generation(&after);
    let floor = "name = \"floor\"\nautostart = false\n[profiles]\nvdi-2g = 1\n[select]\ngpus = [\"0000:85:00.0\"]\n";
    w.vgpud
        .client
        .apply_pool(floor, |_| Ok::<(), vgpu_client::ClientError>(()))
        .await
        .unwrap();
    let lower = published(&w, g1, |s| {
        vfs(s, "gpu-0000-85-00-0").as_deref() == Some("31")
    })
    .await;
    w.vgpud.client.remove_pool("floor").await.unwrap();
    published(&w, generation(&lower), |s| {
        vfs(s, "gpu-0000-85-00-0").as_deref() == Some("32")
    })
    .await;

    // Unprepare: the pools are gone, the VFs given back, the files removed.
    let r = unprepare(&w, "uid-a").await;
    assert_eq!(r.claims["uid-a"].error, "");
    assert!(dra_pools(&w).await.is_empty());
    assert_eq!(vf_state(w.tmp.path(), &l40s_vf).1.as_deref(), Some("0"));
    assert_eq!(vf_state(w.tmp.path(), &flex_vf).0, None);
    assert!(!w.plugin.cdi_spec("uid-a").exists());
    let offers = w.vgpud.client.list_offers().await.unwrap();
    let l40s = offers.iter().find(|g| g.gpu == L40S).unwrap();
    assert_eq!(l40s.vfs.unwrap().free, 32);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_the_phases_gives_the_vf_back_and_orphans_are_removed_at_start() {
    for failpoint in ["after-create", "after-plan"] {
        let mut w = world(Some(failpoint)).await;
        w.api
            .put(claim(NS, "vm-a", "uid-k", &[("vgpu", NODE, L40S_DEV)]));
        let socket = w.plugin.dra_socket();
        let hung = tokio::spawn(async move {
            let mut k = Kubelet::v1(&socket).await;
            k.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![claim_ref(NS, "vm-a", "uid-k")],
            })
            .await
        });
        eventually("the failpoint", || {
            w.plugin.proc.log().contains("failpoint reached")
        })
        .await;
        let made = dra_pools(&w).await;
        assert_eq!(
            made.len(),
            usize::from(failpoint == "after-create"),
            "{failpoint}"
        );
        let vf = made.values().next().map(|p| p.1.clone());
        if let Some(vf) = &vf {
            assert_eq!(vf_state(w.tmp.path(), vf).1.as_deref(), Some("1146"));
        }
        w.plugin.proc.kill9();
        let _ = hung.await;

        // Beside it: an orphan of this driver (a pool no claim of the checkpoint holds) and an
        // operator's pool, which must stay.
        let orphan = vgpu_dra::vf_slot::pool_name("00000000-0000-0000-0000-0000000000aa");
        let orphan_pool = vgpu_dra::vgpud::SlotPool {
            name: orphan.clone(),
            description: vgpu_dra::vf_slot::description(DRIVER, NS, "gone", L40S_DEV),
            profile: "vdi-2g".into(),
            gpu: L40S.into(),
        };
        let apply = |text: String| {
            let c = &w.vgpud.client;
            async move {
                c.apply_pool(&text, |_| Ok::<(), vgpu_client::ClientError>(()))
                    .await
                    .unwrap()
            }
        };
        apply(orphan_pool.toml()).await;
        let mut operator = orphan_pool.clone();
        operator.name = "desktops".into();
        operator.description = "office".into();
        apply(operator.toml()).await;

        w.plugin.restart(&w.vgpud, &w.api, None).await;
        assert!(
            dra_pools(&w).await.is_empty(),
            "{failpoint}: {:?}",
            dra_pools(&w).await
        );
        if let Some(vf) = &vf {
            assert_eq!(
                vf_state(w.tmp.path(), vf).1.as_deref(),
                Some("0"),
                "{failpoint}"
            );
        }
        let names: Vec<String> = w
            .vgpud
            .client
            .pool_status()
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.pool)
            .collect();
        assert_eq!(names, ["desktops"], "{failpoint}");
        assert!(
            w.plugin.checkpoint()["claims"]
                .as_object()
                .unwrap()
                .is_empty()
        );

        // The kubelet asks again: prepared (the operator's pool holds the same type).
        let r = prepare(&w, "uid-k").await;
        assert_eq!(r.claims["uid-k"].error, "", "{failpoint}: {r:?}");
        assert_eq!(dra_pools(&w).await.len(), 1);
        let r = unprepare(&w, "uid-k").await;
        assert_eq!(r.claims["uid-k"].error, "");
        assert!(dra_pools(&w).await.is_empty());
    }
}
