//! Intel GVT-g: mediated vGPUs of an i915 iGPU (types `i915-GVTg_V5_{1,2,4,8}`, `…V4_*` on gen8).
//!
//! The weight is a property of the type: `intel_vgpu_configs` gives type `_N` weight `16 / N`
//! (V5_8 → 2, V5_4 → 4, V5_2 → 8, V5_1 → 16) and the description prints it (drivers/gpu/drm/i915/gvt/
//! vgpu.c). The scheduler gives each vGPU `100 ms × weight / Σweight` per balance period
//! (gvt/sched_policy.c `gvt_balance_timeslice`, `GVT_TS_BALANCE_PERIOD_MS` 100). So a plan chooses,
//! for each vGPU still to be created, the type whose fixed weight brings the shares closest to the
//! requested ones; existing vGPUs keep their type.

use mdev_types::model::{Gpu, Inventory};
use mdev_types::parse::TypeDescription;
use vgpu_host::Host;

use super::common::{self, Slot, slot_plans};
use super::mdev_parent::{MdevParentBackend, MdevParentBase, MdevVendor};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState, SlotState};

/// `GVT_TS_BALANCE_PERIOD_MS`.
const BALANCE_PERIOD_MS: f64 = 100.0;
/// Type ids of GVT-g (kvmgt.c registers `i915-` + the config name).
const TYPE_PREFIX: &str = "i915-GVTg_";
/// Combinations tried exhaustively up to this many; beyond, types are chosen slot by slot.
const MAX_COMBINATIONS: usize = 200_000;

/// One GVT-g type with its fixed weight and what is left of it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GvtType {
    id: String,
    weight: u32,
    available: u32,
}

/// The GVT-g types of an i915 mdev parent.
#[derive(Debug, Clone)]
pub(crate) struct Gvt {
    types: Vec<GvtType>,
}

/// A GPU on i915 whose mdev parent offers `i915-GVTg_*` types with parseable descriptions.
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    if gpu.driver.as_deref() != Some("i915") {
        return Ok(None);
    }
    let Some(parent) = inv.own_parent(gpu) else {
        return Ok(None);
    };
    let types: Vec<GvtType> = parent
        .types
        .iter()
        .filter(|t| t.id.as_str().starts_with(TYPE_PREFIX))
        .filter_map(|t| match &t.details {
            TypeDescription::Gvt(d) => Some(GvtType {
                id: t.id.to_string(),
                weight: d.weight,
                available: t.available_instances,
            }),
            _ => None,
        })
        .collect();
    if types.is_empty() {
        return Ok(None);
    }
    Ok(Some(MdevParentBackend::boxed(gpu, parent, Gvt { types })))
}

impl Gvt {
    fn weight_of(&self, type_id: &str) -> Option<u32> {
        self.types
            .iter()
            .find(|t| t.id == type_id)
            .map(|t| t.weight)
    }

    /// The type of an existing instance.
    fn instance_type(base: &MdevParentBase, uuid: &str) -> Option<String> {
        base.parent
            .types
            .iter()
            .find(|t| t.instances.iter().any(|u| u.to_string() == uuid))
            .map(|t| t.id.to_string())
    }

    /// Whether `counts` (per type, in `self.types` order) can be created together: each within its
    /// own `available_instances`, and — since the types draw on the same graphics memory and fences —
    /// the fractions of each type's availability summing to at most 1 (an approximation: sysfs shows
    /// per-type availability, not the pools behind it).
    fn fits(&self, counts: &[u32]) -> bool {
        let mut frac = 0.0;
        for (t, c) in self.types.iter().zip(counts) {
            if *c == 0 {
                continue;
            }
            if *c > t.available {
                return false;
            }
            frac += f64::from(*c) / f64::from(t.available);
        }
        frac <= 1.0 + 1e-9
    }

    /// Chooses a type index for each new slot: least max share error, then the least resources.
    fn choose(&self, fixed: &[u32], want: &[f64], new: usize) -> Option<Vec<usize>> {
        let nt = self.types.len();
        let score = |choice: &[usize]| -> Option<(f64, f64)> {
            let mut counts = vec![0u32; nt];
            for c in choice {
                counts[*c] += 1;
            }
            if !self.fits(&counts) {
                return None;
            }
            let ws: Vec<u32> = fixed
                .iter()
                .copied()
                .chain(choice.iter().map(|c| self.types[*c].weight))
                .collect();
            let total: f64 = ws.iter().map(|w| f64::from(*w)).sum();
            let err = ws.iter().zip(want).fold(0.0, |m, (w, r)| {
                f64::max(m, (f64::from(*w) / total - r).abs())
            });
            let used: f64 = choice
                .iter()
                .map(|c| 1.0 / f64::from(self.types[*c].available.max(1)))
                .sum();
            Some((err, used))
        };
        let combos = nt.checked_pow(u32::try_from(new).ok()?);
        let mut best: Option<((f64, f64), Vec<usize>)> = None;
        let mut consider = |choice: Vec<usize>| {
            if let Some(s) = score(&choice) {
                let better = best
                    .as_ref()
                    .is_none_or(|(b, _)| s.0 < b.0 - 1e-12 || (s.0 <= b.0 + 1e-12 && s.1 < b.1));
                if better {
                    best = Some((s, choice));
                }
            }
        };
        match combos {
            Some(n) if n <= MAX_COMBINATIONS => {
                for k in 0..n {
                    let mut rest = k;
                    let choice = (0..new)
                        .map(|_| {
                            let c = rest % nt;
                            rest /= nt;
                            c
                        })
                        .collect();
                    consider(choice);
                }
            }
            _ => {
                // Slot by slot: the type whose weight is nearest the slot's requested share of the
                // largest weight.
                let max_w = self.types.iter().map(|t| t.weight).max().unwrap_or(1);
                let max_r = want.iter().cloned().fold(0.0, f64::max).max(1e-9);
                let choice = want[fixed.len()..]
                    .iter()
                    .map(|r| {
                        let target = r / max_r * f64::from(max_w);
                        (0..nt)
                            .min_by(|a, b| {
                                let da = (f64::from(self.types[*a].weight) - target).abs();
                                let db = (f64::from(self.types[*b].weight) - target).abs();
                                da.total_cmp(&db)
                            })
                            .unwrap_or(0)
                    })
                    .collect();
                consider(choice);
            }
        }
        best.map(|(_, c)| c)
    }
}

impl MdevVendor for Gvt {
    const KIND: BackendKind = BackendKind::IntelGvtG;
    const SLOT_NOUN: &'static str = "vGPU";

    fn interface(&self, base: &MdevParentBase) -> String {
        format!(
            "GVT-g mdev parent {} ({} types)",
            base.parent.name,
            self.types.len()
        )
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "the type's fixed weight (16 / instances), chosen at create".to_string(),
            per_slot_weights: true,
            priorities: false,
            reserve: false,
            runtime: false,
        }
    }

    /// Only the GVT-g types count: the most any of them has left.
    fn free(&self, _base: &MdevParentBase) -> u32 {
        self.types.iter().map(|t| t.available).max().unwrap_or(0)
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
            "weighted time slices (type weights)",
            opts.tolerance,
        );
        plan.slots = slot_plans(pairs);
        plan.refusals = refusals;
        plan.refusals
            .extend(common::refuse_priorities(&plan.slots, "GVT-g"));
        if opts.reserve {
            plan.refusals.push(SchedRefusal::gpu(
                "reserve-unsupported",
                "GVT-g divides each 100 ms period among the vGPUs that have work; a share cannot be reserved: drop --reserve",
            ));
        }
        // Existing instances first (their type is fixed), then the new slots in request order.
        let mut order: Vec<usize> = (0..plan.slots.len()).collect();
        order.sort_by_key(|i| plan.slots[*i].device.is_none());
        let fixed: Vec<u32> = order
            .iter()
            .map_while(|i| plan.slots[*i].device.as_deref())
            .map(|u| {
                Self::instance_type(base, u)
                    .and_then(|t| self.weight_of(&t))
                    .unwrap_or(0)
            })
            .collect();
        let want: Vec<f64> = order
            .iter()
            .map(|i| plan.slots[*i].requested_share)
            .collect();
        let new = order.len() - fixed.len();
        let Some(choice) = self.choose(&fixed, &want, new) else {
            plan.refusals.push(SchedRefusal::gpu(
                "no-type-combination",
                format!(
                    "no combination of {} new GVT-g vGPUs fits what is left on {} (available: {})",
                    new,
                    base.parent.name,
                    self.types
                        .iter()
                        .map(|t| format!("{} {}", t.id, t.available))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            return plan;
        };
        let mut types: Vec<Option<String>> = vec![None; plan.slots.len()];
        for (k, i) in order.iter().enumerate() {
            types[*i] = match plan.slots[*i].device.as_deref() {
                Some(u) => Self::instance_type(base, u),
                None => choice
                    .get(k - fixed.len())
                    .map(|c| self.types[*c].id.clone()),
            };
        }
        let weights: Vec<u32> = types
            .iter()
            .map(|t| t.as_deref().and_then(|t| self.weight_of(t)).unwrap_or(0))
            .collect();
        let total: u32 = weights.iter().sum();
        let eff: Vec<f64> = weights
            .iter()
            .map(|w| f64::from(*w) / f64::from(total.max(1)))
            .collect();
        for (s, t) in plan.slots.iter_mut().zip(types) {
            s.mdev_type = t;
        }
        common::set_effective(&mut plan.slots, &eff);
        for s in &mut plan.slots {
            s.quantum_ms = s
                .effective_share
                .map(|e| (e * BALANCE_PERIOD_MS).round() as u32);
        }
        plan.period_ms = Some(BALANCE_PERIOD_MS);
        plan.worst_case_wait_ms = Some(BALANCE_PERIOD_MS);
        plan.notes.push(
            "the weights take effect by creating each new vGPU with its type; nothing is written now"
                .to_string(),
        );
        plan.check_tolerance();
        plan
    }

    fn read_back(
        &self,
        base: &MdevParentBase,
        _host: &dyn Host,
    ) -> Result<SchedState, BackendError> {
        let mut st = SchedState::new(
            &base.gpu,
            Self::KIND.as_str(),
            "weighted time slices (type weights)",
        );
        let slots = base.instance_slots(0);
        let weights: Vec<u32> = slots
            .iter()
            .map(|s| {
                Self::instance_type(base, &s.name)
                    .and_then(|t| self.weight_of(&t))
                    .unwrap_or(0)
            })
            .collect();
        let total: u32 = weights.iter().sum();
        for (s, w) in slots.into_iter().zip(weights) {
            st.slots.push(SlotState {
                quantum_ms: None,
                preempt_timeout_us: None,
                priority: None,
                weight: Some(w),
                share: (total > 0).then(|| f64::from(w) / f64::from(total)),
                device: s.device,
                slot: s.name,
            });
        }
        Ok(st)
    }
}
