//! `org.freedesktop.DBus.Introspectable` at every node vgpud serves, answered by vgpud itself in
//! place of zbus's.
//!
//! zbus's own renders the whole subtree below the called path anew for each call (about 70 KiB of
//! XML at `/` with the demo's GPUs), outside vgpud's admission, and holds it until the reply is
//! written: a user who pipelines calls on many connections makes vgpud hold thousands of answers.
//! Here a call goes through admission like every other read ([`MAX_PENDING`](super::MAX_PENDING)
//! per share, a build on one of the worker places) and stays admitted until its reply is written;
//! it is answered from the XML built for the called path while the served objects have not changed
//! ([`Served`]'s generation, as the object manager's answers), so a flood costs an `Arc` clone and
//! the serialization of each reply.
//!
//! The answer is zbus's (its object server's `Node::introspect`, which the D-Bus specification's
//! "Introspection Data Format" allows): the called node's interfaces in name order, each as its
//! `Interface::introspect_to_writer` writes it, then every node below it, each `<node name="…">`
//! with its own interfaces, two spaces more indented per level. The served nodes are `/`, `/org`,
//! `/org/vgpumanager`, the manager, and below it the GPU and instance objects and the nodes that
//! lead to them (`…/gpu`, `…/instance`); zbus prunes a node once it holds nothing but the standard
//! interfaces and no child, so the containers come and go with their first and last object.
//! zbus adds its own Introspectable to each node it creates; [`install`] puts ours in its place.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use zbus::message::Header;
use zbus::names::InterfaceName;
use zbus::object_server::Interface;
use zbus::{Connection, ObjectPath, ObjectServer, OwnedObjectPath, interface};

use super::admission::{self, Admission};
use super::errors::ApiError;
use super::object_manager::{Kind, Served};
use super::{Authorizer, admit_call};
use vgpu_client::{GPU_INTERFACE, INSTANCE_INTERFACE, MANAGER_INTERFACE, MANAGER_PATH};

/// The interface's name.
const INTROSPECTABLE: &str = "org.freedesktop.DBus.Introspectable";
/// The ObjectManager's name (served at the manager, `object_manager.rs`).
const OBJECT_MANAGER: &str = "org.freedesktop.DBus.ObjectManager";
/// The Peer interface, which zbus serves on every node.
const PEER: &str = "org.freedesktop.DBus.Peer";
/// The Properties interface, which zbus serves on every node.
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";

/// How zbus's Peer introspects (its `#[interface]` of `Ping()` and `GetMachineId() -> s`; D-Bus
/// specification, "org.freedesktop.DBus.Peer"), at level 0. zbus's own type is not public; the
/// tests compare the whole answer with zbus's.
const PEER_XML: &str = "<interface name=\"org.freedesktop.DBus.Peer\">
  <method name=\"Ping\">
  </method>
  <method name=\"GetMachineId\">
    <arg type=\"s\" direction=\"out\"/>
  </method>
</interface>
";

/// The start of zbus's answer, before the called node's interfaces.
const HEADER: &str = "
<!DOCTYPE node PUBLIC \"-//freedesktop//DTD D-BUS Object Introspection 1.0//EN\"
 \"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd\">
<node>
";

/// Who answers `Introspect`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// vgpud, through admission (always, but in the tests' reference service).
    ByVgpud,
    /// zbus's own Introspectable, left on every node (what the tests compare vgpud's answers with).
    #[cfg_attr(not(test), allow(dead_code))]
    ByZbus,
}

/// What the Introspectable of every node shares: the served objects, admission, the interfaces'
/// XML and the last answers.
#[derive(Debug)]
pub(super) struct Introspection {
    served: Arc<Served>,
    admission: Arc<Admission>,
    auth: Authorizer,
    answered: Answered,
    /// Each interface's XML at level 0, by interface name: recorded from the interfaces themselves
    /// as they are registered ([`Introspection::learn`]).
    fragments: Mutex<HashMap<String, Arc<str>>>,
    last: Mutex<Option<Answers>>,
    /// Held by the one call that builds an answer; the others then find it built.
    building: tokio::sync::Mutex<()>,
}

/// The answers built for one generation of the served objects, by called path.
#[derive(Debug)]
struct Answers {
    generation: u64,
    by_path: HashMap<String, Arc<str>>,
}

impl Introspection {
    /// The introspection of the objects in `served`, whose calls `admission` admits (for the
    /// callers' shares `auth` tells).
    pub(super) fn new(
        served: Arc<Served>,
        admission: Arc<Admission>,
        auth: Authorizer,
        answered: Answered,
    ) -> Introspection {
        let mut fragments = HashMap::new();
        fragments.insert(PEER.to_string(), Arc::from(PEER_XML));
        let introspection = Introspection {
            served,
            admission,
            auth,
            answered,
            fragments: Mutex::new(fragments),
            last: Mutex::new(None),
            building: tokio::sync::Mutex::new(()),
        };
        introspection.learn(&zbus::fdo::Properties);
        introspection
    }

    /// Records how `iface` introspects (once per interface name): call it with every interface
    /// vgpud registers, before registering it.
    pub(super) fn learn<I: Interface>(&self, iface: &I) {
        let mut fragments = lock(&self.fragments);
        let name = I::name();
        if !fragments.contains_key(name.as_str()) {
            let mut xml = String::new();
            iface.introspect_to_writer(&mut xml, 0);
            fragments.insert(name.to_string(), Arc::from(xml));
        }
    }

    /// The last answer for `path`, if no served object changed since it was built.
    fn current(&self, path: &str) -> Option<Arc<str>> {
        let generation = self.served.stable_generation()?;
        match &*lock(&self.last) {
            Some(a) if a.generation == generation => a.by_path.get(path).cloned(),
            _ => None,
        }
    }

    /// The answer to the admitted call `ticket` of `Introspect` at `path`: the last one, or one
    /// built from the served objects.
    async fn answer(&self, ticket: &admission::Ticket, path: &str) -> Result<Arc<str>, ApiError> {
        if let Some(a) = self.current(path) {
            return Ok(a);
        }
        let _building = self.building.lock().await;
        // Built meanwhile by the call that held the lock.
        if let Some(a) = self.current(path) {
            return Ok(a);
        }
        // A build walks every served object: it takes one of the admission's worker places, as a
        // Manager1 method does.
        let Ok(_running) = ticket.running().await else {
            return Err(admission::gone_error(ticket, "Introspect"));
        };
        // Read before the objects: an answer is at least as new as its generation.
        let (generation, objects) = self.served.snapshot();
        let fragments = lock(&self.fragments).clone();
        let xml: Arc<str> = Arc::from(
            render(path, &objects, &fragments).ok_or_else(|| ApiError::unknown_object(path))?,
        );
        // One built during a change answers this call only.
        if let Some(generation) = generation {
            let mut last = lock(&self.last);
            match &mut *last {
                Some(a) if a.generation == generation => {
                    a.by_path.insert(path.to_string(), Arc::clone(&xml));
                }
                _ => {
                    *last = Some(Answers {
                        generation,
                        by_path: HashMap::from([(path.to_string(), Arc::clone(&xml))]),
                    });
                }
            }
        }
        Ok(xml)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain data: a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One node of the served tree.
#[derive(Debug, Default)]
struct TreeNode {
    /// The interfaces beyond the standard ones.
    own: Vec<&'static str>,
    children: BTreeMap<String, TreeNode>,
}

/// The node at `path` below `root`, made with its ancestors if missing.
fn node_at<'a>(root: &'a mut TreeNode, path: &str) -> &'a mut TreeNode {
    path.split('/')
        .filter(|s| !s.is_empty())
        .fold(root, |node, segment| {
            node.children.entry(segment.to_string()).or_default()
        })
}

/// The served tree: the nodes down to the manager and every object in `objects`.
fn tree(objects: &[(OwnedObjectPath, Kind)]) -> TreeNode {
    let mut root = TreeNode::default();
    node_at(&mut root, MANAGER_PATH).own = vec![OBJECT_MANAGER, MANAGER_INTERFACE];
    for (path, kind) in objects {
        node_at(&mut root, path.as_str()).own = vec![match kind {
            Kind::Gpu => GPU_INTERFACE,
            Kind::Instance => INSTANCE_INTERFACE,
        }];
    }
    root
}

/// zbus's answer to `Introspect` at `path` for the served `objects`, with the interfaces' XML in
/// `fragments`; `None` when `path` is not served.
fn render(
    path: &str,
    objects: &[(OwnedObjectPath, Kind)],
    fragments: &HashMap<String, Arc<str>>,
) -> Option<String> {
    let root = tree(objects);
    let mut node = &root;
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        node = node.children.get(segment)?;
    }
    let mut xml = String::from(HEADER);
    write_node(&mut xml, node, 0, fragments);
    Some(xml)
}

/// `node`'s interfaces and children at `level`, then its closing tag (its opening one is written
/// by the caller).
fn write_node(
    xml: &mut String,
    node: &TreeNode,
    level: usize,
    fragments: &HashMap<String, Arc<str>>,
) {
    let mut names: Vec<&str> = vec![INTROSPECTABLE, PEER, PROPERTIES];
    names.extend(node.own.iter().copied());
    names.sort_unstable();
    for name in names {
        match fragments.get(name) {
            Some(f) => indent(xml, f, level + 2),
            // Every interface is learnt before it is registered.
            None => tracing::warn!(
                interface = name,
                "no introspection recorded for an interface"
            ),
        }
    }
    for (name, child) in &node.children {
        let _ = writeln!(
            xml,
            "{:indent$}<node name=\"{name}\">",
            "",
            indent = level + 2
        );
        write_node(xml, child, level + 2, fragments);
    }
    let _ = writeln!(xml, "{:indent$}</node>", "", indent = level);
}

/// `fragment` (written at level 0) as written at `level`: zbus indents every line but the empty
/// ones (in doc comments) by the level.
fn indent(xml: &mut String, fragment: &str, level: usize) {
    for line in fragment.lines() {
        if !line.is_empty() {
            let _ = write!(xml, "{:indent$}", "", indent = level);
        }
        xml.push_str(line);
        xml.push('\n');
    }
}

/// An `Introspect` reply that keeps its call admitted until zbus has sent it (see
/// `object_manager::Reply`).
#[derive(Debug)]
pub(super) struct Reply {
    xml: Arc<str>,
    _ticket: admission::Ticket,
}

impl serde::Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.xml)
    }
}

impl zbus::Type for Reply {
    const SIGNATURE: &'static zbus::Signature = <&str as zbus::Type>::SIGNATURE;
}

/// The `org.freedesktop.DBus.Introspectable` interface of one served node.
#[derive(Debug)]
pub(super) struct Introspectable {
    shared: Arc<Introspection>,
}

/// The standard Introspectable (D-Bus specification, "org.freedesktop.DBus.Introspectable").
#[interface(
    name = "org.freedesktop.DBus.Introspectable",
    introspection_docs = false
)]
impl Introspectable {
    /// The XML description of the object, its interfaces and the objects below it.
    async fn introspect(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Reply, ApiError> {
        const METHOD: &str = "Introspect";
        let s = &self.shared;
        let ticket = admit_call(&s.auth, &s.admission, conn, &hdr, METHOD).await?;
        let path = hdr.path().map(|p| p.as_str()).unwrap_or("/");
        let xml = s.answer(&ticket, path).await?;
        Ok(Reply {
            xml,
            _ticket: ticket,
        })
    }
}

/// Puts vgpud's Introspectable in place of zbus's at `path`; `false` when it was there already.
async fn install_at(
    server: &ObjectServer,
    path: &ObjectPath<'_>,
    shared: &Arc<Introspection>,
) -> zbus::Result<bool> {
    if server.interface::<_, Introspectable>(path).await.is_ok() {
        return Ok(false);
    }
    // zbus announces no interface registered or removed (vgpud announces its objects itself,
    // `object_manager::register`), so the swap is seen only by a call made in between, which
    // zbus answers `UnknownInterface`: only nodes nobody has been told of are swapped (a new
    // object, before it is announced, and the nodes made on the way to it; the nodes down to the
    // manager before vgpud takes its name).
    let name = InterfaceName::from_static_str_unchecked(INTROSPECTABLE);
    match server.remove_named(path, name).await {
        Ok(_) | Err(zbus::Error::InterfaceNotFound) => {}
        Err(e) => return Err(e),
    }
    let ours = Introspectable {
        shared: Arc::clone(shared),
    };
    shared.learn(&ours);
    server.at(path, ours).await?;
    Ok(true)
}

/// Puts vgpud's Introspectable at `path` and at the nodes above it that zbus made on the way
/// (each with zbus's own), up to the first that has vgpud's already.
pub(super) async fn install(
    server: &ObjectServer,
    path: &ObjectPath<'_>,
    shared: &Arc<Introspection>,
) -> zbus::Result<()> {
    if shared.answered == Answered::ByZbus {
        return Ok(());
    }
    let mut at = path.clone();
    while install_at(server, &at, shared).await? {
        let parent = match at.as_str().rsplit_once('/') {
            Some(("", "")) | None => return Ok(()),
            Some(("", _)) => "/",
            Some((parent, _)) => parent,
        };
        at = ObjectPath::try_from(parent)?.into_owned();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
