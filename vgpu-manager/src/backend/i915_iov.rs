//! Intel i915 SR-IOV, out-of-tree driver (Intel's SR-IOV i915 for Flex / Arc, DKMS backports): the PF's
//! DRM card carries `prelim_iov/{pf,vfN}/gt/{exec_quantum_ms,preempt_timeout_us,lmem_quota,ggtt_quota,
//! contexts_quota,doorbells_quota}` (`/sys/class/drm/cardN/prelim_iov/`). VFs go to guests through
//! vfio-pci. Weights become per-VF quanta exactly as on xe (`intel_quanta`); this interface has
//! no priority knob.

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory};
use vgpu_host::{Host, HostExt, paths};

use super::common::{self, Slot, VfEnable, assign, slot_plans};
use super::intel_quanta::{plan_quanta, read_state, uncovered_note};
use super::{
    Backend, BackendError, BackendKind, Capabilities, CreateRequest, Created, DetectResult,
    SchedCaps,
};
use crate::profile;
use crate::sched::{PlanOptions, SchedPlan, SchedRequest, SchedState};

/// The PF driver.
const DRIVER: &str = "i915";
/// The directory the out-of-tree driver adds to the PF's DRM card.
const IOV_DIR: &str = "prelim_iov";

/// An i915 PF with `prelim_iov`.
#[derive(Debug, Clone)]
pub struct I915IovBackend {
    gpu: String,
    pf: PciAddress,
    card: String,
    total_vfs: u32,
    num_vfs: u32,
    vfs: Vec<PciAddress>,
}

/// An i915 PF whose DRM card (`<pf>/drm/cardN`) has `prelim_iov/`.
pub(crate) fn detect(host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = gpu.pci else { return Ok(None) };
    if gpu.driver.as_deref() != Some(DRIVER) {
        return Ok(None);
    }
    let drm = paths::pci_attr(&pf, "drm");
    let card = host
        .list_optional(&drm)?
        .into_iter()
        .filter(|n| n.starts_with("card") && !n.contains('-'))
        .find(|n| host.exists(&drm.join(n).join(IOV_DIR)));
    let Some(card) = card else { return Ok(None) };
    let Some(sriov) = common::device(inv, &pf).and_then(|d| d.sriov.clone()) else {
        return Ok(None);
    };
    Ok(Some(Box::new(I915IovBackend {
        gpu: gpu.id.clone(),
        pf,
        card,
        total_vfs: sriov.total_vfs,
        num_vfs: sriov.num_vfs,
        vfs: sriov.vfs,
    })))
}

impl I915IovBackend {
    /// `/sys/class/drm/cardN/prelim_iov/{pf,vfN}/gt/<knob>`; function 0 is the PF.
    fn knob_path(&self, func: u32, knob: &str) -> String {
        let f = if func == 0 {
            "pf".to_string()
        } else {
            format!("vf{func}")
        };
        format!("/sys/class/drm/{}/{IOV_DIR}/{f}/gt/{knob}", self.card)
    }

    fn slots(&self) -> Vec<Slot> {
        if self.num_vfs > 0 {
            (1..)
                .zip(&self.vfs)
                .map(|(i, a)| Slot::new(format!("vf{i}"), Some(a.to_string())))
                .collect()
        } else {
            (1..=self.total_vfs)
                .map(|i| Slot::new(format!("vf{i}"), None))
                .collect()
        }
    }
}

impl Backend for I915IovBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::IntelI915Iov
    }

    fn gpu(&self) -> &str {
        &self.gpu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: self.kind(),
            gpu: self.gpu.clone(),
            interface: format!(
                "SR-IOV VFs through vfio-pci, provisioned in /sys/class/drm/{}/{IOV_DIR}",
                self.card
            ),
            offers: vec![profile::Backend::SriovVf],
            // The VFs that exist (enabled); a plan may also name VFs still to be enabled.
            slots: self
                .slots()
                .into_iter()
                .filter(|s| s.device.is_some())
                .map(|s| s.name)
                .collect(),
            max_slots: self.total_vfs,
            scheduling: SchedCaps {
                knob: "per-VF exec_quantum_ms and preempt_timeout_us (GuC)".to_string(),
                per_slot_weights: true,
                priorities: false,
                reserve: false,
                runtime: true,
            },
        }
    }

    fn create(&self, host: &dyn Host, req: &CreateRequest) -> Result<Created, BackendError> {
        common::create_vf_target(host, &self.pf, req, VfEnable::Sysfs, self)
    }

    fn enable_vfs(&self, host: &dyn Host, num_vfs: u32) -> Result<(), BackendError> {
        common::enable_vfs(host, &self.pf, num_vfs, VfEnable::Sysfs, self)
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        common::destroy_vf(host, created, self)
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let slots = self.slots();
        let (pairs, refusals) = assign(requests, &slots, "VF");
        let mut plan = SchedPlan::new(
            &self.gpu,
            self.kind().as_str(),
            "proportional exec quanta (GuC VF scheduling)",
            opts.tolerance,
        );
        plan.slots = slot_plans(&pairs);
        plan.refusals = refusals;
        plan.refusals
            .extend(common::refuse_priorities(&plan.slots, "i915 prelim_iov"));
        let vfs = if self.num_vfs > 0 {
            self.num_vfs
        } else {
            u32::try_from(plan.slots.len()).unwrap_or(u32::MAX)
        };
        plan_quanta(
            &mut plan,
            opts,
            vfs,
            &|f, knob| self.knob_path(f, knob),
            &|s| s.slot.strip_prefix("vf").and_then(|n| n.parse().ok()),
        );
        plan.notes.extend(uncovered_note(&plan, &slots));
        plan.check_tolerance();
        plan
    }

    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError> {
        let st = SchedState::new(
            &self.gpu,
            self.kind().as_str(),
            "proportional exec quanta (GuC VF scheduling)",
        );
        let vfs = (1..)
            .zip(&self.vfs)
            .map(|(i, a)| (i, format!("vf{i}"), Some(a.to_string())))
            .collect();
        read_state(host, st, vfs, &|f, k| self.knob_path(f, k), false)
    }
}
