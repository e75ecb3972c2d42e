//! Pool apply on the daemon's one executor ([`crate::daemon::exec`]): the steps of a pool plan
//! ([`crate::pool::PoolStep`]) run through [`PoolActions`] ([`SlotSteps`]), each recording what
//! undoes each of its changes ([`PoolUndo`]); on a failure the executor undoes them all in reverse order.
//! It decides; the actions only do. Each action is itself one atomic command of the engine (a
//! define, a start, a VF slot made through its backend), so a device a step creates goes through the
//! ledger protocol like any other.
//!
//! Pure: tested against a fake ([`super::pool_exec_tests`]) with proptest, as reconcile is.

use std::fmt;

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};

use crate::daemon::api::{CoreError, InstanceView, StateError};
use crate::daemon::exec::{self, Effects, Object};
use crate::daemon::store::{Definition, VfSlotRecord};
use crate::pool::{PoolStep, SlotId};
use crate::profile::ProfileTarget;

/// What the executor needs from the engine. Every change is atomic: it either happens or fails
/// leaving nothing behind.
pub(super) trait PoolActions {
    /// The VF slot record of slot `uuid`, if it is a VF slot.
    fn vf_record(&self, uuid: &MdevUuid) -> Option<VfSlotRecord>;
    /// The definition with UUID `uuid`, if any.
    fn definition(&self, uuid: &MdevUuid) -> Option<Definition>;
    /// The instance `uuid` as clients see it.
    fn instance(&mut self, uuid: &MdevUuid) -> Result<InstanceView, CoreError>;
    /// Enables `num_vfs` VFs on PF `pf` of GPU `gpu`; returns the VF count before.
    fn enable_vfs(&mut self, gpu: &str, pf: &PciAddress, num_vfs: u32) -> Result<u32, CoreError>;
    /// Puts the VF count of `pf` back to `previous`.
    fn restore_num_vfs(&mut self, pf: &PciAddress, previous: u32) -> Result<(), CoreError>;
    /// Makes VF slot `slot` on GPU `gpu` as `target` (records it first).
    fn create_vf(
        &mut self,
        slot: &SlotId,
        gpu: &str,
        target: &ProfileTarget,
    ) -> Result<(), CoreError>;
    /// Makes recorded VF slot `r` again on its VF.
    fn recreate_vf(&mut self, r: &VfSlotRecord) -> Result<(), CoreError>;
    /// Gives VF slot `uuid`'s VF back and drops its record; returns the record.
    fn release_vf(&mut self, uuid: &MdevUuid) -> Result<VfSlotRecord, CoreError>;
    /// Gives VF slot `uuid`'s VF back, keeping its record.
    fn stop_vf(&mut self, uuid: &MdevUuid) -> Result<(), CoreError>;
    /// Defines slot `slot` as `type_id` on `parent`, labelled as the slot and serving its profile,
    /// not started: one durable write of the definition.
    fn define(
        &mut self,
        slot: &SlotId,
        parent: &str,
        type_id: &MdevTypeId,
        autostart: bool,
    ) -> Result<(), CoreError>;
    /// Starts defined instance `uuid`.
    fn start(&mut self, uuid: &MdevUuid) -> Result<(), CoreError>;
    /// Defines `slots` (none of them defined yet) on `parent` as [`PoolActions::define`] does, then
    /// starts them all, calling `started(k)` once slot `k` runs. A failure names how many slots it
    /// defined (the first ones) and which slot failed; none of them is left running.
    fn create_slots(
        &mut self,
        parent: &str,
        slots: &[NewSlot],
        autostart: bool,
        started: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed>;
    /// Removes the running slots `uuids` of parent `parent` entirely (devices, then what is recorded
    /// of them), calling `removed(k)` once slot `k` is gone. A failure names how many slots (the first
    /// ones) it removed and which one failed; the others are left as they were.
    fn remove_slots(
        &mut self,
        parent: &str,
        uuids: &[MdevUuid],
        removed: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed>;
    /// Stops instance `uuid` (keeps its definition).
    fn stop(&mut self, uuid: &MdevUuid) -> Result<(), CoreError>;
    /// Removes instance `uuid` entirely.
    fn destroy(&mut self, uuid: &MdevUuid) -> Result<(), CoreError>;
    /// Brings back instance `v` as it was (definition and device).
    fn restore(&mut self, v: &InstanceView) -> Result<(), CoreError>;
}

/// How to undo one change of an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PoolUndo {
    /// The apply defined it: destroy it.
    Destroy(MdevUuid),
    /// The apply started an existing definition: stop it.
    Stop(MdevUuid),
    /// The apply removed it: define (or create) and start it again as it was.
    Restore(Box<InstanceView>),
    /// The apply made this VF slot: give its VF back.
    ReleaseVf(MdevUuid),
    /// The apply set up this recorded VF slot again: give its VF back, keep the record.
    StopVf(MdevUuid),
    /// The apply released this VF slot: make it again.
    RecreateVf(Box<VfSlotRecord>),
    /// The apply enabled VFs on this PF, which had `previous` before.
    NumVfs {
        /// The PF.
        pf: PciAddress,
        /// Its VF count before.
        previous: u32,
    },
}

impl PoolUndo {
    /// What the undone change was made to.
    fn object(&self) -> Object {
        match self {
            PoolUndo::Destroy(u)
            | PoolUndo::Stop(u)
            | PoolUndo::ReleaseVf(u)
            | PoolUndo::StopVf(u) => Object::Instance(*u),
            PoolUndo::Restore(v) => Object::Instance(v.uuid),
            PoolUndo::RecreateVf(r) => Object::Instance(r.uuid),
            PoolUndo::NumVfs { pf, .. } => Object::Pf(*pf),
        }
    }
}

impl fmt::Display for PoolUndo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolUndo::Destroy(u) => write!(f, "destroy {u}"),
            PoolUndo::Stop(u) => write!(f, "stop {u}"),
            PoolUndo::Restore(v) => write!(f, "restore {} ({} on {})", v.uuid, v.type_id, v.parent),
            PoolUndo::ReleaseVf(u) => write!(f, "release the VF of slot {u}"),
            PoolUndo::StopVf(u) => write!(f, "give back the VF of slot {u}"),
            PoolUndo::RecreateVf(r) => write!(f, "make slot {} again on VF {}", r.uuid, r.vf),
            PoolUndo::NumVfs { pf, previous } => write!(f, "set {pf} back to {previous} VFs"),
        }
    }
}

/// The slot a label names, when the label is a slot label of `pool` and `uuid` really is that slot's
/// UUID (a label alone is free text anyone could have given).
pub(super) fn labelled_slot(pool: &str, label: Option<&str>, uuid: &MdevUuid) -> Option<SlotId> {
    let rest = label?.strip_prefix("pool:")?;
    let (name, rest) = rest.split_once('/')?;
    let (profile, index) = rest.rsplit_once('/')?;
    if name != pool {
        return None;
    }
    let slot = SlotId::new(name, profile, index.parse().ok()?);
    (slot.uuid == *uuid).then_some(slot)
}

/// The pool being applied, as far as the executor needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Applying<'a> {
    /// Its name (slot labels carry it).
    pub name: &'a str,
    /// Whether its slots are defined with autostart.
    pub autostart: bool,
}

/// A slot of a [`SlotRun::Creates`]: defined and started with the others of its run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct NewSlot {
    /// The slot (its UUID names the instance).
    pub slot: SlotId,
    /// The type it is defined as.
    pub type_id: MdevTypeId,
}

/// How [`PoolActions::create_slots`] or [`PoolActions::remove_slots`] failed.
#[derive(Debug)]
pub(super) struct SlotsFailed {
    /// How many slots (the first ones) it changed before failing: defined (none of them runs) for
    /// [`PoolActions::create_slots`], removed entirely for [`PoolActions::remove_slots`].
    pub done: usize,
    /// The slot whose change failed.
    pub at: usize,
    /// Why (boxed: a `Result` carrying this stays small).
    pub error: Box<CoreError>,
}

/// The most slots one [`SlotRun::Creates`] or [`SlotRun::Removes`] takes: a run holds its GPU's lock
/// from its first change to its last, and other requests on that GPU (and the kernel events of its
/// devices) wait meanwhile. With an NVIDIA create taking a few hundred milliseconds, eight keep that
/// wait around a second or two, while the parent check and the ledger write, once per run, still
/// count for little per slot.
pub(super) const MAX_RUN: usize = 8;

/// What one transaction step of a pool apply runs.
#[derive(Debug, Clone)]
pub(super) enum SlotRun {
    /// One step of the plan.
    Step(PoolStep),
    /// Consecutive creates of mdev slots on one parent, none of them defined before the apply
    /// started: their definitions are written, the parent checked and their ledger entries written
    /// once for all of them, then their devices are created in order. Each step with its index in
    /// the plan.
    Creates {
        /// The mdev parent of every slot.
        parent: String,
        /// The steps, in plan order.
        steps: Vec<(usize, PoolStep)>,
    },
    /// Consecutive removes of running mdev slots of ours on one parent: their devices are removed
    /// in order, then their ledger entries and definitions at once.
    Removes {
        /// The mdev parent of every slot.
        parent: String,
        /// The steps, in plan order.
        steps: Vec<(usize, PoolStep)>,
    },
}

impl fmt::Display for SlotRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SlotRun::Step(step) => step.fmt(f),
            SlotRun::Creates { steps, .. } | SlotRun::Removes { steps, .. } if steps.len() == 1 => {
                steps[0].1.fmt(f)
            }
            SlotRun::Creates { parent, steps } | SlotRun::Removes { parent, steps } => {
                let name = |i: usize| match &steps[i].1 {
                    PoolStep::Create { slot, .. } | PoolStep::Remove { slot, .. } => slot.name(),
                    other => other.to_string(),
                };
                let verb = if matches!(self, SlotRun::Creates { .. }) {
                    "create"
                } else {
                    "remove"
                };
                write!(
                    f,
                    "{verb} {} slots on {parent} ({} … {})",
                    steps.len(),
                    name(0),
                    name(steps.len() - 1)
                )
            }
        }
    }
}

/// The parent of `step` when it creates an mdev slot nothing names yet (`named` says which UUIDs
/// something names): such creates can run together.
fn fresh_mdev_parent<'s>(step: &'s PoolStep, named: &dyn Fn(&MdevUuid) -> bool) -> Option<&'s str> {
    match step {
        PoolStep::Create {
            slot,
            target: ProfileTarget::Mdev { parent, .. },
            ..
        } if !named(&slot.uuid) => Some(parent.as_str()),
        _ => None,
    }
}

/// How the engine sees the slots of a plan's steps, for [`runs`].
pub(super) struct SlotKinds<'a> {
    /// Whether anything names the UUID already (a definition, a ledger entry, a device): only a
    /// create of a slot nothing names joins a run.
    pub named: &'a dyn Fn(&MdevUuid) -> bool,
    /// The parent of a slot that is a running mdev device of ours with its one definition there:
    /// only the remove of such a slot joins a run.
    pub removable_on: &'a dyn Fn(&MdevUuid) -> Option<String>,
}

/// Groups the steps of a plan (each with its index) into the transaction steps of an apply:
/// consecutive creates of unnamed mdev slots on one parent become one [`SlotRun::Creates`],
/// consecutive removes of removable slots on one parent one [`SlotRun::Removes`], each of at most
/// [`MAX_RUN`] slots; every other step runs alone. The order of the steps is kept.
pub(super) fn runs(
    steps: impl IntoIterator<Item = (usize, PoolStep)>,
    kinds: &SlotKinds<'_>,
) -> Vec<(usize, SlotRun)> {
    let mut out: Vec<(usize, SlotRun)> = Vec::new();
    for (i, step) in steps {
        let (creates, parent) = match &step {
            PoolStep::Remove { slot, .. } => match (kinds.removable_on)(&slot.uuid) {
                Some(parent) => (false, parent),
                None => {
                    out.push((i, SlotRun::Step(step)));
                    continue;
                }
            },
            _ => match fresh_mdev_parent(&step, kinds.named) {
                Some(parent) => (true, parent.to_string()),
                None => {
                    out.push((i, SlotRun::Step(step)));
                    continue;
                }
            },
        };
        let joined = match out.last_mut() {
            Some((_, SlotRun::Creates { parent: p, steps })) if creates => Some((p, steps)),
            Some((_, SlotRun::Removes { parent: p, steps })) if !creates => Some((p, steps)),
            _ => None,
        };
        if let Some((p, steps)) = joined
            && *p == parent
            && steps.len() < MAX_RUN
        {
            steps.push((i, step));
            continue;
        }
        let steps = vec![(i, step)];
        out.push((
            i,
            if creates {
                SlotRun::Creates { parent, steps }
            } else {
                SlotRun::Removes { parent, steps }
            },
        ));
    }
    out
}

/// What a step records of its changes: the executor's [`Effects`].
type Journal = Effects<PoolUndo, CoreError>;

/// Records `u` as the undo of a change just made.
fn done(undo: &mut Journal, u: PoolUndo) {
    undo.done(u.object(), u);
}

/// Executes one step, recording in `undo` how to undo each change it made (also when it fails
/// halfway: what it did before failing is undone with the rest).
pub(super) fn run_step(
    a: &mut dyn PoolActions,
    pool: Applying<'_>,
    step: &PoolStep,
    undo: &mut Journal,
) -> Result<(), CoreError> {
    match step {
        PoolStep::Remove { slot, .. } if a.vf_record(&slot.uuid).is_some() => {
            let record = a.release_vf(&slot.uuid)?;
            done(undo, PoolUndo::RecreateVf(Box::new(record)));
            Ok(())
        }
        PoolStep::EnableVfs { gpu, pf, num_vfs } => {
            let previous = a.enable_vfs(gpu, pf, *num_vfs)?;
            if previous != *num_vfs {
                done(undo, PoolUndo::NumVfs { pf: *pf, previous });
            }
            Ok(())
        }
        PoolStep::Create {
            slot,
            gpu,
            target:
                target @ (ProfileTarget::SriovVf { .. } | ProfileTarget::NvidiaVendorVfio { .. }),
            ..
        } => {
            // A recorded slot whose VF is not set up (a reboot, with a pool applied without
            // autostart) is made again where it is recorded.
            if let Some(r) = a.vf_record(&slot.uuid) {
                a.recreate_vf(&r)?;
                done(undo, PoolUndo::StopVf(slot.uuid));
                return Ok(());
            }
            a.create_vf(slot, gpu, target)?;
            done(undo, PoolUndo::ReleaseVf(slot.uuid));
            Ok(())
        }
        PoolStep::Remove { slot, .. } => {
            let view = a.instance(&slot.uuid)?;
            a.destroy(&slot.uuid)?;
            done(undo, PoolUndo::Restore(Box::new(view)));
            Ok(())
        }
        PoolStep::Create {
            slot,
            target: ProfileTarget::Mdev {
                parent, type_id, ..
            },
            ..
        } => {
            let uuid = slot.uuid;
            match a.definition(&uuid) {
                // A slot defined earlier and stopped since, where the plan puts it: start it.
                Some(d) if d.parent == *parent && d.type_id == *type_id => {
                    a.start(&uuid)?;
                    done(undo, PoolUndo::Stop(uuid));
                    Ok(())
                }
                // This pool's own slot, defined where the plan no longer puts it (its GPU left the
                // selection, or another took its room while it was stopped): move it.
                Some(d) if labelled_slot(pool.name, d.label.as_deref(), &uuid).is_some() => {
                    let remove = PoolStep::Remove {
                        slot: slot.clone(),
                        gpu: d.gpu.clone(),
                        holds: d.type_id.to_string(),
                    };
                    run_step(a, pool, &remove, undo)?;
                    define_and_start(a, pool, slot, parent, type_id, undo)
                }
                Some(d) => Err(StateError::SlotDefinedElsewhere {
                    slot: slot.name(),
                    uuid,
                    defined_type: d.type_id,
                    defined_parent: d.parent,
                    type_id: type_id.clone(),
                    parent: parent.clone(),
                }
                .into()),
                None => define_and_start(a, pool, slot, parent, type_id, undo),
            }
        }
        other => Err(CoreError::WholeGpuSlot {
            step: other.to_string(),
        }),
    }
}

/// Defines `slot` as `type_id` on `parent` (autostart as the pool says) and starts it.
fn define_and_start(
    a: &mut dyn PoolActions,
    pool: Applying<'_>,
    slot: &SlotId,
    parent: &str,
    type_id: &MdevTypeId,
    undo: &mut Journal,
) -> Result<(), CoreError> {
    a.define(slot, parent, type_id, pool.autostart)?;
    done(undo, PoolUndo::Destroy(slot.uuid));
    a.start(&slot.uuid)
}

/// A pool apply's steps on the daemon's executor: [`run_step`] over `actions`, and the slots of a
/// [`SlotRun::Creates`] or [`SlotRun::Removes`] together.
pub(super) struct SlotSteps<'a> {
    /// The engine (or a fake).
    pub actions: &'a mut dyn PoolActions,
    /// The pool being applied.
    pub pool: Applying<'a>,
    /// Called with the plan index and step of each slot of a [`SlotRun::Creates`] or
    /// [`SlotRun::Removes`] once it is done (a [`SlotRun::Step`] is reported by the caller, once its
    /// events are out).
    pub progress: &'a dyn Fn(usize, &PoolStep),
    /// The plan index and step of the slot that failed a [`SlotRun::Creates`] or
    /// [`SlotRun::Removes`], if one did.
    pub failed_at: Option<(usize, PoolStep)>,
}

impl SlotSteps<'_> {
    /// Runs the creates of a [`SlotRun::Creates`]: every slot defined is recorded for undo (destroy),
    /// also when a later one fails.
    fn run_creates(
        &mut self,
        parent: &str,
        steps: &[(usize, PoolStep)],
        undo: &mut Journal,
    ) -> Result<(), CoreError> {
        let mut slots = Vec::with_capacity(steps.len());
        for (_, step) in steps {
            match step {
                PoolStep::Create {
                    slot,
                    target: ProfileTarget::Mdev { type_id, .. },
                    ..
                } => slots.push(NewSlot {
                    slot: slot.clone(),
                    type_id: type_id.clone(),
                }),
                // `runs` puts only mdev creates in a run of creates.
                other => return Err(not_in_a_run(other)),
            }
        }
        let progress = self.progress;
        let result = self.actions.create_slots(
            parent,
            &slots,
            self.pool.autostart,
            &mut report_each(progress, steps),
        );
        let undos = slots.iter().map(|s| PoolUndo::Destroy(s.slot.uuid));
        self.finish_run(steps, result, undos, undo)
    }

    /// Runs the removes of a [`SlotRun::Removes`]: every slot removed is recorded for undo (its view
    /// from before, restored), also when a later one fails.
    fn run_removes(
        &mut self,
        parent: &str,
        steps: &[(usize, PoolStep)],
        undo: &mut Journal,
    ) -> Result<(), CoreError> {
        let mut views = Vec::with_capacity(steps.len());
        for (_, step) in steps {
            match step {
                PoolStep::Remove { slot, .. } => views.push(self.actions.instance(&slot.uuid)?),
                // `runs` puts only removes in a run of removes.
                other => return Err(not_in_a_run(other)),
            }
        }
        let uuids: Vec<MdevUuid> = views.iter().map(|v| v.uuid).collect();
        let progress = self.progress;
        let result = self
            .actions
            .remove_slots(parent, &uuids, &mut report_each(progress, steps));
        let undos = views.into_iter().map(|v| PoolUndo::Restore(Box::new(v)));
        self.finish_run(steps, result, undos, undo)
    }

    /// Records the undos of the slots a run changed (all of them, or the first [`SlotsFailed::done`])
    /// and, when it failed, which of its steps did.
    fn finish_run(
        &mut self,
        steps: &[(usize, PoolStep)],
        result: Result<(), SlotsFailed>,
        undos: impl Iterator<Item = PoolUndo>,
        undo: &mut Journal,
    ) -> Result<(), CoreError> {
        let changed = result.as_ref().map_or_else(|f| f.done, |()| steps.len());
        for u in undos.take(changed) {
            done(undo, u);
        }
        result.map_err(|f| {
            self.failed_at = steps.get(f.at).cloned();
            *f.error
        })
    }
}

/// The refusal of a step a run of slots cannot hold (`runs` never puts one there).
fn not_in_a_run(step: &PoolStep) -> CoreError {
    CoreError::WholeGpuSlot {
        step: step.to_string(),
    }
}

/// Reports slot `k` of the run `steps` through `progress` with its plan index and step.
fn report_each<'a>(
    progress: &'a dyn Fn(usize, &PoolStep),
    steps: &'a [(usize, PoolStep)],
) -> impl FnMut(usize) + 'a {
    move |k| {
        if let Some((i, step)) = steps.get(k) {
            progress(*i, step);
        }
    }
}

impl exec::Actions<SlotRun> for SlotSteps<'_> {
    type Undo = PoolUndo;
    type Error = CoreError;

    fn run(&mut self, run: &SlotRun, undo: &mut Journal) -> Result<(), CoreError> {
        match run {
            SlotRun::Step(step) => run_step(self.actions, self.pool, step, undo),
            SlotRun::Creates { parent, steps } => self.run_creates(parent, steps, undo),
            SlotRun::Removes { parent, steps } => self.run_removes(parent, steps, undo),
        }
    }

    fn undo(&mut self, u: &PoolUndo) -> Result<(), CoreError> {
        let a = &mut *self.actions;
        match u {
            PoolUndo::Destroy(uuid) => a.destroy(uuid),
            PoolUndo::Stop(uuid) => a.stop(uuid),
            PoolUndo::Restore(v) => a.restore(v),
            PoolUndo::ReleaseVf(uuid) => a.release_vf(uuid).map(|_| ()),
            PoolUndo::StopVf(uuid) => a.stop_vf(uuid),
            PoolUndo::RecreateVf(r) => a.recreate_vf(r),
            PoolUndo::NumVfs { pf, previous } => a.restore_num_vfs(pf, *previous),
        }
    }
}
