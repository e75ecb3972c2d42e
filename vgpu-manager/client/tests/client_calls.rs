//! The client's own logic against a scripted Manager1 on a peer-to-peer connection (no bus, no vgpud):
//! the instance a `Create`/`Define` reply names is looked up by the UUID read back from its object
//! path, a reply path that is no instance's is refused, `NotFound` is "no such instance", a JSON
//! report that is not the documented shape names its method, and a call that gets no answer gives up
//! after the call timeout. The real daemon is tested through vgpu-manager's D-Bus tests.

use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vgpu_client::{BusAddress, Client, ClientError, InstanceInfo, NewInstance, instance_path};
use zbus::{OwnedObjectPath, OwnedVariant, connection, interface};

const UUID: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";

/// The daemon's refusals, named as the daemon names them (`org.vgpumanager.Error.<Kind>`).
#[derive(Debug, zbus::DBusError)]
#[zbus(prefix = "org.vgpumanager.Error")]
enum Refusal {
    #[zbus(error)]
    ZBus(zbus::Error),
    NotFound(String),
}

/// Answers as a daemon with one instance would; `Define` answers a path that is no instance's, and
/// `ListGpus` never answers.
struct Scripted;

fn row(uuid: &str, label: &str) -> InstanceInfo {
    InstanceInfo {
        uuid: uuid.into(),
        gpu: "0000:3b:00.0".into(),
        parent: "0000:3b:00.0".into(),
        type_id: "nvidia-231".into(),
        profile: String::new(),
        state: "running".into(),
        defined: false,
        autostart: false,
        owner: "daemon".into(),
        label: label.into(),
        iommu_group: 7,
        created_at: 1,
    }
}

#[interface(name = "org.vgpumanager.Manager1")]
impl Scripted {
    async fn get_instance(&self, uuid: &str) -> Result<InstanceInfo, Refusal> {
        if uuid == UUID {
            Ok(row(uuid, "made by create"))
        } else {
            Err(Refusal::NotFound(format!("no instance {uuid}")))
        }
    }

    async fn create(
        &self,
        _target_kind: &str,
        _target: &str,
        _gpu: &str,
        _uuid: &str,
        _options: HashMap<String, OwnedVariant>,
    ) -> OwnedObjectPath {
        instance_path(UUID)
    }

    async fn define(
        &self,
        _target_kind: &str,
        _target: &str,
        _gpu: &str,
        _uuid: &str,
        _options: HashMap<String, OwnedVariant>,
    ) -> OwnedObjectPath {
        vgpu_client::gpu_path("0000:3b:00.0")
    }

    async fn pool_status(&self) -> String {
        "{\"not\": \"a list\"}".into()
    }

    async fn list_gpus(&self) -> Vec<vgpu_client::GpuInfo> {
        tokio::time::sleep(Duration::from_secs(30)).await;
        Vec::new()
    }
}

/// A client connected to [`Scripted`] over a socket pair; the server connection must stay alive.
async fn scripted() -> (Client, connection::Connection) {
    let (ours, theirs) = UnixStream::pair().expect("socket pair");
    let guid = zbus::Guid::generate();
    let server = connection::Builder::unix_stream(theirs)
        .server(guid)
        .p2p()
        .serve_at(vgpu_client::MANAGER_PATH, Scripted)
        .build();
    let client = connection::Builder::unix_stream(ours).p2p().build();
    let (server, client) = tokio::join!(server, client);
    let bus = BusAddress::Address("unix:path=/scripted".into());
    let client = Client::with_connection(client.expect("client side"), &bus)
        .await
        .expect("client");
    (client, server.expect("server side"))
}

#[tokio::test]
async fn create_looks_up_the_instance_its_reply_names() {
    let (client, _server) = scripted().await;
    let made = client
        .create(&NewInstance::of_type("nvidia-231"))
        .await
        .expect("create");
    assert_eq!(made.uuid, UUID);
    assert_eq!(made.label, "made by create");
}

#[tokio::test]
async fn a_reply_path_that_is_no_instance_is_refused_with_the_path() {
    let (client, _server) = scripted().await;
    let e = client
        .define(&NewInstance::of_profile("vdi-2g"), false)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::BadObjectPath { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("Define") && text.contains("/gpu/0000_3a3b_3a00_2e0"),
        "{text}"
    );
}

#[tokio::test]
async fn not_found_is_no_instance_and_other_lookups_are_errors() {
    let (client, _server) = scripted().await;
    let other = "6a1f0c2e-9b3d-4c1a-8e2f-0d5b7a9c1e01";
    assert_eq!(client.find_instance(other).await.expect("find"), None);
    assert!(client.find_instance(UUID).await.expect("find").is_some());
    let e = client.get_instance(other).await.unwrap_err();
    assert_eq!(e.kind(), Some("NotFound"));
    assert_eq!(e.to_string(), format!("no instance {other}"));
}

#[tokio::test]
async fn a_report_of_another_shape_names_its_method() {
    let (client, _server) = scripted().await;
    let e = client.pool_status().await.unwrap_err();
    assert!(matches!(e, ClientError::BadJson { .. }), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("vgpud's PoolStatus answer is not the documented JSON"),
        "{e}"
    );
}

#[tokio::test]
async fn a_call_without_answer_gives_up_after_the_call_timeout() {
    let (client, _server) = scripted().await;
    let client = client.with_call_timeout(Duration::from_millis(200));
    let started = Instant::now();
    let e = client.list_gpus().await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "waited too long"
    );
    let text = e.to_string();
    assert!(
        text.contains("ListGpus") && text.contains("no answer within"),
        "{text}"
    );
}
