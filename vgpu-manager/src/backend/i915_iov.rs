//! Intel i915 SR-IOV, out-of-tree driver (Intel's SR-IOV i915 for Flex / Arc, DKMS backports): the PF's
//! DRM card carries `prelim_iov/{pf,vfN}/gt/{exec_quantum_ms,preempt_timeout_us,lmem_quota,ggtt_quota,
//! contexts_quota,doorbells_quota}` (`/sys/class/drm/cardN/prelim_iov/`). VFs go to guests through
//! vfio-pci. Weights become per-VF quanta exactly as on xe (`intel_quanta`); this interface has
//! no priority knob.

use mdev_types::model::{Gpu, Inventory};
use vgpu_host::{Host, HostExt, paths};

use super::common::{self, Slot};
use super::intel_quanta::{function_dir, new_plan, plan_quanta, read_state, uncovered_note};
use super::sriov_pf::{PfVendor, SriovPfBackend, SriovPfBase};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState};

/// The driver the PF must be bound to for this backend to detect it.
const DRIVER: &str = "i915";
/// The directory the out-of-tree driver adds to the PF's DRM card.
const IOV_DIR: &str = "prelim_iov";

/// An i915 PF with `prelim_iov`.
#[derive(Debug, Clone)]
pub(crate) struct I915Iov {
    /// The PF's DRM card (`card0`).
    card: String,
}

/// An i915 PF whose DRM card (`<pf>/drm/cardN`) has `prelim_iov/`.
pub(crate) fn detect(host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = common::pci_on(gpu, DRIVER) else {
        return Ok(None);
    };
    let drm = paths::pci_attr(&pf, "drm");
    let card = host
        .list_optional(&drm)?
        .into_iter()
        .filter(|n| n.starts_with("card") && !n.contains('-'))
        .find(|n| host.exists(&drm.join(n).join(IOV_DIR)));
    let Some(card) = card else { return Ok(None) };
    let Some(base) = SriovPfBase::of(inv, gpu, pf) else {
        return Ok(None);
    };
    Ok(Some(SriovPfBackend::boxed(base, I915Iov { card })))
}

impl I915Iov {
    /// `/sys/class/drm/cardN/prelim_iov/{pf,vfN}/gt/<knob>`; function 0 is the PF.
    fn knob_path(&self, func: u32, knob: &str) -> String {
        format!(
            "/sys/class/drm/{}/{IOV_DIR}/{}/gt/{knob}",
            self.card,
            function_dir(func)
        )
    }
}

impl PfVendor for I915Iov {
    const KIND: BackendKind = BackendKind::IntelI915Iov;

    fn interface(&self, _base: &SriovPfBase) -> String {
        format!(
            "SR-IOV VFs through vfio-pci, provisioned in /sys/class/drm/{}/{IOV_DIR}",
            self.card
        )
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "per-VF exec_quantum_ms and preempt_timeout_us (GuC)".to_string(),
            per_slot_weights: true,
            priorities: false,
            reserve: false,
            runtime: true,
        }
    }

    fn plan(
        &self,
        base: &SriovPfBase,
        slots: &[Slot],
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan {
        let mut plan = new_plan(base, Self::KIND, pairs, refusals, opts);
        plan.refusals
            .extend(common::refuse_priorities(&plan.slots, "i915 prelim_iov"));
        plan_quanta(&mut plan, opts, base, &|f, knob| self.knob_path(f, knob));
        plan.notes.extend(uncovered_note(&plan, slots));
        plan.check_tolerance();
        plan
    }

    fn read_back(&self, base: &SriovPfBase, host: &dyn Host) -> Result<SchedState, BackendError> {
        read_state(host, base, Self::KIND, &|f, k| self.knob_path(f, k), false)
    }
}
