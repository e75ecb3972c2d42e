//! Placement: which GPU serves each requested vGPU, with a capacity model true to each backend.
//!
//! * [`model`] — the planner's input ([`Problem`]: GPUs with a [`Rule`], [`Demand`]s with [`Choice`]s).
//! * [`convert`] — builds a [`Problem`] from discovery ([`Inventory`](mdev_types::model::Inventory))
//!   and matching ([`MatchReport`](crate::profile::MatchReport)).
//! * [`planner`] — [`plan`]: the most instances that fit, then the [`Policy`] and NUMA preference.
//! * [`bound`] — an LP-relaxation upper bound on how many instances any placement can place.
//! * [`mig`] — MIG GPU-instance geometry (A100-40GB, H200 from NVML) and [`mig::place_instances`].
//! * [`slots`] — exact packing of ranges on a line of slots (MIG memory slices, vGPU placement ids).
//!
//! The planner is pure: it reads no host and changes nothing.

pub mod bound;
pub mod convert;
pub mod mig;
pub mod model;
pub mod planner;
mod search;
pub mod slots;
mod state;

#[cfg(test)]
mod tests;

pub use model::{Choice, Cost, Demand, GpuCap, ModelError, Problem, Rule, Span};
pub use planner::{Assignment, PlanOptions, Policy, Shortfall, Solution, plan, plan_with};
