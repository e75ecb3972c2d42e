//! Keeps the object tree in step with the core: one Instance1 object per instance and one Gpu1 object
//! per GPU, with Manager1 signals and PropertiesChanged on every change.
//!
//! One task applies the core's events in order. For each event it first changes the object tree,
//! then sends the event's signals, and it publishes two counts: events whose objects are in place,
//! and events whose signals are sent as well. A method call that changed something waits until one
//! of those counts reaches the core's count of events sent (it "settles") before it answers, so a
//! client that gets an object path back can use it at once, and a later stale event can never
//! resurrect an object a newer call removed. This relies on the core sending a command's events
//! before `execute` returns. When the task was quicker than the command's own way back, which is the
//! usual case, the call does not wait at all.
//!
//! Which count a call waits for depends on where it came from. A caller on the bus may be
//! subscribed to the signals, and the bus delivers one connection's messages in the order they were
//! sent, so its reply waits for the signals: it has seen every signal of its change when the reply
//! arrives. A caller on the private socket gets no signals there (they are on the bus, another
//! connection, whose order against the reply nobody can observe), so its reply waits for the
//! objects alone, and the signals go out while the reply does.
//! A pool apply's `PoolProgress` steps that come quicker than [`progress::PROGRESS_SPACING`] are held
//! back and sent together (`progress`); until they are sent, the count of events whose signals are
//! sent stays below them.
//! GPU objects are refreshed by a second task (see `gpu_work`): after an instance change only that
//! instance's GPU is re-read, after a kernel event or a reconcile all of them.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{broadcast, watch};
use zbus::Connection;
use zbus::names::InterfaceName;
use zbus::object_server::SignalEmitter;

use super::admission::Admission;
use super::gpu::{self, GpuObject};
use super::gpu_work::{GpuWork, Work};
use super::instance::InstanceObject;
use super::introspect::Introspection;
use super::object_manager::{self, Kind, Served};
use super::{Executor, QueryError, call};
use crate::daemon::api::{
    Event, GetGpuCapacity, GpuCapacity, GpuView, InstanceView, ListGpus, ListInstances,
};
use mdev_types::ids::MdevTypeId;
use vgpu_client::{GPU_INTERFACE, MANAGER_PATH, gpu_path, instance_path};

mod instances;
mod progress;

use instances::{Instances, Owed};
use progress::{Coalescer, PROGRESS_SPACING};

/// The least time between two re-reads of the GPU objects: a burst of instance changes (a pool
/// apply) re-reads each GPU once per this much time, not once per change; a change after a quiet
/// spell is re-read at once.
const GPU_REFRESH_SPACING: std::time::Duration = std::time::Duration::from_millis(100);

/// How method handlers reach the mirror tasks.
#[derive(Clone)]
pub(super) struct MirrorHandle {
    /// The core's count of events sent so far.
    sent: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The count of events whose objects the instance task has put in place (including those it
    /// sees before its first, which the initial objects reflect).
    placed: watch::Receiver<u64>,
    /// The count of events whose objects are in place and whose signals are sent.
    announced: watch::Receiver<u64>,
    gpus: Arc<GpuWork>,
}

impl std::fmt::Debug for MirrorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorHandle")
            .field("placed", &*self.placed.borrow())
            .field("announced", &*self.announced.borrow())
            .finish_non_exhaustive()
    }
}

impl MirrorHandle {
    /// Returns once every event the core sent before this call is reflected in the object tree and
    /// its signals are sent (at once when the task has gone with the core: nothing more will
    /// change). What a reply to a caller on the bus waits for.
    pub(super) async fn settle(&self) {
        Self::reach(&self.announced, (self.sent)()).await;
    }

    /// Returns once every event the core sent before this call is reflected in the object tree,
    /// whether or not its signals are sent yet. What a reply to a caller on the private socket,
    /// which gets no signals, waits for.
    pub(super) async fn settle_objects(&self) {
        Self::reach(&self.placed, (self.sent)()).await;
    }

    async fn reach(count: &watch::Receiver<u64>, sent: u64) {
        let mut count = count.clone();
        let _ = count.wait_for(|n| *n >= sent).await;
    }

    /// Asks for the GPU objects to be refreshed (capacity may have changed).
    pub(super) fn refresh_gpus(&self) {
        self.gpus.all();
    }
}

/// Sends the pool steps `progress` holds, if any, as one `PoolProgress`.
async fn send_held(progress: &mut Coalescer, mirror: &Instances) {
    if let Some(s) = progress.flush(tokio::time::Instant::now()) {
        mirror.send(Owed::Progress(s)).await;
    }
}

/// All instances, from the engine.
pub(super) async fn list_instances(
    exec: &Arc<dyn Executor>,
) -> Result<Vec<InstanceView>, QueryError> {
    call(exec, ListInstances).await
}

/// All GPUs, from the engine.
pub(super) async fn list_gpus(exec: &Arc<dyn Executor>) -> Result<Vec<GpuView>, QueryError> {
    call(exec, ListGpus).await
}

fn manager_emitter(conn: &Connection) -> zbus::Result<SignalEmitter<'static>> {
    SignalEmitter::new(conn, MANAGER_PATH).map(|e| e.into_owned())
}

/// What the mirror's objects share with the rest of the service.
#[derive(Debug, Clone)]
pub(super) struct Objects {
    /// Told of every object added, removed or changed (after the change).
    pub(super) served: Arc<Served>,
    /// Admits the calls the GPU objects answer with host I/O (`Scheduling`).
    pub(super) admission: Arc<Admission>,
    /// Tells the callers' shares.
    pub(super) auth: super::Authorizer,
    /// The Introspectable every object's node gets.
    pub(super) introspection: Arc<Introspection>,
}

/// Registers the initial objects and starts the mirror tasks. `events` must have been subscribed before
/// `instances` and `gpus` were read, so that nothing in between is lost.
pub(super) async fn start(
    conn: &Connection,
    exec: Arc<dyn Executor>,
    objects: Objects,
    (mut events, events_before): (broadcast::Receiver<Event>, u64),
    instances: Vec<InstanceView>,
    gpus: Vec<GpuView>,
) -> zbus::Result<(MirrorHandle, Vec<tokio::task::JoinHandle<()>>)> {
    let work = Arc::new(GpuWork::default());
    let mut gpu_objects = Gpus {
        conn: conn.clone(),
        exec: Arc::clone(&exec),
        objects: objects.clone(),
        known: HashMap::new(),
    };
    for g in gpus {
        gpu_objects.apply(g).await?;
    }
    let mut mirror = Instances {
        conn: conn.clone(),
        exec: Arc::clone(&exec),
        known: HashMap::new(),
        gpus: Arc::clone(&work),
        served: Arc::clone(&objects.served),
        introspection: Arc::clone(&objects.introspection),
    };
    for v in instances {
        let path = instance_path(&v.uuid.to_string());
        mirror.known.insert(v.uuid, v.clone());
        let change = objects.served.change();
        let object = InstanceObject::new(v);
        let intro = &objects.introspection;
        object_manager::register(conn, intro, &change, &path, object, Kind::Instance).await?;
    }
    let (placed_tx, placed) = watch::channel(events_before);
    let (announced_tx, announced) = watch::channel(events_before);
    let instances_task = tokio::spawn(async move {
        let mut applied = events_before;
        let mut progress = Coalescer::new(PROGRESS_SPACING);
        loop {
            // The next event, or the moment held pool steps are due, whichever comes first.
            let received = match progress.due() {
                Some(at) => tokio::select! {
                    r = events.recv() => Some(r),
                    () = tokio::time::sleep_until(at) => None,
                },
                None => Some(events.recv().await),
            };
            match received {
                None => send_held(&mut progress, &mirror).await,
                Some(Ok(e)) => {
                    let owed = mirror.apply(e).await;
                    applied += 1;
                    placed_tx.send_replace(applied);
                    match owed {
                        Some(Owed::Progress(step)) => {
                            let now = tokio::time::Instant::now();
                            for s in progress.offer(step, now, applied) {
                                mirror.send(Owed::Progress(s)).await;
                            }
                        }
                        Some(owed) => mirror.send(owed).await,
                        None => {}
                    }
                }
                // Lost events: the re-read reflects them too.
                Some(Err(broadcast::error::RecvError::Lagged(n))) => {
                    mirror.lagged(n).await;
                    applied += n;
                    placed_tx.send_replace(applied);
                }
                Some(Err(broadcast::error::RecvError::Closed)) => {
                    send_held(&mut progress, &mirror).await;
                    break;
                }
            }
            // Held pool steps keep the count of events whose signals are sent below them.
            announced_tx.send_replace(progress.announced(applied));
        }
        // The core is gone: dropping the counts' senders releases every waiter.
    });
    let gpu_work = Arc::clone(&work);
    let gpus_task = tokio::spawn(async move {
        let mut last = None;
        loop {
            let work = gpu_work.next_spaced(last, GPU_REFRESH_SPACING).await;
            last = Some(tokio::time::Instant::now());
            let result = match work {
                Work::All => gpu_objects.refresh_all().await,
                Work::Gpus(ids) => gpu_objects.refresh_capacity(&ids).await,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "cannot update the D-Bus objects of the GPUs");
            }
        }
    });
    Ok((
        MirrorHandle {
            sent: Arc::new(move || exec.events_sent()),
            placed,
            announced,
            gpus: work,
        },
        vec![instances_task, gpus_task],
    ))
}

/// The GPU objects.
struct Gpus {
    conn: Connection,
    exec: Arc<dyn Executor>,
    objects: Objects,
    known: HashMap<String, GpuView>,
}

impl Gpus {
    /// Re-reads the GPUs and applies the differences to their objects.
    async fn refresh_all(&mut self) -> zbus::Result<()> {
        let now = match list_gpus(&self.exec).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read GPUs");
                return Ok(());
            }
        };
        let ids: std::collections::HashSet<&str> = now.iter().map(|g| g.id.as_str()).collect();
        let gone: Vec<String> = self
            .known
            .keys()
            .filter(|k| !ids.contains(k.as_str()))
            .cloned()
            .collect();
        for id in gone {
            self.known.remove(&id);
            let path = gpu_path(&id);
            let change = self.objects.served.change();
            object_manager::unregister::<GpuObject>(&self.conn, &change, &path).await?;
        }
        for g in now {
            self.apply(g).await?;
        }
        Ok(())
    }

    /// Re-reads the capacity of the GPUs `ids` (after instance changes) and applies the differences;
    /// falls back to a full refresh for a GPU it does not know or whose set of types changed.
    async fn refresh_capacity(&mut self, ids: &[String]) -> zbus::Result<()> {
        for id in ids {
            let Some(old) = self.known.get(id) else {
                return self.refresh_all().await;
            };
            let GpuCapacity { types, instances } =
                match call(&self.exec, GetGpuCapacity { id: id.clone() }).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(gpu = %id, error = %e, "cannot re-read the GPU's capacity");
                        continue;
                    }
                };
            let now: HashMap<&MdevTypeId, u32> = types.iter().map(|(t, n)| (t, *n)).collect();
            if now.len() != old.types.len() || old.types.iter().any(|(t, _)| !now.contains_key(t)) {
                return self.refresh_all().await;
            }
            let mut g = old.clone();
            for (t, n) in &mut g.types {
                *n = now[&*t];
            }
            g.instances = instances;
            self.apply(g).await?;
        }
        Ok(())
    }

    /// Registers a new GPU object or updates a known one (with PropertiesChanged).
    async fn apply(&mut self, g: GpuView) -> zbus::Result<()> {
        let server = self.conn.object_server();
        let path = gpu_path(&g.id);
        match self.known.get(&g.id) {
            None => {
                self.known.insert(g.id.clone(), g.clone());
                let object = GpuObject::new(
                    g,
                    Arc::clone(&self.exec),
                    Arc::clone(&self.objects.admission),
                    self.objects.auth.clone(),
                );
                let change = self.objects.served.change();
                let intro = &self.objects.introspection;
                object_manager::register(&self.conn, intro, &change, &path, object, Kind::Gpu)
                    .await?;
            }
            Some(old) if *old == g => {}
            Some(old) => {
                let changed = gpu::changed_properties(old, &g);
                self.known.insert(g.id.clone(), g.clone());
                let iface = server.interface::<_, GpuObject>(&path).await?;
                let change = self.objects.served.change();
                iface.get_mut().await.view = g;
                drop(change);
                zbus::fdo::Properties::properties_changed(
                    iface.signal_emitter(),
                    InterfaceName::from_static_str_unchecked(GPU_INTERFACE),
                    changed.iter().map(|(k, v)| (*k, v.clone())).collect(),
                    Cow::Borrowed(&[]),
                )
                .await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handle whose objects and signals are both at the counts of `applied`.
    fn handle(sent: u64, applied: watch::Receiver<u64>) -> MirrorHandle {
        MirrorHandle {
            sent: Arc::new(move || sent),
            placed: applied.clone(),
            announced: applied,
            gpus: Arc::new(GpuWork::default()),
        }
    }

    /// Whether `settle` finishes within a moment.
    async fn settles(h: &MirrorHandle) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(50), h.settle())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn settle_waits_until_every_event_sent_is_applied() {
        let (tx, rx) = watch::channel(1);
        let h = handle(3, rx);
        assert!(!settles(&h).await, "settled with 1 of 3 events applied");
        tx.send_replace(2);
        assert!(!settles(&h).await, "settled with 2 of 3 events applied");
        tx.send_replace(3);
        assert!(settles(&h).await);
        // Caught up already: no wait at all.
        assert!(settles(&handle(3, tx.subscribe())).await);
    }

    #[tokio::test]
    async fn a_caller_without_signals_waits_for_the_objects_alone() {
        let (placed_tx, placed) = watch::channel(2);
        let (announced_tx, announced) = watch::channel(2);
        let h = MirrorHandle {
            sent: Arc::new(|| 3),
            placed,
            announced,
            gpus: Arc::new(GpuWork::default()),
        };
        let objects_settle = |h: &MirrorHandle| {
            let h = h.clone();
            async move {
                tokio::time::timeout(std::time::Duration::from_millis(50), h.settle_objects())
                    .await
                    .is_ok()
            }
        };
        assert!(
            !objects_settle(&h).await,
            "settled with 2 of 3 events' objects"
        );
        // The third event's objects are in place; its signals are not sent yet.
        placed_tx.send_replace(3);
        assert!(objects_settle(&h).await);
        assert!(
            !settles(&h).await,
            "a bus caller's reply went before the signals"
        );
        announced_tx.send_replace(3);
        assert!(settles(&h).await);
    }

    #[tokio::test]
    async fn settle_returns_once_the_mirror_is_gone() {
        let (tx, rx) = watch::channel(0);
        let h = handle(5, rx);
        assert!(!settles(&h).await);
        drop(tx);
        assert!(settles(&h).await, "a settle outlived the mirror task");
    }
}
