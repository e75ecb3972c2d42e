//! Per-VF execution quanta for Intel SR-IOV GPUs (GuC VF scheduling), shared by the xe and the
//! out-of-tree i915 interface: both expose `exec_quantum_ms` and `preempt_timeout_us` per function.
//!
//! Facts:
//! * Intel Data Center GPU Flex Series SR-IOV profile guide (the published Flex 170 profiles): VF exec
//!   quantum `max(32 / VFs, 1)` ms — a 32 ms round split over the VFs; VF preemption timeout 128000 µs
//!   with one VF, else `max(64000 / VFs, 16000)` µs; PF exec quantum 20 ms and preemption timeout
//!   20000 µs.
//! * drivers/gpu/drm/xe/abi/guc_klvs_abi.h: `GUC_KLV_VF_CFG_EXEC_QUANTUM_MAX_VALUE` 100000 ms; 0 means
//!   unlimited ("infinite") for both knobs, so a quantum is never programmed as 0.

use vgpu_host::{Host, HostExt};

use super::common::{Slot, selected_choice, slot_plans};
use super::sriov_pf::SriovPfBase;
use super::{BackendError, BackendKind};
use crate::sched::rr::{RrSlot, wait_bound_us};
use crate::sched::share::{QuantaLimits, proportional_quanta};
use crate::sched::{
    PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, Setting, SettingTarget,
    SlotState, TakesEffect, pct,
};

/// The policy both interfaces report.
pub(crate) const POLICY: &str = "proportional exec quanta (GuC VF scheduling)";

/// Round length of Intel's Flex profiles: 32 ms split over the VFs.
pub(crate) const FLEX_ROUND_MS: u32 = 32;
/// PF exec quantum of Intel's Flex profiles.
pub(crate) const PF_EXEC_QUANTUM_MS: u32 = 20;
/// PF preemption timeout of Intel's Flex profiles.
pub(crate) const PF_PREEMPT_TIMEOUT_US: u32 = 20_000;
/// `GUC_KLV_VF_CFG_EXEC_QUANTUM_MAX_VALUE`.
pub(crate) const EXEC_QUANTUM_MAX_MS: u32 = 100_000;
/// The longest round the planner lengthens to (bounds the worst-case wait; not a vendor limit).
pub(crate) const MAX_ROUND_MS: u32 = 4_000;

/// The Flex profile guide's VF preemption timeout for `vfs` VFs.
pub(crate) fn vf_preempt_timeout_us(vfs: u32) -> u32 {
    if vfs <= 1 {
        128_000
    } else {
        (64_000 / vfs).max(16_000)
    }
}

/// The directory of function `func` under the interface's VF tree: `pf` for 0, else `vfN`.
pub(crate) fn function_dir(func: u32) -> String {
    if func == 0 {
        "pf".to_string()
    } else {
        format!("vf{func}")
    }
}

/// A plan of [`POLICY`] for requests matched to VFs (`pairs`), with the refusals of matching and no
/// quanta yet.
pub(crate) fn new_plan(
    base: &SriovPfBase,
    kind: BackendKind,
    pairs: &[(Slot, &SchedRequest)],
    refusals: Vec<SchedRefusal>,
    opts: &PlanOptions,
) -> SchedPlan {
    let mut plan = SchedPlan::new(&base.gpu, kind.as_str(), POLICY, opts.tolerance);
    plan.slots = slot_plans(pairs);
    plan.refusals = refusals;
    plan
}

/// Fills quanta, preemption timeouts, effective shares, period and worst-case wait into `plan` for the
/// slots already in it (named `vfN`), and emits one setting per knob through `knob_path(function,
/// knob)` (function 0 is the PF). The timeouts are sized for the enabled VFs, or for the planned ones
/// while none is enabled.
pub(crate) fn plan_quanta(
    plan: &mut SchedPlan,
    opts: &PlanOptions,
    base: &SriovPfBase,
    knob_path: &dyn Fn(u32, &str) -> String,
) {
    if plan.slots.is_empty() {
        return;
    }
    let vfs = if base.num_vfs > 0 {
        base.num_vfs
    } else {
        u32::try_from(plan.slots.len()).unwrap_or(u32::MAX)
    };
    let func_of = |s: &crate::sched::SlotPlan| -> Option<u32> {
        s.slot.strip_prefix("vf").and_then(|n| n.parse().ok())
    };
    if opts.reserve {
        plan.refusals.push(SchedRefusal::gpu(
            "reserve-unsupported",
            "the GuC schedules only VFs that have work, so an idle VF's share cannot be reserved: drop --reserve",
        ));
    }
    let weights: Vec<u32> = plan.slots.iter().map(|s| s.weight).collect();
    let limits = QuantaLimits {
        min: 1,
        max: EXEC_QUANTUM_MAX_MS,
        base_period: opts.period_ms.unwrap_or(FLEX_ROUND_MS),
        max_period: MAX_ROUND_MS.max(opts.period_ms.unwrap_or(0)),
    };
    let quanta = match proportional_quanta(&weights, limits, opts.tolerance) {
        Ok(q) => q,
        Err(Some(best)) => {
            plan.notes.push(format!(
                "no round up to {} ms gets every VF within {}; the closest is {} ms",
                limits.max_period,
                pct(opts.tolerance),
                best.period
            ));
            best
        }
        Err(None) => {
            plan.refusals.push(SchedRefusal::gpu(
                "no-quanta",
                format!(
                    "{} VFs cannot get quanta of at least 1 ms within a {} ms round",
                    weights.len(),
                    limits.max_period
                ),
            ));
            return;
        }
    };
    let pt = vf_preempt_timeout_us(vfs);
    let total: u32 = quanta.quanta.iter().sum();
    for (s, q) in plan.slots.iter_mut().zip(&quanta.quanta) {
        let eff = f64::from(*q) / f64::from(total.max(1));
        s.quantum_ms = Some(*q);
        s.preempt_timeout_us = Some(pt);
        s.effective_share = Some(eff);
        s.error = Some(eff - s.requested_share);
    }
    plan.period_ms = Some(f64::from(quanta.period));
    if quanta.period != limits.base_period {
        plan.notes.push(format!(
            "round lengthened from {} ms to {} ms so integer quanta stay within {} of the weights",
            limits.base_period,
            quanta.period,
            pct(opts.tolerance)
        ));
    }
    // Worst case: every other VF and the PF run their quantum and their whole preemption timeout.
    let mut model: Vec<RrSlot> = plan
        .slots
        .iter()
        .map(|s| rr_slot(s.quantum_ms.unwrap_or(0), pt))
        .collect();
    model.push(rr_slot(PF_EXEC_QUANTUM_MS, PF_PREEMPT_TIMEOUT_US));
    let worst = (0..plan.slots.len())
        .map(|i| wait_bound_us(&model, i))
        .max()
        .unwrap_or(0);
    plan.worst_case_wait_ms = Some(worst as f64 / 1000.0);
    plan.notes.push(format!(
        "shares assume the host (PF) is idle; when it has work it runs up to {PF_EXEC_QUANTUM_MS} ms per round"
    ));
    let sysfs = |path: String, value: u32| Setting {
        target: SettingTarget::Sysfs { path },
        value: value.to_string(),
        takes_effect: TakesEffect::Now,
    };
    plan.settings
        .push(sysfs(knob_path(0, "exec_quantum_ms"), PF_EXEC_QUANTUM_MS));
    plan.settings.push(sysfs(
        knob_path(0, "preempt_timeout_us"),
        PF_PREEMPT_TIMEOUT_US,
    ));
    let per_slot: Vec<(u32, u32, u32)> = plan
        .slots
        .iter()
        .filter_map(|s| Some((func_of(s)?, s.quantum_ms?, s.preempt_timeout_us?)))
        .collect();
    for (f, q, t) in per_slot {
        plan.settings
            .push(sysfs(knob_path(f, "exec_quantum_ms"), q));
        plan.settings
            .push(sysfs(knob_path(f, "preempt_timeout_us"), t));
    }
}

fn rr_slot(quantum_ms: u32, pt_us: u32) -> RrSlot {
    RrSlot {
        quantum_us: u64::from(quantum_ms) * 1000,
        preempt_timeout_us: u64::from(pt_us),
        overrun_us: 0,
        load: crate::sched::rr::Load::Busy,
        reserved: false,
    }
}

/// A note naming enabled VFs (`slots` with a device) that the plan leaves out, if any.
pub(crate) fn uncovered_note(plan: &SchedPlan, slots: &[Slot]) -> Option<String> {
    let left: Vec<&str> = slots
        .iter()
        .filter(|s| s.device.is_some() && !plan.slots.iter().any(|p| p.slot == s.name))
        .map(|s| s.name.as_str())
        .collect();
    (!left.is_empty()).then(|| {
        format!(
            "{} enabled but not in the plan: they keep their quanta (0 = unlimited, which lets a busy VF hold the engine until it yields); give them weights too",
            left.join(", ")
        )
    })
}

/// Effective shares from read-back quanta of the enabled VFs (`None` when any is 0 = unlimited).
pub(crate) fn shares_from_quanta(quanta: &[u32]) -> Option<Vec<f64>> {
    if quanta.contains(&0) {
        return None;
    }
    let v: Vec<u64> = quanta.iter().map(|q| u64::from(*q)).collect();
    Some(crate::sched::share::shares_of(&v))
}

/// Reads `exec_quantum_ms`, `preempt_timeout_us` (and, with `priority`, `sched_priority`) of the PF
/// (function 0) and the enabled VFs into a state of [`POLICY`] with shares.
pub(crate) fn read_state(
    host: &dyn Host,
    base: &SriovPfBase,
    kind: BackendKind,
    knob_path: &dyn Fn(u32, &str) -> String,
    priority: bool,
) -> Result<SchedState, BackendError> {
    let mut st = SchedState::new(&base.gpu, kind.as_str(), POLICY);
    let read = |path: &str| {
        host.read_optional(std::path::Path::new(path))
            .map_err(|e| BackendError::host(&base.gpu, e))
    };
    let funcs = std::iter::once(Slot::new("pf", None)).chain(base.enabled_slots());
    for (f, Slot { name, device }) in (0..).zip(funcs) {
        let mut num = |knob: &str| -> Result<Option<u32>, BackendError> {
            let path = knob_path(f, knob);
            let v = read(&path)?;
            if let Some(v) = &v {
                st.raw.push((path, v.clone()));
            }
            Ok(v.and_then(|t| t.parse().ok()))
        };
        let q = num("exec_quantum_ms")?;
        let t = num("preempt_timeout_us")?;
        let p = if priority {
            read(&knob_path(f, "sched_priority"))?.map(|t| selected_choice(&t))
        } else {
            None
        };
        st.slots.push(SlotState {
            slot: name,
            device,
            quantum_ms: q,
            preempt_timeout_us: t,
            priority: p,
            weight: None,
            share: None,
        });
    }
    let vf_quanta: Vec<u32> = st.slots[1..]
        .iter()
        .map(|s| s.quantum_ms.unwrap_or(0))
        .collect();
    match shares_from_quanta(&vf_quanta) {
        Some(shares) => {
            for (s, sh) in st.slots[1..].iter_mut().zip(shares) {
                s.share = Some(sh);
            }
        }
        None => st.notes.push(
            "a VF has exec_quantum_ms 0 (unlimited: it runs until it yields), so shares are not bounded; `vgpuctl sched apply` programs quanta".to_string(),
        ),
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flex_profile_timeouts() {
        // Intel Flex profile guide: 128000 µs for one VF; 64000/VFs floored at 16000 otherwise.
        assert_eq!(vf_preempt_timeout_us(1), 128_000);
        assert_eq!(vf_preempt_timeout_us(2), 32_000);
        assert_eq!(vf_preempt_timeout_us(4), 16_000);
        assert_eq!(vf_preempt_timeout_us(16), 16_000);
    }

    #[test]
    fn unlimited_quanta_have_no_share() {
        assert_eq!(shares_from_quanta(&[8, 0]), None);
        assert_eq!(shares_from_quanta(&[8, 24]), Some(vec![0.25, 0.75]));
    }
}
