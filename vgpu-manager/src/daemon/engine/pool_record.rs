//! Which pools vgpud has applied, and the slot rows of status and apply reports.
//!
//! A pool that applied is kept in the state directory ([`AppliedPool`], `pools/<name>.toml`), with the
//! exact text it was applied with (so it reads back as the same pool). Its slots' instances are
//! ordinary definitions in the state directory; the record only says which pools exist, for
//! [`GetPoolStatus`](crate::daemon::api::GetPoolStatus). A pool whose text no longer
//! loads with the current profiles (e.g. a profile removed since) is reported in the log and skipped.

use std::collections::BTreeMap;

use mdev_types::ids::{MdevTypeId, PciAddress};
use mdev_types::model::Inventory;
use tracing::warn;

use super::lock;
use super::pool::Pools;
use crate::daemon::api::CoreError;
use crate::daemon::store::{AppliedPool, unix_now};
use crate::pool::{Pool, SlotId};
use vgpu_client::{PoolGpu, PoolStatus, SlotRow};

impl Pools {
    /// Records that `pool` was applied with `text`.
    pub(super) fn record_pool(&self, pool: &Pool, text: &str) -> Result<(), CoreError> {
        lock(&self.store).put_pool(&AppliedPool {
            name: pool.name.clone(),
            text: text.to_string(),
            applied_at: unix_now(),
        })?;
        Ok(())
    }

    /// The applied pools in file-name order, each with the file it is kept in (for messages).
    fn applied_pools(&self) -> Vec<(AppliedPool, String)> {
        let store = lock(&self.store);
        let mut pools: Vec<(AppliedPool, String)> = store
            .pools()
            .map(|a| (a.clone(), store.pool_file(&a.name).display().to_string()))
            .collect();
        pools.sort_by_cached_key(|(a, _)| format!("{}.toml", a.name));
        pools
    }

    /// Whether pool `name` is applied with `autostart` (false when it is not applied or its text no
    /// longer loads).
    pub(super) fn autostart(&self, name: &str) -> bool {
        let store = lock(&self.store);
        store.get_pool(name).is_some_and(|a| {
            let origin = store.pool_file(name).display().to_string();
            Pool::from_toml(&origin, &a.text, &self.catalog).is_ok_and(|p| p.autostart)
        })
    }

    /// Every slot of `pool` with its instance (if any), and the slots per GPU.
    pub(super) fn slot_rows(&self, pool: &Pool, inv: &Inventory) -> (Vec<SlotRow>, Vec<PoolGpu>) {
        let vf_records = self.vf_slots.vf_records();
        let views = lock(&self.instances.views);
        let mut rows = Vec::new();
        let mut gpus: Vec<PoolGpu> = Vec::new();
        for (profile, n) in &pool.profiles {
            for index in 0..*n {
                let slot = SlotId::new(&pool.name, profile, index);
                let view = views.get(&slot.uuid);
                let vf = vf_records.iter().find(|r| r.uuid == slot.uuid);
                let gpu = view
                    .map(|v| v.gpu.clone())
                    .or_else(|| vf.map(|r| r.gpu.clone()));
                let found = gpu
                    .as_deref()
                    .and_then(|g| inv.gpus.iter().find(|x| x.id == g));
                if let (true, Some(g)) = (view.is_some() || vf.is_some(), found) {
                    let entry = match gpus.iter_mut().find(|x| x.gpu == g.id) {
                        Some(e) => e,
                        None => {
                            gpus.push(PoolGpu {
                                gpu: g.id.clone(),
                                model: g.model.clone(),
                                numa_node: g.numa_node,
                                profiles: BTreeMap::new(),
                            });
                            let last = gpus.len() - 1;
                            &mut gpus[last]
                        }
                    };
                    *entry.profiles.entry(profile.clone()).or_default() += 1;
                }
                let fault = gpu
                    .as_deref()
                    .and_then(|g| inv.fault_of(g))
                    .map(ToString::to_string);
                rows.push(SlotRow {
                    profile: profile.clone(),
                    index,
                    uuid: slot.uuid.to_string(),
                    gpu,
                    numa_node: found.and_then(|g| g.numa_node),
                    type_id: view
                        .map(|v| v.type_id.to_string())
                        .or_else(|| vf.map(|r| r.holds_text())),
                    parent: view.map(|v| v.parent.clone()),
                    type_name: match (view, vf) {
                        (Some(v), _) => mdev_type_name(inv, &v.parent, &v.type_id),
                        (None, Some(r)) => r.type_name().map(str::to_string),
                        (None, None) => None,
                    },
                    pci_id: vf.and_then(|r| vf_pci_id(inv, r.pf, r.vf)),
                    state: match (view, vf) {
                        (Some(v), _) => v.state.as_str(),
                        (None, Some(r)) if self.vf_slots.vf_slot_running(r) => "running",
                        (None, Some(_)) => "stopped",
                        (None, None) => "missing",
                    }
                    .into(),
                    vf: vf.map(|r| r.vf.to_string()),
                    iommu_group: match (view, vf) {
                        (Some(v), _) => v.iommu_group,
                        (None, Some(r)) => inv
                            .pci_devices
                            .iter()
                            .find(|d| d.address == r.vf)
                            .and_then(|d| d.iommu_group)
                            .map(|g| g.0),
                        (None, None) => None,
                    },
                    fault,
                });
            }
        }
        gpus.sort_by(|a, b| a.gpu.cmp(&b.gpu));
        (rows, gpus)
    }

    /// [`GetPoolStatus`](crate::daemon::api::GetPoolStatus).
    pub(super) fn status(&self) -> Result<Vec<PoolStatus>, CoreError> {
        let applied = self.applied_pools();
        let inv = vgpu_host::discover::discover_without_groups(self.host.as_ref())?;
        let mut out = Vec::new();
        for (record, file) in applied {
            let pool = match Pool::from_toml(&file, &record.text, &self.catalog) {
                Ok(p) => p,
                Err(e) => {
                    warn!(%file, error = %e, "applied pool no longer loads; skipped in status");
                    continue;
                }
            };
            let applied_at = record.applied_at;
            let (slots, gpus) = self.slot_rows(&pool, &inv);
            out.push(PoolStatus {
                in_sync: slots.iter().all(|s| s.state == "running"),
                pool: pool.name,
                description: pool.description,
                policy: pool.policy.as_str().to_string(),
                autostart: pool.autostart,
                applied_at,
                wanted: pool.profiles,
                slots,
                gpus,
            });
        }
        Ok(out)
    }
}

/// The `name` attribute of mdev type `type_id` on `parent`, as discovery read it.
fn mdev_type_name(inv: &Inventory, parent: &str, type_id: &MdevTypeId) -> Option<String> {
    inv.mdev_parents
        .iter()
        .find(|p| p.name == parent)?
        .types
        .iter()
        .find(|t| &t.id == type_id)?
        .name
        .clone()
}

/// VF `vf`'s PCI `vendor:device` id (`10de:26b9`): the VF's own ids when discovery lists it, else its
/// PF's vendor and `sriov_vf_device` (the id every VF of the PF has, Documentation/ABI/testing/sysfs-bus-pci).
fn vf_pci_id(inv: &Inventory, pf: PciAddress, vf: PciAddress) -> Option<String> {
    let text =
        |v: mdev_types::ids::PciId, d: mdev_types::ids::PciId| format!("{:04x}:{:04x}", v.0, d.0);
    if let Some(d) = inv.pci_devices.iter().find(|d| d.address == vf) {
        return Some(text(d.vendor, d.device));
    }
    let p = inv.pci_devices.iter().find(|d| d.address == pf)?;
    Some(text(p.vendor, p.sriov.as_ref()?.vf_device?))
}
