//! The instance objects of the mirror: each core event changes the object tree first and returns
//! the signals it owes ([`Owed`]), which the mirror task sends once it has published that the
//! objects are in place.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use zbus::Connection;
use zbus::names::InterfaceName;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::Variant;

use super::super::Executor;
use super::super::gpu_work::GpuWork;
use super::super::instance::{self, AnnouncedInstance, InstanceObject};
use super::super::introspect::Introspection;
use super::super::manager::Manager;
use super::super::object_manager::{self, Kind, Served};
use super::progress::ProgressSignal;
use super::{list_instances, manager_emitter};
use crate::daemon::api::{Event, InstanceView};
use mdev_types::ids::MdevUuid;
use vgpu_client::{INSTANCE_INTERFACE, instance_path};

/// The instance objects.
pub(super) struct Instances {
    pub(super) conn: Connection,
    pub(super) exec: Arc<dyn Executor>,
    /// The views the objects show, by UUID.
    pub(super) known: HashMap<MdevUuid, InstanceView>,
    pub(super) gpus: Arc<GpuWork>,
    pub(super) served: Arc<Served>,
    pub(super) introspection: Arc<Introspection>,
}

/// The signals owed for a change already made to the object tree, sent once the change's count is
/// published to the callers that wait for the objects alone. An instance is named by its UUID; its
/// object path follows from it (`instance_path`).
pub(super) enum Owed {
    /// `InterfacesAdded` (when the object is new, with the view the mirror knows it by: the
    /// signals of one event are sent before the next event is applied) and `InstanceAdded`.
    Added { uuid: MdevUuid, new_object: bool },
    /// `PropertiesChanged` of the properties that changed, and `InstanceStateChanged` when the
    /// state did.
    Changed {
        uuid: String,
        changed: HashMap<&'static str, Variant<'static>>,
        state: Option<&'static str>,
    },
    /// `InterfacesRemoved` and `InstanceRemoved`.
    Removed { uuid: String },
    /// `PoolProgress` (one step, or several held back together: [`super::progress`]).
    Progress(ProgressSignal),
}

impl Instances {
    /// Puts instance `view` in the object tree; returns the signals owed for it.
    async fn upsert(&mut self, view: InstanceView) -> zbus::Result<Option<Owed>> {
        let uuid = view.uuid.to_string();
        let path = instance_path(&uuid);
        let gpu = view.gpu.clone();
        let owed = match self.known.get(&view.uuid) {
            None => {
                let id = view.uuid;
                self.known.insert(id, view.clone());
                let change = self.served.change();
                let object = InstanceObject::new(view);
                let intro = &self.introspection;
                let new_object = object_manager::place(
                    &self.conn,
                    intro,
                    &change,
                    &path,
                    object,
                    Kind::Instance,
                )
                .await?;
                drop(change);
                Owed::Added {
                    uuid: id,
                    new_object,
                }
            }
            Some(old) if *old == view => return Ok(None),
            Some(old) => {
                if old.gpu != gpu {
                    self.gpus.gpu(&old.gpu);
                }
                let changed = instance::changed_properties(old, &view);
                let state = (old.state != view.state).then(|| view.state.as_str());
                self.known.insert(view.uuid, view.clone());
                let iface = self
                    .conn
                    .object_server()
                    .interface::<_, InstanceObject>(&path)
                    .await?;
                let change = self.served.change();
                iface.get_mut().await.view = view;
                drop(change);
                Owed::Changed {
                    uuid,
                    changed,
                    state,
                }
            }
        };
        self.gpus.gpu(&gpu);
        Ok(Some(owed))
    }

    /// Takes instance `uuid` out of the object tree; returns the signals owed for it.
    async fn remove(&mut self, uuid: MdevUuid) -> zbus::Result<Option<Owed>> {
        let Some(old) = self.known.remove(&uuid) else {
            return Ok(None);
        };
        let uuid = uuid.to_string();
        let path = instance_path(&uuid);
        let change = self.served.change();
        object_manager::take_down::<InstanceObject>(&self.conn, &change, &path).await?;
        drop(change);
        self.gpus.gpu(&old.gpu);
        Ok(Some(Owed::Removed { uuid }))
    }

    /// Sends the signals `owed`.
    async fn announce(&self, owed: Owed) -> zbus::Result<()> {
        let conn = &self.conn;
        match owed {
            Owed::Added { uuid, new_object } => {
                let view = self.known.get(&uuid).filter(|_| new_object);
                let uuid = uuid.to_string();
                let path = instance_path(&uuid);
                if let Some(view) = view {
                    let props = AnnouncedInstance::of(view);
                    object_manager::announce_added::<InstanceObject, _>(conn, &path, &props)
                        .await?;
                }
                Manager::instance_added(&manager_emitter(conn)?, path.as_ref(), &uuid).await
            }
            Owed::Changed {
                uuid,
                changed,
                state,
            } => {
                let path = instance_path(&uuid);
                if !changed.is_empty() {
                    zbus::fdo::Properties::properties_changed(
                        &SignalEmitter::new(conn, path.as_ref())?,
                        InterfaceName::from_static_str_unchecked(INSTANCE_INTERFACE),
                        changed.iter().map(|(k, v)| (*k, v.clone())).collect(),
                        Cow::Borrowed(&[]),
                    )
                    .await?;
                }
                match state {
                    Some(state) => {
                        let emitter = manager_emitter(conn)?;
                        Manager::instance_state_changed(&emitter, path.as_ref(), &uuid, state).await
                    }
                    None => Ok(()),
                }
            }
            Owed::Removed { uuid } => {
                let path = instance_path(&uuid);
                object_manager::announce_removed::<InstanceObject>(conn, &path).await?;
                Manager::instance_removed(&manager_emitter(conn)?, path.as_ref(), &uuid).await
            }
            Owed::Progress(ProgressSignal {
                pool,
                done,
                total,
                step,
            }) => Manager::pool_progress(&manager_emitter(conn)?, &pool, done, total, &step).await,
        }
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
            if let Some(owed) = self.remove(u).await? {
                self.announce(owed).await?;
            }
        }
        for v in now.into_values() {
            if let Some(owed) = self.upsert(v).await? {
                self.announce(owed).await?;
            }
        }
        Ok(())
    }

    /// Changes the object tree as `event` says; returns the signals owed for it.
    pub(super) async fn apply(&mut self, event: Event) -> Option<Owed> {
        let result = match event {
            Event::InstanceAdded(v) | Event::InstanceChanged(v) => self.upsert(v).await,
            Event::InstanceRemoved(u) => self.remove(u).await,
            Event::PoolProgress {
                pool,
                done,
                total,
                step,
            } => Ok(Some(Owed::Progress(ProgressSignal {
                pool,
                done,
                total,
                step,
            }))),
        };
        result.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot update the D-Bus objects of an instance");
            None
        })
    }

    /// Sends the signals `owed`, logging a failure.
    pub(super) async fn send(&self, owed: Owed) {
        if let Err(e) = self.announce(owed).await {
            tracing::warn!(error = %e, "cannot send the D-Bus signals of an instance change");
        }
    }

    pub(super) async fn lagged(&mut self, n: u64) {
        tracing::warn!(lost = n, "missed core events; re-reading all instances");
        if let Err(e) = self.resync().await {
            tracing::warn!(error = %e, "cannot update the D-Bus objects after lost events");
        }
    }
}
