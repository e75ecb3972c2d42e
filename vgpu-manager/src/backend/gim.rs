//! AMD GIM (GPU-IOV Module, MxGPU SR-IOV; github.com/amd/MxGPU-Virtualization): the PF is bound to
//! `gim`, which enables its VFs when it loads and schedules them by world switch.
//!
//! Facts (the README and module parameters of github.com/amd/MxGPU-Virtualization):
//! * the open GIM for MI300-class parts takes module parameters `vf_num` (1–31), `sch_policy`
//!   (1 HW solid, 2 HW liquid, 3 SW fairness, 4 SW round-robin, 5 hybrid liquid) and
//!   `fullaccess_timeout`;
//! * the older GIM reads `/etc/gim_config` with `vf_num`, `vf_fb`, `sched_interval` (ms; 0 means the
//!   6 ms default; at most 2000) and `sched_option`.
//!
//! Neither has a per-VF weight: every VF gets the same time slice, so only equal weights are honoured.
//! Assumptions: the parameters are readable in `/sys/module/gim/parameters/` (declared with read
//! permission); "solid" keeps an idle VF's slice (a reserved share) while "round-robin" passes it on;
//! a GIM without a visible `sch_policy` parameter but with other parameters is the older one.

use std::path::Path;

use mdev_types::model::{Gpu, Inventory};
use vgpu_host::{Host, HostExt};

use super::common::{self, Slot, slot_plans};
use super::sriov_pf::{PfVendor, SriovPfBackend, SriovPfBase, VfEnable};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::sched::{
    PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, Setting, SettingTarget,
    SlotState, TakesEffect,
};

const DRIVER: &str = "gim";
const PARAMS_DIR: &str = "/sys/module/gim/parameters";
const GIM_CONFIG: &str = "/etc/gim_config";
/// `vf_num` range.
const MAX_VFS: u32 = 31;
/// `sched_interval` 0 means this many ms.
const DEFAULT_INTERVAL_MS: u32 = 6;
/// Largest `sched_interval`.
const MAX_INTERVAL_MS: u32 = 2000;
/// `sch_policy` values.
const POLICIES: [(u32, &str); 5] = [
    (1, "HW solid"),
    (2, "HW liquid"),
    (3, "SW fairness"),
    (4, "SW round-robin"),
    (5, "hybrid liquid"),
];
/// Work-conserving equal slices.
const ROUND_ROBIN: u32 = 4;
/// Slices kept for idle VFs.
const SOLID: u32 = 1;

/// An MxGPU PF on GIM.
#[derive(Debug, Clone)]
pub(crate) struct Gim {
    /// The module parameters readable at detection, `(name, value)`.
    params: Vec<(String, String)>,
}

/// A PF bound to `gim` with SR-IOV.
pub(crate) fn detect(host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pf) = common::pci_on(gpu, DRIVER) else {
        return Ok(None);
    };
    let Some(base) = SriovPfBase::of(inv, gpu, pf) else {
        return Ok(None);
    };
    let mut params = Vec::new();
    for name in host.list_optional(Path::new(PARAMS_DIR))? {
        if let Some(v) = host.read_optional(&Path::new(PARAMS_DIR).join(&name))? {
            params.push((name, v));
        }
    }
    Ok(Some(SriovPfBackend::boxed(base, Gim { params })))
}

fn policy_name(p: u32) -> String {
    POLICIES.iter().find(|(n, _)| *n == p).map_or_else(
        || format!("sch_policy {p} (undocumented)"),
        |(_, s)| (*s).to_string(),
    )
}

impl Gim {
    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The older GIM: parameters visible, none of them `sch_policy`.
    fn legacy(&self) -> bool {
        !self.params.is_empty() && self.param("sch_policy").is_none()
    }

    fn setting(&self, key: &str, value: String) -> Setting {
        let target = if self.legacy() {
            SettingTarget::ConfigFile {
                path: GIM_CONFIG.to_string(),
                key: key.to_string(),
            }
        } else {
            SettingTarget::ModuleOption {
                module: DRIVER.to_string(),
                option: key.to_string(),
            }
        };
        Setting {
            target,
            value,
            takes_effect: TakesEffect::ModuleLoad,
        }
    }
}

/// GIM makes its VFs itself when it loads.
const GIM_VFS: VfEnable = VfEnable::AtModuleLoad(
    "GIM enables VFs only when it loads, from vf_num: set `options gim vf_num=N` (or vf_num in /etc/gim_config for the older GIM) and reload gim",
);

impl PfVendor for Gim {
    const KIND: BackendKind = BackendKind::AmdGim;

    fn interface(&self, _base: &SriovPfBase) -> String {
        "MxGPU SR-IOV VFs through vfio-pci, enabled by GIM at load (vf_num)".to_string()
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: if self.legacy() {
                "sched_interval in /etc/gim_config (equal slices)".to_string()
            } else {
                "sch_policy module parameter (equal slices)".to_string()
            },
            per_slot_weights: false,
            priorities: false,
            reserve: true,
            runtime: false,
        }
    }

    /// The enabled VFs, then the ones `vf_num` could add up to GIM's limit.
    fn slots(&self, base: &SriovPfBase) -> Vec<Slot> {
        base.enabled_slots()
            .chain(
                (u32::try_from(base.vfs.len()).unwrap_or(u32::MAX) + 1
                    ..=base.total_vfs.min(MAX_VFS))
                    .map(|i| Slot::new(format!("vf{i}"), None)),
            )
            .collect()
    }

    fn max_slots(&self, base: &SriovPfBase) -> u32 {
        base.total_vfs.min(MAX_VFS)
    }

    fn vf_enable(&self) -> VfEnable {
        GIM_VFS
    }

    fn plan(
        &self,
        base: &SriovPfBase,
        _slots: &[Slot],
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan {
        let policy = if opts.reserve { SOLID } else { ROUND_ROBIN };
        let mut plan = SchedPlan::new(
            &base.gpu,
            Self::KIND.as_str(),
            &policy_name(policy),
            opts.tolerance,
        );
        plan.slots = slot_plans(pairs);
        plan.refusals = refusals;
        plan.refusals
            .extend(common::refuse_priorities(&plan.slots, "GIM"));
        if let Some(r) = common::refuse_unequal(
            &plan.slots,
            "GIM gives every VF the same time slice (sch_policy has no per-VF weight); put differently weighted guests on separate GPUs",
        ) {
            plan.refusals.push(r);
        }
        let n = u32::try_from(plan.slots.len()).unwrap_or(u32::MAX);
        if n == 0 {
            return plan;
        }
        let eff = vec![1.0 / f64::from(n); plan.slots.len()];
        common::set_effective(&mut plan.slots, &eff);
        let current = u32::try_from(base.vfs.len()).unwrap_or(u32::MAX);
        let vf_num = n.max(current);
        plan.settings
            .push(self.setting("vf_num", vf_num.to_string()));
        if self.legacy() {
            let interval = opts.time_slice_ms.unwrap_or(0);
            if interval > MAX_INTERVAL_MS {
                plan.refusals.push(SchedRefusal::gpu(
                    "time-slice-range",
                    format!("sched_interval {interval} ms is above GIM's {MAX_INTERVAL_MS} ms"),
                ));
            }
            plan.settings
                .push(self.setting("sched_interval", interval.to_string()));
            let slice = if interval == 0 {
                DEFAULT_INTERVAL_MS
            } else {
                interval
            };
            plan.period_ms = Some(f64::from(slice * n));
            plan.worst_case_wait_ms = Some(f64::from(slice * (n - 1)));
            if opts.reserve {
                plan.refusals.push(SchedRefusal::gpu(
                    "reserve-unsupported",
                    "the older GIM's sched_option values are not documented here; drop --reserve",
                ));
            }
        } else {
            plan.settings
                .push(self.setting("sch_policy", policy.to_string()));
            if opts.time_slice_ms.is_some() {
                plan.notes.push(
                    "this GIM takes no time-slice parameter: its scheduler sets the slice itself"
                        .to_string(),
                );
            }
        }
        if vf_num != current {
            plan.notes.push(format!(
                "{} VFs are enabled now; vf_num={vf_num} takes effect when gim is reloaded (every VF disappears meanwhile)",
                current
            ));
        }
        plan.notes.push(
            "GIM reads these settings when it loads: reload gim with no VM using its VFs"
                .to_string(),
        );
        plan.check_tolerance();
        plan
    }

    fn read_back(&self, base: &SriovPfBase, host: &dyn Host) -> Result<SchedState, BackendError> {
        let mut st = SchedState::new(&base.gpu, Self::KIND.as_str(), "unknown");
        for name in host
            .list_optional(Path::new(PARAMS_DIR))
            .map_err(|e| BackendError::host(&base.gpu, e))?
        {
            let path = Path::new(PARAMS_DIR).join(&name);
            if let Some(v) = host
                .read_optional(&path)
                .map_err(|e| BackendError::host(&base.gpu, e))?
            {
                st.raw.push((path.display().to_string(), v));
            }
        }
        let policy = st
            .raw
            .iter()
            .find(|(p, _)| p.ends_with("/sch_policy"))
            .and_then(|(_, v)| v.parse::<u32>().ok());
        st.policy = match policy {
            Some(p) => policy_name(p),
            None if self.legacy() => {
                format!("equal slices (sched_interval in {GIM_CONFIG}, not readable from sysfs)")
            }
            None => "unknown (no sch_policy parameter visible)".to_string(),
        };
        let n = base.vfs.len();
        for s in base.enabled_slots() {
            st.slots.push(SlotState {
                slot: s.name,
                device: s.device,
                quantum_ms: None,
                preempt_timeout_us: None,
                priority: None,
                weight: None,
                share: Some(1.0 / n as f64),
            });
        }
        Ok(st)
    }
}
