//! Pool slots held by SR-IOV VFs (xe/i915/GIM VFs through vfio-pci, NVIDIA vendor-VFIO vGPUs).
//!
//! Sysfs does not say which slot a VF serves, so each is recorded in the state directory
//! ([`VfSlotRecord`], `vf-slots/<slot uuid>.toml`): the slot, its GPU, the VF, how many VFs its PF
//! needs, and — once made — what [`Backend::create`] did ([`Created`], which [`Backend::destroy`]
//! undoes). The record is written **before** the VF is touched and completed after, so a crash
//! leaves a record the next start can finish or undo:
//!
//! * at start ([`VfSlots::reconcile`]), a slot whose VF is not (or no longer) set up — a reboot
//!   disables every VF — is made again when its pool is applied with `autostart`: the PF's VFs are
//!   enabled again and the same VF is assigned again;
//! * a record left pending by a crash after the backend's change (its VF on vfio-pci, or carrying the
//!   record's vGPU type) is completed rather than made again, when its pool is applied with autostart
//!   or applied again;
//! * a record left pending by a crash, of a pool not applied with autostart, is dropped after its VF is
//!   given back (unbound from vfio-pci, or its vGPU type cleared).

use mdev_types::ids::{MdevUuid, PciAddress};
use mdev_types::model::Inventory;
use tracing::{info, warn};
use vgpu_host::HostExt;
use vgpu_host::discover::discover;
use vgpu_host::ops::{BindRecord, restore_driver};
use vgpu_host::paths;

use std::sync::Arc;

use vgpu_host::Host;

use super::{Store, lock};
use crate::backend::{Backend, Created, detect_gpu};
use crate::daemon::api::{CoreError, RequestError, StateError, VfInUse};
pub(super) use crate::daemon::store::{VfKind, VfSlotRecord};
use crate::pool::{HeldSlot, SlotId};
use crate::profile::ProfileTarget;

impl VfSlotRecord {
    /// The slot.
    pub(super) fn slot(&self) -> SlotId {
        SlotId::new(&self.pool, &self.profile, self.index)
    }

    /// The target that makes this slot again on the same VF.
    pub(super) fn target(&self) -> ProfileTarget {
        match &self.holds {
            VfKind::SriovVf => ProfileTarget::SriovVf {
                pf: self.pf,
                vf: Some(self.vf),
                vf_driver: None,
                num_vfs: self.num_vfs,
                enable_vfs: false,
            },
            VfKind::NvidiaVgpu { type_id, type_name } => ProfileTarget::NvidiaVendorVfio {
                pf: self.pf,
                vf: self.vf,
                type_id: *type_id,
                type_name: type_name.clone(),
            },
        }
    }

    /// The NVIDIA vGPU type name its VF holds (`NVIDIA L40S-2Q`); `None` for a plain SR-IOV VF.
    pub(super) fn type_name(&self) -> Option<&str> {
        match &self.holds {
            VfKind::SriovVf => None,
            VfKind::NvidiaVgpu { type_name, .. } => Some(type_name),
        }
    }

    /// What it holds, for status rows (`VF 0000:03:00.1`, `NVIDIA L40S-2Q on VF …`).
    pub(super) fn holds_text(&self) -> String {
        match &self.holds {
            VfKind::SriovVf => format!("VF {}", self.vf),
            VfKind::NvidiaVgpu { type_name, .. } => format!("{type_name} on VF {}", self.vf),
        }
    }
}

/// The VF slot service: the slot records in the store and the VFs they hold.
pub(super) struct VfSlots {
    pub(super) host: Arc<dyn Host>,
    store: Arc<Store>,
}

impl VfSlots {
    /// The service over `host` and the records in `store`.
    pub(super) fn new(host: Arc<dyn Host>, store: Arc<Store>) -> VfSlots {
        VfSlots { host, store }
    }

    /// Every VF slot record, by UUID.
    pub(super) fn vf_records(&self) -> Vec<VfSlotRecord> {
        lock(&self.store).vf_slots().cloned().collect()
    }

    /// The record of slot `uuid`, if it is a VF slot.
    pub(super) fn vf_record(&self, uuid: &MdevUuid) -> Option<VfSlotRecord> {
        lock(&self.store).get_vf_slot(uuid).cloned()
    }

    pub(super) fn put_vf_record(&self, r: &VfSlotRecord) -> Result<(), CoreError> {
        lock(&self.store).put_vf_slot(r)?;
        Ok(())
    }

    pub(super) fn drop_vf_record(&self, uuid: &MdevUuid) -> Result<(), CoreError> {
        lock(&self.store).remove_vf_slot(uuid)?;
        Ok(())
    }

    /// The VF slots recorded for `pool`, as the planner takes them.
    pub(super) fn held_vf_slots(&self, pool: &str) -> Vec<HeldSlot> {
        self.vf_records()
            .into_iter()
            .filter(|r| r.pool == pool)
            .map(|r| HeldSlot {
                slot: r.slot(),
                gpu: r.gpu.clone(),
                vf: r.vf,
            })
            .collect()
    }

    /// Whether the slot's VF is set up now: made, the VF exists, and it is on vfio-pci (or has the vGPU
    /// type).
    pub(super) fn vf_slot_running(&self, r: &VfSlotRecord) -> bool {
        r.created.as_ref().is_some_and(|c| self.is_set_up(c))
    }

    /// Whether the VF shows what `created` says was done to it: bound to vfio-pci, or carrying the
    /// vGPU type.
    fn is_set_up(&self, created: &Created) -> bool {
        match created {
            Created::Vf { vf, .. } => {
                self.host
                    .link_name(&paths::pci_attr(vf, "driver"))
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some("vfio-pci")
            }
            Created::NvidiaVgpu { vf, type_id, .. } => self.nvidia_vgpu_type(vf) == Some(*type_id),
        }
    }

    /// The vGPU type set on an NVIDIA VF now (`<vf>/nvidia/current_vgpu_type`, the attribute
    /// `backend::nvidia_vfio` writes; its source is named there), `None` when unreadable.
    fn nvidia_vgpu_type(&self, vf: &PciAddress) -> Option<u32> {
        self.host
            .read_trimmed(&paths::pci_device(vf).join("nvidia/current_vgpu_type"))
            .ok()
            .and_then(|s| s.parse().ok())
    }

    fn backend_of(&self, gpu: &str) -> Result<(Box<dyn Backend>, Inventory), CoreError> {
        let inv = discover(self.host.as_ref())?;
        let b = detect_gpu(self.host.as_ref(), &inv, gpu)?;
        Ok((b, inv))
    }

    /// Enables `num_vfs` VFs on GPU `gpu` through its backend; returns how many it had before.
    pub(super) fn enable_vfs_on(
        &self,
        gpu: &str,
        pf: &PciAddress,
        num_vfs: u32,
    ) -> Result<u32, CoreError> {
        let (b, inv) = self.backend_of(gpu)?;
        let before = inv
            .pci_devices
            .iter()
            .find(|d| d.address == *pf)
            .and_then(|d| d.sriov.as_ref())
            .map_or(0, |s| s.num_vfs);
        b.enable_vfs(self.host.as_ref(), num_vfs)?;
        info!(%gpu, %pf, num_vfs, before, "SR-IOV VFs enabled");
        Ok(before)
    }

    /// Puts the VF count of `pf` back to `previous` (undoing [`VfSlots::enable_vfs_on`]); only from a count
    /// to 0, the one change the kernel allows while VFs exist.
    pub(super) fn restore_num_vfs(&self, pf: &PciAddress, previous: u32) -> Result<(), CoreError> {
        if previous != 0 {
            return Ok(());
        }
        vgpu_host::ops::set_sriov_numvfs(self.host.as_ref(), pf, 0)?;
        Ok(())
    }

    /// A VF of `pf` for a new slot: `wanted` when the plan named one, else the first enabled VF with no
    /// driver that no slot holds.
    fn pick_vf(
        &self,
        inv: &Inventory,
        pf: &PciAddress,
        wanted: Option<PciAddress>,
    ) -> Result<PciAddress, CoreError> {
        let held: Vec<PciAddress> = self.vf_records().iter().map(|r| r.vf).collect();
        if let Some(v) = wanted {
            if held.contains(&v) {
                return Err(StateError::VfHeld { vf: v, pf: *pf }.into());
            }
            let dev = inv.pci_devices.iter().find(|d| d.address == v);
            // NVIDIA's VFs stay on the nvidia driver; a vGPU type set means someone uses it. Other VFs
            // must have no driver: a host driver or a foreign vfio-pci binding means they are in use.
            let busy = match dev {
                None => Some(VfInUse::Missing),
                Some(d) => match &d.nvidia_vf {
                    Some(n) => n.current_type.map(VfInUse::HasVgpuType),
                    None => d.driver.clone().map(VfInUse::BoundTo),
                },
            };
            if let Some(why) = busy {
                return Err(StateError::VfBusy {
                    vf: v,
                    pf: *pf,
                    why,
                }
                .into());
            }
            return Ok(v);
        }
        let vfs = inv
            .pci_devices
            .iter()
            .find(|d| d.address == *pf)
            .and_then(|d| d.sriov.as_ref())
            .map(|s| s.vfs.clone())
            .unwrap_or_default();
        vfs.into_iter()
            .filter(|v| !held.contains(v))
            .find(|v| {
                inv.pci_devices
                    .iter()
                    .find(|d| d.address == *v)
                    .is_some_and(|d| d.driver.is_none())
            })
            .ok_or_else(|| StateError::NoFreeVf { pf: *pf }.into())
    }

    /// Makes `slot` on GPU `gpu` as `target` (an SR-IOV VF or NVIDIA vGPU target of the plan): picks
    /// the VF, records the slot, lets the backend set it up, completes the record.
    pub(super) fn create_vf_slot(
        &self,
        slot: &SlotId,
        gpu: &str,
        target: &ProfileTarget,
    ) -> Result<VfSlotRecord, CoreError> {
        let (b, inv) = self.backend_of(gpu)?;
        let (pf, vf, num_vfs, holds) = match target {
            ProfileTarget::SriovVf {
                pf,
                vf,
                num_vfs,
                enable_vfs,
                ..
            } => {
                let vf = self.pick_vf(&inv, pf, *vf)?;
                (
                    *pf,
                    vf,
                    if *enable_vfs { *num_vfs } else { 0 },
                    VfKind::SriovVf,
                )
            }
            ProfileTarget::NvidiaVendorVfio {
                pf,
                vf,
                type_id,
                type_name,
            } => (
                *pf,
                self.pick_vf(&inv, pf, Some(*vf))?,
                0,
                VfKind::NvidiaVgpu {
                    type_id: *type_id,
                    type_name: type_name.clone(),
                },
            ),
            other => {
                return Err(RequestError::NotVfTarget {
                    target: other.to_string(),
                }
                .into());
            }
        };
        let record = VfSlotRecord {
            uuid: slot.uuid,
            pool: slot.pool.clone(),
            profile: slot.profile.clone(),
            index: slot.index,
            gpu: gpu.to_string(),
            pf,
            vf,
            num_vfs,
            holds,
            created: None,
        };
        let record = self.make_vf_slot(b.as_ref(), record, None)?;
        info!(slot = %record.uuid, %vf, %gpu, "VF slot made");
        Ok(record)
    }

    /// Gives slot `uuid`'s VF back (the backend's destroy) and drops its record; returns the record.
    pub(super) fn release_vf_slot(&self, uuid: &MdevUuid) -> Result<VfSlotRecord, CoreError> {
        let r = self
            .vf_record(uuid)
            .ok_or(CoreError::NotFound { uuid: *uuid })?;
        self.give_back(&r)?;
        self.drop_vf_record(uuid)?;
        info!(slot = %uuid, vf = %r.vf, "VF slot released");
        Ok(r)
    }

    /// Gives slot `uuid`'s VF back but keeps its record (the slot is then stopped).
    pub(super) fn stop_vf_slot(&self, uuid: &MdevUuid) -> Result<(), CoreError> {
        let r = self
            .vf_record(uuid)
            .ok_or(CoreError::NotFound { uuid: *uuid })?;
        self.give_back(&r)
    }

    /// Undoes what the backend did for `r` (or, for a pending record, what it may have done).
    fn give_back(&self, r: &VfSlotRecord) -> Result<(), CoreError> {
        if !self.host.exists(&paths::pci_device(&r.vf)) {
            return Ok(());
        }
        let created = r.created.clone().unwrap_or_else(|| pending_created(r));
        match &created {
            Created::Vf { bind, .. } => restore_driver(self.host.as_ref(), bind)?,
            // Only a vGPU of our type is ours to clear: the type may never have been set (a crash
            // before the write) or a reboot cleared it, and then there is nothing to undo.
            Created::NvidiaVgpu { vf, type_id, .. }
                if self.nvidia_vgpu_type(vf) != Some(*type_id) => {}
            _ => {
                let (b, _) = self.backend_of(&r.gpu)?;
                b.destroy(self.host.as_ref(), &created)?;
            }
        }
        Ok(())
    }

    /// Makes slot `r` again on its VF, enabling its PF's VFs first when they are missing.
    pub(super) fn recreate_vf_slot(&self, r: &VfSlotRecord) -> Result<(), CoreError> {
        if !self.host.exists(&paths::pci_device(&r.vf)) && r.num_vfs > 0 {
            self.enable_vfs_on(&r.gpu, &r.pf, r.num_vfs)?;
        }
        // A pending record whose VF is set up: vgpud stopped after the backend's change and before
        // the record's completion. Setting it up again would fail (the NVIDIA driver refuses a
        // second vGPU type with EPERM) or record the VF's vfio-pci binding as the driver to give it
        // back to; completing the record is what the interrupted make would have done.
        if r.created.is_none() {
            let done = pending_created(r);
            if self.is_set_up(&done) {
                self.put_vf_record(&VfSlotRecord {
                    created: Some(done),
                    ..r.clone()
                })?;
                info!(slot = %r.uuid, vf = %r.vf, "VF slot found set up; its pending record is completed");
                return Ok(());
            }
        }
        let (b, _) = self.backend_of(&r.gpu)?;
        self.make_vf_slot(b.as_ref(), r.clone(), Some(r.clone()))
            .map(|_| ())
    }

    /// At start: VF slots whose VF is not set up are made again when their pool is applied with
    /// autostart; pending records of other pools are undone and dropped.
    pub(super) fn reconcile(&self, pool_autostart: impl Fn(&str) -> bool) {
        for r in self.vf_records() {
            if self.vf_slot_running(&r) {
                continue;
            }
            let autostart = pool_autostart(&r.pool);
            if autostart {
                match self.recreate_vf_slot(&r) {
                    Ok(()) => {
                        info!(slot = %r.uuid, vf = %r.vf, pool = %r.pool, "VF slot made again at start")
                    }
                    Err(e) => {
                        warn!(slot = %r.uuid, vf = %r.vf, error = %e, "VF slot could not be made again; `vgpuctl pool apply` retries")
                    }
                }
            } else if r.created.is_none() {
                let outcome = self
                    .give_back(&r)
                    .and_then(|()| self.drop_vf_record(&r.uuid));
                match outcome {
                    Ok(()) => info!(slot = %r.uuid, vf = %r.vf, "half-made VF slot undone"),
                    Err(e) => {
                        warn!(slot = %r.uuid, vf = %r.vf, error = %e, "half-made VF slot could not be undone")
                    }
                }
            }
        }
    }
}

/// What the backend does for pending record `r` (one written before its VF was touched): its VF,
/// picked driverless or named by the plan, bound to vfio-pci; or its vGPU type set.
fn pending_created(r: &VfSlotRecord) -> Created {
    match &r.holds {
        VfKind::SriovVf => Created::Vf {
            pf: r.pf,
            vf: r.vf,
            bind: BindRecord {
                addr: r.vf,
                previous_driver: None,
                previous_override: None,
            },
        },
        VfKind::NvidiaVgpu { type_id, .. } => Created::NvidiaVgpu {
            pf: r.pf,
            vf: r.vf,
            type_id: *type_id,
        },
    }
}
