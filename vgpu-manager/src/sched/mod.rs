//! Time-slice scheduling: turning the `weight` (and optional `priority`) of the vGPUs on one GPU into
//! that GPU's real scheduling knob, and saying how close the result comes.
//!
//! This module is vendor-neutral. It holds
//!
//! * the request and plan types every backend speaks ([`SchedRequest`], [`PlanOptions`], [`SchedPlan`],
//!   [`SlotPlan`], [`Setting`], [`SchedRefusal`], [`ApplyReport`], [`SchedState`]);
//! * the share arithmetic ([`share`]): requested shares from weights, proportional quanta by largest
//!   remainder with the period searched until every slot is within the tolerance;
//! * a deterministic round-robin model ([`rr`]) with quanta, preemption overruns and preemption timeouts,
//!   used by the property tests to show that programmed quanta give every busy slot its requested share
//!   and to bound the worst-case wait.
//!
//! Which knob a GPU has (xe exec quanta, NVIDIA `RmPVMRL`, GVT-g type weights, GIM `sch_policy`) is the
//! business of its backend in [`crate::backend`]; each backend's `plan` returns a [`SchedPlan`].
//!
//! Shares are fractions of the GPU's engine time when every slot is busy (0.0–1.0); "within 1 %" means
//! an absolute difference of at most 0.01 (one percentage point).

use serde::{Deserialize, Serialize};

use crate::profile::Priority;
/// What a GPU's scheduling is now: defined in the client crate, whose `SchedulingView` carries it.
pub use vgpu_client::sched::{SchedState, SlotState};

pub mod rr;
pub mod share;

#[cfg(test)]
mod tests;

/// Default tolerance between requested and effective share: one percentage point.
pub const DEFAULT_TOLERANCE: f64 = 0.01;

/// One vGPU (or VF) that will run on a GPU and how much of it it should get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedRequest {
    /// Which slot the request is for (`vf3`, an mdev UUID, a VF address), as the backend names its slots
    /// ([`SlotPlan::slot`]); `None` takes the next slot in the backend's order.
    pub slot: Option<String>,
    /// Relative weight 1–100 (a profile's `weight`).
    pub weight: u32,
    /// Scheduling priority, when asked for.
    pub priority: Option<Priority>,
    /// Framebuffer of the vGPU in MiB, when known (NVIDIA refuses unequal weights with mixed sizes).
    pub framebuffer_mib: Option<u64>,
    /// Who asked (a profile name), for reports.
    pub label: Option<String>,
}

impl SchedRequest {
    /// A request of `weight` for the next slot, without priority or size.
    pub fn weight(weight: u32) -> Self {
        Self {
            slot: None,
            weight,
            priority: None,
            framebuffer_mib: None,
            label: None,
        }
    }

    /// The request a profile makes: its weight, priority, framebuffer and name.
    pub fn from_profile(profile: &crate::profile::Profile) -> Self {
        Self {
            slot: None,
            weight: profile.weight,
            priority: profile.priority,
            framebuffer_mib: (profile.framebuffer_mib > 0).then_some(profile.framebuffer_mib),
            label: Some(profile.name.clone()),
        }
    }
}

/// Knobs of the planning itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanOptions {
    /// The round length to aim for when quanta are proportional (ms); `None`: the backend's default
    /// (the vendor's published profile). The planner lengthens it when rounding would miss the
    /// tolerance.
    pub period_ms: Option<u32>,
    /// A time slice to use where the scheduler has one global slice (ms); `None`: vendor default.
    pub time_slice_ms: Option<u32>,
    /// Reserve each slot's share even while others are idle (NVIDIA fixed share, GIM solid); default:
    /// work-conserving, idle slots give their time to busy ones.
    pub reserve: bool,
    /// Largest acceptable |effective − requested| share per slot; default [`DEFAULT_TOLERANCE`].
    pub tolerance: f64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            period_ms: None,
            time_slice_ms: None,
            reserve: false,
            tolerance: DEFAULT_TOLERANCE,
        }
    }
}

/// The plan for one slot (a VF or a vGPU).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotPlan {
    /// The backend's name for the slot (`vf1`, `vgpu2`, an mdev UUID).
    pub slot: String,
    /// The device behind it, when it exists (a VF address, an mdev UUID).
    pub device: Option<String>,
    /// Who asked, when known (a profile name).
    pub label: Option<String>,
    /// The requested weight, relative to the other slots' weights on the GPU.
    pub weight: u32,
    /// The requested priority, when any.
    pub priority: Option<Priority>,
    /// weight / sum of weights.
    pub requested_share: f64,
    /// The share the programmed knob gives when every slot is busy; `None` when the device has no
    /// engine to share (virtual sample devices).
    pub effective_share: Option<f64>,
    /// effective − requested (`None` with `effective_share`).
    pub error: Option<f64>,
    /// Execution quantum to program, ms (per-slot quantum schedulers).
    pub quantum_ms: Option<u32>,
    /// Preemption timeout to program, µs (per-slot quantum schedulers).
    pub preempt_timeout_us: Option<u32>,
    /// The type to create the vGPU with, when the weight is a property of the type (GVT-g).
    pub mdev_type: Option<String>,
}

/// When a setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TakesEffect {
    /// Immediately, written to sysfs by `apply`.
    Now,
    /// When the module is next loaded (modprobe configuration): needs a driver reload.
    ModuleLoad,
    /// When the vGPU is created (the choice of type).
    AtCreate,
}

/// Where a setting goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SettingTarget {
    /// A sysfs attribute (kernel path) that `apply` writes.
    Sysfs {
        /// The kernel path of the sysfs attribute.
        path: String,
    },
    /// A module option in modprobe configuration (`options MODULE NAME=VALUE`).
    ModuleOption {
        /// The module (`nvidia`, `gim`).
        module: String,
        /// The option (`NVreg_RegistryDwordsPerDevice`).
        option: String,
    },
    /// A `key=value` line of a driver's own configuration file.
    ConfigFile {
        /// The file (`/etc/gim_config`).
        path: String,
        /// The key of the `key=value` line.
        key: String,
    },
}

/// One value to set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Setting {
    /// Where the value goes: a sysfs attribute, module option or config file line.
    pub target: SettingTarget,
    /// The value to write, as text.
    pub value: String,
    /// When it takes effect.
    pub takes_effect: TakesEffect,
}

/// Something the plan cannot honour, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedRefusal {
    /// The slot concerned, or `None` for the whole GPU.
    pub slot: Option<String>,
    /// A stable code (`unequal-weights`, `priority-unsupported`, …).
    pub code: String,
    /// A sentence naming the numbers and what to change.
    pub reason: String,
}

impl SchedRefusal {
    /// A refusal for the whole GPU.
    pub fn gpu(code: &str, reason: impl Into<String>) -> Self {
        Self {
            slot: None,
            code: code.to_string(),
            reason: reason.into(),
        }
    }

    /// A refusal for one slot.
    pub fn slot(slot: &str, code: &str, reason: impl Into<String>) -> Self {
        Self {
            slot: Some(slot.to_string()),
            code: code.to_string(),
            reason: reason.into(),
        }
    }
}

/// A GPU's scheduling plan: what to program, what each slot gets, and what cannot be honoured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedPlan {
    /// The GPU (`Gpu::id`).
    pub gpu: String,
    /// The backend that made it ([`crate::backend::BackendKind`] spelling).
    pub backend: String,
    /// The scheduling policy chosen, in the vendor's words (`equal share`, `proportional exec quanta`).
    pub policy: String,
    /// Length of one round with every slot busy, ms, when the scheduler has rounds.
    pub period_ms: Option<f64>,
    /// Longest a busy slot waits for its turn, ms, when bounded.
    pub worst_case_wait_ms: Option<f64>,
    /// The tolerance the plan was checked against.
    pub tolerance: f64,
    /// Largest |error| over the slots (0 when no slot has an effective share).
    pub max_error: f64,
    /// One entry per request, in request order.
    pub slots: Vec<SlotPlan>,
    /// What to set, in order.
    pub settings: Vec<Setting>,
    /// What cannot be honoured; `apply` refuses a plan with refusals.
    pub refusals: Vec<SchedRefusal>,
    /// Further facts the operator should know (e.g. a driver reload is needed).
    pub notes: Vec<String>,
}

impl SchedPlan {
    /// An empty plan for `gpu` by `backend` under `policy`.
    pub fn new(gpu: &str, backend: &str, policy: &str, tolerance: f64) -> Self {
        Self {
            gpu: gpu.to_string(),
            backend: backend.to_string(),
            policy: policy.to_string(),
            period_ms: None,
            worst_case_wait_ms: None,
            tolerance,
            max_error: 0.0,
            slots: Vec::new(),
            settings: Vec::new(),
            refusals: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// True when nothing was refused.
    pub fn honoured(&self) -> bool {
        self.refusals.is_empty()
    }

    /// Recomputes [`SchedPlan::max_error`] from the slots and refuses every slot whose error exceeds
    /// the tolerance (with the numbers).
    pub fn check_tolerance(&mut self) {
        self.max_error = self
            .slots
            .iter()
            .filter_map(|s| s.error)
            .fold(0.0, |m, e| m.max(e.abs()));
        let over: Vec<SchedRefusal> = self
            .slots
            .iter()
            .filter(|s| s.error.is_some_and(|e| e.abs() > self.tolerance + 1e-12))
            .map(|s| {
                SchedRefusal::slot(
                    &s.slot,
                    "share-off-target",
                    format!(
                        "{} would get {} of the GPU instead of the requested {} (off by {}, tolerance {})",
                        s.slot,
                        pct(s.effective_share.unwrap_or(0.0)),
                        pct(s.requested_share),
                        pct(s.error.unwrap_or(0.0).abs()),
                        pct(self.tolerance)
                    ),
                )
            })
            .collect();
        self.refusals.extend(over);
    }
}

/// `0.2534` → `25.34%`.
pub fn pct(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

/// What `apply` did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyReport {
    /// The GPU's id (`Gpu::id`) the plan was applied to.
    pub gpu: String,
    /// Settings written now (sysfs), in order.
    pub written: Vec<Setting>,
    /// Settings the operator must put in place (modprobe or driver configuration), with when they take
    /// effect.
    pub pending: Vec<Setting>,
    /// The state read back after writing.
    pub state: SchedState,
    /// Facts about the pending part (driver reload, no VM may run).
    pub notes: Vec<String>,
}
