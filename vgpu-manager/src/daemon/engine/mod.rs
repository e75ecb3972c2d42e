//! The engine: [`Core`] executes [`Command`]s against the host and the state directory (the routing
//! table is `routes.rs`: one `Handle` impl per command). It knows nothing of D-Bus: transports call
//! [`Core::execute`] and forward [`Core::subscribe`] events. (Named `engine`, not `core`, so that it
//! never shadows the `core` crate.)
//!
//! Semantics (close to mdevctl's, so libvirt users find what they know):
//! * `Create` makes a transient instance now (ledger entry first, then the kernel's `create`).
//! * `Define` persists a definition without starting it; `Start`/`Stop` create/remove its device.
//! * `Destroy` removes the device and the definition: the instance is gone.
//! * `Undefine` deletes the definition; a running device stays, as a transient instance.
//! * `autostart` definitions are created by reconcile: when the daemon starts and when their parent
//!   appears (its driver loaded late). A `Stop` is respected until then.
//! * Devices not in the ownership ledger are foreign: listed, never modified by an automatic action;
//!   a `Stop` or `Destroy` that names one adopts it into the ledger first, then acts (`foreign.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::broadcast;
use tracing::{error, info, warn};

use vgpu_host::Host;

use super::api::{Command, CoreError, Event, Handle};
use super::mdevctl_dir::MdevctlDir;
use super::store::StateDir;
use crate::profile::Catalog;

mod choose;
mod definitions;
mod event_bus;
mod foreign;
mod gpu_impact;
mod health;
mod incoming;
mod instances;
mod lifecycle;
mod locks;
mod mdev_event;
mod metrics_source;
pub(crate) mod persist;
mod pool;
mod pool_create;
mod pool_exec;
#[cfg(test)]
mod pool_exec_tests;
mod pool_record;
mod pool_remove;
mod pool_shrink;
mod pool_stop;
mod reconcile;
mod routes;
mod sched;
mod startup;
mod vf_make;
mod vf_slots;
mod vfio;
mod views;

pub use gpu_impact::GpuImpact;
pub use pool_stop::FinishedApply;
pub use reconcile::ReconcileScope;
pub use startup::{STARTUP_RETRY_FIRST, STARTUP_RETRY_MAX, StartupRetry, next_retry_delay};

use instances::Instances;
use pool::Pools;
use sched::Scheduling;
use vf_slots::VfSlots;
use vfio::Vfio;

/// The state directory (and mdevctl's definition directory beside it), shared by the services that
/// keep records in it (one lock: the store is one directory with one flock).
type Store = Mutex<persist::Persist>;

/// The daemon's core: the services, each holding only what it needs, behind one command entry
/// ([`Core::execute`]; `routes.rs` says which service serves each command).
///
/// * `Instances`: the lifecycle commands, placement, reconcile and instance views; owns the
///   per-parent locks and the event stream.
/// * `VfSlots`: pool slots held by SR-IOV VFs, made through the GPU's vendor backend.
/// * `Pools`: plan, apply (over instances and VF slots) and status of pools.
/// * `Scheduling`: time-slice scheduling through the vendor backends.
/// * `Vfio`: preflight and opening running instances for a VMM.
///
/// Thread-safe: every method takes `&self`.
pub struct Core {
    instances: Arc<Instances>,
    vf_slots: Arc<VfSlots>,
    pools: Pools,
    scheduling: Scheduling,
    vfio: Vfio,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("host", &self.instances.host.describe())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Core {
    /// Opens the state directory (locking it), then reconciles the host with it (startup scope:
    /// autostart definitions are created where their parent exists, then VF slots of autostart
    /// pools are made again).
    pub fn open(
        host: Arc<dyn Host>,
        state_dir: &Path,
        catalog: Catalog,
    ) -> Result<Core, CoreError> {
        Core::open_with(host, state_dir, catalog, None)
    }

    /// [`Core::open`], keeping a file in mdevctl's definition directory `mdevctl_dir` for every
    /// definition and listing the foreign ones found there (see [`crate::daemon::mdevctl_dir`]).
    /// The directory is reconciled with the store before the host is.
    pub fn open_with(
        host: Arc<dyn Host>,
        state_dir: &Path,
        catalog: Catalog,
        mdevctl_dir: Option<MdevctlDir>,
    ) -> Result<Core, CoreError> {
        let (store, report) = StateDir::open(state_dir)?;
        for aside in &report.set_aside {
            warn!(file = %aside.file.display(), moved_to = %aside.moved_to.display(), reason = %aside.reason, "state file set aside");
        }
        info!(
            state_dir = %state_dir.display(),
            definitions = report.definitions,
            ledger = report.ledger_entries,
            host = %host.describe(),
            "state loaded"
        );
        if let Some(dir) = &mdevctl_dir {
            info!(mdevctl_dir = %dir.path().display(), "definitions kept in mdevctl's directory too");
        }
        let mut store = persist::Persist::new(store, mdevctl_dir);
        store.reconcile_files(true);
        let events = Arc::new(event_bus::EventBus::new());
        let store = Arc::new(Mutex::new(store));
        let catalog = Arc::new(catalog);
        let instances = Arc::new(Instances::new(
            host.clone(),
            catalog.clone(),
            store.clone(),
            Arc::clone(&events),
        ));
        let vf_slots = Arc::new(VfSlots::new(host.clone(), store.clone()));
        let pools = Pools::new(
            host.clone(),
            catalog,
            store,
            events,
            instances.clone(),
            vf_slots.clone(),
        );
        let core = Core {
            scheduling: Scheduling::new(host.clone()),
            vfio: Vfio::new(host, instances.clone()),
            instances,
            vf_slots,
            pools,
        };
        incoming::spawn_reaper(Arc::downgrade(&core.instances));
        match core.instances.reconcile(ReconcileScope::Startup) {
            Ok(_) => {}
            // The hardware is not a reason not to serve: the state directory is usable, and the host is
            // read again on every request and uevent.
            Err(CoreError::Host(e)) => {
                error!(error = %e, "cannot read the host at startup: serving anyway; the startup reconcile (autostart instances) is owed and retried on every kernel event and with a back-off (Core::retry_startup) until the host reads")
            }
            Err(e) => return Err(e),
        }
        core.vf_slots.reconcile(|pool| core.pools.autostart(pool));
        Ok(core)
    }

    /// A number that changes after every change of the instance views, so a cache of something derived
    /// from [`ListInstances`](crate::daemon::api::ListInstances) can tell it is still current: a reply obtained *after* reading
    /// generation `g` is at least as new as every change before `g`, and while the generation still
    /// reads `g`, no change has happened since.
    pub fn views_generation(&self) -> u64 {
        self.instances
            .views_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Events for signals and property updates. Slow receivers lose the oldest events (and should then
    /// re-list).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.instances.events.subscribe().0
    }

    /// [`Core::subscribe`], with the number of events sent before the receiver's first: together
    /// with [`Core::events_sent`], a subscriber that counts the events it handled knows when it has
    /// caught up.
    pub fn subscribe_counted(&self) -> (broadcast::Receiver<Event>, u64) {
        self.instances.events.subscribe()
    }

    /// How many events have been sent so far.
    pub fn events_sent(&self) -> u64 {
        self.instances.events.sent()
    }

    /// Executes one command (the same as [`Handle::handle`], callable without naming the trait).
    pub fn execute<C: Command>(&self, cmd: C) -> Result<C::Reply, CoreError>
    where
        Self: Handle<C>,
    {
        self.handle(cmd)
    }

    /// Handles a kernel uevent. An mdev event refreshes that instance (one removed behind our back is
    /// noticed); anything else re-reads the registered parents, and a parent that appeared (its driver
    /// loaded late) gets its autostart instances. Returns whether every GPU must be re-read, beyond
    /// the instance events sent ([`GpuImpact`]).
    ///
    /// While the startup reconcile is owed (the host could not be read at start), any event retries
    /// it first ([`Core::retry_startup`]).
    pub fn handle_uevent(&self, ev: &vgpu_host::uevent::Uevent) -> GpuImpact {
        self.instances.health.note_uevent(ev);
        if let Some(impact) = self.uevent_retries_startup() {
            return impact;
        }
        self.instances.handle_uevent(ev)
    }

    /// Reconciles mdevctl's definition directory with vgpud's definitions after it changed (an edit
    /// of an own definition's file is taken in, a removed one written again; see
    /// [`crate::daemon::mdevctl_dir`]) and refreshes the instances whose definition changed.
    pub fn mdevctl_dir_changed(&self) {
        self.instances.mdevctl_dir_changed();
    }

    /// The mdevctl definition directory vgpud keeps, if any.
    pub fn mdevctl_dir(&self) -> Option<MdevctlDir> {
        lock(&self.instances.store).mdevctl_dir().cloned()
    }

    /// Plans and executes a reconcile of the instances (see [`ReconcileScope`]).
    pub fn reconcile(
        &self,
        scope: ReconcileScope,
    ) -> Result<crate::daemon::reconcile::ExecReport, CoreError> {
        self.instances.reconcile(scope)
    }
}
