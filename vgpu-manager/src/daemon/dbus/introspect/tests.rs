//! vgpud's Introspect against zbus's own, on a simulated host served twice over peer-to-peer
//! connections: once as vgpud serves it, once with zbus's Introspectable left on every node (the
//! reference), both following the same engine.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use futures_util::StreamExt;
use zbus::connection::Builder;
use zbus::fdo::ManagedObjects;
use zbus::message::Type;

use super::*;
use crate::daemon::api::{CreateInstance, DestroyInstance, InstanceSpec, InstanceTarget};
use crate::daemon::dbus::admission::Principal;
use crate::daemon::dbus::{Executor, MAX_PENDING, Service, call, serve_objects};
use mdev_types::ids::MdevUuid;
use vgpu_client::instance_path;

/// One served copy of the objects: the serving and the client end of a connection.
struct Served2 {
    server: Connection,
    client: Connection,
    service: Service,
}

async fn serve_copy(exec: &Arc<dyn Executor>, answered: Answered) -> Served2 {
    let (a, b) = UnixStream::pair().unwrap();
    let guid = zbus::Guid::generate();
    let (server, client) = tokio::try_join!(
        Builder::unix_stream(a).server(guid).p2p().build(),
        Builder::unix_stream(b).p2p().build(),
    )
    .unwrap();
    let service = serve_objects(&server, Arc::clone(exec), Authorizer::default(), answered)
        .await
        .unwrap();
    Served2 {
        server,
        client,
        service,
    }
}

/// vgpud's objects on `--sim demo`, served by vgpud and, for reference, with zbus's Introspect.
struct Setup {
    ours: Served2,
    zbus: Served2,
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
    let ours = serve_copy(&exec, Answered::ByVgpud).await;
    let zbus = serve_copy(&exec, Answered::ByZbus).await;
    Setup {
        ours,
        zbus,
        exec,
        _state: state,
    }
}

/// The answer to `Introspect` at `path` on `conn`, or the error's name.
async fn introspect(conn: &Connection, path: &str) -> Result<String, String> {
    match conn
        .call_method(None::<&str>, path, Some(INTROSPECTABLE), "Introspect", &())
        .await
    {
        Ok(reply) => Ok(reply.body().deserialize().unwrap()),
        Err(zbus::Error::MethodError(name, _, _)) => Err(name.to_string()),
        Err(zbus::Error::FDO(e)) => Err(zbus::DBusError::name(&*e).to_string()),
        Err(e) => panic!("Introspect of {path}: {e}"),
    }
}

/// A node of an answer, for comparing answers whose children come in another order (zbus keeps a
/// node's children in a hash map): its own lines (its interfaces' XML as written, in order) and
/// its children by name. Read line by line, as zbus writes one element per line (its doc comments
/// may hold `--`, which an XML parser refuses).
#[derive(Debug, Default, PartialEq, Eq)]
struct Parsed {
    lines: Vec<String>,
    children: BTreeMap<String, Parsed>,
}

fn parse(xml: &str) -> Parsed {
    let mut lines = xml.lines();
    for line in lines.by_ref() {
        if line == "<node>" {
            break;
        }
    }
    let root = parse_node(&mut lines);
    let rest: Vec<&str> = lines.collect();
    assert!(rest.is_empty(), "after the root node: {rest:?} in {xml}");
    root
}

/// The node whose opening line was just read, up to its closing line.
fn parse_node(lines: &mut std::str::Lines<'_>) -> Parsed {
    let mut p = Parsed::default();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if let Some(name) = t
            .strip_prefix("<node name=\"")
            .and_then(|r| r.strip_suffix("\">"))
        {
            let child = parse_node(lines);
            p.children.insert(name.to_string(), child);
        } else if t == "</node>" {
            return p;
        } else {
            p.lines.push(line.to_string());
        }
    }
    panic!("a node without its closing line");
}

/// Every path of the tree `p` (at `path`).
fn paths(path: &str, p: &Parsed, out: &mut Vec<String>) {
    out.push(path.to_string());
    for (name, child) in &p.children {
        let below = if path == "/" {
            format!("/{name}")
        } else {
            format!("{path}/{name}")
        };
        paths(&below, child, out);
    }
}

impl Setup {
    /// Waits until both copies show the same tree (their mirrors follow the engine each on its own
    /// and refresh GPUs in the background), then checks that ours answers as zbus at every node:
    /// the same XML but for the order of children, of the same length, at every node, and the
    /// same error where no node is.
    async fn compare(&self, what: &str) -> Parsed {
        self.ours.service.mirror.settle().await;
        self.zbus.service.mirror.settle().await;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let theirs = introspect(&self.zbus.client, "/").await.unwrap();
            let ours = introspect(&self.ours.client, "/").await.unwrap();
            if parse(&ours) == parse(&theirs) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: Introspect of / differs:\nours:\n{ours}\nzbus's:\n{theirs}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let tree = parse(&introspect(&self.zbus.client, "/").await.unwrap());
        let mut all = Vec::new();
        paths("/", &tree, &mut all);
        assert!(all.len() > 6, "{what}: too few nodes: {all:?}");
        for path in &all {
            let theirs = introspect(&self.zbus.client, path).await.unwrap();
            let ours = introspect(&self.ours.client, path).await.unwrap();
            assert_eq!(parse(&ours), parse(&theirs), "{what}: at {path}");
            assert_eq!(ours.len(), theirs.len(), "{what}: at {path}");
            // Answered again from the same objects, still equal.
            let again = introspect(&self.ours.client, path).await.unwrap();
            assert_eq!(again, ours, "{what}: the reused answer at {path} differs");
        }
        for path in [
            "/org/vgpumanager/Manager1/nothing",
            "/org/vgpumanager/Manager1/instance",
        ] {
            if all.iter().any(|p| p == path) {
                continue;
            }
            assert_eq!(
                introspect(&self.ours.client, path).await,
                introspect(&self.zbus.client, path).await,
                "{what}: at {path}, where no object is"
            );
        }
        tree
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
        self.ours.service.mirror.settle().await;
        v.uuid
    }

    async fn destroy(&self, uuid: MdevUuid) {
        call(&self.exec, DestroyInstance { uuid }).await.unwrap();
        self.ours.service.mirror.settle().await;
    }

    async fn shared(&self) -> Arc<Introspection> {
        let iface = self
            .ours
            .server
            .object_server()
            .interface::<_, Introspectable>(MANAGER_PATH)
            .await
            .expect("vgpud's Introspectable at the manager");
        Arc::clone(&iface.get().await.shared)
    }
}

/// The instance objects below the manager in the tree `root`.
fn instances(root: &Parsed) -> usize {
    let manager = &root.children["org"].children["vgpumanager"].children["Manager1"];
    assert!(manager.children.contains_key("gpu"), "{manager:?}");
    manager
        .children
        .get("instance")
        .map_or(0, |c| c.children.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_zbus_own_at_every_node_through_creates_and_destroys() {
    let s = setup().await;
    // The demo host has a foreign instance.
    let at_start = instances(&s.compare("at start").await);
    let a = s.create("vdi-1g").await;
    let b = s.create("vdi-2g").await;
    assert_eq!(
        instances(&s.compare("after two creates").await),
        at_start + 2
    );
    s.destroy(a).await;
    assert_eq!(instances(&s.compare("after a destroy").await), at_start + 1);
    s.destroy(b).await;
    assert_eq!(
        instances(&s.compare("after the last destroy").await),
        at_start
    );
}

/// An interface of no meaning, to make nodes with.
struct Thing;

#[interface(name = "org.example.Thing")]
impl Thing {
    #[zbus(property)]
    fn n(&self) -> u32 {
        7
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_zbus_prunes_and_makes_anew_gets_ours_again() {
    let (a, b) = UnixStream::pair().unwrap();
    let (conn, _peer) = tokio::try_join!(
        Builder::unix_stream(a)
            .server(zbus::Guid::generate())
            .p2p()
            .build(),
        Builder::unix_stream(b).p2p().build(),
    )
    .unwrap();
    let server = conn.object_server();
    let shared = Arc::new(Introspection::new(
        Arc::default(),
        Arc::default(),
        Authorizer::default(),
        Answered::ByVgpud,
    ));
    let ours = async |path: &str| server.interface::<_, Introspectable>(path).await.is_ok();
    let leaf = ObjectPath::try_from("/org/x/container/leaf").unwrap();
    server.at(&leaf, Thing).await.unwrap();
    install(server, &leaf, &shared).await.unwrap();
    for p in [
        "/",
        "/org",
        "/org/x",
        "/org/x/container",
        "/org/x/container/leaf",
    ] {
        assert!(ours(p).await, "{p}: zbus's Introspectable left");
    }
    // The last object gone, zbus prunes the nodes that held only the standard interfaces.
    server.remove::<Thing, _>(&leaf).await.unwrap();
    assert!(!ours("/org/x/container").await, "the container is pruned");
    assert!(ours("/").await, "the root stays");
    // Made anew (with zbus's Introspectable), ours is put back on the way.
    server.at(&leaf, Thing).await.unwrap();
    assert!(!ours("/org/x/container").await, "zbus's, before the swap");
    install(server, &leaf, &shared).await.unwrap();
    for p in [
        "/",
        "/org",
        "/org/x",
        "/org/x/container",
        "/org/x/container/leaf",
    ] {
        assert!(ours(p).await, "{p}: zbus's Introspectable left");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_admitted_and_refused_past_the_share() {
    let s = setup().await;
    assert!(introspect(&s.ours.client, MANAGER_PATH).await.is_ok());
    // The peer-to-peer client has no bus name: its share is its connection's (no sender).
    let shared = s.shared().await;
    // The first call's admission is released once its reply is written, which may be just after the
    // client has read it: wait for that (a bounded retry), then hold the whole share.
    let mut held = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while held.len() < MAX_PENDING {
        match shared.admission.admit(None, Principal::Unknown, "ListGpus") {
            Ok(a) => held.push(a),
            Err(e) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the share never freed: {e}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    assert_eq!(
        introspect(&s.ours.client, MANAGER_PATH).await,
        Err("org.vgpumanager.Error.LimitsExceeded".to_string()),
        "past the share's calls pending, Introspect is refused as any other read"
    );
    drop(held);
    assert!(introspect(&s.ours.client, MANAGER_PATH).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_reused_until_an_object_changes() {
    let s = setup().await;
    let shared = s.shared().await;
    let last = |path: &str| {
        let last = lock(&shared.last);
        last.as_ref()
            .and_then(|a| Some((a.generation, Arc::clone(a.by_path.get(path)?))))
    };
    introspect(&s.ours.client, "/").await.unwrap();
    let (g1, first) = last("/").expect("an answer is kept");
    introspect(&s.ours.client, "/").await.unwrap();
    let (g2, again) = last("/").unwrap();
    assert!(
        g1 == g2 && Arc::ptr_eq(&first, &again),
        "nothing changed: reused"
    );
    // Another path has its own answer, kept beside.
    introspect(&s.ours.client, MANAGER_PATH).await.unwrap();
    assert!(last(MANAGER_PATH).is_some() && last("/").is_some());
    // An instance added: built anew, with it.
    let uuid = s.create("vdi-1g").await;
    let xml = introspect(&s.ours.client, "/").await.unwrap();
    let path = instance_path(&uuid.to_string());
    let node = path.as_str().rsplit('/').next().unwrap();
    assert!(xml.contains(&format!("<node name=\"{node}\">")), "{xml}");
    let (g3, with) = last("/").unwrap();
    assert!(g3 > g2 && !Arc::ptr_eq(&again, &with), "a change: rebuilt");
    assert!(
        last(MANAGER_PATH).is_none(),
        "the old generation's answers are dropped"
    );
}

/// The object an ObjectManager signal is about and the interfaces it names.
fn about(msg: &zbus::Message) -> (OwnedObjectPath, Vec<String>) {
    type Added = (
        OwnedObjectPath,
        HashMap<String, HashMap<String, zbus::OwnedVariant>>,
    );
    match msg.header().member().map(|m| m.to_string()).as_deref() {
        Some("InterfacesAdded") => {
            let (p, ifaces): Added = msg.body().deserialize().unwrap();
            (p, ifaces.into_keys().collect())
        }
        Some("InterfacesRemoved") => msg.body().deserialize().unwrap(),
        other => panic!("not an ObjectManager signal: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_are_announced_once_without_the_introspectable() {
    let s = setup().await;
    let mut stream = zbus::MessageStream::from(&s.ours.client);
    let uuid = s.create("vdi-1g").await;
    s.destroy(uuid).await;
    // Something after the destroy's signals, to know they have all come.
    let path = instance_path(&uuid.to_string());
    s.ours
        .server
        .emit_signal(None::<&str>, "/", "org.example.Test", "End", &())
        .await
        .unwrap();
    let mut signals = Vec::new();
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("the end signal")
            .unwrap()
            .unwrap();
        let hdr = msg.header();
        if msg.message_type() != Type::Signal {
            continue;
        }
        if hdr.member().map(|m| m.as_str()) == Some("End") {
            break;
        }
        if hdr.interface().map(|i| i.as_str()) != Some(OBJECT_MANAGER) {
            continue;
        }
        let (p, names) = about(&msg);
        assert!(
            !names.iter().any(|n| n == INTROSPECTABLE),
            "an ObjectManager signal names the Introspectable: {msg:?} about {p}: {names:?}"
        );
        if p == path {
            signals.push((hdr.member().unwrap().to_string(), names));
        }
    }
    let instance = vec![vgpu_client::INSTANCE_INTERFACE.to_string()];
    assert_eq!(
        signals,
        [
            ("InterfacesAdded".to_string(), instance.clone()),
            ("InterfacesRemoved".to_string(), instance)
        ],
        "the instance's ObjectManager signals"
    );
    // Nor do the answers of GetManagedObjects list it.
    let reply = s
        .ours
        .client
        .call_method(
            None::<&str>,
            MANAGER_PATH,
            Some(OBJECT_MANAGER),
            "GetManagedObjects",
            &(),
        )
        .await
        .unwrap();
    let objects: ManagedObjects = reply.body().deserialize().unwrap();
    assert!(
        objects
            .values()
            .all(|ifaces| !ifaces.keys().any(|n| n.as_str() == INTROSPECTABLE)),
        "{objects:?}"
    );
}

#[test]
fn a_fragment_is_indented_as_zbus_writes_it_at_a_level() {
    let mut at0 = String::new();
    zbus::fdo::Properties.introspect_to_writer(&mut at0, 0);
    let mut at4 = String::new();
    zbus::fdo::Properties.introspect_to_writer(&mut at4, 4);
    let mut ours = String::new();
    indent(&mut ours, &at0, 4);
    assert_eq!(ours, at4);
}
