//! The plugin as the kubelet sees it: a fake kubelet (tonic clients from the plugin's own protos)
//! dials the real `vgpu-dra-plugin` binary over its real Unix sockets; the plugin reads claims from a
//! fake API server and makes vGPUs through the real `vgpud` on the simulated `demo` host.
//!
//! Needs `target/debug/vgpud` (`cargo build -p vgpu-manager --bin vgpud`; `cargo test --workspace`
//! builds it) or `$VGPUD`.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use vgpu_dra::pb::{dra_v1, dra_v1beta1, pluginregistration as reg};

const NS: &str = "vms";
const DEV0: &str = "gpu-0000-01-00-0-vdi-2g-0";
const DEV1: &str = "gpu-0000-01-00-0-vdi-2g-1";

struct World {
    _tmp: tempfile::TempDir,
    vgpud: Vgpud,
    api: FakeApi,
    plugin: Plugin,
}

async fn world(failpoint: Option<&str>) -> World {
    let tmp = tempfile::tempdir().unwrap();
    let vgpud = Vgpud::start(tmp.path()).await;
    let api = FakeApi::start(tmp.path());
    let plugin = Plugin::start(tmp.path(), &vgpud, &api, failpoint).await;
    World {
        _tmp: tmp,
        vgpud,
        api,
        plugin,
    }
}

async fn prepare(w: &World, claims: Vec<dra_v1::Claim>) -> dra_v1::NodePrepareResourcesResponse {
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    k.node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

async fn unprepare(
    w: &World,
    claims: Vec<dra_v1::Claim>,
) -> dra_v1::NodeUnprepareResourcesResponse {
    let mut k = Kubelet::v1(&w.plugin.dra_socket()).await;
    k.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
}

/// The instances vgpud has for the plugin (labelled `dra:`), by UUID.
async fn dra_instances(w: &World) -> Vec<vgpu_client::InstanceInfo> {
    w.vgpud.dra_instances().await
}

fn read_json(p: &std::path::Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_tells_the_kubelet_the_driver_and_its_services() {
    let w = world(None).await;
    let mut k = Kubelet::registration(&w.plugin.registration_socket())
        .await
        .unwrap();
    let info = k.get_info(reg::InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, DRIVER);
    assert_eq!(
        std::path::Path::new(&info.endpoint),
        w.plugin.dra_socket(),
        "the endpoint is the DRA socket"
    );
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert!(w.plugin.dra_socket().exists());

    k.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: false,
        error: "version mismatch".into(),
    })
    .await
    .unwrap();
    k.notify_registration_status(reg::RegistrationStatus {
        plugin_registered: true,
        error: String::new(),
    })
    .await
    .unwrap();
    // A restarted kubelet dials again and asks again.
    drop(k);
    let mut again = Kubelet::registration(&w.plugin.registration_socket())
        .await
        .unwrap();
    let info2 = again
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info2, info);
    let log = w.plugin.proc.log();
    assert!(
        log.contains("the kubelet refused the registration"),
        "{log}"
    );
    assert!(log.contains("registered with the kubelet"), "{log}");

    // Both DRA versions answer on the one socket; another service does not.
    let mut beta = Kubelet::v1beta1(&w.plugin.dra_socket()).await;
    let r = beta
        .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest { claims: vec![] })
        .await
        .unwrap();
    assert!(r.into_inner().claims.is_empty());
    let mut wrong = Kubelet::registration(&w.plugin.dra_socket()).await.unwrap();
    let e = wrong.get_info(reg::InfoRequest {}).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_makes_the_vgpu_cdi_spec_and_metadata_and_unprepare_removes_them() {
    let mut w = world(None).await;
    let uid = "0b6c7e9e-0000-4000-8000-000000000001";
    w.api.put(claim(NS, "vm-gpu", uid, &[("vgpu", NODE, DEV0)]));
    let before = w.vgpud.instances().await;
    assert!(
        before.iter().any(|i| i.uuid == FOREIGN_UUID),
        "the demo host has a foreign instance"
    );

    let r = prepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    let c = &r.claims[uid];
    assert_eq!(c.error, "");
    assert_eq!(c.devices.len(), 1);
    let d = &c.devices[0];
    assert_eq!(d.request_names, ["vgpu"]);
    assert_eq!(d.pool_name, NODE);
    assert_eq!(d.device_name, DEV0);
    let cdi_name = format!("{uid}-{DEV0}");
    assert_eq!(
        d.cdi_device_ids,
        [format!("vgpu-manager.io/vgpu={cdi_name}")]
    );

    // vgpud made one vdi-2g on the allocated GPU.
    let made = dra_instances(&w).await;
    assert_eq!(made.len(), 1, "{made:?}");
    let inst = &made[0];
    assert_eq!((inst.gpu.as_str(), inst.profile.as_str()), (GPU, "vdi-2g"));
    assert_eq!(inst.state, "running");
    assert_eq!(inst.label, format!("dra:{NS}/vm-gpu"));
    let group = inst.iommu_group().expect("an IOMMU group");

    // The CDI spec names the VFIO nodes and mounts the metadata file.
    let spec = read_json(&w.plugin.cdi_spec(uid));
    assert_eq!(spec["cdiVersion"], "0.6.0");
    assert_eq!(spec["kind"], "vgpu-manager.io/vgpu");
    let dev = &spec["devices"][0];
    assert_eq!(dev["name"], cdi_name.as_str());
    let nodes: Vec<&str> = dev["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        nodes,
        [format!("/dev/vfio/{group}").as_str(), "/dev/vfio/vfio"]
    );
    let mount = &dev["containerEdits"]["mounts"][0];
    let md_host = w.plugin.metadata_file(uid, "vgpu");
    assert_eq!(mount["hostPath"], md_host.display().to_string());
    assert_eq!(
        mount["containerPath"],
        format!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-gpu/vgpu/{DRIVER}-metadata.json"
        )
    );

    // The metadata file is what KubeVirt reads.
    let md = read_json(&md_host);
    assert_eq!(md["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(md["kind"], "DeviceMetadata");
    assert_eq!(md["metadata"]["uid"], uid);
    assert_eq!(md["requests"][0]["name"], "vgpu");
    let mdev = &md["requests"][0]["devices"][0];
    assert_eq!(mdev["driver"], DRIVER);
    assert_eq!(mdev["name"], DEV0);
    assert_eq!(mdev["attributes"]["mdevUUID"]["string"], inst.uuid.as_str());
    assert_eq!(
        mdev["attributes"]["resource.kubernetes.io/pciBusID"]["string"],
        GPU
    );

    let ck = w.plugin.checkpoint();
    assert_eq!(ck["claims"][uid]["phase"], "completed");

    let r = unprepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
    assert!(dra_instances(&w).await.is_empty());
    assert!(!w.plugin.cdi_spec(uid).exists());
    assert!(!md_host.exists());
    assert!(
        w.plugin.checkpoint()["claims"]
            .as_object()
            .unwrap()
            .is_empty()
    );
    let after = w.vgpud.instances().await;
    assert!(
        after.iter().any(|i| i.uuid == FOREIGN_UUID),
        "the foreign instance is untouched"
    );
    w.plugin.proc.terminate();
    assert!(
        !w.plugin.registration_socket().exists(),
        "sockets removed on SIGTERM"
    );
    assert!(!w.plugin.dra_socket().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_prepare_gives_the_same_answer_and_makes_nothing_new() {
    let w = world(None).await;
    let uid = "0b6c7e9e-0000-4000-8000-000000000002";
    // A template claim with two devices in one request: one metadata file, mounted once.
    let mut c = claim(
        NS,
        "vm-x7k2-gpu",
        uid,
        &[("vgpu", NODE, DEV0), ("vgpu", NODE, DEV1)],
    );
    c["metadata"]["annotations"] =
        serde_json::json!({"resource.kubernetes.io/pod-claim-name": "gpu"});
    w.api.put(c);
    let first = prepare(&w, vec![claim_ref(NS, "vm-x7k2-gpu", uid)]).await;
    assert_eq!(first.claims[uid].error, "");
    assert_eq!(first.claims[uid].devices.len(), 2);
    let made = dra_instances(&w).await;
    assert_eq!(made.len(), 2);
    let reads = w.api.reads();

    let again = prepare(&w, vec![claim_ref(NS, "vm-x7k2-gpu", uid)]).await;
    assert_eq!(again, first);
    assert_eq!(dra_instances(&w).await, made, "no second vGPU");
    assert_eq!(
        w.api.reads(),
        reads,
        "a completed claim is answered from the checkpoint"
    );

    // The v1beta1 service (kubelets before 1.34) gives the same devices.
    let mut beta = Kubelet::v1beta1(&w.plugin.dra_socket()).await;
    let b = beta
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest {
            claims: vec![dra_v1beta1::Claim {
                namespace: NS.into(),
                uid: uid.into(),
                name: "vm-x7k2-gpu".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<_> = b.claims[uid]
        .devices
        .iter()
        .map(|d| d.cdi_device_ids.clone())
        .collect();
    let v1_ids: Vec<_> = first.claims[uid]
        .devices
        .iter()
        .map(|d| d.cdi_device_ids.clone())
        .collect();
    assert_eq!(ids, v1_ids);

    let spec = read_json(&w.plugin.cdi_spec(uid));
    let mounts: Vec<_> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|d| {
            d["containerEdits"]["mounts"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(mounts.len(), 1, "one metadata mount per request: {spec}");
    assert_eq!(
        mounts[0]["containerPath"],
        format!(
            "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/vgpu/{DRIVER}-metadata.json"
        )
    );
    let md = read_json(&w.plugin.metadata_file(uid, "vgpu"));
    assert_eq!(md["podClaimName"], "gpu");
    assert_eq!(md["requests"][0]["devices"].as_array().unwrap().len(), 2);

    // A vGPU that vanished (a node reboot) is made again, under the same UUID.
    w.vgpud.client.destroy(&made[0].uuid).await.unwrap();
    let third = prepare(&w, vec![claim_ref(NS, "vm-x7k2-gpu", uid)]).await;
    assert_eq!(third.claims[uid].error, "");
    let remade = dra_instances(&w).await;
    let uuids =
        |v: &[vgpu_client::InstanceInfo]| v.iter().map(|i| i.uuid.clone()).collect::<Vec<_>>();
    assert_eq!(uuids(&remade), uuids(&made));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_between_the_phases_is_rolled_back_at_the_next_start() {
    for failpoint in ["after-create", "after-plan"] {
        let mut w = world(Some(failpoint)).await;
        let uid = "0b6c7e9e-0000-4000-8000-000000000003";
        w.api.put(claim(NS, "vm-gpu", uid, &[("vgpu", NODE, DEV0)]));
        // The kubelet's call hangs at the failpoint; the test kills the plugin under it.
        let sock = w.plugin.dra_socket();
        let call = tokio::spawn(async move {
            let mut k = Kubelet::v1(&sock).await;
            k.node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![claim_ref(NS, "vm-gpu", uid)],
            })
            .await
        });
        let log = w.plugin.proc.log.clone();
        eventually("the failpoint", || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("failpoint reached")
        })
        .await;
        assert_eq!(w.plugin.checkpoint()["claims"][uid]["phase"], "started");
        let expect = usize::from(failpoint == "after-create");
        assert_eq!(dra_instances(&w).await.len(), expect, "{failpoint}");
        w.plugin.proc.kill9();
        assert!(call.await.unwrap().is_err(), "the kubelet got no answer");
        assert!(!w.plugin.cdi_spec(uid).exists());

        w.plugin.restart(&w.vgpud, &w.api, None).await;
        assert!(
            dra_instances(&w).await.is_empty(),
            "{failpoint}: the vGPU made before the kill is gone"
        );
        assert!(w.plugin.checkpoint()["claims"].get(uid).is_none());
        assert!(
            w.vgpud
                .instances()
                .await
                .iter()
                .any(|i| i.uuid == FOREIGN_UUID)
        );
        let log = w.plugin.proc.log();
        assert!(log.contains("rolling back a prepare cut short"), "{log}");

        // The kubelet retries and this time it completes.
        let r = prepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
        assert_eq!(r.claims[uid].error, "", "{failpoint}");
        assert_eq!(dra_instances(&w).await.len(), 1);
        assert_eq!(w.plugin.checkpoint()["claims"][uid]["phase"], "completed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_plugin_keeps_what_it_prepared_until_the_kubelet_unprepares_it() {
    let mut w = world(None).await;
    let uid = "0b6c7e9e-0000-4000-8000-000000000004";
    w.api.put(claim(NS, "vm-gpu", uid, &[("vgpu", NODE, DEV0)]));
    let first = prepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(first.claims[uid].error, "");
    w.plugin.proc.kill9();
    w.api.clear();
    w.plugin.restart(&w.vgpud, &w.api, None).await;
    assert_eq!(
        dra_instances(&w).await.len(),
        1,
        "a completed claim survives a restart"
    );
    // The claim is gone from the API server, yet the kubelet's retry is answered from the checkpoint.
    let again = prepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(again, first);
    let r = unprepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
    assert!(dra_instances(&w).await.is_empty());
    // Unpreparing again is fine.
    let r = unprepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
}

/// A node reboot takes the vGPUs of prepared claims (mdevs do not outlive it) but not the plugin's
/// checkpoint: the plugin makes them again when it starts, under their UUIDs, before any prepare.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_plugin_makes_again_the_vgpus_of_prepared_claims_that_are_gone() {
    let mut w = world(None).await;
    let uid = "0b6c7e9e-0000-4000-8000-000000000005";
    w.api.put(claim(NS, "vm-gpu", uid, &[("vgpu", NODE, DEV0)]));
    let first = prepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(first.claims[uid].error, "");
    let made = dra_instances(&w).await;
    assert_eq!(made.len(), 1, "{made:?}");
    w.plugin.proc.kill9();
    // The vGPU is gone, as after a reboot.
    w.vgpud.client.destroy(&made[0].uuid).await.unwrap();
    assert!(dra_instances(&w).await.is_empty());
    w.plugin.restart(&w.vgpud, &w.api, None).await;
    let back = dra_instances(&w).await;
    assert_eq!(back.len(), 1, "{back:?}");
    assert_eq!(
        (
            back[0].uuid.as_str(),
            back[0].label.as_str(),
            back[0].state.as_str()
        ),
        (made[0].uuid.as_str(), made[0].label.as_str(), "running")
    );
    assert!(w.plugin.cdi_spec(uid).exists());
    let r = unprepare(&w, vec![claim_ref(NS, "vm-gpu", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
    assert!(dra_instances(&w).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unprepare_of_a_claim_never_prepared_here_is_ok_and_touches_nothing() {
    let w = world(None).await;
    let before = w.vgpud.instances().await;
    let r = unprepare(
        &w,
        vec![claim_ref(
            NS,
            "other",
            "0b6c7e9e-0000-4000-8000-0000000000ff",
        )],
    )
    .await;
    assert_eq!(r.claims["0b6c7e9e-0000-4000-8000-0000000000ff"].error, "");
    assert_eq!(w.vgpud.instances().await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_claim_fails_alone_with_a_reason() {
    let w = world(None).await;
    let good = "0b6c7e9e-0000-4000-8000-000000000010";
    w.api.put(claim(NS, "good", good, &[("vgpu", NODE, DEV0)]));
    w.api
        .put(claim(NS, "pool", "u-pool", &[("vgpu", "node-2", DEV1)]));
    w.api
        .put(claim(NS, "name", "u-name", &[("vgpu", NODE, "gpu0")]));
    w.api
        .put(claim(NS, "renamed", "u-new", &[("vgpu", NODE, DEV1)]));
    let mut unallocated = claim(NS, "pending", "u-pending", &[]);
    unallocated["status"] = serde_json::json!({});
    w.api.put(unallocated);
    let r = prepare(
        &w,
        vec![
            claim_ref(NS, "good", good),
            claim_ref(NS, "pool", "u-pool"),
            claim_ref(NS, "name", "u-name"),
            claim_ref(NS, "renamed", "u-old"),
            claim_ref(NS, "pending", "u-pending"),
            claim_ref(NS, "missing", "u-missing"),
        ],
    )
    .await;
    assert_eq!(r.claims[good].error, "");
    let err = |uid: &str| r.claims[uid].error.clone();
    assert!(
        err("u-pool").contains("pool \"node-2\""),
        "{}",
        err("u-pool")
    );
    assert!(
        err("u-name").contains("does not publish"),
        "{}",
        err("u-name")
    );
    assert!(err("u-old").contains("has UID u-new"), "{}", err("u-old"));
    assert!(
        err("u-pending").contains("not allocated"),
        "{}",
        err("u-pending")
    );
    assert!(
        err("u-missing").contains("answered 404"),
        "{}",
        err("u-missing")
    );
    for uid in ["u-pool", "u-name", "u-old", "u-pending", "u-missing"] {
        assert!(r.claims[uid].devices.is_empty());
    }
    assert_eq!(
        dra_instances(&w).await.len(),
        1,
        "only the good claim made a vGPU"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_with_no_device_of_this_driver_prepares_to_nothing() {
    let w = world(None).await;
    let uid = "0b6c7e9e-0000-4000-8000-000000000030";
    let mut c = claim(NS, "nic", uid, &[("nic", NODE, "nic-0")]);
    c["status"]["allocation"]["devices"]["results"][0]["driver"] = "net.example.com".into();
    w.api.put(c);
    let r = prepare(&w, vec![claim_ref(NS, "nic", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
    assert!(r.claims[uid].devices.is_empty());
    assert!(dra_instances(&w).await.is_empty());
    assert!(
        !w.plugin.cdi_spec(uid).exists(),
        "no CDI spec without devices (the CDI registry refuses one)"
    );
    let r = unprepare(&w, vec![claim_ref(NS, "nic", uid)]).await;
    assert_eq!(r.claims[uid].error, "");
}
