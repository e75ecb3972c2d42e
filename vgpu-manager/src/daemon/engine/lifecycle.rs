//! The mutating commands. Devices are created and removed on the daemon's one executor
//! ([`Instances::create_device_owned`], [`Instances::remove_device_owned`]), which follows the ledger protocol of
//! [`crate::daemon::store`]: the ledger entry is written before a device is created and removed only
//! after it is gone, so a crash at any point leaves nothing the next start cannot reconcile.

use tracing::info;

use mdev_types::ids::MdevUuid;

use super::choose::Placement;
use super::foreign::OnForeign;
use super::instances::Instances;
use super::lock;
use super::views::device_identity;
use crate::daemon::api::{
    CoreError, InstanceSpec, InstanceView, Ownership, RequestError, StateError,
};
use crate::daemon::store::{LedgerEntry, LedgerOwnership, unix_now};

/// Releases a UUID reservation when dropped.
pub(super) struct Reservation<'a> {
    core: &'a Instances,
    uuid: MdevUuid,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        lock(&self.core.inflight).remove(&self.uuid);
    }
}

/// The view of an instance a command just made; it vanishing meanwhile is a state error.
fn made(
    view: Option<InstanceView>,
    uuid: MdevUuid,
    doing: &'static str,
) -> Result<InstanceView, CoreError> {
    view.ok_or_else(|| StateError::Vanished { uuid, doing }.into())
}

impl Instances {
    /// Reserves a UUID nobody uses (no definition, no ledger entry, no device, no request in flight).
    pub(super) fn reserve_new(&self, uuid: MdevUuid) -> Result<Reservation<'_>, CoreError> {
        let store = lock(&self.store);
        let mut inflight = lock(&self.inflight);
        let taken = inflight.contains(&uuid)
            || store.get_definition(&uuid).is_some()
            || store.get_ledger(&uuid).is_some()
            || self.device_exists(&uuid);
        if taken {
            return Err(CoreError::Exists { uuid });
        }
        inflight.insert(uuid);
        Ok(Reservation { core: self, uuid })
    }

    pub(super) fn create(&self, req: InstanceSpec) -> Result<InstanceView, CoreError> {
        let place = self.place(&req, true)?;
        // A transient device must not shadow a definition mdevctl keeps for the UUID (starting that
        // definition is what mdevctl does for `start -u UUID`).
        if let Some(uuid) = req.uuid
            && let Some(parent) = lock(&self.store).foreign_definition_parent(&uuid)
        {
            return Err(StateError::ForeignDefinition { uuid, parent }.into());
        }
        let uuid = req.uuid.unwrap_or_else(MdevUuid::new_random);
        let _reserved = self.reserve_new(uuid)?;
        // The view is read before the parent is unlocked: a Destroy of the new UUID waits for the
        // lock, so the answer is the instance this call made, not what a later command left.
        // A GPU whose VFs are its parents is locked whole, and its VF chosen again under the lock:
        // two creates on it must not both pick the one VF that was free when they were placed.
        let on_vfs = place.vf_chosen;
        let lock_key = if on_vfs { &place.gpu } else { &place.parent };
        let view = self.locks.with_parent(lock_key, || {
            let mut place = place.clone();
            if on_vfs && self.available(&place.parent, &place.type_id) == Some(0) {
                place.parent =
                    self.free_vf_parent(&place.gpu, &place.type_id)
                        .ok_or_else(|| RequestError::VfsFull {
                            gpu: place.gpu.clone(),
                            type_id: place.type_id.clone(),
                        })?;
            }
            self.create_device_owned(&uuid, &place, req.label.clone(), &req.attrs)?;
            Ok::<_, CoreError>(self.refresh_made(&uuid, &place.parent, &place.type_id))
        });
        if view.is_err() {
            // The next create reads the GPU again (`health.rs`).
            self.health.forget(&place.gpu);
        }
        made(view?, uuid, "created")
    }

    pub(super) fn define(&self, req: InstanceSpec) -> Result<InstanceView, CoreError> {
        self.define_profiled(req, None)
    }

    /// [`Instances::define`] of an instance that serves `profile` (a pool slot, defined by its
    /// type): the profile goes into the one definition write. A definition that already names a
    /// profile keeps it.
    pub(super) fn define_serving(
        &self,
        req: InstanceSpec,
        profile: &str,
    ) -> Result<InstanceView, CoreError> {
        let uuid = req.uuid;
        let view = self.define_profiled(req, Some(profile))?;
        if view.profile.is_some() {
            return Ok(view);
        }
        // Defined on one of the other paths (a running device, an alternate): named afterwards.
        let uuid = uuid.unwrap_or(view.uuid);
        self.set_profile_if_unset(&uuid, profile)?;
        made(self.refresh_one(&uuid), uuid, "defined")
    }

    fn define_profiled(
        &self,
        req: InstanceSpec,
        profile: Option<&str>,
    ) -> Result<InstanceView, CoreError> {
        if let Some(uuid) = req.uuid
            && self.device_exists(&uuid)
            && lock(&self.store).get_definition(&uuid).is_none()
        {
            return self.define_running(uuid, &req);
        }
        let place = self.place(&req, false)?;
        if let Some(uuid) = req.uuid
            && let Some(view) = self.define_alternate(uuid, &place, &req)?
        {
            return Ok(view);
        }
        let uuid = req.uuid.unwrap_or_else(MdevUuid::new_random);
        let _reserved = self.reserve_new(uuid)?;
        let mut def = place.definition(uuid, &req);
        if def.profile.is_none() {
            def.profile = profile.map(str::to_string);
        }
        lock(&self.store).put_definition(&def)?;
        info!(%uuid, parent = %def.parent, type_id = %def.type_id, "instance defined");
        made(self.refresh_one(&uuid), uuid, "defined")
    }

    /// Defining the UUID of an existing foreign device takes it over, if parent and type agree.
    pub(super) fn adopt(
        &self,
        uuid: MdevUuid,
        req: &InstanceSpec,
    ) -> Result<InstanceView, CoreError> {
        let Some((parent, type_id)) = device_identity(self.host.as_ref(), &uuid) else {
            return Err(StateError::Vanished {
                uuid,
                doing: "adopted",
            }
            .into());
        };
        let place = self.place(req, false)?;
        if place.type_id != type_id || place.parent != parent {
            return Err(CoreError::Exists { uuid });
        }
        let _reserved = self.reserve_new_for_adoption(uuid)?;
        self.locks
            .with_parent(&parent, || -> Result<(), CoreError> {
                let mut store = lock(&self.store);
                store.put_ledger(&LedgerEntry {
                    uuid,
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                    ownership: LedgerOwnership::Adopted,
                    created_at: unix_now(),
                    gpu: Some(place.gpu.clone()),
                    profile: place.profile.clone(),
                    label: req.label.clone(),
                })?;
                store.put_definition(&place.definition(uuid, req))?;
                Ok(())
            })?;
        info!(%uuid, %parent, %type_id, "foreign instance adopted by an explicit definition");
        made(self.refresh_one(&uuid), uuid, "adopted")
    }

    pub(super) fn reserve_new_for_adoption(
        &self,
        uuid: MdevUuid,
    ) -> Result<Reservation<'_>, CoreError> {
        let mut inflight = lock(&self.inflight);
        if !inflight.insert(uuid) {
            return Err(CoreError::Exists { uuid });
        }
        Ok(Reservation { core: self, uuid })
    }

    /// The current view, or NotFound.
    fn view(&self, uuid: &MdevUuid) -> Result<InstanceView, CoreError> {
        if let Some(v) = lock(&self.views).get(uuid) {
            return Ok(v.clone());
        }
        // Not cached (e.g. made behind our back a moment ago): look at the host directly.
        self.refresh_one(uuid)
            .ok_or(CoreError::NotFound { uuid: *uuid })
    }

    fn not_foreign(&self, v: &InstanceView) -> Result<(), CoreError> {
        if v.ownership == Ownership::Foreign {
            return Err(CoreError::Foreign { uuid: v.uuid });
        }
        Ok(())
    }

    /// The parent instance `uuid` is on now: its device's, else its definition's, else its ledger
    /// entry's; `None` when nothing of it exists.
    fn current_parent(&self, uuid: &MdevUuid) -> Option<String> {
        if let Some((parent, _)) = device_identity(self.host.as_ref(), uuid) {
            return Some(parent);
        }
        let store = lock(&self.store);
        store
            .get_definition(uuid)
            .map(|d| d.parent.clone())
            .or_else(|| store.get_ledger(uuid).map(|l| l.parent.clone()))
    }

    /// Runs `f` with the parent of instance `uuid` locked, and what `f` decides on read under that
    /// lock: the cached view may be older than a concurrent command's change (every change of an
    /// instance happens under its parent's lock). An instance that moved to another parent meanwhile
    /// (destroyed and made again there) is followed; one that no longer exists is NotFound.
    fn with_instance_locked<T>(
        &self,
        uuid: &MdevUuid,
        mut f: impl FnMut(&str) -> Result<T, CoreError>,
    ) -> Result<T, CoreError> {
        // Each retry means another command re-made the instance elsewhere in between; a few are
        // plenty, and a client that keeps moving it gets NotFound rather than a livelock.
        for _ in 0..4 {
            let Some(parent) = self.current_parent(uuid) else {
                break;
            };
            let done = self.locks.with_parent(&parent, || {
                (self.current_parent(uuid).as_deref() == Some(parent.as_str())).then(|| f(&parent))
            });
            if let Some(result) = done {
                return result;
            }
        }
        Err(CoreError::NotFound { uuid: *uuid })
    }

    pub(super) fn start(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        let v = self.view(&uuid)?;
        self.not_foreign(&v)?;
        self.with_instance_locked(&uuid, |parent| {
            // Read under the lock: a concurrent Destroy may have removed the definition.
            let def = lock(&self.store).get_definition(&uuid).cloned();
            let Some(def) = def else {
                if self.device_exists(&uuid) {
                    return Err(StateError::TransientRunning { uuid }.into());
                }
                return Err(CoreError::NotFound { uuid });
            };
            if self.device_exists(&uuid) {
                return Err(StateError::AlreadyRunning { uuid }.into());
            }
            if def.parent != parent || !self.parent_exists(&def.parent) {
                return Err(StateError::ParentMissing {
                    uuid,
                    parent: def.parent.clone(),
                }
                .into());
            }
            // Checked before anything is written, as for a create: a faulted GPU gets nothing new
            // (its parent, and the physical GPU when the parent is one of its VFs).
            let mut checked = vec![def.parent.as_str()];
            if def.gpu != def.parent {
                checked.push(def.gpu.as_str());
            }
            for id in checked {
                if let Some(fault) = self.health.fault(self.host.as_ref(), id) {
                    return Err(RequestError::Faulted {
                        gpu: id.to_string(),
                        fault: Box::new(fault),
                    }
                    .into());
                }
            }
            let place = Placement {
                parent: def.parent.clone(),
                gpu: def.gpu.clone(),
                type_id: def.type_id.clone(),
                profile: def.profile.clone(),
                vf_chosen: false,
            };
            let made = self.create_device_owned(&uuid, &place, def.label.clone(), &def.attrs);
            if made.is_err() {
                // The next create or start reads the GPU again (`health.rs`).
                self.health.forget(&place.gpu);
                self.health.forget(&place.parent);
            }
            made?;
            Ok(self.refresh_made(&uuid, &place.parent, &place.type_id))
        })
    }

    /// Removes the running device of instance `uuid` on `parent` if we own it (or, with
    /// [`OnForeign::AdoptFirst`], once adopted); `what` names the command for messages. The parent
    /// lock must be held, so that what is read here is current.
    fn remove_running_locked(
        &self,
        uuid: &MdevUuid,
        parent: &str,
        what: &'static str,
        on_foreign: OnForeign,
    ) -> Result<(), CoreError> {
        if !self.device_exists(uuid) {
            return Err(StateError::NotRunning {
                uuid: *uuid,
                action: what,
            }
            .into());
        }
        if lock(&self.store).get_ledger(uuid).is_none() {
            if on_foreign == OnForeign::Refuse {
                return Err(CoreError::Foreign { uuid: *uuid });
            }
            self.adopt_named_locked(uuid, what)?;
        }
        self.remove_device_owned(uuid, parent)
    }

    /// Stops instance `uuid`, refusing a device vgpud did not create (see [`Self::stop_named`]).
    pub(super) fn stop(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        self.stop_with(uuid, OnForeign::Refuse)
    }

    /// Stops instance `uuid`; `on_foreign` says what happens to a device vgpud did not create.
    pub(super) fn stop_with(
        &self,
        uuid: MdevUuid,
        on_foreign: OnForeign,
    ) -> Result<Option<InstanceView>, CoreError> {
        // Existence from the views (which also notice a device made behind our back); ownership is
        // decided under the lock, as the cached view may be older than a concurrent change.
        self.view(&uuid)?;
        self.with_instance_locked(&uuid, |parent| {
            self.remove_running_locked(&uuid, parent, "stop", on_foreign)?;
            Ok(self.refresh_one(&uuid))
        })
    }

    /// Removes the device (if running) and the definition. Of concurrent Destroys of one instance
    /// exactly one succeeds: each decides under the parent's lock, and the later ones find nothing
    /// (NotFound).
    pub(super) fn destroy(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        self.destroy_with(uuid, OnForeign::Refuse)
    }

    /// Destroys instance `uuid`; `on_foreign` says what happens to a device vgpud did not create.
    pub(super) fn destroy_with(
        &self,
        uuid: MdevUuid,
        on_foreign: OnForeign,
    ) -> Result<Option<InstanceView>, CoreError> {
        self.view(&uuid)?;
        self.with_instance_locked(&uuid, |parent| {
            let running = self.device_exists(&uuid);
            if running {
                self.remove_running_locked(&uuid, parent, "destroy", on_foreign)?;
            }
            let defined = lock(&self.store).remove_definition(&uuid)?.is_some();
            if !running && !defined {
                // Only a ledger entry left (its create failed and is being undone): nothing to
                // destroy.
                return Err(CoreError::NotFound { uuid });
            }
            Ok(self.refresh_one(&uuid))
        })
    }

    pub(super) fn undefine(&self, uuid: MdevUuid) -> Result<Option<InstanceView>, CoreError> {
        let v = self.view(&uuid)?;
        self.may_undefine(&v)?;
        if lock(&self.store).remove_definition(&uuid)?.is_none() {
            // A concurrent Destroy may have removed the whole instance since the view was read.
            if !self.device_exists(&uuid) {
                return Err(CoreError::NotFound { uuid });
            }
            return Err(StateError::NotDefined { uuid }.into());
        }
        Ok(self.refresh_one(&uuid))
    }

    pub(super) fn set_autostart(
        &self,
        uuid: MdevUuid,
        autostart: bool,
    ) -> Result<Option<InstanceView>, CoreError> {
        let v = self.view(&uuid)?;
        self.not_foreign(&v)?;
        {
            let mut store = lock(&self.store);
            let Some(mut def) = store.get_definition(&uuid).cloned() else {
                // A concurrent Destroy may have removed the whole instance since the view was read.
                if !self.device_exists(&uuid) {
                    return Err(CoreError::NotFound { uuid });
                }
                return Err(StateError::TransientAutostart { uuid }.into());
            };
            def.autostart = autostart;
            store.put_definition(&def)?;
        }
        Ok(self.refresh_one(&uuid))
    }

    /// See [`crate::daemon::api::RedefineInstance`]: the definition changes, a running device stays.
    pub(super) fn redefine(
        &self,
        change: crate::daemon::api::RedefineInstance,
    ) -> Result<Option<InstanceView>, CoreError> {
        let uuid = change.uuid;
        let v = self.view(&uuid)?;
        self.not_foreign(&v)?;
        {
            let mut store = lock(&self.store);
            let Some(mut def) = store.get_definition(&uuid).cloned() else {
                if !self.device_exists(&uuid) {
                    return Err(CoreError::NotFound { uuid });
                }
                return Err(StateError::NotDefined { uuid }.into());
            };
            if def.type_id == change.type_id
                && def.autostart == change.autostart
                && def.attrs == change.attrs
            {
                // Nothing changes: nothing is written (the mdevctl front end's capability check
                // redefines a definition as it is). The store is unlocked before the view is read.
                drop(store);
                return Ok(self.refresh_one(&uuid));
            }
            if def.type_id != change.type_id {
                def.type_id = change.type_id;
                // The profile chose the old type.
                def.profile = None;
            }
            def.autostart = change.autostart;
            def.attrs = change.attrs;
            store.put_definition(&def)?;
        }
        info!(%uuid, "definition changed in place");
        Ok(self.refresh_one(&uuid))
    }

    /// The core places a type without knowing the profile it serves; a slot does know it, so it is
    /// written into the definition before the device is started (and so reaches the ledger too).
    pub(super) fn set_profile_if_unset(
        &self,
        uuid: &MdevUuid,
        profile: &str,
    ) -> Result<(), CoreError> {
        {
            let mut store = lock(&self.store);
            if let Some(mut def) = store.get_definition(uuid).cloned()
                && def.profile.is_none()
            {
                def.profile = Some(profile.to_string());
                store.put_definition(&def)?;
            }
        }
        self.refresh_one(uuid);
        Ok(())
    }
}
