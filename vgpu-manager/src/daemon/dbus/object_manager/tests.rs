//! The object manager against zbus's own, on a simulated host served over a peer-to-peer connection.

use std::time::Duration;

use futures_util::StreamExt;
use std::os::unix::net::UnixStream;
use zbus::connection::Builder;
use zbus::fdo::ManagedObjects;
use zbus::message::Type;
use zbus::object_server::InterfaceRef;

use super::*;
use crate::daemon::api::{CreateInstance, DestroyInstance, InstanceSpec, InstanceTarget};
use crate::daemon::dbus::{Executor, Service, call, serve};
use mdev_types::ids::MdevUuid;
use vgpu_client::{INSTANCE_INTERFACE, instance_path};

const OM: &str = "org.freedesktop.DBus.ObjectManager";

/// vgpud's objects on `--sim demo`: the serving and the client end of a peer-to-peer connection.
struct Setup {
    server: Connection,
    client: Connection,
    service: Service,
    exec: Arc<dyn Executor>,
    _state: tempfile::TempDir,
}

async fn setup() -> Setup {
    let state = tempfile::tempdir().unwrap();
    let host = vgpu_sim::SimHost::builtin("demo").unwrap();
    let core = crate::daemon::engine::Core::open(
        Arc::new(host),
        state.path(),
        crate::profile::Catalog::builtin().unwrap(),
    )
    .unwrap();
    let exec: Arc<dyn Executor> = Arc::new(core);
    let (a, b) = UnixStream::pair().unwrap();
    let guid = zbus::Guid::generate();
    let (server, client) = tokio::try_join!(
        Builder::unix_stream(a).server(guid).p2p().build(),
        Builder::unix_stream(b).p2p().build(),
    )
    .unwrap();
    let service = serve(&server, Arc::clone(&exec)).await.unwrap();
    Setup {
        server,
        client,
        service,
        exec,
        _state: state,
    }
}

impl Setup {
    /// Our answer, over the bus.
    async fn ours(&self) -> ManagedObjects {
        let reply = self
            .client
            .call_method(
                None::<&str>,
                MANAGER_PATH,
                Some(OM),
                "GetManagedObjects",
                &(),
            )
            .await
            .unwrap();
        reply.body().deserialize().unwrap()
    }

    /// zbus's own answer for the same objects, read over the bus as zbus's `fdo::ObjectManager`
    /// builds it (its object server's `get_managed_objects`; vgpu-manager no longer builds zbus's
    /// `object-manager` feature, which announces objects itself): every node below the manager in
    /// the introspection, each with the `GetAll` of its interfaces but the standard ones.
    async fn zbus_own(&self) -> ManagedObjects {
        let xml: String = self
            .client
            .call_method(
                None::<&str>,
                MANAGER_PATH,
                Some("org.freedesktop.DBus.Introspectable"),
                "Introspect",
                &(),
            )
            .await
            .unwrap()
            .body()
            .deserialize()
            .unwrap();
        // zbus writes doc comments as XML comments, which may hold `--` (not allowed in XML).
        let xml = without_comments(&xml);
        let options = roxmltree::ParsingOptions {
            allow_dtd: true,
            ..Default::default()
        };
        let doc = roxmltree::Document::parse_with_options(&xml, options).unwrap();
        let mut nodes = Vec::new();
        let mut todo: Vec<(String, roxmltree::Node<'_, '_>)> = doc
            .root_element()
            .children()
            .filter(|n| n.has_tag_name("node"))
            .map(|n| {
                (
                    format!("{MANAGER_PATH}/{}", n.attribute("name").unwrap()),
                    n,
                )
            })
            .collect();
        while let Some((path, node)) = todo.pop() {
            for child in node.children().filter(|n| n.has_tag_name("node")) {
                todo.push((
                    format!("{path}/{}", child.attribute("name").unwrap()),
                    child,
                ));
            }
            let interfaces: Vec<String> = node
                .children()
                .filter(|n| n.has_tag_name("interface"))
                .map(|n| n.attribute("name").unwrap().to_string())
                .filter(|n| {
                    ![
                        "org.freedesktop.DBus.Introspectable",
                        "org.freedesktop.DBus.Peer",
                        "org.freedesktop.DBus.Properties",
                        OM,
                    ]
                    .contains(&n.as_str())
                })
                .collect();
            nodes.push((path, interfaces));
        }
        let mut all = ManagedObjects::new();
        for (path, interfaces) in nodes {
            let mut props = HashMap::new();
            for name in interfaces {
                let got: HashMap<String, OwnedVariant> = self
                    .client
                    .call_method(
                        None::<&str>,
                        path.as_str(),
                        Some("org.freedesktop.DBus.Properties"),
                        "GetAll",
                        &(name.as_str(),),
                    )
                    .await
                    .unwrap()
                    .body()
                    .deserialize()
                    .unwrap();
                props.insert(name.try_into().unwrap(), got);
            }
            all.insert(ObjectPath::try_from(path).unwrap().into(), props);
        }
        all
    }

    /// Waits until zbus's answer satisfies `ready` (the mirror refreshes GPUs in the background),
    /// then checks that ours equals it.
    async fn compare_once(&self, what: &str, ready: impl Fn(&ManagedObjects) -> bool) {
        self.service.mirror.settle().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let theirs = loop {
            let theirs = self.zbus_own().await;
            if ready(&theirs) {
                break theirs;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: the objects never got there: {theirs:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let ours = self.ours().await;
        assert_eq!(ours, theirs, "{what}: our answer differs from zbus's");
        // And answered again from the same objects, still equal.
        assert_eq!(
            self.ours().await,
            theirs,
            "{what}: the reused answer differs"
        );
    }

    async fn object_manager(&self) -> InterfaceRef<ObjectManager> {
        self.server
            .object_server()
            .interface::<_, ObjectManager>(MANAGER_PATH)
            .await
            .unwrap()
    }

    async fn create(&self, profile: &str) -> MdevUuid {
        let spec = InstanceSpec {
            target: InstanceTarget::Profile(profile.into()),
            gpu: None,
            uuid: None,
            autostart: false,
            label: Some("vm-1".into()),
            attrs: Vec::new(),
        };
        let v = call(&self.exec, CreateInstance(spec)).await.unwrap();
        self.service.mirror.settle().await;
        v.uuid
    }

    async fn destroy(&self, uuid: MdevUuid) {
        call(&self.exec, DestroyInstance { uuid }).await.unwrap();
        self.service.mirror.settle().await;
    }
}

/// `xml` without its comments.
fn without_comments(xml: &str) -> String {
    let mut plain = String::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<!--") {
        plain.push_str(&rest[..start]);
        rest = rest[start..]
            .find("-->")
            .map_or("", |end| &rest[start + end + 3..]);
    }
    plain.push_str(rest);
    plain
}

/// Whether `objects` has the instance `uuid` and a GPU object that lists it (the GPU's refresh
/// after the change is done).
fn shows_instance(objects: &ManagedObjects, uuid: MdevUuid) -> bool {
    let path = instance_path(&uuid.to_string());
    objects.contains_key(&path) && gpus_list(objects).contains(&path.to_string())
}

/// The instance paths the GPU objects list in their `Instances` property.
fn gpus_list(objects: &ManagedObjects) -> Vec<String> {
    let mut listed = Vec::new();
    for ifaces in objects.values() {
        for (name, props) in ifaces {
            if name.as_str() != "org.vgpumanager.Gpu1" {
                continue;
            }
            let Some(v) = props.get("Instances") else {
                continue;
            };
            let paths: Vec<OwnedObjectPath> = v.try_clone().unwrap().try_into().unwrap();
            listed.extend(paths.into_iter().map(|p| p.to_string()));
        }
    }
    listed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_zbus_own_through_creates_destroys_and_gpu_changes() {
    let s = setup().await;
    s.compare_once("at start", |o| !o.is_empty()).await;
    assert!(
        s.ours()
            .await
            .keys()
            .any(|p| p.as_str() == "/org/vgpumanager/Manager1/gpu"),
        "the intermediate node is listed, as zbus lists it"
    );
    let a = s.create("vdi-1g").await;
    s.compare_once("after a create", |o| shows_instance(o, a))
        .await;
    let b = s.create("vdi-2g").await;
    // The GPU that got `b` changed its Types and Instances properties.
    s.compare_once("after a second create", |o| {
        shows_instance(o, a) && shows_instance(o, b)
    })
    .await;
    s.destroy(a).await;
    s.compare_once("after a destroy", |o| {
        let gone = instance_path(&a.to_string()).to_string();
        !o.keys().any(|p| p.as_str() == gone) && !gpus_list(o).contains(&gone)
    })
    .await;
    s.destroy(b).await;
    s.compare_once("after the last destroy", |o| {
        !gpus_list(o).contains(&instance_path(&b.to_string()).to_string())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_reused_until_an_object_changes_or_it_ages() {
    let s = setup().await;
    let om = s.object_manager().await;
    let last = || async {
        let o = om.get().await;
        let last = o.last();
        last.as_ref()
            .map(|a| (a.generation, Arc::clone(&a.objects)))
    };
    s.ours().await;
    let (g1, first) = last().await.expect("an answer is kept");
    s.ours().await;
    let (g2, again) = last().await.unwrap();
    assert!(
        g1 == g2 && Arc::ptr_eq(&first, &again),
        "nothing changed: reused"
    );

    // A change of a served value (a Scheduling write, a preflight report): built anew.
    om.get().await.served.changed();
    s.ours().await;
    let (g3, after) = last().await.unwrap();
    assert!(g3 > g2 && !Arc::ptr_eq(&again, &after), "a change: rebuilt");

    // An instance added: built anew, with it.
    let uuid = s.create("vdi-1g").await;
    let ours = s.ours().await;
    assert!(ours.contains_key(&instance_path(&uuid.to_string())));
    let (g4, with) = last().await.unwrap();
    assert!(g4 > g3 && !Arc::ptr_eq(&after, &with));

    // During a change, answers are built for their call and not kept.
    let served = Arc::clone(&om.get().await.served);
    let change = served.change();
    s.ours().await;
    let (g5, during) = last().await.unwrap();
    assert!(
        g5 == g4 && Arc::ptr_eq(&with, &during),
        "none kept during a change"
    );
    drop(change);
    s.ours().await;
    let (g6, _) = last().await.unwrap();
    assert!(g6 > g5, "kept again once the change is over");

    // Old enough: built anew though nothing changed (Scheduling is read from the host).
    let (_, before) = last().await.unwrap();
    tokio::time::sleep(MAX_ANSWER_AGE + Duration::from_millis(100)).await;
    s.ours().await;
    let (_, aged) = last().await.unwrap();
    assert!(
        !Arc::ptr_eq(&before, &aged),
        "an answer past its age: rebuilt"
    );
}

/// The object an InterfacesAdded or InterfacesRemoved signal is about.
fn signal_path(msg: &zbus::Message) -> Option<OwnedObjectPath> {
    type Added = (
        OwnedObjectPath,
        HashMap<String, HashMap<String, OwnedVariant>>,
    );
    match msg.header().member()?.as_str() {
        "InterfacesAdded" => msg.body().deserialize::<Added>().ok().map(|(p, _)| p),
        "InterfacesRemoved" => msg
            .body()
            .deserialize::<(OwnedObjectPath, Vec<String>)>()
            .ok()
            .map(|(p, _)| p),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zbus_still_announces_objects_added_and_removed() {
    let s = setup().await;
    let mut stream = zbus::MessageStream::from(&s.client);
    let uuid = s.create("vdi-1g").await;
    let path = instance_path(&uuid.to_string());
    // The next ObjectManager signal about `path` (the GPU objects registered at start are
    // announced too, maybe after the stream began).
    let mut next_about = async |path: &OwnedObjectPath| loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a signal")
            .unwrap()
            .unwrap();
        let hdr = msg.header();
        if msg.message_type() == Type::Signal
            && hdr.interface().map(|i| i.as_str()) == Some(OM)
            && hdr.path().map(|p| p.as_str()) == Some(MANAGER_PATH)
            && signal_path(&msg).as_ref() == Some(path)
        {
            return msg;
        }
    };
    let added = next_about(&path).await;
    assert_eq!(added.header().member().unwrap().as_str(), "InterfacesAdded");
    let (p, ifaces): (
        OwnedObjectPath,
        HashMap<String, HashMap<String, OwnedVariant>>,
    ) = added.body().deserialize().unwrap();
    assert_eq!(p, path);
    let props = &ifaces[INSTANCE_INTERFACE];
    assert_eq!(
        String::try_from(props["Uuid"].try_clone().unwrap()).unwrap(),
        uuid.to_string()
    );
    // Every property, as `GetAll` of the registered object reads it.
    let get_all: HashMap<String, OwnedVariant> = s
        .client
        .call_method(
            None::<&str>,
            &path,
            Some("org.freedesktop.DBus.Properties"),
            "GetAll",
            &(INSTANCE_INTERFACE,),
        )
        .await
        .unwrap()
        .body()
        .deserialize()
        .unwrap();
    assert!(get_all.len() >= 10, "{get_all:?}");
    assert_eq!(props, &get_all);
    s.destroy(uuid).await;
    let removed = next_about(&path).await;
    assert_eq!(
        removed.header().member().unwrap().as_str(),
        "InterfacesRemoved"
    );
    let (p, names): (OwnedObjectPath, Vec<String>) = removed.body().deserialize().unwrap();
    assert_eq!((p, names), (path, vec![INSTANCE_INTERFACE.to_string()]));
}

/// How zbus 6's `fdo::ObjectManager` introspects (this test compared with it while vgpu-manager
/// built zbus's `object-manager` feature): the interface of the D-Bus specification,
/// "org.freedesktop.DBus.ObjectManager".
const ZBUS_OBJECT_MANAGER_XML: &str = r#"<interface name="org.freedesktop.DBus.ObjectManager">
  <method name="GetManagedObjects">
    <arg type="a{oa{sa{sv}}}" direction="out"/>
  </method>
  <signal name="InterfacesAdded">
    <arg name="object_path" type="o"/>
    <arg name="interfaces_and_properties" type="a{sa{sv}}"/>
  </signal>
  <signal name="InterfacesRemoved">
    <arg name="object_path" type="o"/>
    <arg name="interfaces" type="as"/>
  </signal>
</interface>
"#;

#[test]
fn the_interface_introspects_as_zbus_own() {
    let mut ours = String::new();
    ObjectManager::new(Arc::default(), Arc::default(), Authorizer::default())
        .introspect_to_writer(&mut ours, 0);
    assert_eq!(ours, ZBUS_OBJECT_MANAGER_XML);
}

/// The properties `InterfacesAdded` announces of a new instance object, as the mirror serializes
/// them from the view, against the object's own `GetAll`: the same names and the same values, for
/// views that set each property its own way (a label, attributes, no IOMMU group, a foreign
/// device, a stopped definition).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn announced_instance_properties_are_the_objects_get_all() {
    use crate::daemon::api::{InstanceState, InstanceView, MdevAttr, Ownership};
    use crate::daemon::dbus::instance::{AnnouncedInstance, InstanceObject};

    let s = setup().await;
    let running = InstanceView {
        uuid: "6d0c5a4e-7b1f-4c1e-9a55-766770757465".parse().unwrap(),
        gpu: "0000:41:00.0".into(),
        parent: "0000:41:00.4".into(),
        type_id: "nvidia-558".parse().unwrap(),
        profile: Some("vdi-2g".into()),
        state: InstanceState::Running,
        defined: true,
        autostart: true,
        ownership: Ownership::Daemon,
        label: Some("desktop-07".into()),
        iommu_group: Some(131),
        created_at: 1_765_000_000,
        attrs: vec![
            MdevAttr::new("assign_adapter", "5").unwrap(),
            MdevAttr::new("assign_domain", "0x2b").unwrap(),
        ],
    };
    let foreign = InstanceView {
        profile: None,
        defined: false,
        autostart: false,
        ownership: Ownership::Foreign,
        label: None,
        attrs: Vec::new(),
        ..running.clone()
    };
    let stopped = InstanceView {
        state: InstanceState::Stopped,
        iommu_group: None,
        ownership: Ownership::Adopted,
        ..running.clone()
    };
    for view in [running, foreign, stopped] {
        let path = instance_path(&view.uuid.to_string());
        let emitter = SignalEmitter::new(&s.server, path.clone()).unwrap();
        let get_all = InstanceObject::new(view.clone())
            .get_all(s.server.object_server(), &s.server, None, &emitter)
            .await
            .unwrap();
        // Through a message, as a client reads the signal.
        let msg = zbus::Message::signal(&path, INSTANCE_INTERFACE, "Probe")
            .build(&AnnouncedInstance::of(&view))
            .unwrap();
        let announced: HashMap<String, OwnedVariant> = msg.body().deserialize().unwrap();
        assert!(get_all.len() >= 14, "{get_all:?}");
        assert_eq!(announced, get_all, "{view:?}");
    }
}
