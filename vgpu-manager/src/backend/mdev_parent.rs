//! The base of every backend that drives an mdev parent (NVIDIA classic vGPU, GVT-g, the kernel's
//! samples): the parent's instances are its slots, its free capacity adds `new1`, `new2`, …, and a
//! vGPU is created and removed through the parent's `create` / the device's `remove` attribute
//! (`vgpu_host::ops`). A vendor module adds only its interface line, its scheduler and its plan
//! ([`MdevVendor`]); [`MdevParentBackend`] is the [`Backend`] of the pair.

use std::fmt;

use mdev_types::model::{Gpu, MdevParent};
use vgpu_host::Host;

use super::common::{Slot, assign, unsupported};
use super::{Backend, BackendError, BackendKind, Capabilities, Created, NewVgpu, SchedCaps};
use crate::profile;
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState};

/// The GPU and mdev parent a backend drives, as detection found them.
#[derive(Debug, Clone)]
pub(crate) struct MdevParentBase {
    /// The GPU (`Gpu::id`).
    pub gpu: String,
    /// Its mdev parent, with every type and instance.
    pub parent: MdevParent,
}

impl MdevParentBase {
    /// The instances of the parent as slots (named by UUID), then `extra` free slots as `new1`,
    /// `new2`, ….
    pub fn instance_slots(&self, extra: u32) -> Vec<Slot> {
        let mut slots: Vec<Slot> = self
            .parent
            .types
            .iter()
            .flat_map(|t| t.instances.iter())
            .map(|u| Slot::new(u.to_string(), Some(u.to_string())))
            .collect();
        slots.extend((1..=extra).map(|i| Slot::new(format!("new{i}"), None)));
        slots
    }

    /// How many more instances the parent takes: the most any of its types has left.
    pub fn free(&self) -> u32 {
        self.parent
            .types
            .iter()
            .map(|t| t.available_instances)
            .max()
            .unwrap_or(0)
    }

    /// How many instances exist.
    pub fn existing(&self) -> usize {
        self.parent.types.iter().map(|t| t.instances.len()).sum()
    }
}

/// What a vendor adds to an mdev parent: how it describes the interface and how it schedules.
pub(crate) trait MdevVendor: fmt::Debug + Send + Sync {
    /// Which interface.
    const KIND: BackendKind;
    /// What one instance is called in refusals (`vGPU`, `mdev instance`).
    const SLOT_NOUN: &'static str;

    /// The interface in a line (`GVT-g mdev parent i915-0000:00:02.0 (4 types)`).
    fn interface(&self, base: &MdevParentBase) -> String;

    /// What its scheduler can do.
    fn scheduling(&self) -> SchedCaps;

    /// How many more instances can be created (by default [`MdevParentBase::free`]).
    fn free(&self, base: &MdevParentBase) -> u32 {
        base.free()
    }

    /// The plan for requests already matched to slots (`pairs`), with the refusals of matching.
    fn plan(
        &self,
        base: &MdevParentBase,
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan;

    /// Reads the scheduling the driver has programmed now, per slot.
    fn read_back(&self, base: &MdevParentBase, host: &dyn Host)
    -> Result<SchedState, BackendError>;
}

/// An mdev-parent backend: the shared base with one vendor's scheduling.
#[derive(Debug)]
pub(crate) struct MdevParentBackend<V> {
    base: MdevParentBase,
    vendor: V,
}

impl<V: MdevVendor + 'static> MdevParentBackend<V> {
    /// The backend of `gpu` on `parent`, boxed as detection returns it.
    pub fn boxed(gpu: &Gpu, parent: &MdevParent, vendor: V) -> Box<dyn Backend> {
        Box::new(MdevParentBackend {
            base: MdevParentBase {
                gpu: gpu.id.clone(),
                parent: parent.clone(),
            },
            vendor,
        })
    }
}

impl<V: MdevVendor> Backend for MdevParentBackend<V> {
    fn kind(&self) -> BackendKind {
        V::KIND
    }

    fn gpu(&self) -> &str {
        &self.base.gpu
    }

    fn capabilities(&self) -> Capabilities {
        let slots = self.base.instance_slots(0);
        Capabilities {
            backend: V::KIND,
            gpu: self.base.gpu.clone(),
            interface: self.vendor.interface(&self.base),
            offers: vec![profile::Delivery::Mdev],
            max_slots: u32::try_from(slots.len()).unwrap_or(u32::MAX)
                + self.vendor.free(&self.base),
            slots: slots.into_iter().map(|s| s.name).collect(),
            scheduling: self.vendor.scheduling(),
        }
    }

    /// Refuses: an mdev parent's instances are created by the daemon, under its ownership ledger.
    fn create(&self, _host: &dyn Host, req: &NewVgpu) -> Result<Created, BackendError> {
        Err(unsupported(
            self,
            &format!("create {}", req.target),
            "mdev instances are created by vgpud under its ownership ledger: `vgpuctl create` or `vgpuctl define` + `vgpuctl start` (D-Bus Manager1.Create)",
        ))
    }

    /// Refuses: this backend creates nothing it could undo.
    fn destroy(&self, _host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        Err(unsupported(
            self,
            &format!("destroy {created:?}"),
            "it creates no VF-backed vGPUs; mdev instances are removed by vgpud (`vgpuctl stop`, `vgpuctl destroy`)",
        ))
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let slots = self.base.instance_slots(self.vendor.free(&self.base));
        let (pairs, refusals) = assign(requests, &slots, V::SLOT_NOUN);
        self.vendor.plan(&self.base, &pairs, refusals, opts)
    }

    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError> {
        self.vendor.read_back(&self.base, host)
    }
}
