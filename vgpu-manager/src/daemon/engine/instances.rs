//! Instances: the lifecycle commands, placement, reconcile and the views clients see of every mdev
//! instance ([`Instances`]). It owns the per-parent locks, the view cache and the event stream; the
//! other services reach instances only through it.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use tracing::{info, warn};

use mdev_types::fault::FaultScope;
use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use vgpu_host::discover::{discover, discover_without_groups};
use vgpu_host::{Host, HostExt, paths};

use super::{GpuImpact, ReconcileScope, Store, gpu_impact, lock, locks, mdev_event};
use crate::daemon::api::{CoreError, GpuCapacity, GpuView, InstanceState, InstanceView};
use crate::profile::Catalog;

/// The instance service. Thread-safe: every method takes `&self`; operations on one mdev parent are
/// serialized, different parents proceed in parallel.
pub(super) struct Instances {
    pub(super) host: Arc<dyn Host>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) store: Arc<Store>,
    pub(super) locks: locks::Locks,
    /// UUIDs with a create/define in flight, so two requests for one UUID cannot race.
    pub(super) inflight: Mutex<HashSet<MdevUuid>>,
    /// Incoming migration targets between their record and their device (see `incoming.rs`): the
    /// reaper leaves their records alone.
    pub(super) incoming_making: Mutex<HashSet<MdevUuid>>,
    /// The current view of every instance, kept up to date by our own operations and refreshes.
    pub(super) views: Mutex<BTreeMap<MdevUuid, InstanceView>>,
    /// The registered mdev parents as last seen, to notice one that appears.
    known_parents: Mutex<BTreeSet<String>>,
    pub(super) events: Arc<super::event_bus::EventBus>,
    /// Bumped after every change of `views` (see [`super::Core::views_generation`]).
    pub(super) views_generation: std::sync::atomic::AtomicU64,
    /// The instance events held back per thread (see [`Instances::hold_events`]).
    pub(super) held: Mutex<super::views::HeldEvents>,
    /// Whether a startup-scope reconcile has succeeded (see [`super::Core::startup_owed`]).
    pub(super) startup_done: std::sync::atomic::AtomicBool,
    /// Operation records and the metrics snapshot (`metrics_source.rs`).
    pub(super) metrics: Arc<crate::daemon::metrics::Registry>,
    /// The GPUs a create found readable, and when (`health.rs`).
    pub(super) health: super::health::HealthMemo,
    /// Which mdev parents are SR-IOV VFs, for what a kernel event means to the GPU objects.
    parent_kinds: gpu_impact::ParentKinds,
}

impl Instances {
    /// The service over `host` and `store`, with no views yet (the first reconcile computes them).
    pub(super) fn new(
        host: Arc<dyn Host>,
        catalog: Arc<Catalog>,
        store: Arc<Store>,
        events: Arc<super::event_bus::EventBus>,
    ) -> Instances {
        let i = Instances {
            host,
            catalog,
            store,
            locks: locks::Locks::default(),
            inflight: Mutex::new(HashSet::new()),
            incoming_making: Mutex::new(HashSet::new()),
            views: Mutex::new(BTreeMap::new()),
            known_parents: Mutex::new(BTreeSet::new()),
            events,
            views_generation: std::sync::atomic::AtomicU64::new(0),
            held: Mutex::default(),
            startup_done: std::sync::atomic::AtomicBool::new(false),
            metrics: Arc::default(),
            health: super::health::HealthMemo::default(),
            parent_kinds: gpu_impact::ParentKinds::default(),
        };
        *lock(&i.known_parents) = i.parents_now();
        i
    }

    /// Every instance as clients see it.
    pub(super) fn list(&self) -> Vec<InstanceView> {
        lock(&self.views).values().cloned().collect()
    }

    /// Instance `uuid` as clients see it, or NotFound.
    pub(super) fn get(&self, uuid: &MdevUuid) -> Result<InstanceView, CoreError> {
        lock(&self.views)
            .get(uuid)
            .cloned()
            .ok_or(CoreError::NotFound { uuid: *uuid })
    }

    /// Handles a kernel uevent. An mdev event refreshes that instance (one removed behind our back is
    /// noticed); anything else re-reads the registered parents, and a parent that appeared (its driver
    /// loaded late) gets its autostart instances. Ordering makes this race-free: the kernel sends a PCI
    /// device's `bind` and a module's `add` only after the probe or init that registered the parent.
    /// Returns whether every GPU must be re-read, beyond the instance events sent ([`GpuImpact`]).
    pub(super) fn handle_uevent(&self, ev: &vgpu_host::uevent::Uevent) -> GpuImpact {
        self.metrics.ops().uevent();
        let impact = self.parent_kinds.impact(self.host.as_ref(), ev);
        if !ev.is_relevant() {
            return impact;
        }
        if ev.subsystem.as_deref() == Some("mdev") {
            if let Some(uuid) = ev.devpath.rsplit('/').next().and_then(|u| u.parse().ok()) {
                let parent = ev.devpath.rsplit('/').nth(1).filter(|p| !p.is_empty());
                // The event of a command's own write: that command read the device back already.
                let agrees = || {
                    parent.is_some_and(|p| {
                        mdev_event::view_agrees(lock(&self.views).get(&uuid), &ev.action, p)
                    })
                };
                if agrees() {
                    return impact;
                }
                if matches!(ev.action.as_str(), "add" | "bind") {
                    // A command making this UUID holds its parent's lock from its write to `create`
                    // until it has read the device back: the event is most likely that write's,
                    // and the lock is the wait for it (no polling for the links meanwhile).
                    let making = lock(&self.inflight).contains(&uuid);
                    if let Some(p) = parent
                        && making
                        && self.locks.with_parent(p, agrees)
                    {
                        return impact;
                    }
                    // The kernel sends both while it makes the device, before its links (see
                    // `mdev_event::wait_for_links`); a command's own write is done waiting once it has
                    // read the device back.
                    mdev_event::wait_for_links(self.host.as_ref(), &uuid, &agrees);
                }
                // Under the parent's lock (the device's directory sits in its parent's): a command
                // whose own sysfs write sent this event finishes first, so the refresh sees its
                // result, and a state in between (a slot being destroyed: its device gone, its
                // definition not yet) is never announced.
                match parent {
                    Some(parent) => {
                        self.locks.with_parent(parent, || {
                            if !agrees() {
                                self.refresh_one(&uuid);
                            }
                        });
                    }
                    None => {
                        self.refresh_one(&uuid);
                    }
                }
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

    /// The devices discovery cannot read now (a fresh read of the host).
    pub(super) fn list_faults(&self) -> Result<Vec<mdev_types::fault::DeviceFault>, CoreError> {
        Ok(discover(self.host.as_ref())?.faults)
    }

    /// [`ListOffers`](crate::daemon::api::ListOffers): one discovery, matched against the catalog;
    /// `held_vfs` are the VFs pool slots hold.
    pub(super) fn offers(
        &self,
        held_vfs: &[mdev_types::ids::PciAddress],
    ) -> Result<Vec<vgpu_client::GpuOffers>, CoreError> {
        let inv = discover_without_groups(self.host.as_ref())?;
        Ok(crate::profile::offers::host_offers(
            &self.catalog,
            &inv,
            held_vfs,
            |id| health(inv.fault_of(id)),
        ))
    }

    pub(super) fn list_gpus(&self) -> Result<Vec<GpuView>, CoreError> {
        let inv = discover_without_groups(self.host.as_ref())?;
        let views = lock(&self.views);
        let running_on = |id: &str| -> Vec<MdevUuid> {
            views
                .values()
                .filter(|v| v.gpu == id && v.state == InstanceState::Running)
                .map(|v| v.uuid)
                .collect()
        };
        // A GPU whose PCI function could not be read is not among `inv.gpus`: it is listed from its
        // fault, so that its object stays and says why it is not used.
        let unread = inv
            .faults
            .iter()
            .filter(|f| matches!(f.scope, FaultScope::PciDevice | FaultScope::MdevParent))
            .filter(|f| !inv.gpus.iter().any(|g| g.id == f.device))
            .filter(|f| {
                f.scope == FaultScope::PciDevice
                    || inv.mdev_parents.iter().all(|p| p.name != f.device)
            })
            .map(|f| GpuView {
                id: f.device.clone(),
                vendor: "unknown".to_string(),
                model: format!("unreadable {}", f.scope.as_str()),
                driver: None,
                numa_node: None,
                types: Vec::new(),
                instances: running_on(&f.device),
                health: health(Some(f)),
            });
        let mut out: Vec<GpuView> = inv
            .gpus
            .iter()
            .map(|g| {
                // Each type's instances left, summed over the VFs when they are the parents.
                let types = inv
                    .gpu_mdev_parent(g)
                    .map(|p| {
                        p.types
                            .into_iter()
                            .map(|t| (t.id, t.available_instances))
                            .collect()
                    })
                    .unwrap_or_default();
                GpuView {
                    id: g.id.clone(),
                    vendor: g.vendor.as_str().to_string(),
                    model: g.model.clone(),
                    driver: g.driver.clone(),
                    numa_node: g.numa_node,
                    types,
                    instances: running_on(&g.id),
                    health: health(inv.fault_of(&g.id)),
                }
            })
            .collect();
        out.extend(unread);
        Ok(out)
    }

    /// The types' available instances on mdev parent `id` (none when it is not a registered parent, as
    /// in [`Instances::list_gpus`]) and its running instances.
    pub(super) fn gpu_capacity(&self, id: &str) -> GpuCapacity {
        // A GPU whose VFs are its parents: each type's instances left summed over the VFs.
        let parents = match self.parent_exists(id) {
            true => vec![id.to_string()],
            false => self.vf_parents(id),
        };
        let mut types: Vec<(MdevTypeId, u32)> = Vec::new();
        for parent in &parents {
            let dir = paths::mdev_parent(parent).join("mdev_supported_types");
            for name in self.host.list_optional(&dir).unwrap_or_default() {
                let Ok(type_id) = name.parse::<MdevTypeId>() else {
                    continue;
                };
                let Some(available) = self.available(parent, &type_id) else {
                    continue;
                };
                match types.iter_mut().find(|(t, _)| *t == type_id) {
                    Some((_, n)) => *n = n.saturating_add(available),
                    None => types.push((type_id, available)),
                }
            }
        }
        let instances = lock(&self.views)
            .values()
            .filter(|v| v.gpu == id && v.state == InstanceState::Running)
            .map(|v| v.uuid)
            .collect();
        GpuCapacity { types, instances }
    }

    /// True when the mdev device exists on the host.
    pub(super) fn device_exists(&self, uuid: &MdevUuid) -> bool {
        self.host.exists(&paths::mdev_device(uuid))
    }

    /// The GPU mdev parent `parent` makes vGPUs of, as clients see it: the physical function when the
    /// parent is an SR-IOV VF (`physfn` link: NVIDIA classic vGPU on Ampere and later), else the
    /// parent itself.
    pub(super) fn gpu_of_parent(&self, parent: &str) -> String {
        parent
            .parse::<PciAddress>()
            .ok()
            .and_then(|a| {
                self.host
                    .link_name(&paths::pci_device(&a).join("physfn"))
                    .ok()
                    .flatten()
            })
            .filter(|pf| pf.parse::<PciAddress>().is_ok())
            .unwrap_or_else(|| parent.to_string())
    }

    /// The registered mdev parents on the SR-IOV VFs of `gpu`, in VF order (`virtfnN` links); empty
    /// when `gpu` is no PCI function or its VFs are no parents.
    pub(super) fn vf_parents(&self, gpu: &str) -> Vec<String> {
        let Ok(pf) = gpu.parse::<PciAddress>() else {
            return Vec::new();
        };
        let dir = paths::pci_device(&pf);
        let mut vfs: Vec<(u32, String)> = self
            .host
            .list_optional(&dir)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|name| {
                let index = name.strip_prefix("virtfn")?.parse().ok()?;
                let vf = self.host.link_name(&dir.join(&name)).ok().flatten()?;
                Some((index, vf))
            })
            .filter(|(_, vf)| self.parent_exists(vf))
            .collect();
        vfs.sort();
        vfs.into_iter().map(|(_, vf)| vf).collect()
    }

    /// The first of `gpu`'s VF parents that can take an instance of `type_id` now.
    pub(super) fn free_vf_parent(&self, gpu: &str, type_id: &MdevTypeId) -> Option<String> {
        self.vf_parents(gpu)
            .into_iter()
            .find(|vf| self.available(vf, type_id).is_some_and(|n| n > 0))
    }

    /// True when the parent is registered.
    pub(super) fn parent_exists(&self, parent: &str) -> bool {
        self.host.exists(&paths::mdev_parent(parent))
    }

    pub(super) fn read_group(&self, uuid: &MdevUuid) -> Option<u32> {
        self.host
            .link_name(&paths::mdev_device(uuid).join("iommu_group"))
            .ok()
            .flatten()
            .and_then(|g| g.parse().ok())
    }
}

/// The `Health` of a GPU: `ok`, or `faulted: ` and its fault.
fn health(fault: Option<&mdev_types::fault::DeviceFault>) -> String {
    match fault {
        None => "ok".to_string(),
        Some(f) => format!("faulted: {f}"),
    }
}
