//! Intel xe SR-IOV: VFs handed to guests through vfio-pci, scheduled by the GuC with a per-VF execution
//! quantum and preemption timeout set in `<pf>/sriov_admin/` (kernel ABI
//! Documentation/ABI/testing/sysfs-driver-intel-xe-sriov: `sriov_admin/{pf,vfN}/profile/
//! {exec_quantum_ms,preempt_timeout_us,sched_priority}`, `.bulk_profile/`, `vfN/stop`).
//!
//! Weights become quanta proportional to them (`intel_quanta`). Priority: a VF's own
//! `sched_priority` is read-only and offers only `low` and `normal`; `.bulk_profile/sched_priority`
//! sets every function at once and may not select `high` (xe_sriov_pf_sysfs.c
//! `profile_vf_attr_is_visible`, `sched_priority_bulk_high_allowed`).

use std::collections::BTreeSet;

use mdev_types::model::{Gpu, Inventory};
use vgpu_host::{Host, paths};

use super::common::{self, Slot};
use super::intel_quanta::{function_dir, new_plan, plan_quanta, read_state, uncovered_note};
use super::sriov_pf::{PfVendor, SriovPfBackend, SriovPfBase};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::profile::Priority;
use crate::sched::{
    PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, Setting, SettingTarget,
    TakesEffect,
};

/// The PF driver that provides `sriov_admin` (drivers/gpu/drm/xe/xe_pci.c).
const DRIVER: &str = "xe";

/// An xe PF with `sriov_admin`.
#[derive(Debug, Clone)]
pub(crate) struct Xe {
    /// `<pf>/sriov_admin`.
    admin: String,
}

/// An xe PF whose `sriov_admin` directory exists.
pub(crate) fn detect(host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = common::pci_on(gpu, DRIVER) else {
        return Ok(None);
    };
    // The ABI file: sriov_admin appears when the device is an SR-IOV PF managed by xe.
    if !host.exists(&paths::pci_attr(&pf, "sriov_admin")) {
        return Ok(None);
    }
    let Some(base) = SriovPfBase::of(inv, gpu, pf) else {
        return Ok(None);
    };
    let admin = format!("{}/sriov_admin", paths::pci_device(&pf).display());
    Ok(Some(SriovPfBackend::boxed(base, Xe { admin })))
}

impl Xe {
    /// `sriov_admin/{pf,vfN}/profile/<knob>`; function 0 is the PF.
    fn knob_path(&self, func: u32, knob: &str) -> String {
        format!("{}/{}/profile/{knob}", self.admin, function_dir(func))
    }

    fn priority_setting(&self, plan: &mut SchedPlan) {
        let asked: BTreeSet<Priority> = plan.slots.iter().filter_map(|s| s.priority).collect();
        if asked.is_empty() {
            return;
        }
        let all: BTreeSet<Priority> = plan
            .slots
            .iter()
            .map(|s| s.priority.unwrap_or(Priority::Normal))
            .collect();
        let Some(p) = all.iter().next().copied().filter(|_| all.len() == 1) else {
            plan.refusals.push(SchedRefusal::gpu(
                "priority-per-vf",
                "the VFs ask for different priorities, but xe sets VF priority only for all functions at once (.bulk_profile/sched_priority; a VF's own sched_priority is read-only): give every VF the same priority",
            ));
            return;
        };
        if p == Priority::High {
            plan.refusals.push(SchedRefusal::gpu(
                "priority-high",
                "xe lets only the PF run at high priority; VFs take low or normal",
            ));
            return;
        }
        plan.settings.push(Setting {
            target: SettingTarget::Sysfs {
                path: format!("{}/.bulk_profile/sched_priority", self.admin),
            },
            value: p.as_str().to_string(),
            takes_effect: TakesEffect::Now,
        });
        plan.notes.push(format!(
            "priority {p} is set for every function through .bulk_profile"
        ));
    }
}

impl PfVendor for Xe {
    const KIND: BackendKind = BackendKind::IntelXeSriov;

    fn interface(&self, _base: &SriovPfBase) -> String {
        "SR-IOV VFs through vfio-pci, provisioned in sriov_admin".to_string()
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "per-VF exec_quantum_ms and preempt_timeout_us (GuC)".to_string(),
            per_slot_weights: true,
            priorities: true,
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
        plan_quanta(&mut plan, opts, base, &|f, knob| self.knob_path(f, knob));
        self.priority_setting(&mut plan);
        if base.num_vfs == 0 {
            plan.notes.push(format!(
                "no VF is enabled on {}: the quanta hold for the VFs enabled later (set sriov_drivers_autoprobe=0 before sriov_numvfs)",
                base.pf
            ));
        }
        plan.notes.extend(uncovered_note(&plan, slots));
        plan.check_tolerance();
        plan
    }

    fn read_back(&self, base: &SriovPfBase, host: &dyn Host) -> Result<SchedState, BackendError> {
        let mut st = read_state(host, base, Self::KIND, &|f, k| self.knob_path(f, k), true)?;
        if base.vfs.is_empty() {
            st.notes.push(format!("no VF is enabled on {}", base.pf));
        }
        Ok(st)
    }
}
