//! Ledgered mdev devices on the daemon's one executor ([`crate::daemon::exec`]): the steps of a
//! reconcile [`Plan`] and a command's single create or removal become changes to the ledger and the
//! kernel through [`StepActions`], each recording its undo, so a failure rolls back what the run did.
//!
//! The ledger protocol, by construction: a create writes its ledger entry before the device (the
//! entries of every create of a run in one batch, before the first step); undoing it removes the
//! device first and the entry second; an entry is kept whenever its device may still exist.

use std::fmt;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::plan::{Plan, ReconcileStep};
use crate::daemon::api::{CoreError, MdevAttr};
use crate::daemon::exec::{self, Effects, Object};
use crate::daemon::store::{LedgerEntry, LedgerOwnership};

/// What ledgered device changes need from the daemon core. Implementations must keep the ledger
/// durable (`put_ledger` returns only once the entry is on disk).
pub trait StepActions {
    /// What an action fails with (the engine's [`CoreError`]; tests use their own).
    type Error: fmt::Display + fmt::Debug;
    /// Durably writes (or replaces) a ledger entry. Entries for new devices come with `gpu`,
    /// `profile` and `label` unset; implementations may fill them from the definition.
    fn put_ledger(&mut self, entry: &LedgerEntry) -> Result<(), Self::Error>;
    /// Durably writes several new entries, returning once all of them are on disk. The executor
    /// writes the entries of every device a run creates with one call before its first step (one
    /// flush instead of one per device). On error any subset may have been written. The default
    /// writes them one by one.
    fn put_ledgers(&mut self, entries: &[LedgerEntry]) -> Result<(), Self::Error> {
        entries.iter().try_for_each(|e| self.put_ledger(e))
    }
    /// Durably removes a ledger entry.
    fn remove_ledger(&mut self, uuid: &MdevUuid) -> Result<(), Self::Error>;
    /// Creates the mdev device (writes the parent's `create` attribute).
    fn create_device(
        &mut self,
        uuid: &MdevUuid,
        parent: &str,
        type_id: &MdevTypeId,
    ) -> Result<(), Self::Error>;
    /// Writes one mdev attribute of a device just created (`/sys/bus/mdev/devices/<uuid>/<name>`).
    fn write_attr(&mut self, uuid: &MdevUuid, attr: &MdevAttr) -> Result<(), Self::Error>;
    /// Removes one of our mdev devices (writes its `remove` attribute), succeeding only once it is
    /// gone; a device already gone is success.
    fn remove_device(&mut self, uuid: &MdevUuid, parent: &str) -> Result<(), Self::Error>;
    /// Whether a device with this UUID exists; asked after a failed create, because only a device
    /// known to be absent may lose its ledger entry.
    fn device_exists(&mut self, uuid: &MdevUuid) -> Result<bool, Self::Error>;
    /// Seconds since the Unix epoch, for the ledger's `created_at`.
    fn now(&self) -> u64;
}

/// The change a step makes to ledgered devices, if any.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// Write the ledger entry (replacing `replaces`), create the device, then write its attributes in
    /// order; a refused attribute fails the step, and the rollback removes the device.
    Create {
        /// The device's UUID.
        uuid: &'a MdevUuid,
        /// The mdev parent to create it on.
        parent: &'a str,
        /// Its mdev type.
        type_id: &'a MdevTypeId,
        /// A stale entry for this UUID that the new one overwrites (put back on rollback).
        replaces: &'a Option<LedgerEntry>,
        /// The mdev attributes to write after the create, in order.
        attrs: &'a [MdevAttr],
    },
    /// Forget a ledger entry whose device is gone.
    DropLedger(&'a LedgerEntry),
    /// Remove one of our devices, then its ledger entry. Not undone: it is the last change of the
    /// command that asks for it, and a removed device is not brought back.
    Remove {
        /// The device's UUID.
        uuid: &'a MdevUuid,
        /// Its parent.
        parent: &'a str,
    },
}

/// A step the ledgered-device executor can run: a reconcile [`ReconcileStep`] or a command's [`Removal`].
pub trait DeviceStep: Clone + fmt::Display {
    /// What the step changes (`None` for steps that only report).
    fn change(&self) -> Option<Change<'_>>;
}

impl DeviceStep for ReconcileStep {
    fn change(&self) -> Option<Change<'_>> {
        match self {
            ReconcileStep::Create {
                uuid,
                parent,
                type_id,
                replaces,
                attrs,
            } => Some(Change::Create {
                uuid,
                parent,
                type_id,
                replaces,
                attrs,
            }),
            ReconcileStep::DropLedger { entry } => Some(Change::DropLedger(entry)),
            _ => None,
        }
    }
}

/// A command's removal of one of our devices (stop, destroy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    /// The device's UUID.
    pub uuid: MdevUuid,
    /// Its mdev parent.
    pub parent: String,
}

impl fmt::Display for Removal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "remove {} from {}", self.uuid, self.parent)
    }
}

impl DeviceStep for Removal {
    fn change(&self) -> Option<Change<'_>> {
        Some(Change::Remove {
            uuid: &self.uuid,
            parent: &self.parent,
        })
    }
}

/// How one effect on a ledgered device is undone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerUndo {
    /// Remove a device this run created (its ledger entry is kept if this fails: the device is ours).
    RemoveDevice {
        /// The device.
        uuid: MdevUuid,
        /// Its parent.
        parent: String,
    },
    /// Put the ledger back as it was: remove a new entry (`previous` unset) or put back the old one.
    RestoreLedger {
        /// The entry's UUID.
        uuid: MdevUuid,
        /// The entry before this run, if there was one.
        previous: Option<LedgerEntry>,
    },
    /// Not an undo that runs: checking whether a failed create left a device failed, so the ledger
    /// entry is kept to be safe (the next reconcile drops it if there is no device).
    CheckDevice {
        /// The device.
        uuid: MdevUuid,
    },
}

impl fmt::Display for LedgerUndo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerUndo::RemoveDevice { uuid, parent } => write!(f, "remove {uuid} from {parent}"),
            LedgerUndo::RestoreLedger {
                uuid,
                previous: None,
            } => write!(f, "drop the ledger entry of {uuid}"),
            LedgerUndo::RestoreLedger {
                uuid,
                previous: Some(_),
            } => write!(f, "put back the ledger entry of {uuid}"),
            LedgerUndo::CheckDevice { uuid } => write!(f, "check whether {uuid} exists"),
        }
    }
}

/// What a run of ledgered device steps did.
pub type ExecReport<E = CoreError, S = ReconcileStep> = exec::Report<S, LedgerUndo, E>;
/// The step of a run that failed.
pub type StepFailure<E = CoreError, S = ReconcileStep> = exec::StepFailure<S, E>;
/// An undo of a run that failed.
pub type RollbackError<E = CoreError, S = ReconcileStep> = exec::RollbackError<S, LedgerUndo, E>;

/// [`StepActions`] as the executor's [`exec::Actions`].
struct Ledgered<'a, A: ?Sized> {
    actions: &'a mut A,
    /// The entries of every create of the run, written before its first step.
    batch: Option<Vec<(LedgerEntry, Option<LedgerEntry>)>>,
}

impl<A: StepActions + ?Sized, S: DeviceStep> exec::Actions<S> for Ledgered<'_, A> {
    type Undo = LedgerUndo;
    type Error = A::Error;

    fn run(&mut self, step: &S, fx: &mut Effects<LedgerUndo, A::Error>) -> Result<(), A::Error> {
        if let Some(batch) = self.batch.take().filter(|b| !b.is_empty()) {
            let entries: Vec<LedgerEntry> = batch.iter().map(|(e, _)| e.clone()).collect();
            let written = self.actions.put_ledgers(&entries);
            // On an error any subset may be on disk: every one is restored (none has a device).
            for (e, previous) in batch {
                fx.done(
                    Object::Instance(e.uuid),
                    LedgerUndo::RestoreLedger {
                        uuid: e.uuid,
                        previous,
                    },
                );
            }
            written?;
        }
        match step.change() {
            None => Ok(()),
            Some(Change::Create {
                uuid,
                parent,
                type_id,
                attrs,
                ..
            }) => {
                let remove = || LedgerUndo::RemoveDevice {
                    uuid: *uuid,
                    parent: parent.to_string(),
                };
                let Err(error) = self.actions.create_device(uuid, parent, type_id) else {
                    fx.done(Object::Instance(*uuid), remove());
                    // mdevctl src/mdev.rs `start`: each attribute in order once the device exists;
                    // one refused fails the start, and the rollback removes the device again.
                    return attrs
                        .iter()
                        .try_for_each(|a| self.actions.write_attr(uuid, a));
                };
                match self.actions.device_exists(uuid) {
                    // Nothing was created: the entry can go.
                    Ok(false) => {}
                    // The kernel made it despite the error: it is ours, so undo removes it.
                    Ok(true) => fx.done(Object::Instance(*uuid), remove()),
                    // Unknown: keep the entry (a device we made must never be unrecorded).
                    Err(check) => fx.uncertain(
                        Object::Instance(*uuid),
                        LedgerUndo::CheckDevice { uuid: *uuid },
                        check,
                    ),
                }
                Err(error)
            }
            Some(Change::DropLedger(entry)) => {
                self.actions.remove_ledger(&entry.uuid)?;
                fx.done(
                    Object::Instance(entry.uuid),
                    LedgerUndo::RestoreLedger {
                        uuid: entry.uuid,
                        previous: Some(entry.clone()),
                    },
                );
                Ok(())
            }
            Some(Change::Remove { uuid, parent }) => {
                self.actions.remove_device(uuid, parent)?;
                self.actions.remove_ledger(uuid)
            }
        }
    }

    fn undo(&mut self, undo: &LedgerUndo) -> Result<(), A::Error> {
        match undo {
            LedgerUndo::RemoveDevice { uuid, parent } => self.actions.remove_device(uuid, parent),
            LedgerUndo::RestoreLedger {
                previous: Some(old),
                ..
            } => self.actions.put_ledger(old),
            LedgerUndo::RestoreLedger {
                uuid,
                previous: None,
            } => self.actions.remove_ledger(uuid),
            // Recorded only as uncertain, never as an effect to undo.
            LedgerUndo::CheckDevice { .. } => Ok(()),
        }
    }
}

/// Runs the plan's action steps in order on the daemon's executor. The ledger entries of all its
/// creates are written first, in one batch (the ledger protocol only needs each entry on disk before
/// its device is created). On the first failure it stops and undoes the run: the failing step's
/// partial effect, the pre-written entries, every completed step, newest first.
pub fn execute<A: StepActions + ?Sized>(plan: &Plan, actions: &mut A) -> ExecReport<A::Error> {
    let steps = plan
        .steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.is_action())
        .map(|(i, s)| (i, s.clone()));
    execute_steps(actions, steps)
}

/// Runs ledgered device steps (numbered as the caller's plan numbers them) as [`execute`] does.
pub fn execute_steps<A: StepActions + ?Sized, S: DeviceStep>(
    actions: &mut A,
    steps: impl IntoIterator<Item = (usize, S)>,
) -> ExecReport<A::Error, S> {
    let steps: Vec<(usize, S)> = steps.into_iter().collect();
    let now = actions.now();
    let batch = steps
        .iter()
        .filter_map(|(_, s)| match s.change()? {
            Change::Create {
                uuid,
                parent,
                type_id,
                replaces,
                ..
            } => Some((
                LedgerEntry {
                    uuid: *uuid,
                    parent: parent.to_string(),
                    type_id: type_id.clone(),
                    ownership: LedgerOwnership::Daemon,
                    created_at: now,
                    gpu: None,
                    profile: None,
                    label: None,
                },
                replaces.clone(),
            )),
            _ => None,
        })
        .collect();
    let mut ledgered = Ledgered {
        actions,
        batch: Some(batch),
    };
    exec::execute::<S, _>(&mut ledgered, steps)
}
