//! The executor: carries out a [`Plan`]'s action steps through [`StepActions`] and, if one fails,
//! undoes what this run already did, in reverse order.

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::plan::{Plan, Step};
use crate::daemon::api::CoreError;
use crate::daemon::store::{LedgerEntry, LedgerOwnership};

/// What the executor needs from the daemon core. Implementations must keep the ledger durable
/// (`put_ledger` returns only once the entry is on disk).
pub trait StepActions {
    /// What an action fails with (the engine's [`CoreError`]; tests use their own).
    type Error: std::fmt::Display + std::fmt::Debug;
    /// Durably writes (or replaces) a ledger entry. Entries for new devices come with `gpu`,
    /// `profile` and `label` unset; implementations may fill them from the definition.
    fn put_ledger(&mut self, entry: &LedgerEntry) -> Result<(), Self::Error>;
    /// Durably writes several new entries, returning once all of them are on disk. The executor
    /// writes the entries of every device a plan creates with one call before creating the first
    /// device (one flush instead of one per device). On error any subset may have been written.
    /// The default writes them one by one.
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
    /// Removes an mdev device this run created (writes its `remove` attribute); only called to roll
    /// back.
    fn remove_device(&mut self, uuid: &MdevUuid, parent: &str) -> Result<(), Self::Error>;
    /// Whether a device with this UUID exists; asked after a failed create, because only a device
    /// known to be absent may lose its ledger entry.
    fn device_exists(&mut self, uuid: &MdevUuid) -> Result<bool, Self::Error>;
    /// Seconds since the Unix epoch, for the ledger's `created_at`.
    fn now(&self) -> u64;
}

/// The step that failed.
#[derive(Debug, Clone)]
pub struct StepFailure<E = CoreError> {
    /// Its index in [`Plan::steps`].
    pub index: usize,
    /// The step.
    pub step: Step,
    /// The error.
    pub error: E,
}

/// An undo action that failed; its effect stays in place.
#[derive(Debug, Clone)]
pub struct RollbackError<E = CoreError> {
    /// The step being undone.
    pub step: Step,
    /// What could not be undone.
    pub what: UndoAction,
    /// The error.
    pub error: E,
}

/// One undo action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UndoAction {
    /// Removing a device created by this run (its ledger entry is then kept: the device is ours).
    RemoveDevice,
    /// Restoring the ledger to what it was (removing a new entry or putting back an old one).
    RestoreLedger,
    /// Checking whether a failed create left a device (the ledger entry is then kept to be safe).
    CheckDevice,
}

/// What [`execute`] did.
#[derive(Debug, Clone)]
pub struct ExecReport<E = CoreError> {
    /// Action steps that completed, in order. Without a failure these are the plan's effects; with
    /// one they were undone (see `rolled_back`, `rollback_errors`).
    pub completed: Vec<Step>,
    /// The step that failed, if any (execution stops there).
    pub failure: Option<StepFailure<E>>,
    /// Completed steps whose effects were undone, in the order undone (reverse of `completed`).
    pub rolled_back: Vec<Step>,
    /// Undo actions that failed (their effects remain; the next reconcile sees them).
    pub rollback_errors: Vec<RollbackError<E>>,
}

impl<E> Default for ExecReport<E> {
    fn default() -> Self {
        ExecReport {
            completed: Vec::new(),
            failure: None,
            rolled_back: Vec::new(),
            rollback_errors: Vec::new(),
        }
    }
}

impl<E> ExecReport<E> {
    /// True when every action step succeeded.
    pub fn succeeded(&self) -> bool {
        self.failure.is_none()
    }
}

/// What a Create did so far, to undo it precisely.
struct CreateDone<'a> {
    step: &'a Step,
    uuid: &'a MdevUuid,
    parent: &'a str,
    replaces: &'a Option<LedgerEntry>,
    device: bool,
}

/// A completed (or partially completed) step's undo information.
enum Done<'a> {
    Create(CreateDone<'a>),
    DropLedger(&'a Step, &'a LedgerEntry),
}

/// Runs the plan's action steps in order. The ledger entries of all its creates are written first,
/// in one batch (the ledger protocol only needs each entry on disk before its device is created). On
/// the first failure it stops, undoes the failing step's partial effect, restores the pre-written
/// entries of creates it did not reach, undoes every completed step in reverse order, and reports
/// it all.
pub fn execute<E: std::fmt::Display + std::fmt::Debug>(
    plan: &Plan,
    actions: &mut dyn StepActions<Error = E>,
) -> ExecReport<E> {
    let mut report = ExecReport::default();
    let creates: Vec<(usize, CreateDone<'_>)> = plan
        .steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| match step {
            Step::Create {
                uuid,
                parent,
                replaces,
                ..
            } => Some((
                index,
                CreateDone {
                    step,
                    uuid,
                    parent,
                    replaces,
                    device: false,
                },
            )),
            _ => None,
        })
        .collect();
    let entries: Vec<LedgerEntry> = plan
        .steps
        .iter()
        .filter_map(|step| match step {
            Step::Create {
                uuid,
                parent,
                type_id,
                ..
            } => Some(new_entry(actions, uuid, parent, type_id)),
            _ => None,
        })
        .collect();
    if let Some(&(first, _)) = creates.first()
        && let Err(error) = actions.put_ledgers(&entries)
    {
        // Which entries reached the disk is unknown; restore all of them (none has a device).
        for (_, c) in creates.into_iter().rev() {
            undo(actions, Done::Create(c), &mut report, false);
        }
        fail(&mut report, first, &plan.steps[first], error);
        return report;
    }
    let mut pending = creates.into_iter().peekable();
    let mut done: Vec<Done<'_>> = Vec::new();
    for (index, step) in plan.steps.iter().enumerate() {
        let result = match step {
            Step::Create { type_id, .. } => {
                let Some((_, mut d)) = pending.next_if(|(i, _)| *i == index) else {
                    continue;
                };
                match run_create(actions, &mut d, type_id, &mut report) {
                    Ok(()) => {
                        done.push(Done::Create(d));
                        Ok(())
                    }
                    Err((error, partial)) => {
                        if let Some(p) = partial {
                            undo(actions, Done::Create(p), &mut report, false);
                        }
                        Err(error)
                    }
                }
            }
            Step::DropLedger { entry } => actions
                .remove_ledger(&entry.uuid)
                .map(|()| done.push(Done::DropLedger(step, entry))),
            _ => continue,
        };
        match result {
            Ok(()) => report.completed.push(step.clone()),
            Err(error) => {
                tracing::warn!("reconcile: step {index} ({step}) failed: {error}; rolling back");
                // Creates never reached have only their pre-written entry to take back.
                let unreached: Vec<_> = pending.collect();
                for (_, c) in unreached.into_iter().rev() {
                    undo(actions, Done::Create(c), &mut report, false);
                }
                while let Some(d) = done.pop() {
                    undo(actions, d, &mut report, true);
                }
                fail(&mut report, index, step, error);
                break;
            }
        }
    }
    report
}

/// Records the failed step.
fn fail<E>(report: &mut ExecReport<E>, index: usize, step: &Step, error: E) {
    report.failure = Some(StepFailure {
        index,
        step: step.clone(),
        error,
    });
}

/// The ledger entry a create writes before making its device.
fn new_entry<E: std::fmt::Display + std::fmt::Debug>(
    actions: &dyn StepActions<Error = E>,
    uuid: &MdevUuid,
    parent: &str,
    type_id: &MdevTypeId,
) -> LedgerEntry {
    LedgerEntry {
        uuid: *uuid,
        parent: parent.to_string(),
        type_id: type_id.clone(),
        ownership: LedgerOwnership::Daemon,
        created_at: actions.now(),
        gpu: None,
        profile: None,
        label: None,
    }
}

/// Creates the device of a create whose ledger entry is already on disk. On failure returns the
/// error and, if something is to be undone, what.
fn run_create<'a, E: std::fmt::Display + std::fmt::Debug>(
    actions: &mut dyn StepActions<Error = E>,
    d: &mut CreateDone<'a>,
    type_id: &MdevTypeId,
    report: &mut ExecReport<E>,
) -> Result<(), (E, Option<CreateDone<'a>>)> {
    let Err(error) = actions.create_device(d.uuid, d.parent, type_id) else {
        d.device = true;
        return Ok(());
    };
    let partial = |device| CreateDone { device, ..*d };
    match actions.device_exists(d.uuid) {
        // Nothing was created: the entry can go.
        Ok(false) => Err((error, Some(partial(false)))),
        // The kernel made it despite the error: it is ours, so undo removes it.
        Ok(true) => Err((error, Some(partial(true)))),
        // Unknown: keep the entry (a device we made must never be unrecorded); the next reconcile
        // drops it if there is no device.
        Err(check) => {
            report.rollback_errors.push(RollbackError {
                step: d.step.clone(),
                what: UndoAction::CheckDevice,
                error: check,
            });
            Err((error, None))
        }
    }
}

/// Undoes one step; `listed` adds it to `rolled_back` when fully undone.
fn undo<E: std::fmt::Display + std::fmt::Debug>(
    actions: &mut dyn StepActions<Error = E>,
    d: Done<'_>,
    report: &mut ExecReport<E>,
    listed: bool,
) {
    let mut fail = |step: &Step, what, error| {
        report.rollback_errors.push(RollbackError {
            step: step.clone(),
            what,
            error,
        });
    };
    let (step, ok) = match d {
        Done::Create(c) => {
            let device_gone = !c.device
                || match actions.remove_device(c.uuid, c.parent) {
                    Ok(()) => true,
                    Err(e) => {
                        fail(c.step, UndoAction::RemoveDevice, e);
                        false
                    }
                };
            // The device is still ours while it exists: keep its entry then.
            let ledger_ok = device_gone && {
                let r = match c.replaces {
                    Some(old) => actions.put_ledger(old),
                    None => actions.remove_ledger(c.uuid),
                };
                r.map_err(|e| fail(c.step, UndoAction::RestoreLedger, e))
                    .is_ok()
            };
            (c.step, device_gone && ledger_ok)
        }
        Done::DropLedger(step, entry) => {
            let ok = actions
                .put_ledger(entry)
                .map_err(|e| fail(step, UndoAction::RestoreLedger, e))
                .is_ok();
            (step, ok)
        }
    };
    if listed && ok {
        report.rolled_back.push(step.clone());
    }
}
