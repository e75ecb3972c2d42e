//! `org.freedesktop.DBus.ObjectManager` at `/org/vgpumanager/Manager1`, served by vgpud itself
//! instead of zbus's `fdo::ObjectManager`.
//!
//! zbus's own reads the properties of every object for each call, outside vgpud's admission, with
//! the whole object tree locked meanwhile (and `Gpu1.Scheduling`, read from the host, per GPU per
//! call), so a client that pipelines calls makes vgpud build thousands of answers at once. Here a
//! call goes through admission ([`MAX_PENDING`](super::MAX_PENDING) per client, like the Manager1
//! methods) and is answered from the last answer built while the served objects have not changed
//! since ([`Served`]'s generation, bumped by the mirror after each change): a flood costs an `Arc`
//! clone and the serialization of each reply. One call at a time builds a new answer, on one of the
//! admission's worker places.
//!
//! The answer is the one zbus's would be (D-Bus specification, "org.freedesktop.DBus.ObjectManager"):
//! every object below the manager's path with each interface's `GetAll` properties, and, as zbus
//! lists every node of its tree below the manager, the intermediate nodes (`…/gpu`, `…/instance`)
//! with no interface.
//!
//! vgpud also announces the objects it adds and removes below the manager itself ([`register`],
//! [`unregister`]: `InterfacesAdded` with the interface's `GetAll` properties, `InterfacesRemoved`
//! with its name), as zbus's object server announces each interface registered below an object
//! manager. zbus's own announcing (its `object-manager` feature, off here) would also announce the
//! Introspectable vgpud puts in place of zbus's on each node (`introspect.rs`), which no client
//! should see as an interface of an object.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use zbus::fdo::ManagedObjects;
use zbus::message::Header;
use zbus::names::InterfaceName;
use zbus::object_server::{Interface, SignalEmitter};
use zbus::{Connection, ObjectPath, ObjectServer, OwnedObjectPath, OwnedVariant, interface};

use super::admission::{self, Admission};
use super::errors::ApiError;
use super::gpu::GpuObject;
use super::instance::InstanceObject;
use super::introspect::{self, Introspection};
use super::{Authorizer, admit_call};
use vgpu_client::MANAGER_PATH;

/// How long an answer is reused while no served object changed: `Gpu1.Scheduling` is read from the
/// host (its vendor backend), which may change it without vgpud knowing, so an answer is rebuilt
/// at least this often under a flood (one rebuild, not one per call).
pub(super) const MAX_ANSWER_AGE: Duration = Duration::from_secs(1);

/// What an object below the manager serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `org.vgpumanager.Gpu1` ([`GpuObject`]).
    Gpu,
    /// `org.vgpumanager.Instance1` ([`InstanceObject`]).
    Instance,
}

/// The objects the mirror serves below the manager, with a generation that changes with each change
/// of one of them (an object added or removed, a property changed).
///
/// The mirror makes each change of the object tree inside a [`Change`]: while one is under way no
/// answer is reused or kept, so a client that reacts to the change's signal (zbus emits
/// `InterfacesAdded` from inside the registration) is never answered from before it.
#[derive(Debug, Default)]
pub(super) struct Served {
    state: Mutex<ServedState>,
}

#[derive(Debug, Default)]
struct ServedState {
    generation: u64,
    /// Changes under way.
    changing: usize,
    objects: HashMap<OwnedObjectPath, Kind>,
}

/// A change of the object tree under way (see [`Served::change`]); dropping it ends the change.
#[derive(Debug)]
pub(super) struct Change<'a> {
    served: &'a Served,
}

impl Change<'_> {
    /// The object `path` of `kind` is now served (call once it is registered).
    pub(super) fn added(&self, path: &ObjectPath<'_>, kind: Kind) {
        self.served
            .lock()
            .objects
            .insert(path.to_owned().into(), kind);
    }

    /// The object `path` is no longer served (call once it is removed).
    pub(super) fn removed(&self, path: &ObjectPath<'_>) {
        self.served.lock().objects.remove(path);
    }
}

impl Drop for Change<'_> {
    fn drop(&mut self) {
        let mut s = self.served.lock();
        s.changing = s.changing.saturating_sub(1);
        s.generation += 1;
    }
}

impl Served {
    fn lock(&self) -> MutexGuard<'_, ServedState> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Begins a change of the object tree: an object registered or removed, a served value
    /// replaced. Hold it over the change.
    pub(super) fn change(&self) -> Change<'_> {
        let mut s = self.lock();
        s.changing += 1;
        s.generation += 1;
        Change { served: self }
    }

    /// Something the objects show may have changed without the mirror changing them (a value read
    /// from the host, a report kept by an object): the next answer is built anew.
    pub(super) fn changed(&self) {
        self.lock().generation += 1;
    }

    /// The current generation, if no change is under way.
    pub(super) fn stable_generation(&self) -> Option<u64> {
        let s = self.lock();
        (s.changing == 0).then_some(s.generation)
    }

    /// The generation (if no change is under way) and the objects as of then (or newer: the
    /// objects may change before they are read).
    pub(super) fn snapshot(&self) -> (Option<u64>, Vec<(OwnedObjectPath, Kind)>) {
        let s = self.lock();
        let objects = s.objects.iter().map(|(p, k)| (p.clone(), *k)).collect();
        ((s.changing == 0).then_some(s.generation), objects)
    }
}

/// The last answer built.
#[derive(Debug)]
struct Answer {
    generation: u64,
    built: Instant,
    objects: Arc<ManagedObjects>,
}

/// The `org.freedesktop.DBus.ObjectManager` interface of the manager object.
#[derive(Debug)]
pub(super) struct ObjectManager {
    served: Arc<Served>,
    admission: Arc<Admission>,
    auth: Authorizer,
    last: Mutex<Option<Answer>>,
    /// Held by the one call that builds a new answer; the others then find it built.
    building: tokio::sync::Mutex<()>,
}

impl ObjectManager {
    /// The object manager of the objects in `served`, whose calls `admission` admits (for the
    /// callers' shares `auth` tells).
    pub(super) fn new(
        served: Arc<Served>,
        admission: Arc<Admission>,
        auth: Authorizer,
    ) -> ObjectManager {
        ObjectManager {
            served,
            admission,
            auth,
            last: Mutex::new(None),
            building: tokio::sync::Mutex::new(()),
        }
    }

    fn last(&self) -> MutexGuard<'_, Option<Answer>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.last.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The last answer, if no served object changed since and it is younger than
    /// [`MAX_ANSWER_AGE`].
    fn current(&self) -> Option<Arc<ManagedObjects>> {
        let generation = self.served.stable_generation()?;
        match &*self.last() {
            Some(a) if a.generation == generation && a.built.elapsed() < MAX_ANSWER_AGE => {
                Some(Arc::clone(&a.objects))
            }
            _ => None,
        }
    }

    /// The answer to the admitted call `ticket` of `method`: the last one, or a new one built from
    /// the served objects.
    async fn answer(
        &self,
        ticket: &admission::Ticket,
        method: &str,
        server: &ObjectServer,
        conn: &Connection,
    ) -> Result<Arc<ManagedObjects>, ApiError> {
        if let Some(a) = self.current() {
            return Ok(a);
        }
        let _building = self.building.lock().await;
        // Built meanwhile by the call that held the lock.
        if let Some(a) = self.current() {
            return Ok(a);
        }
        // A build reads every object (and the host, for Gpu1.Scheduling): it takes one of the
        // admission's worker places, as a Manager1 method does.
        let Ok(_running) = ticket.running().await else {
            return Err(admission::gone_error(ticket, method));
        };
        let built = Instant::now();
        // Read before the objects: an answer is at least as new as its generation.
        let (generation, objects) = self.served.snapshot();
        let objects = Arc::new(managed_objects(server, conn, &objects).await?);
        // One built during a change answers this call only.
        if let Some(generation) = generation {
            *self.last() = Some(Answer {
                generation,
                built,
                objects: Arc::clone(&objects),
            });
        }
        Ok(objects)
    }
}

/// A `GetManagedObjects` reply that keeps its call admitted until zbus has sent it: zbus serializes
/// and writes a method's return value after the method returns, and an answer reused from memory
/// returns at once, so without it a pipelining client would have every one of its calls admitted
/// in turn and thousands of replies waiting to be written, ahead of every other client's.
#[derive(Debug)]
pub(super) struct Reply {
    objects: Arc<ManagedObjects>,
    _ticket: admission::Ticket,
}

impl serde::Serialize for Reply {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.objects.serialize(serializer)
    }
}

impl zbus::Type for Reply {
    const SIGNATURE: &'static zbus::Signature = ManagedObjects::SIGNATURE;
}

/// The `GetAll` properties of the interface `I` at `path`; `None` once the object has gone.
async fn properties<I: Interface>(
    server: &ObjectServer,
    conn: &Connection,
    path: &ObjectPath<'_>,
) -> Result<Option<HashMap<String, OwnedVariant>>, ApiError> {
    let iface = match server.interface::<_, I>(path).await {
        Ok(i) => i,
        Err(zbus::Error::InterfaceNotFound) => return Ok(None),
        Err(e) => return Err(ApiError::internal(format!("cannot look up {path}: {e}"))),
    };
    let object = iface.get().await;
    // No header: the read is vgpud's own, as zbus's object manager makes it.
    object
        .get_all(server, conn, None, iface.signal_emitter())
        .await
        .map(Some)
        .map_err(|e| ApiError::internal(format!("cannot read the properties of {path}: {e}")))
}

/// zbus's `GetManagedObjects` answer for the manager serving `objects`.
async fn managed_objects(
    server: &ObjectServer,
    conn: &Connection,
    objects: &[(OwnedObjectPath, Kind)],
) -> Result<ManagedObjects, ApiError> {
    let below = format!("{MANAGER_PATH}/");
    let mut answer = ManagedObjects::new();
    for (path, kind) in objects {
        let (name, props) = match kind {
            Kind::Gpu => (
                GpuObject::name(),
                properties::<GpuObject>(server, conn, path).await?,
            ),
            Kind::Instance => (
                InstanceObject::name(),
                properties::<InstanceObject>(server, conn, path).await?,
            ),
        };
        let Some(props) = props else { continue };
        // The nodes between the manager and the object, which zbus lists with no interface.
        let mut node = path.as_str();
        while let Some((parent, _)) = node.rsplit_once('/') {
            if !parent.starts_with(&below) {
                break;
            }
            if let Ok(p) = ObjectPath::try_from(parent) {
                answer.entry(p.into()).or_default();
            }
            node = parent;
        }
        answer.insert(path.clone(), HashMap::from([(name.into(), props)]));
    }
    Ok(answer)
}

/// Registers `object` (of `kind`) at `path` below the manager, within `change`: with vgpud's
/// Introspectable on its node and on the nodes made on the way to it, then announced with
/// `InterfacesAdded` and the object's `GetAll` properties, read as zbus's object server reads them for
/// that signal (no caller). An object already registered there is left as it is, not announced again.
pub(super) async fn register<I: Interface>(
    conn: &Connection,
    introspection: &Arc<Introspection>,
    change: &Change<'_>,
    path: &ObjectPath<'_>,
    object: I,
    kind: Kind,
) -> zbus::Result<()> {
    // The announced properties are read before zbus takes the object: nothing changes it in between
    // (the mirror is its only writer), and they need no lookup of the object in zbus's tree.
    let props = object
        .get_all(
            conn.object_server(),
            conn,
            None,
            &SignalEmitter::new(conn, path.clone())?,
        )
        .await?;
    if place(conn, introspection, change, path, object, kind).await? {
        announce_added::<I, _>(conn, path, &props).await?;
    }
    Ok(())
}

/// The first half of [`register`]: puts `object` in place at `path` without announcing it; false
/// when an object was already registered there (it is left as it is).
pub(super) async fn place<I: Interface>(
    conn: &Connection,
    introspection: &Arc<Introspection>,
    change: &Change<'_>,
    path: &ObjectPath<'_>,
    object: I,
    kind: Kind,
) -> zbus::Result<bool> {
    let server = conn.object_server();
    introspection.learn(&object);
    let known = server.at(path, object).await?.is_some();
    if !known {
        introspect::install(server, path, introspection).await?;
    }
    change.added(path, kind);
    Ok(!known)
}

/// The second half of [`register`]: `InterfacesAdded` of the object at `path` serving `I`, with
/// `props`, every property of `I` as its `GetAll` answers (an `a{sv}`: a map of variants, or a
/// struct serialized as one).
pub(super) async fn announce_added<I: Interface, P>(
    conn: &Connection,
    path: &ObjectPath<'_>,
    props: &P,
) -> zbus::Result<()>
where
    P: serde::Serialize + zbus::wire::Type,
{
    // `ObjectManager::interfaces_added` declares the signal; it is sent here with a body of any
    // `a{sv}`, which the declared map type would not take.
    let emitter = SignalEmitter::new(conn, MANAGER_PATH)?;
    let body = (path, HashMap::from([(I::name(), props)]));
    emitter
        .emit(ObjectManager::name(), "InterfacesAdded", &body)
        .await
}

/// Removes the object `path` serving `I` within `change`, and announces it with
/// `InterfacesRemoved` (zbus prunes its node, and the nodes above that then hold nothing).
pub(super) async fn unregister<I: Interface>(
    conn: &Connection,
    change: &Change<'_>,
    path: &ObjectPath<'_>,
) -> zbus::Result<()> {
    take_down::<I>(conn, change, path).await?;
    announce_removed::<I>(conn, path).await
}

/// The first half of [`unregister`]: removes the object without announcing it.
pub(super) async fn take_down<I: Interface>(
    conn: &Connection,
    change: &Change<'_>,
    path: &ObjectPath<'_>,
) -> zbus::Result<()> {
    conn.object_server().remove::<I, _>(path).await?;
    change.removed(path);
    Ok(())
}

/// The second half of [`unregister`]: `InterfacesRemoved` of the object at `path` serving `I`.
pub(super) async fn announce_removed<I: Interface>(
    conn: &Connection,
    path: &ObjectPath<'_>,
) -> zbus::Result<()> {
    let emitter = SignalEmitter::new(conn, MANAGER_PATH)?;
    ObjectManager::interfaces_removed(&emitter, path.clone(), Cow::Owned(vec![I::name()])).await
}

/// The standard ObjectManager (D-Bus specification, "org.freedesktop.DBus.ObjectManager").
#[interface(
    name = "org.freedesktop.DBus.ObjectManager",
    introspection_docs = false
)]
impl ObjectManager {
    /// Every object below the manager with its interfaces and their properties.
    async fn get_managed_objects(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Reply, ApiError> {
        const METHOD: &str = "GetManagedObjects";
        let ticket = admit_call(&self.auth, &self.admission, conn, &hdr, METHOD).await?;
        let objects = self.answer(&ticket, METHOD, server, conn).await?;
        Ok(Reply {
            objects,
            _ticket: ticket,
        })
    }

    /// An object appeared below the manager, or gained interfaces. Declared for introspection;
    /// sent by [`announce_added`], whose properties may be any `a{sv}`.
    #[zbus(signal)]
    async fn interfaces_added(
        emitter: &SignalEmitter<'_>,
        object_path: ObjectPath<'_>,
        interfaces_and_properties: &HashMap<InterfaceName<'_>, HashMap<String, OwnedVariant>>,
    ) -> zbus::Result<()>;

    /// An object below the manager went, or lost interfaces ([`unregister`]).
    #[zbus(signal)]
    async fn interfaces_removed(
        emitter: &SignalEmitter<'_>,
        object_path: ObjectPath<'_>,
        interfaces: Cow<'_, [InterfaceName<'_>]>,
    ) -> zbus::Result<()>;
}

#[cfg(test)]
mod tests;
