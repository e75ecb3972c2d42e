//! Removing a pool ([`RemovePool`](crate::daemon::api::RemovePool)): every slot of the pool is given
//! back — its mdev instance destroyed (definition and device), its VF released (unbound from
//! vfio-pci, or its NVIDIA vGPU type cleared) and its VF slot record dropped — and then the pool's
//! record. VFs an apply enabled stay enabled (other slots may use them; the offers count them as
//! free). Removing a pool vgpud does not know changes nothing.
//!
//! Slots are found by what vgpud recorded, never by name alone: definitions (and running instances)
//! labelled as a slot of the pool whose UUID is that slot's (`pool::identity`), and the VF slot
//! records of the pool. A failure stops the removal with what is left recorded, so removing again
//! finishes it.

use std::collections::BTreeSet;
use std::sync::PoisonError;

use mdev_types::ids::MdevUuid;
use tracing::info;

use super::lock;
use super::pool::{APPLYING, Pools};
use super::pool_exec::labelled_slot;
use crate::daemon::api::{CoreError, RequestError};
use vgpu_client::PoolRemoval;

impl Pools {
    /// [`RemovePool`](crate::daemon::api::RemovePool): gives back every slot of pool `name` and
    /// forgets the pool.
    pub(super) fn remove(&self, name: &str) -> Result<PoolRemoval, CoreError> {
        if !crate::toml_file::valid_name(name) {
            return Err(RequestError::BadPoolName {
                name: name.to_string(),
            }
            .into());
        }
        let _one = APPLYING.lock().unwrap_or_else(PoisonError::into_inner);
        let mut removed = Vec::new();
        for r in self.vf_slots.vf_records() {
            if r.pool == name {
                self.vf_slots.release_vf_slot(&r.uuid)?;
                removed.push(r.slot().name());
            }
        }
        for (uuid, slot) in self.mdev_slots(name) {
            self.instances.destroy(uuid)?;
            removed.push(slot);
        }
        let applied = {
            let mut store = lock(&self.store);
            let applying = store.remove_applying(name)?.is_some();
            store.remove_pool(name)?.is_some() || applying
        };
        if applied || !removed.is_empty() {
            info!(pool = %name, slots = removed.len(), "pool removed");
        }
        Ok(PoolRemoval {
            pool: name.to_string(),
            applied,
            removed,
        })
    }

    /// The mdev instances (defined or running) that are slots of pool `name`, with the slots' names.
    fn mdev_slots(&self, name: &str) -> Vec<(MdevUuid, String)> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::new();
        let defined: Vec<(MdevUuid, Option<String>)> = lock(&self.store)
            .definitions()
            .map(|d| (d.uuid, d.label.clone()))
            .collect();
        let running: Vec<(MdevUuid, Option<String>)> = self
            .instances
            .list()
            .into_iter()
            .map(|v| (v.uuid, v.label))
            .collect();
        for (uuid, label) in defined.into_iter().chain(running) {
            if let Some(slot) = labelled_slot(name, label.as_deref(), &uuid)
                && seen.insert(uuid)
            {
                out.push((uuid, slot.name()));
            }
        }
        out
    }
}
