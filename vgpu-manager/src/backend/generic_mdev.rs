//! Any mdev parent no vendor module claims — in practice the kernel's sample drivers (mtty, mdpy,
//! mbochs; samples/vfio-mdev/), which emulate a serial port or a framebuffer in the host CPU. They have
//! no GPU engine, so there is nothing to time-slice: plans report no effective share and refuse nothing.

use mdev_types::model::{Gpu, Inventory};
use vgpu_host::Host;

use super::common::{Slot, slot_plans};
use super::mdev_parent::{MdevParentBackend, MdevParentBase, MdevVendor};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, SlotState};

/// An mdev parent without a scheduler.
#[derive(Debug, Clone)]
pub(crate) struct GenericMdev;

/// The GPU's mdev parent, whatever its driver.
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    Ok(inv
        .own_parent(gpu)
        .map(|p| MdevParentBackend::boxed(gpu, p, GenericMdev)))
}

impl MdevVendor for GenericMdev {
    const KIND: BackendKind = BackendKind::GenericMdev;
    const SLOT_NOUN: &'static str = "mdev instance";

    fn interface(&self, base: &MdevParentBase) -> String {
        format!(
            "mdev parent {} ({} types)",
            base.parent.name,
            base.parent.types.len()
        )
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "none (no GPU engine)".to_string(),
            per_slot_weights: false,
            priorities: false,
            reserve: false,
            runtime: false,
        }
    }

    fn plan(
        &self,
        base: &MdevParentBase,
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan {
        let mut plan = SchedPlan::new(
            &base.gpu,
            Self::KIND.as_str(),
            "not scheduled",
            opts.tolerance,
        );
        plan.slots = slot_plans(pairs);
        plan.refusals = refusals;
        plan.notes.push(format!(
            "{} emulates its device in the host CPU; there is no GPU engine to share, so weights have no effect",
            base.parent.name
        ));
        plan
    }

    fn read_back(
        &self,
        base: &MdevParentBase,
        _host: &dyn Host,
    ) -> Result<SchedState, BackendError> {
        let mut st = SchedState::new(&base.gpu, Self::KIND.as_str(), "not scheduled");
        st.slots = base
            .instance_slots(0)
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
