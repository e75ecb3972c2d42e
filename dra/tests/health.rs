//! The device-health stream as the kubelet watches it: the real plugin (reporting every 200 ms), the
//! real vgpud on the simulated `demo` host, a fake kubelet's `NodeWatchResources` over the real
//! socket. Needs `target/debug/vgpud` (or `$VGPUD`), as `kubelet.rs` does.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use vgpu_dra::pb::{dra_health_v1, dra_health_v1alpha1, dra_v1};

const UID: &str = "0b6c7e9e-0000-4000-8000-000000000020";
const DEV: &str = "gpu-0000-01-00-0-vdi-2g-0";

/// The next message of `stream` whose device list is not empty, within the test's patience.
async fn next_devices<S>(stream: &mut S) -> Vec<dra_health_v1alpha1::DeviceHealth>
where
    S: tokio_stream::Stream<
            Item = Result<dra_health_v1alpha1::NodeWatchResourcesResponse, tonic::Status>,
        > + Unpin,
{
    use tokio_stream::StreamExt;
    loop {
        let m = tokio::time::timeout(PATIENCE, stream.next())
            .await
            .expect("a health report in time")
            .expect("the stream goes on")
            .unwrap();
        if !m.devices.is_empty() {
            return m.devices;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_devices_are_reported_healthy_until_their_vgpu_goes() {
    let tmp = tempfile::tempdir().unwrap();
    let vgpud = Vgpud::start(tmp.path()).await;
    let api = FakeApi::start(tmp.path());
    let mut plugin = Plugin::start(tmp.path(), &vgpud, &api, None).await;

    // Before any prepare the stream runs and reports nothing.
    let mut watch = Kubelet::health_v1alpha1(&plugin.dra_socket()).await;
    let mut stream = watch
        .node_watch_resources(dra_health_v1alpha1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(PATIENCE, tokio_stream::StreamExt::next(&mut stream))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(first.devices.is_empty());

    api.put(claim("vms", "vm-gpu", UID, &[("vgpu", NODE, DEV)]));
    let mut k = Kubelet::v1(&plugin.dra_socket()).await;
    let r = k
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("vms", "vm-gpu", UID)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.claims[UID].error, "");

    let devices = next_devices(&mut stream).await;
    assert_eq!(devices.len(), 1);
    let d = &devices[0];
    let id = d.device.as_ref().unwrap();
    assert_eq!(
        (id.pool_name.as_str(), id.device_name.as_str()),
        (NODE, DEV)
    );
    assert_eq!(
        d.health,
        dra_health_v1alpha1::HealthStatus::Healthy as i32,
        "{d:?}"
    );
    assert!(d.last_updated_time > 1_700_000_000, "Unix seconds: {d:?}");
    assert!(d.health_check_timeout_seconds >= 1);

    // The vGPU vanishes behind the plugin's back: the device turns unhealthy, with the reason.
    let uuid = vgpud
        .instances()
        .await
        .into_iter()
        .find(|i| i.label == "dra:vms/vm-gpu")
        .unwrap()
        .uuid;
    vgpud.client.destroy(&uuid).await.unwrap();
    let start = std::time::Instant::now();
    let d = loop {
        let d = next_devices(&mut stream).await.remove(0);
        if d.health == dra_health_v1alpha1::HealthStatus::Unhealthy as i32 {
            break d;
        }
        assert!(start.elapsed() < PATIENCE, "never reported unhealthy");
    };
    assert_eq!(d.message, format!("vGPU {uuid} is gone"));

    // The v1 API streams the same.
    let mut v1 = Kubelet::health_v1(&plugin.dra_socket()).await;
    let mut s1 = v1
        .node_watch_resources(dra_health_v1::NodeWatchResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let m = tokio::time::timeout(PATIENCE, tokio_stream::StreamExt::next(&mut s1))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(m.devices.len(), 1);
    assert_eq!(
        m.devices[0].health,
        dra_health_v1::HealthStatus::Unhealthy as i32
    );

    // Unprepared, the device is no longer reported; and open streams do not hold up a SIGTERM.
    k.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
        claims: vec![claim_ref("vms", "vm-gpu", UID)],
    })
    .await
    .unwrap();
    let start = std::time::Instant::now();
    loop {
        let m = tokio::time::timeout(PATIENCE, tokio_stream::StreamExt::next(&mut s1))
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        if m.devices.is_empty() {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "still reported: {m:?}");
    }
    plugin.proc.terminate();
}
