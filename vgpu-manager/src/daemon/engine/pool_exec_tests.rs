//! The pool executor against a fake engine: a failure at any change undoes the apply exactly, and
//! undos that fail are each reported.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use proptest::prelude::*;

use super::pool::slot_label;
use super::pool_exec::{
    Applying, MAX_RUN, NewSlot, PoolActions, SlotKinds, SlotRun, SlotSteps, SlotsFailed, run_step,
    runs,
};
use crate::daemon::api::{CoreError, InstanceState, InstanceView, Ownership};
use crate::daemon::exec::{Effects, execute};
use crate::daemon::store::{Definition, VfKind, VfSlotRecord};
use crate::pool::{PoolStep, SlotId};
use crate::profile::ProfileTarget;

const POOL: &str = "vdi";

/// One mdev instance of the fake.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Inst {
    parent: String,
    type_id: MdevTypeId,
    defined: bool,
    running: bool,
    label: Option<String>,
    profile: Option<String>,
}

/// What the fake engine holds, and which of its changes fail.
#[derive(Debug, Clone, Default)]
struct Fake {
    instances: BTreeMap<MdevUuid, Inst>,
    /// VF slots: the record and whether its VF is set up.
    vfs: BTreeMap<MdevUuid, (VfSlotRecord, bool)>,
    num_vfs: BTreeMap<PciAddress, u32>,
    calls: usize,
    fail: BTreeSet<usize>,
    failed: usize,
}

type State = (
    BTreeMap<MdevUuid, Inst>,
    BTreeMap<MdevUuid, (VfSlotRecord, bool)>,
    BTreeMap<PciAddress, u32>,
);

impl Fake {
    fn state(&self) -> State {
        (
            self.instances.clone(),
            self.vfs.clone(),
            self.num_vfs.clone(),
        )
    }

    /// Counts a change; `Err` (and no effect) if it is an injected failure.
    fn call(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        let n = self.calls;
        self.calls += 1;
        if self.fail.contains(&n) {
            self.failed += 1;
            return Err(CoreError::NotFound { uuid: *uuid });
        }
        Ok(())
    }

    fn inst(&mut self, uuid: &MdevUuid) -> Result<&mut Inst, CoreError> {
        self.instances
            .get_mut(uuid)
            .ok_or(CoreError::NotFound { uuid: *uuid })
    }
}

fn ty(s: &str) -> MdevTypeId {
    s.parse().unwrap()
}

/// The UUID the fake's PF-level changes count under (errors need one).
fn pf_uuid() -> MdevUuid {
    SlotId::new(POOL, "pf", 0).uuid
}

fn pf() -> PciAddress {
    "0000:03:00.0".parse().unwrap()
}

fn vf_of(index: u32) -> PciAddress {
    format!("0000:03:00.{}", index + 1).parse().unwrap()
}

fn record(slot: &SlotId) -> VfSlotRecord {
    VfSlotRecord {
        uuid: slot.uuid,
        pool: slot.pool.clone(),
        profile: slot.profile.clone(),
        index: slot.index,
        gpu: pf().to_string(),
        pf: pf(),
        vf: vf_of(slot.index),
        num_vfs: 0,
        holds: VfKind::SriovVf,
        created: None,
    }
}

impl PoolActions for Fake {
    fn vf_record(&self, uuid: &MdevUuid) -> Option<VfSlotRecord> {
        self.vfs.get(uuid).map(|(r, _)| r.clone())
    }

    fn definition(&self, uuid: &MdevUuid) -> Option<Definition> {
        let i = self.instances.get(uuid).filter(|i| i.defined)?;
        Some(Definition {
            uuid: *uuid,
            parent: i.parent.clone(),
            gpu: i.parent.clone(),
            type_id: i.type_id.clone(),
            profile: i.profile.clone(),
            autostart: false,
            label: i.label.clone(),
            created_at: 0,
            attrs: Vec::new(),
        })
    }

    fn instance(&mut self, uuid: &MdevUuid) -> Result<InstanceView, CoreError> {
        let i = self.inst(uuid)?.clone();
        Ok(InstanceView {
            uuid: *uuid,
            gpu: i.parent.clone(),
            parent: i.parent,
            type_id: i.type_id,
            profile: i.profile,
            state: if i.running {
                InstanceState::Running
            } else {
                InstanceState::Stopped
            },
            defined: i.defined,
            autostart: false,
            ownership: Ownership::Daemon,
            label: i.label,
            iommu_group: None,
            created_at: 0,
            attrs: Vec::new(),
        })
    }

    fn enable_vfs(&mut self, _gpu: &str, pf: &PciAddress, num_vfs: u32) -> Result<u32, CoreError> {
        self.call(&pf_uuid())?;
        Ok(self.num_vfs.insert(*pf, num_vfs).unwrap_or(0))
    }

    fn restore_num_vfs(&mut self, pf: &PciAddress, previous: u32) -> Result<(), CoreError> {
        self.call(&pf_uuid())?;
        if previous == 0 {
            self.num_vfs.remove(pf);
        } else {
            self.num_vfs.insert(*pf, previous);
        }
        Ok(())
    }

    fn create_vf(
        &mut self,
        slot: &SlotId,
        _gpu: &str,
        _t: &ProfileTarget,
    ) -> Result<(), CoreError> {
        self.call(&slot.uuid)?;
        assert!(!self.vfs.contains_key(&slot.uuid), "slot made twice");
        self.vfs.insert(slot.uuid, (record(slot), true));
        Ok(())
    }

    fn recreate_vf(&mut self, r: &VfSlotRecord) -> Result<(), CoreError> {
        self.call(&r.uuid)?;
        self.vfs.insert(r.uuid, (r.clone(), true));
        Ok(())
    }

    fn release_vf(&mut self, uuid: &MdevUuid) -> Result<VfSlotRecord, CoreError> {
        self.call(uuid)?;
        self.vfs
            .remove(uuid)
            .map(|(r, _)| r)
            .ok_or(CoreError::NotFound { uuid: *uuid })
    }

    fn stop_vf(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.call(uuid)?;
        let v = self
            .vfs
            .get_mut(uuid)
            .ok_or(CoreError::NotFound { uuid: *uuid })?;
        v.1 = false;
        Ok(())
    }

    fn define(
        &mut self,
        slot: &SlotId,
        parent: &str,
        type_id: &MdevTypeId,
        _autostart: bool,
    ) -> Result<(), CoreError> {
        self.call(&slot.uuid)?;
        assert!(
            !self.instances.contains_key(&slot.uuid),
            "defined over an existing instance"
        );
        self.instances.insert(
            slot.uuid,
            Inst {
                parent: parent.to_string(),
                type_id: type_id.clone(),
                defined: true,
                running: false,
                label: Some(slot_label(slot)),
                profile: Some(slot.profile.clone()),
            },
        );
        Ok(())
    }

    fn start(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.call(uuid)?;
        let i = self.inst(uuid)?;
        assert!(i.defined && !i.running, "start of {i:?}");
        i.running = true;
        Ok(())
    }

    fn create_slots(
        &mut self,
        parent: &str,
        slots: &[NewSlot],
        autostart: bool,
        started: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        for (k, s) in slots.iter().enumerate() {
            if let Err(error) = self.define(&s.slot, parent, &s.type_id, autostart) {
                return Err(SlotsFailed {
                    done: k,
                    at: k,
                    error: Box::new(error),
                });
            }
        }
        for (k, s) in slots.iter().enumerate() {
            if let Err(error) = self.start(&s.slot.uuid) {
                // As the engine's: a failed start leaves none of the run's devices.
                for t in &slots[..k] {
                    self.inst(&t.slot.uuid).unwrap().running = false;
                }
                return Err(SlotsFailed {
                    done: slots.len(),
                    at: k,
                    error: Box::new(error),
                });
            }
            started(k);
        }
        Ok(())
    }

    fn remove_slots(
        &mut self,
        parent: &str,
        uuids: &[MdevUuid],
        removed: &mut dyn FnMut(usize),
    ) -> Result<(), SlotsFailed> {
        for (k, uuid) in uuids.iter().enumerate() {
            let ok = self
                .instances
                .get(uuid)
                .is_some_and(|i| i.running && i.defined && i.parent == parent);
            assert!(ok, "{uuid} is no running slot on {parent}");
            if let Err(error) = self.call(uuid) {
                return Err(SlotsFailed {
                    done: k,
                    at: k,
                    error: Box::new(error),
                });
            }
            self.instances.remove(uuid);
        }
        for k in 0..uuids.len() {
            removed(k);
        }
        Ok(())
    }

    fn stop(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.call(uuid)?;
        self.inst(uuid)?.running = false;
        Ok(())
    }

    fn destroy(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        self.call(uuid)?;
        self.instances
            .remove(uuid)
            .map(|_| ())
            .ok_or(CoreError::NotFound { uuid: *uuid })
    }

    fn restore(&mut self, v: &InstanceView) -> Result<(), CoreError> {
        self.call(&v.uuid)?;
        self.instances.insert(
            v.uuid,
            Inst {
                parent: v.parent.clone(),
                type_id: v.type_id.clone(),
                defined: v.defined,
                running: v.state == InstanceState::Running,
                label: v.label.clone(),
                profile: v.profile.clone(),
            },
        );
        Ok(())
    }
}

/// What a slot is before the apply, and so which step the plan gives it.
#[derive(Debug, Clone, Copy)]
enum Before {
    /// Nothing: defined and started on p1.
    Absent,
    /// Running on p1: removed.
    Running,
    /// Defined and stopped on p1: started.
    Stopped,
    /// Defined and stopped on p2 (this pool's slot): moved to p1.
    Elsewhere,
    /// A VF slot not there yet: made.
    NewVf,
    /// A VF slot set up: released.
    VfUp,
    /// A VF slot recorded, its VF not set up: made again.
    VfDown,
}

fn before() -> impl Strategy<Value = Before> {
    prop_oneof![
        Just(Before::Absent),
        Just(Before::Running),
        Just(Before::Stopped),
        Just(Before::Elsewhere),
        Just(Before::NewVf),
        Just(Before::VfUp),
        Just(Before::VfDown),
    ]
}

fn mdev(parent: &str, defined: bool, running: bool, slot: &SlotId) -> Inst {
    Inst {
        parent: parent.into(),
        type_id: ty("nvidia-1"),
        defined,
        running,
        label: Some(slot_label(slot)),
        profile: Some(slot.profile.clone()),
    }
}

/// The fake before the apply and the apply's steps.
fn scenario(slots: &[Before], enable: bool) -> (Fake, Vec<PoolStep>) {
    let mut fake = Fake::default();
    let mut steps = Vec::new();
    if enable {
        steps.push(PoolStep::EnableVfs {
            gpu: pf().to_string(),
            pf: pf(),
            num_vfs: 8,
        });
    }
    let mdev_target = ProfileTarget::Mdev {
        parent: "p1".into(),
        type_id: ty("nvidia-1"),
        type_name: Some("T".into()),
    };
    let vf_target = ProfileTarget::SriovVf {
        pf: pf(),
        vf: None,
        vf_driver: None,
        num_vfs: 0,
        enable_vfs: false,
    };
    for (i, b) in slots.iter().enumerate() {
        let slot = SlotId::new(POOL, "vdi-2g", u32::try_from(i).unwrap());
        let create = |target: &ProfileTarget| PoolStep::Create {
            slot: slot.clone(),
            gpu: "p1".into(),
            numa_node: None,
            target: target.clone(),
            start: None,
        };
        let remove = PoolStep::Remove {
            slot: slot.clone(),
            gpu: "p1".into(),
            holds: "nvidia-1".into(),
        };
        match b {
            Before::Absent => steps.push(create(&mdev_target)),
            Before::Running => {
                fake.instances
                    .insert(slot.uuid, mdev("p1", true, true, &slot));
                steps.push(remove);
            }
            Before::Stopped => {
                fake.instances
                    .insert(slot.uuid, mdev("p1", true, false, &slot));
                steps.push(create(&mdev_target));
            }
            Before::Elsewhere => {
                fake.instances
                    .insert(slot.uuid, mdev("p2", true, false, &slot));
                steps.push(create(&mdev_target));
            }
            Before::NewVf => steps.push(create(&vf_target)),
            Before::VfUp => {
                fake.vfs.insert(slot.uuid, (record(&slot), true));
                steps.push(remove);
            }
            Before::VfDown => {
                fake.vfs.insert(slot.uuid, (record(&slot), false));
                steps.push(create(&vf_target));
            }
        }
    }
    (fake, steps)
}

/// The executor's steps of an apply of [`POOL`] (no autostart) over `fake`, reporting to `progress`.
fn steps_over<'a>(fake: &'a mut Fake, progress: &'a dyn Fn(usize, &PoolStep)) -> SlotSteps<'a> {
    SlotSteps {
        actions: fake,
        pool: Applying {
            name: POOL,
            autostart: false,
        },
        progress,
        failed_at: None,
    }
}

/// `steps` grouped into runs over the fake's slots, as the engine groups them over its own.
fn runs_of(fake: &Fake, steps: &[PoolStep]) -> Vec<(usize, SlotRun)> {
    runs(
        steps.iter().cloned().enumerate(),
        &SlotKinds {
            named: &|u| fake.instances.contains_key(u),
            removable_on: &|u| {
                fake.instances
                    .get(u)
                    .filter(|i| i.running && i.defined)
                    .map(|i| i.parent.clone())
            },
        },
    )
}

/// Runs `steps` as an apply does; on the first failure rolls back. Returns the failed step's index
/// and the undos that failed.
fn apply(fake: &mut Fake, steps: &[PoolStep]) -> Option<(usize, usize)> {
    let units = runs_of(fake, steps);
    let mut run = steps_over(fake, &|_, _| {});
    let report = execute(&mut run, units);
    let at = run.failed_at.map(|(i, _)| i);
    report
        .failure
        .map(|f| (at.unwrap_or(f.index), report.rollback_errors.len()))
}

proptest! {
    /// Without failures every slot ends as its step says; with one failure at any change, the apply
    /// is undone exactly.
    #[test]
    fn a_failure_at_any_change_undoes_the_apply(
        slots in proptest::collection::vec(before(), 1..7),
        enable in any::<bool>(),
        k in 0usize..40,
    ) {
        let (start, steps) = scenario(&slots, enable);
        let mut fake = start.clone();
        prop_assert_eq!(apply(&mut fake, &steps), None);
        let changes = fake.calls;
        for (i, b) in slots.iter().enumerate() {
            let uuid = SlotId::new(POOL, "vdi-2g", u32::try_from(i).unwrap()).uuid;
            match b {
                Before::Absent | Before::Stopped | Before::Elsewhere => {
                    let inst = &fake.instances[&uuid];
                    prop_assert!(inst.running && inst.defined && inst.parent == "p1", "{:?}", inst);
                    prop_assert_eq!(inst.profile.as_deref(), Some("vdi-2g"));
                }
                Before::Running | Before::VfUp => {
                    prop_assert!(!fake.instances.contains_key(&uuid) && !fake.vfs.contains_key(&uuid));
                }
                Before::NewVf | Before::VfDown => prop_assert!(fake.vfs[&uuid].1),
            }
        }
        // The same apply with change k failing.
        let mut fake = start.clone();
        fake.fail.insert(k);
        let outcome = apply(&mut fake, &steps);
        if k < changes {
            let (_, undo_failures) = outcome.expect("the injected failure stops the apply");
            prop_assert_eq!(undo_failures, 0);
            prop_assert_eq!(fake.state(), start.state());
        } else {
            prop_assert_eq!(outcome, None);
        }
    }

    /// Undos that fail are each reported; the others still run.
    #[test]
    fn failing_undos_are_each_reported(
        slots in proptest::collection::vec(before(), 1..7),
        pick in any::<proptest::sample::Index>(),
        undo_fails in proptest::collection::btree_set(0usize..60, 0..4),
    ) {
        let (start, steps) = scenario(&slots, true);
        let mut probe = start.clone();
        apply(&mut probe, &steps);
        prop_assume!(probe.calls > 0);
        // Any change of the apply fails first.
        let k = pick.index(probe.calls);
        let mut fake = start.clone();
        fake.fail.insert(k);
        // Failures injected after the first one can only hit undos.
        fake.fail.extend(undo_fails.iter().map(|u| k + 1 + u));
        let (_, reported) = apply(&mut fake, &steps).expect("the injected failure stops the apply");
        prop_assert_eq!(reported, fake.failed - 1);
        if reported == 0 {
            prop_assert_eq!(fake.state(), start.state());
        }
    }
}

#[test]
fn a_slot_defined_as_something_else_is_refused_before_any_change() {
    let slot = SlotId::new(POOL, "vdi-2g", 0);
    let mut fake = Fake::default();
    let mut other = mdev("p2", true, false, &slot);
    other.label = Some("desk-3".into());
    fake.instances.insert(slot.uuid, other);
    let start = fake.state();
    let step = PoolStep::Create {
        slot: slot.clone(),
        gpu: "p1".into(),
        numa_node: None,
        target: ProfileTarget::Mdev {
            parent: "p1".into(),
            type_id: ty("nvidia-1"),
            type_name: Some("T".into()),
        },
        start: None,
    };
    let mut undo = Effects::new();
    let e = run_step(
        &mut fake,
        Applying {
            name: POOL,
            autostart: false,
        },
        &step,
        &mut undo,
    )
    .unwrap_err();
    assert_eq!(e.kind(), "State");
    assert!(
        e.to_string().contains("already defined as nvidia-1 on p2"),
        "{e}"
    );
    assert!(undo.is_empty());
    assert_eq!(fake.state(), start);
}

fn mdev_create(index: u32, parent: &str) -> PoolStep {
    PoolStep::Create {
        slot: SlotId::new(POOL, "vdi-2g", index),
        gpu: parent.into(),
        numa_node: None,
        target: ProfileTarget::Mdev {
            parent: parent.into(),
            type_id: ty("nvidia-1"),
            type_name: Some("T".into()),
        },
        start: None,
    }
}

/// The plan indices of each transaction step, and whether it is a run of creates.
fn shape(units: &[(usize, SlotRun)]) -> Vec<(bool, Vec<usize>)> {
    units
        .iter()
        .map(|(i, u)| match u {
            SlotRun::Step(_) => (false, vec![*i]),
            SlotRun::Creates { steps, .. } | SlotRun::Removes { steps, .. } => {
                (true, steps.iter().map(|(i, _)| *i).collect())
            }
        })
        .collect()
}

#[test]
fn fresh_creates_on_one_parent_run_together_and_nothing_else_does() {
    let defined = SlotId::new(POOL, "vdi-2g", 2).uuid;
    let remove = PoolStep::Remove {
        slot: SlotId::new(POOL, "vdi-2g", 9),
        gpu: "p1".into(),
        holds: "nvidia-1".into(),
    };
    let steps = vec![
        remove,
        mdev_create(0, "p1"),
        mdev_create(1, "p1"),
        // Defined already: started (or moved) on its own.
        mdev_create(2, "p1"),
        mdev_create(3, "p1"),
        // Another parent starts another run.
        mdev_create(4, "p2"),
        mdev_create(5, "p2"),
    ];
    let units = runs(
        steps.into_iter().enumerate(),
        &SlotKinds {
            named: &|u| *u == defined,
            removable_on: &|_| None,
        },
    );
    assert_eq!(
        shape(&units),
        vec![
            (false, vec![0]),
            (true, vec![1, 2]),
            (false, vec![3]),
            (true, vec![4]),
            (true, vec![5, 6]),
        ]
    );
    assert_eq!(
        units[4].1.to_string(),
        "create 2 slots on p2 (vdi-2g/4 … vdi-2g/5)"
    );
    // A run of one reads as its step.
    assert_eq!(units[3].1.to_string(), mdev_create(3, "p1").to_string());

    // Runs hold at most MAX_RUN slots.
    let n = u32::try_from(MAX_RUN * 2 + 1).unwrap();
    let nothing = SlotKinds {
        named: &|_| false,
        removable_on: &|_| None,
    };
    let units = runs((0..n).map(|i| mdev_create(i, "p1")).enumerate(), &nothing);
    let sizes: Vec<usize> = shape(&units).iter().map(|(_, s)| s.len()).collect();
    assert_eq!(sizes, vec![MAX_RUN, MAX_RUN, 1]);
}

#[test]
fn a_run_of_creates_reports_each_slot_and_names_the_one_that_failed() {
    let steps: Vec<PoolStep> = (0..5).map(|i| mdev_create(i, "p1")).collect();
    let units = runs(
        steps.iter().cloned().enumerate(),
        &SlotKinds {
            named: &|_| false,
            removable_on: &|_| None,
        },
    );
    assert_eq!(units.len(), 1);

    let mut fake = Fake::default();
    let seen = std::cell::RefCell::new(Vec::new());
    let progress = |i: usize, step: &PoolStep| seen.borrow_mut().push((i, step.to_string()));
    let mut run = steps_over(&mut fake, &progress);
    let report = execute(&mut run, units.clone());
    assert!(report.succeeded());
    assert!(run.failed_at.is_none());
    let expected: Vec<(usize, String)> = steps
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.to_string()))
        .collect();
    assert_eq!(*seen.borrow(), expected);
    assert!(fake.instances.values().all(|i| i.defined && i.running));

    // Five defines, then five starts: the second start fails.
    let mut fake = Fake::default();
    fake.fail.insert(6);
    let start = fake.state();
    let mut run = steps_over(&mut fake, &|_, _| {});
    let report = execute(&mut run, units);
    let (i, step) = run.failed_at.clone().unwrap();
    assert_eq!((i, step), (1, steps[1].clone()));
    let failure = report.failure.unwrap();
    assert_eq!(failure.index, 0);
    assert!(report.rollback_errors.is_empty());
    // Every definition it wrote was destroyed again.
    assert_eq!(report.effects, 5);
    assert_eq!(fake.state(), start);
}

#[test]
fn removes_of_running_slots_on_one_parent_run_together() {
    let mut fake = Fake::default();
    let remove = |i: u32| {
        let slot = SlotId::new(POOL, "vdi-2g", i);
        PoolStep::Remove {
            slot,
            gpu: "p1".into(),
            holds: "nvidia-1".into(),
        }
    };
    for i in 0..4 {
        let slot = SlotId::new(POOL, "vdi-2g", i);
        // Slot 2 is stopped: removed on its own.
        fake.instances
            .insert(slot.uuid, mdev("p1", true, i != 2, &slot));
    }
    let steps: Vec<PoolStep> = (0..4).map(remove).collect();
    let units = runs_of(&fake, &steps);
    assert_eq!(
        shape(&units),
        vec![(true, vec![0, 1]), (false, vec![2]), (true, vec![3])]
    );
    assert_eq!(
        units[0].1.to_string(),
        "remove 2 slots on p1 (vdi-2g/0 … vdi-2g/1)"
    );

    // The second removal fails: the first slot is restored, the error names the second.
    let start = fake.state();
    fake.fail.insert(1);
    let mut run = steps_over(&mut fake, &|_, _| {});
    let report = execute(&mut run, units);
    assert_eq!(run.failed_at.clone().map(|(i, _)| i), Some(1));
    assert!(report.failure.is_some());
    assert_eq!(report.effects, 1);
    assert!(report.rollback_errors.is_empty());
    assert_eq!(fake.state(), start);
}
