//! The ResourceSlices the real `vgpu-dra-plugin` publishes for the real `vgpud` on the simulated
//! `demo` host, as a fake API server receives them: every object is checked against Kubernetes'
//! OpenAPI v3 schema of resource.k8s.io/v1 and the rules its descriptions state (the fake refuses a
//! slice that fails, and the tests assert nothing was refused), the pool as a whole against the
//! pool rules; the devices and counters against vgpud's own offers; re-publication after a prepare,
//! an unprepare and on a change made outside the plugin; nothing written when nothing changed.
//!
//! Needs `target/debug/vgpud` (`cargo test --workspace` builds it) or `$VGPUD`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use vgpu_dra::pb::dra_v1;

const NS: &str = "vms";
/// The demo host's T4 #1 (empty at start) and T4 #2 (holds one foreign nvidia-231).
const T4_1: &str = "0000:01:00.0";
const T4_2: &str = "0000:83:00.0";

struct World {
    _tmp: tempfile::TempDir,
    vgpud: Vgpud,
    api: FakeApi,
    plugin: Plugin,
}

async fn world() -> World {
    world_on("demo").await
}

/// The plugin over vgpud on the simulated host `sim`.
async fn world_on(sim: &str) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let vgpud = Vgpud::start_on(tmp.path(), sim).await;
    let api = FakeApi::start(tmp.path());
    let plugin = Plugin::start(tmp.path(), &vgpud, &api, None).await;
    World {
        _tmp: tmp,
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

/// The pool once the plugin has published a complete generation newer than `after`.
async fn published_after(w: &World, after: i64) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let s: Vec<Value> = w
            .api
            .slices()
            .into_iter()
            .filter(|x| x["spec"]["nodeName"] == NODE)
            .collect();
        let g = generation(&s);
        let complete = !s.is_empty()
            && s.iter().all(|x| {
                x["spec"]["pool"]["generation"] == g
                    && x["spec"]["pool"]["resourceSliceCount"] == s.len()
            });
        if g > after && complete {
            return s;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "no complete generation after {after}; slices {s:#?}\nrefused {:?}\nplugin log:\n{}",
            w.api.rejected(),
            w.plugin.proc.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn devices(slices: &[Value]) -> Vec<Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn counter_sets(slices: &[Value]) -> BTreeMap<String, Value> {
    slices
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_string(),
                c["counters"].clone(),
            )
        })
        .collect()
}

fn gpu_of(d: &Value) -> String {
    d["attributes"]["gpu"]["string"]
        .as_str()
        .unwrap()
        .to_string()
}

fn checked(w: &World, slices: &[Value]) {
    assert_eq!(w.api.rejected(), vec![], "the API server refused slices");
    let errors = openapi::pool_rules(slices);
    assert!(errors.is_empty(), "pool rules: {errors:#?}");
    for s in slices {
        let mut e = openapi::validate("io.k8s.api.resource.v1.ResourceSlice", s);
        e.extend(openapi::resource_slice_rules(s));
        assert!(e.is_empty(), "{}: {e:#?}", s["metadata"]["name"]);
        assert_eq!(s["spec"]["driver"], DRIVER);
        assert_eq!(s["spec"]["nodeName"], NODE);
        assert_eq!(s["spec"]["pool"]["name"], NODE);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_hosts_gpus_are_published_as_vgpud_offers_them() {
    let w = world().await;
    let slices = published_after(&w, 0).await;
    checked(&w, &slices);
    let offers = w.vgpud.client.list_offers().await.unwrap();
    let devs = devices(&slices);
    let sets = counter_sets(&slices);

    // T4 #1 is empty: one device per slot of every profile it serves, all drawing from its set.
    let t4 = offers.iter().find(|g| g.gpu == T4_1).unwrap();
    let want: u32 = t4.options.iter().map(|o| o.max_instances).sum();
    let on_t4: Vec<&Value> = devs.iter().filter(|d| gpu_of(d) == T4_1).collect();
    assert_eq!(on_t4.len() as u32, want);
    for o in &t4.options {
        for i in 0..o.max_instances {
            let name = format!("gpu-0000-01-00-0-{}-{i}", o.profile);
            let d = on_t4
                .iter()
                .find(|d| d["name"] == name.as_str())
                .unwrap_or_else(|| panic!("{name} is not published"));
            assert_eq!(d["attributes"]["type"]["string"], o.type_id.as_str());
            assert_eq!(d["attributes"]["profile"]["string"], o.profile.as_str());
            assert_eq!(d["consumesCounters"][0]["counterSet"], "gpu-0000-01-00-0");
        }
    }
    // The share counter is the capacity in units of the types' common multiple; every type fits
    // exactly its max_instances times.
    let share: u64 = sets["gpu-0000-01-00-0"]["share"]["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    for o in &t4.options {
        let d = on_t4
            .iter()
            .find(|d| d["attributes"]["profile"]["string"] == o.profile.as_str())
            .unwrap();
        let draw: u64 = d["consumesCounters"][0]["counters"]["share"]["value"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(share / draw, u64::from(o.max_instances), "{}", o.profile);
        assert_eq!(share % draw, 0);
    }

    // T4 #2 holds a foreign nvidia-231 (homogeneous rule): only nvidia-231 profiles are published,
    // and the foreign vGPU's share is not available.
    let t4b = offers.iter().find(|g| g.gpu == T4_2).unwrap();
    let on_b: Vec<&Value> = devs.iter().filter(|d| gpu_of(d) == T4_2).collect();
    assert!(!on_b.is_empty());
    assert!(
        on_b.iter()
            .all(|d| d["attributes"]["type"]["string"] == "nvidia-231"),
        "{on_b:#?}"
    );
    let o231 = t4b
        .options
        .iter()
        .find(|o| o.type_id == "nvidia-231")
        .unwrap();
    let share_b: u64 = sets["gpu-0000-83-00-0"]["share"]["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(o231.in_use, 1);
    assert_eq!(
        share_b,
        u64::from(o231.available),
        "one unit per nvidia-231 left"
    );

    // Nothing changes: nothing is written again.
    let writes = w.api.slice_writes();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        w.api.slice_writes(),
        writes,
        "unchanged slices were written again"
    );
    assert_eq!(generation(&w.api.slices()), generation(&slices));
    assert_eq!(w.api.slices().len(), slices.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_and_unprepare_publish_the_gpus_new_shape() {
    let w = world().await;
    let before = published_after(&w, 0).await;
    let g0 = generation(&before);
    let dev = "gpu-0000-01-00-0-vdi-2g-0";
    assert!(devices(&before).iter().any(|d| d["name"] == dev));
    let vdi_type =
        devices(&before).iter().find(|d| d["name"] == dev).unwrap()["attributes"]["type"]["string"]
            .as_str()
            .unwrap()
            .to_string();

    w.api
        .put(claim(NS, "vm-a", "uid-a", &[("vgpu", NODE, dev)]));
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    let resp = k
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref(NS, "vm-a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims["uid-a"].error, "", "{resp:?}");

    // The homogeneous T4 now holds our vGPU: only its type stays, the allocated device among them,
    // and our vGPU's share counts as the scheduler's (the allocation draws it).
    let after = published_after(&w, g0).await;
    checked(&w, &after);
    let on_t4: Vec<Value> = devices(&after)
        .into_iter()
        .filter(|d| gpu_of(d) == T4_1)
        .collect();
    assert!(on_t4.iter().any(|d| d["name"] == dev));
    assert!(
        on_t4
            .iter()
            .all(|d| d["attributes"]["type"]["string"] == vdi_type.as_str()),
        "{on_t4:#?}"
    );
    let sets = counter_sets(&after);
    let before_sets = counter_sets(&before);
    let share = |s: &BTreeMap<String, Value>| -> u64 {
        s["gpu-0000-01-00-0"]["share"]["value"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap()
    };
    let draw: u64 = on_t4[0]["consumesCounters"][0]["counters"]["share"]["value"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let max = on_t4
        .iter()
        .filter(|d| d["attributes"]["type"]["string"] == vdi_type.as_str())
        .filter(|d| d["attributes"]["profile"]["string"] == "vdi-2g")
        .count() as u64;
    assert_eq!(
        share(&sets),
        draw * max,
        "the whole GPU is still this driver's to allocate"
    );
    assert!(share(&before_sets) >= share(&sets));

    // Unprepare: the vGPU is gone, every size is back.
    let g1 = generation(&after);
    let resp = k
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
            claims: vec![claim_ref(NS, "vm-a", "uid-a")],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(resp.claims["uid-a"].error, "");
    let again = published_after(&w, g1).await;
    checked(&w, &again);
    let names = |s: &[Value]| -> Vec<String> {
        let mut v: Vec<String> = devices(s)
            .iter()
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&again), names(&before));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_outside_the_plugin_and_leftover_slices_are_reconciled() {
    let w = world().await;
    let first = published_after(&w, 0).await;
    let g0 = generation(&first);
    // A slice of this driver and node that the current pool does not have (an older plugin's).
    let mut stale = first[0].clone();
    stale["metadata"] = serde_json::json!({"name": "node-1-vgpu-devices-99"});
    w.api.insert_slice(stale);
    // Another node's slice of the same driver is not ours to touch.
    let mut other = first[0].clone();
    other["metadata"] = serde_json::json!({"name": "node-2-vgpu-counters-0"});
    other["spec"]["nodeName"] = "node-2".into();
    other["spec"]["pool"]["name"] = "node-2".into();
    w.api.insert_slice(other);

    // A vGPU made outside the plugin on T4 #1 (vgpuctl, a pool, libvirt): the GPU's shape changes.
    w.vgpud
        .client
        .create(&vgpu_client::NewInstance {
            gpu: Some(T4_1.to_string()),
            ..vgpu_client::NewInstance::of_profile("vdi-1g")
        })
        .await
        .unwrap();
    let after = published_after(&w, g0).await;
    let ours: Vec<Value> = after
        .iter()
        .filter(|s| s["spec"]["nodeName"] == NODE)
        .cloned()
        .collect();
    assert!(
        !ours
            .iter()
            .any(|s| s["metadata"]["name"] == "node-1-vgpu-devices-99"),
        "the leftover slice was not deleted"
    );
    assert!(
        w.api
            .slices()
            .iter()
            .any(|s| s["metadata"]["name"] == "node-2-vgpu-counters-0"),
        "another node's slice was deleted"
    );
    checked(&w, &ours);
    let on_t4: Vec<Value> = devices(&ours)
        .into_iter()
        .filter(|d| gpu_of(d) == T4_1)
        .collect();
    let t = &on_t4[0]["attributes"]["type"]["string"];
    assert!(
        on_t4
            .iter()
            .all(|d| &d["attributes"]["type"]["string"] == t)
    );
    assert!(
        on_t4
            .iter()
            .any(|d| d["attributes"]["profile"]["string"] == "vdi-1g")
    );
}

/// An A10 in classic vGPU mode (the `ampere` host): its 32 SR-IOV VFs are its mdev parents, one vGPU
/// each. It is published as one GPU whose devices and counters follow its framebuffer, not its VFs;
/// a prepare on it makes the vGPU on a free VF, and the next publication counts it against the GPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_whose_vfs_are_its_mdev_parents_is_published_and_prepared_as_one_gpu() {
    const A10: &str = "0000:41:00.0";
    let w = world_on("ampere").await;
    let slices = published_after(&w, 0).await;
    checked(&w, &slices);
    let devs = devices(&slices);
    let on_a10: Vec<&Value> = devs.iter().filter(|d| gpu_of(d) == A10).collect();
    let vdi: Vec<&&Value> = on_a10
        .iter()
        .filter(|d| d["attributes"]["profile"]["string"] == "vdi-2g")
        .collect();
    // 24 GB hold twelve A10-2Q, although each of the 32 VFs shows one available.
    assert_eq!(vdi.len(), 12, "{on_a10:#?}");
    assert!(
        devs.iter().all(|d| !gpu_of(d).starts_with("0000:41:00.4")),
        "a VF is no GPU of its own"
    );
    let sets = counter_sets(&slices);
    let fb_of = |sets: &BTreeMap<String, Value>| -> u64 {
        let q = sets["gpu-0000-41-00-0"]["framebuffer"]["value"]
            .as_str()
            .unwrap()
            .to_string();
        q.trim_end_matches("Mi").parse().unwrap()
    };
    assert_eq!(fb_of(&sets), 24576, "{sets:#?}");

    let uid = "0b6c7e9e-0000-4000-8000-0000000000a1";
    let dev = "gpu-0000-41-00-0-vdi-2g-0";
    w.api.put(claim(NS, "vm-a10", uid, &[("vgpu", NODE, dev)]));
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    let r = k
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref(NS, "vm-a10", uid)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.claims[uid].error, "");
    let made = w.vgpud.dra_instances().await;
    assert_eq!(made.len(), 1, "{made:?}");
    assert_eq!(made[0].gpu, A10);
    assert_eq!(
        made[0].parent, "0000:41:00.4",
        "the vGPU is on the first free VF"
    );
    assert_eq!(made[0].state, "running");

    // The next publication still lists the device this driver holds, and its framebuffer is
    // counted as this driver's (the scheduler counts it against the allocation).
    let after = published_after(&w, generation(&slices)).await;
    checked(&w, &after);
    assert_eq!(fb_of(&counter_sets(&after)), 24576);
    let still: Vec<Value> = devices(&after)
        .into_iter()
        .filter(|d| gpu_of(d) == A10)
        .collect();
    assert!(still.iter().any(|d| d["name"] == dev), "{still:#?}");
    assert!(
        still
            .iter()
            .all(|d| d["attributes"]["profile"]["string"] != "compute-8g"),
        "the homogeneous rule leaves only the A10-2Q profiles: {still:#?}"
    );
}
