//! Keeps the object tree in step with the core: one Instance1 object per instance and one Gpu1 object
//! per GPU, with Manager1 signals and PropertiesChanged on every change.
//!
//! One task applies the core's events in order and publishes how many it has applied. A method call
//! that changed something waits until that count reaches the core's count of events sent (it
//! "settles") before it answers, so a client that gets an object path back can use it at once, and
//! a later stale event can never resurrect an object a newer call removed. This relies on the core
//! sending a command's events before `execute` returns. When the task was quicker than the command's
//! own way back, which is the usual case, the call does not wait at all.
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
use super::instance::{self, InstanceObject};
use super::introspect::Introspection;
use super::manager::Manager;
use super::object_manager::{self, Kind, Served};
use super::{Executor, QueryError, call};
use crate::daemon::api::{
    Event, GetGpuCapacity, GpuCapacity, GpuView, InstanceView, ListGpus, ListInstances,
};
use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_client::{GPU_INTERFACE, INSTANCE_INTERFACE, MANAGER_PATH, gpu_path, instance_path};

/// The least time between two re-reads of the GPU objects: a burst of instance changes (a pool
/// apply) re-reads each GPU once per this much time, not once per change; a change after a quiet
/// spell is re-read at once.
const GPU_REFRESH_SPACING: std::time::Duration = std::time::Duration::from_millis(100);

/// How method handlers reach the mirror tasks.
#[derive(Clone)]
pub(super) struct MirrorHandle {
    /// The core's count of events sent so far.
    sent: Arc<dyn Fn() -> u64 + Send + Sync>,
    /// The count of events the instance task has applied (including those it sees before its
    /// first, which the initial objects reflect).
    applied: watch::Receiver<u64>,
    gpus: Arc<GpuWork>,
}

impl std::fmt::Debug for MirrorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MirrorHandle")
            .field("applied", &*self.applied.borrow())
            .finish_non_exhaustive()
    }
}

impl MirrorHandle {
    /// Returns once every event the core sent before this call is reflected in the object tree (at
    /// once when the task has gone with the core: nothing more will change).
    pub(super) async fn settle(&self) {
        let sent = (self.sent)();
        let mut applied = self.applied.clone();
        let _ = applied.wait_for(|n| *n >= sent).await;
    }

    /// Asks for the GPU objects to be refreshed (capacity may have changed).
    pub(super) fn refresh_gpus(&self) {
        self.gpus.all();
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

/// The instance objects.
struct Instances {
    conn: Connection,
    exec: Arc<dyn Executor>,
    known: HashMap<MdevUuid, InstanceView>,
    gpus: Arc<GpuWork>,
    served: Arc<Served>,
    introspection: Arc<Introspection>,
}

impl Instances {
    async fn upsert(&mut self, view: InstanceView) -> zbus::Result<()> {
        let uuid_text = view.uuid.to_string();
        let path = instance_path(&uuid_text);
        let server = self.conn.object_server();
        let gpu = view.gpu.clone();
        match self.known.get(&view.uuid) {
            None => {
                self.known.insert(view.uuid, view.clone());
                let change = self.served.change();
                let object = InstanceObject::new(view);
                let intro = &self.introspection;
                object_manager::register(&self.conn, intro, &change, &path, object, Kind::Instance)
                    .await?;
                drop(change);
                Manager::instance_added(&manager_emitter(&self.conn)?, path.as_ref(), &uuid_text)
                    .await?;
            }
            Some(old) if *old == view => return Ok(()),
            Some(old) => {
                if old.gpu != gpu {
                    self.gpus.gpu(&old.gpu);
                }
                let changed = instance::changed_properties(old, &view);
                let state_changed = old.state != view.state;
                self.known.insert(view.uuid, view.clone());
                let state = view.state.as_str();
                let iface = server.interface::<_, InstanceObject>(&path).await?;
                let change = self.served.change();
                iface.get_mut().await.view = view;
                drop(change);
                if !changed.is_empty() {
                    zbus::fdo::Properties::properties_changed(
                        iface.signal_emitter(),
                        InterfaceName::from_static_str_unchecked(INSTANCE_INTERFACE),
                        changed.iter().map(|(k, v)| (*k, v.clone())).collect(),
                        Cow::Borrowed(&[]),
                    )
                    .await?;
                }
                if state_changed {
                    Manager::instance_state_changed(
                        &manager_emitter(&self.conn)?,
                        path.as_ref(),
                        &uuid_text,
                        state,
                    )
                    .await?;
                }
            }
        }
        self.gpus.gpu(&gpu);
        Ok(())
    }

    async fn remove(&mut self, uuid: MdevUuid) -> zbus::Result<()> {
        let Some(old) = self.known.remove(&uuid) else {
            return Ok(());
        };
        let uuid_text = uuid.to_string();
        let path = instance_path(&uuid_text);
        let change = self.served.change();
        object_manager::unregister::<InstanceObject>(&self.conn, &change, &path).await?;
        drop(change);
        Manager::instance_removed(&manager_emitter(&self.conn)?, path.as_ref(), &uuid_text).await?;
        self.gpus.gpu(&old.gpu);
        Ok(())
    }

    /// Re-reads every instance from the core (after lost events) and applies the differences.
    async fn resync(&mut self) -> zbus::Result<()> {
        let views = match list_instances(&self.exec).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(error = %e, "cannot re-read instances after lost events; objects may be stale until the next change");
                return Ok(());
            }
        };
        let now: HashMap<MdevUuid, InstanceView> = views.into_iter().map(|v| (v.uuid, v)).collect();
        let gone: Vec<MdevUuid> = self
            .known
            .keys()
            .filter(|u| !now.contains_key(u))
            .copied()
            .collect();
        for u in gone {
            self.remove(u).await?;
        }
        for v in now.into_values() {
            self.upsert(v).await?;
        }
        Ok(())
    }

    async fn apply(&mut self, event: Event) {
        let result = match event {
            Event::InstanceAdded(v) | Event::InstanceChanged(v) => self.upsert(v).await,
            Event::InstanceRemoved(u) => self.remove(u).await,
            Event::PoolProgress {
                pool,
                done,
                total,
                step,
            } => match manager_emitter(&self.conn) {
                Ok(em) => Manager::pool_progress(&em, &pool, done, total, &step).await,
                Err(e) => Err(e),
            },
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "cannot update the D-Bus objects of an instance");
        }
    }

    async fn lagged(&mut self, n: u64) {
        tracing::warn!(lost = n, "missed core events; re-reading all instances");
        if let Err(e) = self.resync().await {
            tracing::warn!(error = %e, "cannot update the D-Bus objects after lost events");
        }
    }
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
    let (applied_tx, applied) = watch::channel(events_before);
    let instances_task = tokio::spawn(async move {
        let mut applied = events_before;
        loop {
            match events.recv().await {
                Ok(e) => {
                    mirror.apply(e).await;
                    applied += 1;
                }
                // Lost events: the re-read reflects them too.
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    mirror.lagged(n).await;
                    applied += n;
                }
                Err(broadcast::error::RecvError::Closed) => break,
            }
            applied_tx.send_replace(applied);
        }
        // The core is gone: dropping the count's sender releases every waiter.
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
            applied,
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

    fn handle(sent: u64, applied: watch::Receiver<u64>) -> MirrorHandle {
        MirrorHandle {
            sent: Arc::new(move || sent),
            applied,
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
    async fn settle_returns_once_the_mirror_is_gone() {
        let (tx, rx) = watch::channel(0);
        let h = handle(5, rx);
        assert!(!settles(&h).await);
        drop(tx);
        assert!(settles(&h).await, "a settle outlived the mirror task");
    }
}
