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

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory};
use vgpu_host::{Host, paths};

use super::common::{self, Slot, VfEnable, assign, slot_plans};
use super::intel_quanta::{plan_quanta, read_state, uncovered_note};
use super::{
    Backend, BackendError, BackendKind, Capabilities, CreateRequest, Created, DetectResult,
    SchedCaps,
};
use crate::profile::{self, Priority};
use crate::sched::{
    PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, Setting, SettingTarget,
    TakesEffect,
};

/// The PF driver that provides `sriov_admin` (drivers/gpu/drm/xe/xe_pci.c).
const DRIVER: &str = "xe";

/// An xe PF with `sriov_admin`.
#[derive(Debug, Clone)]
pub struct XeBackend {
    gpu: String,
    pf: PciAddress,
    total_vfs: u32,
    num_vfs: u32,
    vfs: Vec<PciAddress>,
}

/// An xe PF whose `sriov_admin` directory exists.
pub(crate) fn detect(host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = gpu.pci else { return Ok(None) };
    if gpu.driver.as_deref() != Some(DRIVER) {
        return Ok(None);
    }
    // The ABI file: sriov_admin appears when the device is an SR-IOV PF managed by xe.
    if !host.exists(&paths::pci_attr(&pf, "sriov_admin")) {
        return Ok(None);
    }
    let Some(sriov) = common::device(inv, &pf).and_then(|d| d.sriov.clone()) else {
        return Ok(None);
    };
    Ok(Some(Box::new(XeBackend {
        gpu: gpu.id.clone(),
        pf,
        total_vfs: sriov.total_vfs,
        num_vfs: sriov.num_vfs,
        vfs: sriov.vfs,
    })))
}

impl XeBackend {
    fn admin(&self) -> String {
        format!("{}/sriov_admin", paths::pci_device(&self.pf).display())
    }

    /// `sriov_admin/{pf,vfN}/profile/<knob>`; function 0 is the PF.
    fn knob_path(&self, func: u32, knob: &str) -> String {
        let f = if func == 0 {
            "pf".to_string()
        } else {
            format!("vf{func}")
        };
        format!("{}/{f}/profile/{knob}", self.admin())
    }

    /// `vf1…vfN`: the enabled VFs, or every possible VF while none is enabled.
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
                path: format!("{}/.bulk_profile/sched_priority", self.admin()),
            },
            value: common::priority_name(p).to_string(),
            takes_effect: TakesEffect::Now,
        });
        plan.notes.push(format!(
            "priority {} is set for every function through .bulk_profile",
            common::priority_name(p)
        ));
    }
}

impl Backend for XeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::IntelXeSriov
    }

    fn gpu(&self) -> &str {
        &self.gpu
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            backend: self.kind(),
            gpu: self.gpu.clone(),
            interface: "SR-IOV VFs through vfio-pci, provisioned in sriov_admin".to_string(),
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
                priorities: true,
                reserve: false,
                runtime: true,
            },
        }
    }

    fn create(&self, host: &dyn Host, req: &CreateRequest) -> Result<Created, BackendError> {
        common::create_vf_target(host, &self.pf, req, VfEnable::Sysfs, self)
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        common::destroy_vf(host, created, self)
    }

    fn enable_vfs(&self, host: &dyn Host, num_vfs: u32) -> Result<(), BackendError> {
        common::enable_vfs(host, &self.pf, num_vfs, VfEnable::Sysfs, self)
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
        self.priority_setting(&mut plan);
        if self.num_vfs == 0 {
            plan.notes.push(format!(
                "no VF is enabled on {}: the quanta hold for the VFs enabled later (set sriov_drivers_autoprobe=0 before sriov_numvfs)",
                self.pf
            ));
        }
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
        let mut st = read_state(host, st, vfs, &|f, k| self.knob_path(f, k), true)?;
        if self.vfs.is_empty() {
            st.notes.push(format!("no VF is enabled on {}", self.pf));
        }
        Ok(st)
    }
}
