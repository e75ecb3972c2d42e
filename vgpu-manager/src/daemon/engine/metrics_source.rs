//! The engine's side of the metrics ([`crate::daemon::metrics`]): the snapshot of the host families,
//! built from the instance views, one discovery, the pools' status, the vendor backends and the
//! placement model when something changed; and the operation records of `routes.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use mdev_types::ids::PciAddress;
use mdev_types::model::Inventory;
use tracing::debug;
use vgpu_host::discover::discover;

use super::Core;
use crate::daemon::api::{
    Access, Command, CoreError, GetPoolStatus, GpuView, Handle, InstanceView,
};
use crate::daemon::metrics::snapshot::{
    GpuRow, InstanceRow, PoolRow, ShareRow, Snapshot, TypeRow, VfCounts,
};
use crate::daemon::metrics::{Format, Freshness, Registry, ops};
use crate::placement::convert::{DemandInput, HostUse, build};
use crate::placement::{Policy, plan};
use crate::profile::match_profile;

/// The most instances of one profile the capacity count asks the planner to place on one GPU.
const MAX_COUNTED: u32 = 1024;

impl Core {
    /// The engine's metrics: its operation records and its last host snapshot.
    pub fn metrics(&self) -> &Arc<Registry> {
        &self.instances.metrics
    }

    /// The exposition of every metric family in `format`, from a snapshot as fresh as `freshness`
    /// asks (the host is read only when the views changed since the last one, or it is old).
    pub fn metrics_text(&self, format: Format, freshness: Freshness) -> String {
        let registry = self.metrics();
        let key = (self.views_generation(), registry.ops().epoch());
        let snapshot = registry.snapshot(key, freshness, || self.build_snapshot());
        registry.render(format, &snapshot)
    }

    /// Records one command that ran (changes and device opens only: reads are not operations).
    pub(super) fn record<C: Command, T>(&self, started: Instant, result: &Result<T, CoreError>) {
        if !matches!(C::ACCESS, Access::Change | Access::Device) {
            return;
        }
        let outcome = match result {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        self.metrics().ops().operation(
            ops::op_label(std::any::type_name::<C>()),
            outcome,
            started.elapsed(),
            C::ACCESS.is_change(),
        );
    }

    /// Reads everything the host families show. What cannot be read is left out (and logged at
    /// debug level): a scrape never fails for it.
    fn build_snapshot(&self) -> Snapshot {
        let host = self.instances.host.as_ref();
        let views = self.instances.list();
        let pools = self.handle(GetPoolStatus).unwrap_or_else(|e| {
            debug!(error = %e, "metrics: pool status not read");
            Vec::new()
        });
        let gpus = self.instances.list_gpus().unwrap_or_default();
        let inv = match discover(host) {
            Ok(inv) => Some(inv),
            Err(e) => {
                debug!(error = %e, "metrics: host not read");
                None
            }
        };
        // Which pool each slot UUID belongs to, and the VFs slots hold, per GPU.
        let mut pool_of: BTreeMap<&str, &str> = BTreeMap::new();
        let mut held_vfs: BTreeMap<&str, u32> = BTreeMap::new();
        let mut claimed: Vec<PciAddress> = Vec::new();
        for p in &pools {
            for s in &p.slots {
                pool_of.insert(&s.uuid, &p.pool);
                if let Some(vf) = &s.vf {
                    if let Some(g) = &s.gpu {
                        *held_vfs.entry(g.as_str()).or_default() += 1;
                    }
                    claimed.extend(vf.parse::<PciAddress>().ok());
                }
            }
        }
        let gpu_rows = match &inv {
            Some(inv) => gpu_rows(self, inv, &gpus, &held_vfs, &claimed),
            None => Vec::new(),
        };
        Snapshot {
            gpus: gpu_rows,
            instances: views.iter().map(|v| instance_row(v, &pool_of)).collect(),
            pools: pools
                .iter()
                .map(|p| {
                    let mut slots = BTreeMap::new();
                    for s in &p.slots {
                        *slots.entry(s.state.clone()).or_insert(0) += 1;
                    }
                    PoolRow {
                        name: p.pool.clone(),
                        wanted: p.wanted.values().sum(),
                        slots,
                    }
                })
                .collect(),
        }
    }
}

/// The GPU rows: the GPUs' views, with what discovery, the backends and the planner add.
fn gpu_rows(
    core: &Core,
    inv: &Inventory,
    gpus: &[GpuView],
    held_vfs: &BTreeMap<&str, u32>,
    claimed: &[PciAddress],
) -> Vec<GpuRow> {
    let host = core.instances.host.as_ref();
    let backends = crate::backend::detect(host, inv).unwrap_or_default();
    let capacity = profile_capacity(core, inv, claimed);
    gpus.iter()
        .map(|g| {
            let disc = inv.gpus.iter().find(|x| x.id == g.id);
            // The GPU's own parent, or its VFs' parents (one vGPU each), counted per type.
            let types: Vec<TypeRow> = disc
                .and_then(|d| inv.gpu_mdev_parent(d))
                .map(|p| {
                    p.types
                        .into_iter()
                        .map(|t| TypeRow {
                            id: t.id.to_string(),
                            name: t.name.unwrap_or_default(),
                            available: t.available_instances,
                            created: u32::try_from(t.instances.len()).unwrap_or(u32::MAX),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let backend = backends
                .iter()
                .find(|d| d.gpu == g.id)
                .and_then(|d| d.backend.as_ref());
            let vfs = disc
                .and_then(|d| d.pci)
                .and_then(|a| inv.pci_devices.iter().find(|p| p.address == a))
                .and_then(|p| p.sriov.as_ref())
                .map(|s| VfCounts {
                    total: s.total_vfs,
                    enabled: s.num_vfs,
                    in_use: held_vfs.get(g.id.as_str()).copied().unwrap_or(0),
                });
            GpuRow {
                id: g.id.clone(),
                vendor: g.vendor.clone(),
                model: g.model.clone(),
                driver: g.driver.clone().unwrap_or_default(),
                numa_node: g.numa_node.map(|n| n.to_string()).unwrap_or_default(),
                backend: backend.map(|b| b.kind().to_string()).unwrap_or_default(),
                healthy: g.health == "ok",
                types,
                vfs,
                profile_capacity: capacity.get(g.id.as_str()).cloned().unwrap_or_default(),
                shares: backend
                    .map(|b| shares(b.as_ref(), host))
                    .unwrap_or_default(),
            }
        })
        .collect()
}

fn instance_row(v: &InstanceView, pool_of: &BTreeMap<&str, &str>) -> InstanceRow {
    let uuid = v.uuid.to_string();
    let label = v.label.clone().unwrap_or_default();
    InstanceRow {
        pool: pool_of
            .get(uuid.as_str())
            .copied()
            .unwrap_or("")
            .to_string(),
        domain: label
            // The hook labels what it creates `libvirt:<domain>` (`crate::hook::label_for`).
            .strip_prefix("libvirt:")
            .unwrap_or("")
            .to_string(),
        uuid,
        gpu: v.gpu.clone(),
        type_id: v.type_id.to_string(),
        profile: v.profile.clone().unwrap_or_default(),
        label,
        owner: v.ownership.as_str(),
        state: v.state,
    }
}

/// The scheduling shares a backend reads back, per device.
fn shares(b: &dyn crate::backend::Backend, host: &dyn vgpu_host::Host) -> Vec<ShareRow> {
    let Ok(state) = b.read_back(host) else {
        return Vec::new();
    };
    let weights: Option<u32> = state.slots.iter().map(|s| s.weight).sum();
    state
        .slots
        .iter()
        .filter_map(|s| {
            let device = s.device.clone()?;
            let requested = match (s.weight, weights) {
                (Some(w), Some(total)) if total > 0 => Some(f64::from(w) / f64::from(total)),
                _ => None,
            };
            (requested.is_some() || s.share.is_some()).then_some(ShareRow {
                device,
                requested,
                effective: s.share,
            })
        })
        .collect()
}

/// Per GPU and shipped profile, how many more instances the planner places there now: the profile
/// alone on that GPU, as many as its options could hold.
fn profile_capacity(
    core: &Core,
    inv: &Inventory,
    claimed: &[PciAddress],
) -> BTreeMap<String, Vec<(String, u32)>> {
    let mut out: BTreeMap<String, Vec<(String, u32)>> = BTreeMap::new();
    for profile in core.instances.catalog.profiles() {
        let report = match_profile(profile, inv);
        for gpu in &inv.gpus {
            let placed = report
                .gpu(&gpu.id)
                .filter(|m| m.best.is_some() && inv.fault_of(&gpu.id).is_none())
                .map(|m| {
                    let most: u32 = m
                        .best
                        .iter()
                        .chain(&m.alternatives)
                        .map(|o| o.capacity)
                        .fold(0u32, u32::saturating_add)
                        .min(MAX_COUNTED);
                    if most == 0 {
                        return 0;
                    }
                    let converted = build(
                        inv,
                        &[DemandInput {
                            report: &report,
                            need_mib: profile.framebuffer_mib,
                            count: most,
                            numa: None,
                        }],
                        &|g| g.id == gpu.id,
                        HostUse {
                            released: &[],
                            claimed_vfs: claimed,
                        },
                    );
                    match plan(&converted.problem, Policy::Consolidate) {
                        Ok(s) => u32::try_from(s.placed).unwrap_or(u32::MAX),
                        Err(e) => {
                            debug!(gpu = %gpu.id, profile = %profile.name, error = %e, "metrics: capacity not planned");
                            0
                        }
                    }
                })
                .unwrap_or(0);
            out.entry(gpu.id.clone())
                .or_default()
                .push((profile.name.clone(), placed));
        }
    }
    out
}
