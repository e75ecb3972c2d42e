//! Any mdev parent no vendor module claims — in practice the kernel's sample drivers (mtty, mdpy,
//! mbochs; samples/vfio-mdev/), which emulate a serial port or a framebuffer in the host CPU. They have
//! no GPU engine, so there is nothing to time-slice: plans report no effective share and refuse nothing.

use mdev_types::model::{Gpu, Inventory, MdevParent};
use vgpu_host::Host;

use super::common::{self, Slot, assign, slot_plans};
use super::{
    Backend, BackendError, BackendKind, Capabilities, CreateRequest, Created, DetectResult,
    SchedCaps,
};
use crate::profile;
use crate::sched::{PlanOptions, SchedPlan, SchedRequest, SchedState, SlotState};

/// An mdev parent without a scheduler.
#[derive(Debug, Clone)]
pub struct GenericMdevBackend {
    gpu: String,
    parent: MdevParent,
}

/// The GPU's mdev parent, whatever its driver.
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    Ok(parent_of(inv, gpu).map(|p| {
        Box::new(GenericMdevBackend {
            gpu: gpu.id.clone(),
            parent: p.clone(),
        }) as Box<dyn Backend>
    }))
}

/// The mdev parent of a GPU: the one at its PCI address, or the virtual parent of its name.
pub(crate) fn parent_of<'a>(inv: &'a Inventory, gpu: &Gpu) -> Option<&'a MdevParent> {
    inv.mdev_parents.iter().find(|p| match gpu.pci {
        Some(a) => p.pci == Some(a),
        None => p.name == gpu.id,
    })
}

/// The instances of a parent as slots (named by UUID), then free capacity as `new1`, `new2`, ….
pub(crate) fn instance_slots(parent: &MdevParent, extra: u32) -> Vec<Slot> {
    let mut slots: Vec<Slot> = parent
        .types
        .iter()
        .flat_map(|t| t.instances.iter())
        .map(|u| Slot::new(u.to_string(), Some(u.to_string())))
        .collect();
    slots.extend((1..=extra).map(|i| Slot::new(format!("new{i}"), None)));
    slots
}

impl GenericMdevBackend {
    fn free(&self) -> u32 {
        self.parent
            .types
            .iter()
            .map(|t| t.available_instances)
            .max()
            .unwrap_or(0)
    }
}

impl Backend for GenericMdevBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::GenericMdev
    }

    fn gpu(&self) -> &str {
        &self.gpu
    }

    fn capabilities(&self) -> Capabilities {
        let slots = instance_slots(&self.parent, 0);
        Capabilities {
            backend: self.kind(),
            gpu: self.gpu.clone(),
            interface: format!(
                "mdev parent {} ({} types)",
                self.parent.name,
                self.parent.types.len()
            ),
            offers: vec![profile::Backend::Mdev],
            max_slots: u32::try_from(slots.len()).unwrap_or(u32::MAX) + self.free(),
            slots: slots.into_iter().map(|s| s.name).collect(),
            scheduling: SchedCaps {
                knob: "none (no GPU engine)".to_string(),
                per_slot_weights: false,
                priorities: false,
                reserve: false,
                runtime: false,
            },
        }
    }

    fn create(&self, host: &dyn Host, req: &CreateRequest) -> Result<Created, BackendError> {
        common::create_mdev_target(host, &self.parent.name, req, self)
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        common::destroy_mdev(host, created, self)
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let (pairs, refusals) = assign(
            requests,
            &instance_slots(&self.parent, self.free()),
            "mdev instance",
        );
        let mut plan = SchedPlan::new(
            &self.gpu,
            self.kind().as_str(),
            "not scheduled",
            opts.tolerance,
        );
        plan.slots = slot_plans(&pairs);
        plan.refusals = refusals;
        plan.notes.push(format!(
            "{} emulates its device in the host CPU; there is no GPU engine to share, so weights have no effect",
            self.parent.name
        ));
        plan
    }

    fn read_back(&self, _host: &dyn Host) -> Result<SchedState, BackendError> {
        let mut st = SchedState::new(&self.gpu, self.kind().as_str(), "not scheduled");
        st.slots = instance_slots(&self.parent, 0)
            .into_iter()
            .map(|s| SlotState {
                slot: s.name,
                device: s.device,
                quantum_ms: None,
                preempt_timeout_us: None,
                priority: None,
                weight: None,
                share: None,
            })
            .collect();
        Ok(st)
    }
}
