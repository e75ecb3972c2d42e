//! Pools in the daemon: plan, apply, status.
//!
//! Apply is all-or-nothing as far as the daemon can make it:
//! * **Refused before any change** when the plan leaves a profile short (the exact shortfall per
//!   profile is the message).
//! * **mdev slots** run through the core's own commands ([`DefineInstance`], [`StartInstance`],
//!   [`DestroyInstance`]), so the ledger protocol, per-parent locks, the kernel's capacity check and
//!   persistence apply to slots exactly as to any instance. A slot is defined (autostart as the pool
//!   says) with its stable UUID, labelled `pool:<pool>/<profile>/<index>`, then started. Consecutive
//!   new slots on one parent are made as one run (see [`super::pool_create`]): one parent check,
//!   their definitions, one ledger batch, then their devices, each announced and reported as it
//!   starts.
//! * **VF slots** (xe/i915 VFs on vfio-pci, NVIDIA vendor-VFIO vGPUs; see [`super::vf_slots`]) are
//!   made through the GPU's vendor backend: `EnableVfs` steps enable the PF's VFs (autoprobe off),
//!   each slot takes a free VF and is recorded before the VF is touched.
//! * **Stopped slots**: the plan sees running instances only. A slot of the pool that is defined but
//!   stopped is started again when the plan puts it where it is defined, moved (destroyed and defined
//!   anew) when the plan puts it elsewhere, and removed when the pool no longer wants it. A definition
//!   with a slot's UUID that this pool did not make (no slot label) is never replaced: the apply fails.
//! * **A failed step undoes this apply**: what it created is destroyed, what it started is stopped,
//!   what it removed is defined and started again, in reverse order.
//!
//! A pool that applied is recorded (see [`super::pool_record`]) for [`GetPoolStatus`](crate::daemon::api::GetPoolStatus).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};

use mdev_types::ids::MdevUuid;
use tracing::{info, warn};
use vgpu_host::discover::discover_without_groups;

use std::cell::Cell;

use super::pool_exec::{
    Applying, NewSlot, PoolActions, PoolUndo, SlotKinds, SlotRun, SlotSteps, SlotsFailed,
    labelled_slot, runs,
};
use std::sync::Arc;

use vgpu_host::Host;

use super::instances::Instances;
use super::vf_slots::VfSlots;
use super::{Store, lock};
use crate::daemon::api::{
    CoreError, Event, InstanceSpec, InstanceState, InstanceTarget, InstanceView, UndoFailure,
};
use crate::daemon::exec::{Failed, Report, Transaction, Undone};
use crate::daemon::store::{Definition, VfSlotRecord};
use crate::pool::{Pool, PoolPlan, PoolStep, SlotId, plan_pool};
use crate::profile::Catalog;
use crate::profile::ProfileTarget;
use mdev_types::ids::{MdevTypeId, PciAddress};
use vgpu_client::PoolSummary;

/// Where pools received as text are said to come from in error messages.
const ORIGIN: &str = "pool";

/// One apply at a time: two concurrent applies of one pool would both plan the same creates. A
/// process-wide lock (rather than a `Core` field) because there is one core per daemon.
pub(super) static APPLYING: Mutex<()> = Mutex::new(());

/// The label of a slot's instance.
pub(super) fn slot_label(slot: &SlotId) -> String {
    format!("pool:{}/{}/{}", slot.pool, slot.profile, slot.index)
}

/// The refusal of a plan that leaves a profile short, or `None` when every slot is placed.
fn shortfall(plan: &PoolPlan) -> Option<CoreError> {
    (!plan.shortfall.is_empty()).then(|| CoreError::Shortfall {
        pool: plan.pool.clone(),
        host: plan.host.clone(),
        shortfall: plan.shortfall.clone(),
        proven_optimal: plan.proven_optimal,
    })
}

/// The pool service: plans and applies pools over the instances and VF slots, and reports their
/// status from the applied-pool records.
pub(super) struct Pools {
    pub(super) host: Arc<dyn Host>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) store: Arc<Store>,
    /// For apply progress.
    events: Arc<super::event_bus::EventBus>,
    pub(super) instances: Arc<Instances>,
    pub(super) vf_slots: Arc<VfSlots>,
    /// Set when vgpud shuts down: an apply stops at its next step boundary (see `pool_stop`).
    pub(super) stopping: std::sync::atomic::AtomicBool,
}

impl Pools {
    /// The service; `events` carries apply progress.
    pub(super) fn new(
        host: Arc<dyn Host>,
        catalog: Arc<Catalog>,
        store: Arc<Store>,
        events: Arc<super::event_bus::EventBus>,
        instances: Arc<Instances>,
        vf_slots: Arc<VfSlots>,
    ) -> Pools {
        Pools {
            host,
            catalog,
            store,
            events,
            instances,
            vf_slots,
            stopping: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether `step` leaves the host's PCI devices as they were: an mdev made or removed changes
    /// only its parent's capacity, while enabling VFs, or taking or releasing one (its driver, its
    /// vendor type), changes PCI devices.
    fn leaves_pci_alone(&self, step: &PoolStep) -> bool {
        match step {
            PoolStep::Create { target, .. } => matches!(target, ProfileTarget::Mdev { .. }),
            PoolStep::Remove { slot, .. } => self.vf_slots.vf_record(&slot.uuid).is_none(),
            PoolStep::EnableVfs { .. } => false,
        }
    }

    fn parse_pool(&self, text: &str) -> Result<Pool, CoreError> {
        Ok(Pool::from_toml(ORIGIN, text, &self.catalog)?)
    }

    fn plan_of(&self, pool: &Pool) -> Result<(PoolPlan, mdev_types::model::Inventory), CoreError> {
        let inv = discover_without_groups(self.host.as_ref())?;
        let held = self.vf_slots.held_vf_slots(&pool.name);
        let plan = plan_pool(pool, &self.catalog, &inv, &held)?;
        Ok((plan, inv))
    }

    /// [`PlanPool`](crate::daemon::api::PlanPool).
    pub(super) fn plan(&self, text: &str) -> Result<PoolPlan, CoreError> {
        let pool = self.parse_pool(text)?;
        let (plan, _) = self.plan_of(&pool)?;
        Ok(plan)
    }

    /// [`ApplyPool`](crate::daemon::api::ApplyPool): one run of the daemon's executor, kept only
    /// when every step succeeds.
    ///
    /// The apply is recorded as in progress before its first change and that record is removed
    /// once it applied or was undone; vgpud's shutdown stops it at a step boundary, leaving the record
    /// for the next start to finish the apply ([`super::Core::finish_interrupted_applies`]).
    pub(super) fn apply(&self, text: &str) -> Result<PoolSummary, CoreError> {
        let _one = APPLYING.lock().unwrap_or_else(PoisonError::into_inner);
        let pool = self.parse_pool(text)?;
        if let Some(summary) = self.already_applied(&pool, text)? {
            // A kill between recording the pool and dropping its in-progress record leaves that
            // record behind; the host matching the recorded pool means it is done (and a newer
            // request supersedes an older interrupted one, as a full apply's record would).
            if lock(&self.store).applying().any(|a| a.name == pool.name) {
                self.unmark_applying(&pool);
            }
            return Ok(summary);
        }
        self.mark_applying(&pool, text)?;
        let outcome = self.apply_marked(&pool, text);
        if !matches!(outcome, Err(CoreError::Interrupted { .. })) {
            self.unmark_applying(&pool);
        }
        outcome
    }

    /// The summary of applying `pool` (as `text`) when the host already matches it and it is recorded
    /// with this very text: one discovery, no write (the in-progress record guards changes, and there
    /// are none). `None` when anything is to be done, which the full apply then does.
    fn already_applied(&self, pool: &Pool, text: &str) -> Result<Option<PoolSummary>, CoreError> {
        let recorded = lock(&self.store)
            .get_pool(&pool.name)
            .is_some_and(|a| a.text == text);
        if !recorded
            || !self.stopped_vf_slots(pool).is_empty()
            || !self.unwanted_stopped_slots(pool).is_empty()
        {
            return Ok(None);
        }
        let (plan, inv) = self.plan_of(pool)?;
        if !plan.steps.is_empty() || shortfall(&plan).is_some() {
            return Ok(None);
        }
        let (slots, gpus) = self.slot_rows(pool, &inv);
        info!(pool = %pool.name, "pool applied: the host already matches it");
        Ok(Some(PoolSummary {
            pool: pool.name.clone(),
            host: inv.host.clone(),
            changed: false,
            steps: 0,
            created: Vec::new(),
            removed: Vec::new(),
            kept: u32::try_from(plan.keep.len()).unwrap_or(u32::MAX),
            slots,
            gpus,
        }))
    }

    /// The steps of [`Pools::apply`], once the apply is recorded as in progress.
    fn apply_marked(&self, pool: &Pool, text: &str) -> Result<PoolSummary, CoreError> {
        let pool = pool.clone();
        let mut slots = Slots(self);
        // The step count is known once the plan is made (after the restarts below).
        let total = Cell::new(0u32);
        let progress = |i: usize, step: &PoolStep| self.progress(&pool.name, i, total.get(), step);
        let mut steps_of = SlotSteps {
            actions: &mut slots,
            pool: Applying {
                name: &pool.name,
                autostart: pool.autostart,
            },
            progress: &progress,
            failed_at: None,
        };
        let mut run = Transaction::new(&mut steps_of);
        let mut created = Vec::new();
        let mut removed = Vec::new();
        // VF slots the pool still wants whose VF is not set up (after a reboot, for a pool applied
        // without autostart) are made again first, on their recorded VFs, so that the plan sees the
        // VFs they hold (a PF whose VFs a reboot disabled would otherwise look free).
        let restarts = self.stopped_vf_slots(&pool);
        for (i, step) in restarts.iter().enumerate() {
            self.check_stopping(&pool, i, restarts.len())?;
            run = match self.run_held(run, i, &SlotRun::Step(step.clone())) {
                Ok(run) => run,
                Err(failed) => {
                    let undone = failed.roll_back();
                    return Err(self.failed_apply(&pool, restarts.len(), undone, None));
                }
            };
            if let PoolStep::Create { slot, .. } = step {
                created.push(slot.name());
            }
        }
        let (plan, planned_on) = match self.plan_of(&pool) {
            Ok(found) => found,
            Err(e) => {
                self.log_rollback(&pool, &run.roll_back());
                return Err(e);
            }
        };
        if let Some(refusal) = shortfall(&plan) {
            self.log_rollback(&pool, &run.roll_back());
            return Err(refusal);
        }
        // The plan sees running slots only; a stopped slot the pool no longer wants is removed too.
        let mut steps = restarts;
        let first = steps.len();
        steps.extend(self.unwanted_stopped_slots(&pool));
        steps.extend(plan.steps.iter().cloned());
        total.set(u32::try_from(steps.len()).unwrap_or(u32::MAX));
        // Whether the inventory read for the plan still describes the host's PCI devices once the
        // steps ran (the summary's GPUs, type names and faults come from it; slot states come from
        // the instance views either way).
        let pci_unchanged = steps.iter().skip(first).all(|s| self.leaves_pci_alone(s));
        // The restarts ran before the plan existed; their progress goes out now, with the total.
        for (i, step) in steps.iter().enumerate().take(first) {
            progress(i, step);
        }
        let mdevctl = self.instances.mdevctl_names();
        // The devices present, from the read the plan was made from: a slot removed in a run needs
        // one (a stopped slot goes the way of a single destroy).
        let present: BTreeSet<MdevUuid> =
            planned_on.mdev_instances.iter().map(|i| i.uuid).collect();
        let grouped = runs(
            steps.iter().cloned().enumerate().skip(first),
            &SlotKinds {
                named: &|uuid| !self.instances.is_fresh(uuid, &mdevctl),
                removable_on: &|uuid| {
                    if !present.contains(uuid) || self.vf_slots.vf_record(uuid).is_some() {
                        return None;
                    }
                    self.instances.owned_on(uuid)
                },
            },
        );
        for (i, unit) in grouped {
            self.check_stopping(&pool, i, steps.len())?;
            run = match self.run_held(run, i, &unit) {
                Ok(run) => run,
                Err(failed) => {
                    let undone = failed.roll_back();
                    let at = steps_of.failed_at.take();
                    return Err(self.failed_apply(&pool, steps.len(), undone, at));
                }
            };
            let mut note = |step: &PoolStep| match step {
                PoolStep::Create { slot, .. } => created.push(slot.name()),
                PoolStep::Remove { slot, .. } => removed.push(slot.name()),
                PoolStep::EnableVfs { .. } => {}
            };
            match &unit {
                SlotRun::Step(step) => {
                    note(step);
                    // After the step's held events: a subscriber learns of the slot first.
                    progress(i, step);
                }
                // Each slot's progress went out as it was done.
                SlotRun::Creates { steps, .. } | SlotRun::Removes { steps, .. } => {
                    steps.iter().for_each(|(_, step)| note(step));
                }
            }
        }
        run.commit();
        let total = total.get();
        self.record_pool(&pool, text)?;
        info!(pool = %pool.name, steps = total, created = created.len(), removed = removed.len(), "pool applied");
        let inv = if pci_unchanged {
            planned_on
        } else {
            discover_without_groups(self.host.as_ref())?
        };
        let (slots, gpus) = self.slot_rows(&pool, &inv);
        let summary = PoolSummary {
            pool: pool.name.clone(),
            host: inv.host.clone(),
            changed: total > 0,
            steps: total,
            created,
            removed,
            kept: u32::try_from(plan.keep.len().saturating_sub(first)).unwrap_or(u32::MAX),
            slots,
            gpus,
        };
        Ok(summary)
    }

    /// Reports step `i` (of `total`) of an apply of pool `name` as done. Nobody listening is fine:
    /// progress is a courtesy.
    fn progress(&self, name: &str, i: usize, total: u32, step: &PoolStep) {
        self.events.send(Event::PoolProgress {
            pool: name.to_string(),
            done: u32::try_from(i + 1).unwrap_or(u32::MAX),
            total,
            step: step.to_string(),
        });
    }

    /// Runs transaction step `i` of an apply. A single step runs with the instance events it causes
    /// held back: one event per slot it changes, before the step's progress (see
    /// [`Instances::hold_events`]); a failed step's events go out before its rollback runs. A run of
    /// creates or removes announces each slot itself as it is done, before that slot's progress.
    // Transaction::run's own result, passed on unchanged (its failure carries the run to roll back).
    #[allow(clippy::result_large_err)]
    fn run_held<'a, A>(
        &self,
        run: Transaction<'a, SlotRun, A>,
        i: usize,
        unit: &SlotRun,
    ) -> Result<Transaction<'a, SlotRun, A>, Failed<'a, SlotRun, A>>
    where
        A: crate::daemon::exec::Actions<SlotRun> + ?Sized,
    {
        let _held = matches!(unit, SlotRun::Step(_)).then(|| self.instances.hold_events());
        run.run(i, unit)
    }

    /// The error of an apply whose step failed, out of `total`, and was undone as `report` says;
    /// `at` is the plan step that failed when it was one of a run of creates or removes.
    fn failed_apply(
        &self,
        pool: &Pool,
        total: usize,
        Undone { failure, report }: Undone<SlotRun, PoolUndo, CoreError>,
        at: Option<(usize, PoolStep)>,
    ) -> CoreError {
        let (index, step) = match at {
            Some((i, step)) => (i, step.to_string()),
            None => (failure.index, failure.step.to_string()),
        };
        warn!(pool = %pool.name, %step, error = %failure.error, "pool apply failed; undone");
        self.log_rollback(pool, &report);
        CoreError::PoolStep {
            pool: pool.name.clone(),
            number: index + 1,
            total,
            step,
            cause: Box::new(failure.error),
            undone: report.effects,
            rollback: report
                .rollback_errors
                .into_iter()
                .map(|e| UndoFailure {
                    undo: e.what.to_string(),
                    error: e.error,
                })
                .collect(),
        }
    }

    /// Logs what a rollback could not undo.
    fn log_rollback(&self, pool: &Pool, report: &Report<SlotRun, PoolUndo, CoreError>) {
        for f in &report.rollback_errors {
            warn!(pool = %pool.name, undo = %f.what, error = %f.error, "undoing a pool apply failed; `vgpuctl pool status` shows what is left");
        }
        for l in &report.left {
            warn!(pool = %pool.name, undo = %l.what, step = %l.step, "left in place: undoing a later change of the same slot failed");
        }
    }

    /// Create steps for the VF slots of `pool` that it still wants whose VF is not set up now: each
    /// makes the slot again on its recorded VF.
    fn stopped_vf_slots(&self, pool: &Pool) -> Vec<PoolStep> {
        self.vf_slots
            .vf_records()
            .into_iter()
            .filter(|r| r.pool == pool.name)
            .filter(|r| pool.profiles.get(&r.profile).is_some_and(|n| r.index < *n))
            .filter(|r| !self.vf_slots.vf_slot_running(r))
            .map(|r| PoolStep::Create {
                slot: r.slot(),
                gpu: r.gpu.clone(),
                numa_node: None,
                target: r.target(),
                start: None,
            })
            .collect()
    }

    /// Remove steps for the defined, stopped slots of `pool` that it no longer wants (a profile it
    /// dropped, an index past its count).
    fn unwanted_stopped_slots(&self, pool: &Pool) -> Vec<PoolStep> {
        let store = lock(&self.store);
        store
            .definitions()
            .filter(|d| !self.instances.device_exists(&d.uuid))
            .filter_map(|d| {
                let slot = labelled_slot(&pool.name, d.label.as_deref(), &d.uuid)?;
                let wanted = pool
                    .profiles
                    .get(&slot.profile)
                    .is_some_and(|n| slot.index < *n);
                (!wanted).then(|| PoolStep::Remove {
                    slot,
                    gpu: d.gpu.clone(),
                    holds: d.type_id.to_string(),
                })
            })
            .collect()
    }

    /// Brings back an instance this apply removed: its definition (if it had one) and its device (if
    /// it ran).
    fn restore(&self, v: &InstanceView) -> Result<(), CoreError> {
        let req = InstanceSpec {
            target: InstanceTarget::Type(v.type_id.clone()),
            gpu: Some(v.parent.clone()),
            uuid: Some(v.uuid),
            autostart: v.autostart,
            label: v.label.clone(),
            attrs: v.attrs.clone(),
        };
        if !v.defined {
            self.instances.create(req)?;
            return Ok(());
        }
        self.instances.define(req)?;
        if let Some(p) = &v.profile {
            self.instances.set_profile_if_unset(&v.uuid, p)?;
        }
        if v.state == InstanceState::Running {
            self.instances.start(v.uuid)?;
        }
        Ok(())
    }
}

/// The engine's side of the pool executor.
struct Slots<'a>(&'a Pools);

impl PoolActions for Slots<'_> {
    fn vf_record(&self, uuid: &MdevUuid) -> Option<VfSlotRecord> {
        self.0.vf_slots.vf_record(uuid)
    }

    fn definition(&self, uuid: &MdevUuid) -> Option<Definition> {
        lock(&self.0.store).get_definition(uuid).cloned()
    }

    fn instance(&mut self, uuid: &MdevUuid) -> Result<InstanceView, CoreError> {
        self.0.instances.get(uuid)
    }

    fn enable_vfs(&mut self, gpu: &str, pf: &PciAddress, num_vfs: u32) -> Result<u32, CoreError> {
        self.0.vf_slots.enable_vfs_on(gpu, pf, num_vfs)
    }

    fn restore_num_vfs(&mut self, pf: &PciAddress, previous: u32) -> Result<(), CoreError> {
        self.0.vf_slots.restore_num_vfs(pf, previous)
    }

    fn create_vf(
        &mut self,
        slot: &SlotId,
        gpu: &str,
        target: &ProfileTarget,
    ) -> Result<(), CoreError> {
        self.0
            .vf_slots
            .create_vf_slot(slot, gpu, target)
            .map(|_| ())
    }

    fn recreate_vf(&mut self, r: &VfSlotRecord) -> Result<(), CoreError> {
        self.0.vf_slots.recreate_vf_slot(r)
    }

    fn release_vf(&mut self, uuid: &MdevUuid) -> Result<VfSlotRecord, CoreError> {
        self.0.vf_slots.release_vf_slot(uuid)
    }

    fn stop_vf(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.0.vf_slots.stop_vf_slot(uuid)
    }

    fn define(
        &mut self,
        slot: &SlotId,
        parent: &str,
        type_id: &MdevTypeId,
        autostart: bool,
    ) -> Result<(), CoreError> {
        let spec = InstanceSpec {
            target: InstanceTarget::Type(type_id.clone()),
            gpu: Some(parent.to_string()),
            uuid: Some(slot.uuid),
            autostart,
            label: Some(slot_label(slot)),
            attrs: Vec::new(),
        };
        self.0
            .instances
            .define_serving(spec, &slot.profile)
            .map(|_| ())
    }

    fn start(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.0.instances.start(*uuid).map(|_| ())
    }

    fn create_slots(
        &mut self,
        parent: &str,
        slots: &[NewSlot],
        autostart: bool,
        started: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        self.0
            .instances
            .create_slots(parent, slots, autostart, started)
    }

    fn remove_slots(
        &mut self,
        parent: &str,
        uuids: &[MdevUuid],
        removed: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        self.0.instances.remove_slots(parent, uuids, removed)
    }

    fn stop(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.0.instances.stop(*uuid).map(|_| ())
    }

    fn destroy(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.0.instances.destroy(*uuid).map(|_| ())
    }

    fn restore(&mut self, v: &InstanceView) -> Result<(), CoreError> {
        self.0.restore(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_step_lines_name_the_slot() {
        let slot = SlotId::new("vdi", "vdi-2g", 3);
        assert_eq!(slot_label(&slot), "pool:vdi/vdi-2g/3");
        let step = PoolStep::Remove {
            slot,
            gpu: "0000:83:00.0".into(),
            holds: "nvidia-231".into(),
        };
        assert_eq!(
            step.to_string(),
            "remove vdi-2g/3 (nvidia-231) from 0000:83:00.0"
        );
    }

    #[test]
    fn only_a_true_slot_label_names_a_slot() {
        let slot = SlotId::new("vdi", "vdi-2g", 3);
        let label = slot_label(&slot);
        assert_eq!(
            labelled_slot("vdi", Some(&label), &slot.uuid),
            Some(slot.clone())
        );
        // Another pool's label, a label on another UUID, free text: not this pool's slot.
        assert_eq!(labelled_slot("vdi2", Some(&label), &slot.uuid), None);
        let other = SlotId::new("vdi", "vdi-2g", 4).uuid;
        assert_eq!(labelled_slot("vdi", Some(&label), &other), None);
        assert_eq!(labelled_slot("vdi", Some("desk-3"), &slot.uuid), None);
        assert_eq!(labelled_slot("vdi", None, &slot.uuid), None);
    }
}
