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
//! * Devices not in the ownership ledger are foreign: listed, never modified.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::broadcast;
use tracing::{info, warn};

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::discover::discover;
use vgpu_host::{Host, HostExt, paths};

use super::api::{
    Command, CoreError, Event, GpuCapacity, GpuView, Handle, InstanceState, InstanceView,
};
use super::store::StateDir;
use crate::profile::Catalog;

mod choose;
mod gpu_impact;
mod lifecycle;
mod locks;
mod pool;
mod pool_exec;
#[cfg(test)]
mod pool_exec_tests;
mod pool_record;
mod reconcile;
mod routes;
mod sched;
mod vf_make;
mod vf_slots;
mod vfio;
mod views;

pub use gpu_impact::GpuImpact;
pub use reconcile::ReconcileScope;

/// The daemon's core. Thread-safe: every method takes `&self`; operations on one mdev parent are
/// serialized, different parents proceed in parallel.
pub struct Core {
    host: Arc<dyn Host>,
    catalog: Catalog,
    store: Mutex<StateDir>,
    locks: locks::Locks,
    /// UUIDs with a create/define in flight, so two requests for one UUID cannot race.
    inflight: Mutex<HashSet<MdevUuid>>,
    /// The current view of every instance, kept up to date by our own operations and refreshes.
    views: Mutex<BTreeMap<MdevUuid, InstanceView>>,
    /// The registered mdev parents as last seen, to notice one that appears.
    known_parents: Mutex<BTreeSet<String>>,
    events: broadcast::Sender<Event>,
    /// Bumped after every change of `views` (see [`Core::views_generation`]).
    views_generation: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("host", &self.host.describe())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Core {
    /// Opens the state directory (locking it), then reconciles the host with it (startup scope:
    /// autostart definitions are created where their parent exists).
    pub fn open(
        host: Arc<dyn Host>,
        state_dir: &Path,
        catalog: Catalog,
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
        let (events, _) = broadcast::channel(4096);
        let core = Core {
            host,
            catalog,
            store: Mutex::new(store),
            locks: locks::Locks::default(),
            inflight: Mutex::new(HashSet::new()),
            views: Mutex::new(BTreeMap::new()),
            known_parents: Mutex::new(BTreeSet::new()),
            events,
            views_generation: std::sync::atomic::AtomicU64::new(0),
        };
        *lock(&core.known_parents) = core.parents_now();
        core.reconcile(ReconcileScope::Startup)?;
        core.reconcile_vf_slots();
        Ok(core)
    }

    /// A number that changes after every change of the instance views, so a cache of something derived
    /// from [`ListInstances`](crate::daemon::api::ListInstances) can tell it is still current: a reply obtained *after* reading
    /// generation `g` is at least as new as every change before `g`, and while the generation still
    /// reads `g`, no change has happened since.
    pub fn views_generation(&self) -> u64 {
        self.views_generation
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Events for signals and property updates. Slow receivers lose the oldest events (and should then
    /// re-list).
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
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
    /// loaded late) gets its autostart instances. Ordering makes this race-free: the kernel sends a PCI
    /// device's `bind` and a module's `add` only after the probe or init that registered the parent.
    /// Returns whether every GPU must be re-read, beyond the instance events sent ([`GpuImpact`]).
    pub fn handle_uevent(&self, ev: &vgpu_host::uevent::Uevent) -> GpuImpact {
        let impact = gpu_impact::gpu_impact(self.host.as_ref(), ev);
        if !ev.is_relevant() {
            return impact;
        }
        if ev.subsystem.as_deref() == Some("mdev") {
            if let Some(uuid) = ev.devpath.rsplit('/').next().and_then(|u| u.parse().ok()) {
                if matches!(ev.action.as_str(), "add" | "bind") {
                    self.wait_for_mdev_links(&uuid);
                }
                self.refresh_one(&uuid);
            }
            return impact;
        }
        let now = self.parents_now();
        let appeared: Vec<String> = {
            let mut known = lock(&self.known_parents);
            let new = now.difference(&known).cloned().collect();
            *known = now;
            new
        };
        let scopes: Vec<ReconcileScope> = if appeared.is_empty() {
            vec![ReconcileScope::Refresh]
        } else {
            appeared
                .into_iter()
                .map(ReconcileScope::ParentAppeared)
                .collect()
        };
        for scope in scopes {
            info!(?scope, action = %ev.action, devpath = %ev.devpath, "reconcile after a kernel event");
            if let Err(e) = self.reconcile(scope) {
                warn!(error = %e, devpath = %ev.devpath, "reconcile after a kernel event failed");
            }
        }
        impact
    }

    /// The names under `/sys/class/mdev_bus` now.
    fn parents_now(&self) -> BTreeSet<String> {
        self.host
            .list_optional(std::path::Path::new(paths::MDEV_BUS_CLASS))
            .unwrap_or_default()
            .into_iter()
            .collect()
    }

    fn list_gpus(&self) -> Result<Vec<GpuView>, CoreError> {
        let inv = discover(self.host.as_ref())?;
        let views = lock(&self.views);
        Ok(inv
            .gpus
            .iter()
            .map(|g| {
                let parent = inv.mdev_parents.iter().find(|p| p.name == g.id);
                GpuView {
                    id: g.id.clone(),
                    vendor: g.vendor.as_str().to_string(),
                    model: g.model.clone(),
                    driver: g.driver.clone(),
                    numa_node: g.numa_node,
                    types: parent
                        .map(|p| {
                            p.types
                                .iter()
                                .map(|t| (t.id.clone(), t.available_instances))
                                .collect()
                        })
                        .unwrap_or_default(),
                    instances: views
                        .values()
                        .filter(|v| v.gpu == g.id && v.state == InstanceState::Running)
                        .map(|v| v.uuid)
                        .collect(),
                }
            })
            .collect())
    }

    /// The types' available instances on mdev parent `id` (none when it is not a registered parent, as
    /// in [`Core::list_gpus`]) and its running instances.
    fn gpu_capacity(&self, id: &str) -> GpuCapacity {
        let dir = paths::mdev_parent(id).join("mdev_supported_types");
        let types = self
            .host
            .list_optional(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|name| {
                let type_id: MdevTypeId = name.parse().ok()?;
                let available = self.available(id, &type_id)?;
                Some((type_id, available))
            })
            .collect();
        let instances = lock(&self.views)
            .values()
            .filter(|v| v.gpu == id && v.state == InstanceState::Running)
            .map(|v| v.uuid)
            .collect();
        GpuCapacity { types, instances }
    }

    /// Waits (briefly) until a new mdev's `mdev_type` link exists. The kernel announces the device
    /// (`add`, then `bind` when vfio-mdev probes it) from `device_add` and only afterwards creates its
    /// `mdev_type` link and `remove` file (drivers/vfio/mdev/mdev_core.c `mdev_device_create` →
    /// `mdev_create_sysfs_files`), so a view computed at the event could miss the device for good.
    /// Gives up after about a second (the device may be gone again), leaving it to the refresh.
    fn wait_for_mdev_links(&self, uuid: &MdevUuid) {
        let dir = paths::mdev_device(uuid);
        let mut pause = std::time::Duration::from_millis(1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        while self.host.exists(&dir)
            && !self.host.exists(&dir.join("mdev_type"))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(pause);
            pause = (pause * 2).min(std::time::Duration::from_millis(50));
        }
    }

    /// True when the mdev device exists on the host.
    fn device_exists(&self, uuid: &MdevUuid) -> bool {
        self.host.exists(&paths::mdev_device(uuid))
    }

    /// True when the parent is registered.
    fn parent_exists(&self, parent: &str) -> bool {
        self.host.exists(&paths::mdev_parent(parent))
    }

    fn read_group(&self, uuid: &MdevUuid) -> Option<u32> {
        self.host
            .link_name(&paths::mdev_device(uuid).join("iommu_group"))
            .ok()
            .flatten()
            .and_then(|g| g.parse().ok())
    }
}
