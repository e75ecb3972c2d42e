//! Pool slots made together: the creates of one [`SlotRun::Creates`](super::pool_exec::SlotRun)
//! (undefined mdev slots on one parent) as one command of the engine.
//!
//! A pool that grows by dozens of slots would otherwise repeat, per slot, what only needs doing once
//! per run: the parent's health check, the search for a placement the plan already made, the ledger
//! write (the ledger protocol wants each entry on disk before its device exists, and one batch file
//! written before the first device satisfies that for all of them) and a view computed for a stopped
//! definition that is started a moment later. What each slot still gets of its own: its definition,
//! written durably before any device exists, its device, and one event when it runs.
//!
//! Crash safety is the per-slot path's: definitions come first (a crash leaves definitions without
//! devices, which the interrupted apply's record makes the next start finish), then the ledger
//! batch, then the devices, each on the reconcile executor, which removes the devices and entries of
//! a run whose create failed.

use tracing::info;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::instances::Instances;
use super::lock;
use super::pool::slot_label;
use super::pool_exec::{NewSlot, SlotsFailed};
use crate::daemon::api::{CoreError, RequestError};
use crate::daemon::store::{Definition, unix_now};

/// The UUIDs mdevctl's definition directory held definitions of when it was read
/// ([`Instances::mdevctl_names`]).
pub(super) struct MdevctlNames(std::collections::HashSet<MdevUuid>);

impl Instances {
    /// What names UUIDs in mdevctl's definition directory now, for [`Instances::is_fresh`]: read
    /// once for all the slots of an apply rather than once per slot.
    pub(super) fn mdevctl_names(&self) -> MdevctlNames {
        MdevctlNames(lock(&self.store).mdevctl_defined_uuids())
    }

    /// True when nothing names `uuid` yet: no definition (main, alternate, or a file of mdevctl's
    /// directory as `mdevctl` read it), no ledger entry, no device. Only such slots are made by
    /// [`Instances::create_slots`]; any other goes the way of a single define, which knows how to
    /// take over what is there.
    pub(super) fn is_fresh(&self, uuid: &MdevUuid, mdevctl: &MdevctlNames) -> bool {
        let store = lock(&self.store);
        store.get_definition(uuid).is_none()
            && store.alternates_of(uuid).next().is_none()
            && store.get_ledger(uuid).is_none()
            && !mdevctl.0.contains(uuid)
            && !self.device_exists(uuid)
    }

    /// Defines `slots` on mdev parent `parent` (each labelled as its slot, serving its profile, with
    /// `autostart`) and starts them, calling `started(k)` once slot `k` runs and its view is
    /// announced. The parent is checked once: it must be registered and not faulted. A failure
    /// before any definition is written leaves nothing; one after leaves the definitions written so
    /// far ([`SlotsFailed::defined`]) and no device.
    pub(super) fn create_slots(
        &self,
        parent: &str,
        slots: &[NewSlot],
        autostart: bool,
        started: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        let refused = |at: usize, error: CoreError| SlotsFailed {
            done: 0,
            at,
            error: Box::new(error),
        };
        if !self.parent_exists(parent) {
            return Err(refused(
                0,
                RequestError::NoParent {
                    parent: parent.to_string(),
                    host: self.host.describe(),
                }
                .into(),
            ));
        }
        // Checked before anything is written: a faulted GPU gets nothing new.
        if let Some(fault) = self.health.fault(self.host.as_ref(), parent) {
            return Err(refused(
                0,
                RequestError::Faulted {
                    gpu: parent.to_string(),
                    fault: Box::new(fault),
                }
                .into(),
            ));
        }
        let mut reserved = Vec::with_capacity(slots.len());
        for (k, s) in slots.iter().enumerate() {
            reserved.push(
                self.reserve_new(s.slot.uuid)
                    .map_err(|error| refused(k, error))?,
            );
        }
        let now = unix_now();
        // A VF's slots belong to its physical GPU (NVIDIA classic vGPU on Ampere and later).
        let gpu = self.gpu_of_parent(parent);
        self.locks.with_parent(parent, || {
            let defs: Vec<Definition> = slots
                .iter()
                .map(|s| Definition {
                    uuid: s.slot.uuid,
                    parent: parent.to_string(),
                    gpu: gpu.clone(),
                    type_id: s.type_id.clone(),
                    profile: Some(s.slot.profile.clone()),
                    autostart,
                    label: Some(slot_label(&s.slot)),
                    created_at: now,
                    attrs: Vec::new(),
                })
                .collect();
            // All of them durable before the first device is made, with one directory sync.
            if let Err((k, error)) = lock(&self.store).put_new_definitions(&defs) {
                return Err(SlotsFailed {
                    done: k,
                    at: k.min(slots.len().saturating_sub(1)),
                    error: Box::new(error),
                });
            }
            let run = self.start_slots(parent, slots, started);
            if run.is_err() {
                // The next create reads the GPU again (`health.rs`).
                self.health.forget(parent);
            }
            run
        })
    }

    /// Creates the devices of the slots just defined on `parent` in one run of the reconcile
    /// executor (one ledger batch for all of them), announcing each as it comes. The parent lock must
    /// be held.
    fn start_slots(
        &self,
        parent: &str,
        slots: &[NewSlot],
        started: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        let creates: Vec<(MdevUuid, MdevTypeId)> = slots
            .iter()
            .map(|s| (s.slot.uuid, s.type_id.clone()))
            .collect();
        let mut announce = |uuid: &MdevUuid| {
            info!(%uuid, %parent, "pool slot defined and created");
            let k = creates.iter().position(|(u, _)| u == uuid);
            match k {
                Some(k) => self.refresh_made(uuid, parent, &creates[k].1),
                None => self.refresh_one(uuid),
            };
            if let Some(k) = k {
                started(k);
            }
        };
        let Some(failure) = self.create_devices_owned(parent, &creates, &mut announce) else {
            return Ok(());
        };
        // The devices made before the failure are gone again: their views say so.
        for s in slots {
            self.refresh_one(&s.slot.uuid);
        }
        Err(SlotsFailed {
            done: slots.len(),
            at: failure.index,
            error: Box::new(failure.error),
        })
    }
}
