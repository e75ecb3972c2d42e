//! Wiring the reconcile planner and executor (`daemon::reconcile`) to the host and the store.

use tracing::{info, warn};

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::discover::discover;
use vgpu_host::ops::{self, LifecycleError};

use super::choose::Placement;
use super::instances::Instances;
use super::lock;
use crate::daemon::api::{CoreError, MdevAttr, StateError};
use crate::daemon::reconcile::{
    ExecReport, Plan, ReconcileInput, ReconcileStep, Removal, StepActions, StepFailure, execute,
    execute_steps, plan,
};
use crate::daemon::store::{LedgerEntry, StateDir, unix_now};

/// Which autostart definitions a reconcile may create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileScope {
    /// Daemon start or an explicit request: every autostart definition whose device is missing.
    Startup,
    /// A parent registered (its driver loaded): the autostart definitions on that parent.
    ParentAppeared(String),
    /// Something changed behind our back: refresh views and forget stale ledger entries only.
    Refresh,
}

/// The executor's actions on the real host and store.
struct Actions<'a> {
    core: &'a Instances,
    /// What clients see of a device a command creates (gpu, profile, label), written into its new
    /// ledger entry; reconcile's creates take these from their definitions instead.
    shown: Option<Shown>,
    /// Called with each device's UUID once the kernel created it.
    created: Option<&'a mut dyn FnMut(&MdevUuid)>,
}

/// See [`Actions::shown`].
struct Shown {
    gpu: String,
    profile: Option<String>,
    label: Option<String>,
}

impl Actions<'_> {
    /// `entry` with what clients see filled in.
    fn complete(&self, store: &StateDir, entry: &LedgerEntry) -> LedgerEntry {
        let mut entry = entry.clone();
        if let Some(s) = &self.shown {
            entry.gpu = entry.gpu.or_else(|| Some(s.gpu.clone()));
            entry.profile = entry.profile.or_else(|| s.profile.clone());
            entry.label = entry.label.or_else(|| s.label.clone());
        }
        with_definition(store, &entry)
    }
}

impl StepActions for Actions<'_> {
    type Error = CoreError;

    fn put_ledger(&mut self, entry: &LedgerEntry) -> Result<(), CoreError> {
        let mut store = lock(&self.core.store);
        let entry = self.complete(&store, entry);
        store.put_ledger(&entry).map_err(Into::into)
    }

    fn put_ledgers(&mut self, entries: &[LedgerEntry]) -> Result<(), CoreError> {
        let mut store = lock(&self.core.store);
        let entries: Vec<LedgerEntry> = entries.iter().map(|e| self.complete(&store, e)).collect();
        store.put_ledgers(&entries).map_err(Into::into)
    }

    fn remove_ledger(&mut self, uuid: &MdevUuid) -> Result<(), CoreError> {
        lock(&self.core.store)
            .remove_ledger(uuid)
            .map(|_| ())
            .map_err(Into::into)
    }

    fn create_device(
        &mut self,
        uuid: &MdevUuid,
        parent: &str,
        type_id: &MdevTypeId,
    ) -> Result<(), CoreError> {
        ops::create_mdev(self.core.host.as_ref(), parent, type_id, uuid)?;
        if let Some(created) = &mut self.created {
            created(uuid);
        }
        Ok(())
    }

    fn write_attr(&mut self, uuid: &MdevUuid, attr: &MdevAttr) -> Result<(), CoreError> {
        ops::write_mdev_attr(self.core.host.as_ref(), uuid, attr.name(), attr.value())
            .map_err(Into::into)
    }

    fn remove_device(&mut self, uuid: &MdevUuid, _parent: &str) -> Result<(), CoreError> {
        self.core.remove_mdev_checked(uuid)
    }

    fn device_exists(&mut self, uuid: &MdevUuid) -> Result<bool, CoreError> {
        Ok(self.core.device_exists(uuid))
    }

    fn now(&self) -> u64 {
        unix_now()
    }
}

/// Keeps what clients see (gpu, profile, label) from the definition the entry serves.
fn with_definition(store: &StateDir, entry: &LedgerEntry) -> LedgerEntry {
    let mut entry = entry.clone();
    if let Some(def) = store.get_definition(&entry.uuid) {
        entry.gpu = entry.gpu.or_else(|| Some(def.gpu.clone()));
        entry.profile = entry.profile.or_else(|| def.profile.clone());
        entry.label = entry.label.or_else(|| def.label.clone());
    }
    entry
}

/// Keeps only the creates the scope allows.
fn scoped(mut plan: Plan, scope: &ReconcileScope) -> Plan {
    plan.steps.retain(|s| match (s, scope) {
        (ReconcileStep::Create { .. }, ReconcileScope::Startup) => true,
        (ReconcileStep::Create { parent, .. }, ReconcileScope::ParentAppeared(p)) => parent == p,
        (ReconcileStep::Create { .. }, ReconcileScope::Refresh) => false,
        _ => true,
    });
    plan
}

impl Instances {
    /// Creates the device of `uuid` at `place` through the reconcile executor, so a command's create
    /// follows the same ledger protocol and rollback as reconcile's: the ledger entry is written first;
    /// if the kernel refuses, a device it made anyway is removed and the entry dropped, and the entry
    /// is kept whenever the device may still exist. Then `attrs` are written to the device in order; a
    /// refused one fails the create and the device is removed again. The parent lock must be held.
    pub(super) fn create_device_owned(
        &self,
        uuid: &MdevUuid,
        place: &Placement,
        label: Option<String>,
        attrs: &[MdevAttr],
    ) -> Result<(), CoreError> {
        let step = ReconcileStep::Create {
            uuid: *uuid,
            parent: place.parent.clone(),
            type_id: place.type_id.clone(),
            replaces: None,
            attrs: attrs.to_vec(),
        };
        let shown = Shown {
            gpu: place.gpu.clone(),
            profile: place.profile.clone(),
            label,
        };
        match self.create_ledgered(vec![step], Some(shown), None) {
            Some(f) => Err(f.error),
            None => {
                info!(%uuid, parent = %place.parent, type_id = %place.type_id, "instance created");
                Ok(())
            }
        }
    }

    /// Creates the devices `creates` (`(uuid, type)`, all on `parent`, each with a definition that
    /// says what clients see of it) through the reconcile executor in one run: all their ledger
    /// entries in one batch first, then each device in order, `created(uuid)` called once the kernel
    /// made it. A refused create undoes the whole run (every device it made removed, every entry
    /// dropped); the failure names the index of the create that failed. The parent lock must be held.
    pub(super) fn create_devices_owned(
        &self,
        parent: &str,
        creates: &[(MdevUuid, MdevTypeId)],
        created: &mut dyn FnMut(&MdevUuid),
    ) -> Option<StepFailure> {
        let steps = creates
            .iter()
            .map(|(uuid, type_id)| ReconcileStep::Create {
                uuid: *uuid,
                parent: parent.to_string(),
                type_id: type_id.clone(),
                replaces: None,
                attrs: Vec::new(),
            })
            .collect();
        self.create_ledgered(steps, None, Some(created))
    }

    /// One run of the reconcile executor over the create `steps`; logs what its rollback left.
    fn create_ledgered<'a>(
        &'a self,
        steps: Vec<ReconcileStep>,
        shown: Option<Shown>,
        created: Option<&'a mut dyn FnMut(&MdevUuid)>,
    ) -> Option<StepFailure> {
        let mut actions = Actions {
            core: self,
            shown,
            created,
        };
        let report = execute(&Plan { steps }, &mut actions);
        for e in &report.rollback_errors {
            warn!(step = %e.step, error = %e.error, "undoing a failed create is incomplete; reconcile finishes it");
        }
        report.failure
    }

    /// Removes the mdev `uuid` through the kernel (one already gone is fine) and checks it is gone.
    pub(super) fn remove_mdev_checked(&self, uuid: &MdevUuid) -> Result<(), CoreError> {
        match ops::remove_mdev(self.host.as_ref(), uuid) {
            Ok(()) | Err(LifecycleError::NoSuchInstance { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        if self.device_exists(uuid) {
            return Err(StateError::StillPresent { uuid: *uuid }.into());
        }
        Ok(())
    }

    /// Removes our device of `uuid` on `parent`, then its ledger entry, on the same executor as every
    /// other change. The parent lock must be held.
    pub(super) fn remove_device_owned(
        &self,
        uuid: &MdevUuid,
        parent: &str,
    ) -> Result<(), CoreError> {
        let step = Removal {
            uuid: *uuid,
            parent: parent.to_string(),
        };
        let mut actions = Actions {
            core: self,
            shown: None,
            created: None,
        };
        match execute_steps(&mut actions, [(0, step)]).failure {
            Some(f) => Err(f.error),
            None => {
                info!(%uuid, "instance removed");
                Ok(())
            }
        }
    }

    /// Plans and executes a reconcile with every other operation held off, then refreshes all views.
    pub(super) fn reconcile(&self, scope: ReconcileScope) -> Result<ExecReport, CoreError> {
        let run = self.reconcile_run(scope);
        let ok = matches!(&run, Ok(r) if r.failure.is_none());
        self.metrics.ops().reconcile(ok);
        run
    }

    fn reconcile_run(&self, scope: ReconcileScope) -> Result<ExecReport, CoreError> {
        let report = {
            let _exclusive = self.locks.exclusive();
            let inv = discover(self.host.as_ref())?;
            let input = {
                let mut store = lock(&self.store);
                store.prefer_autostart_alternates(|u| self.device_exists(u));
                ReconcileInput::from_inventory(
                    store.definitions().cloned(),
                    store.ledger().cloned(),
                    &inv,
                )
            };
            let plan = scoped(plan(&input), &scope);
            for step in plan
                .steps
                .iter()
                .filter(|s| !matches!(s, ReconcileStep::Keep { .. }))
            {
                info!(?scope, %step, "reconcile step");
            }
            execute(
                &plan,
                &mut Actions {
                    core: self,
                    shown: None,
                    created: None,
                },
            )
        };
        if let Some(f) = &report.failure {
            warn!(step = %f.step, error = %f.error, rolled_back = report.rolled_back.len(), "reconcile step failed; this run was rolled back");
        }
        for e in &report.rollback_errors {
            warn!(step = %e.step, error = %e.error, "rollback incomplete; the next reconcile sees what is left");
        }
        self.refresh_all();
        if scope == ReconcileScope::Startup {
            self.startup_done
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(report)
    }
}
