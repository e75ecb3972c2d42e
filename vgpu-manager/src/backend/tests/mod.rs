//! Backend tests on simulated hosts: detection, plans per vendor, apply and read-back through the
//! simulated kernel, lifecycle, and the round-robin model driven by real plans.

use mdev_types::model::Inventory;
use vgpu_host::discover::discover;
use vgpu_sim::SimHost;

use super::{Backend, detect_gpu};
use crate::sched::{PlanOptions, SchedPlan, SchedRequest};

mod detect;
mod gim_gvt;
mod intel;
mod lifecycle;
mod nvidia;

/// A builtin simulated host and its inventory.
fn host(name: &str) -> (SimHost, Inventory) {
    let h = SimHost::builtin(name).unwrap_or_else(|e| panic!("{e}"));
    let inv = discover(&h).unwrap_or_else(|e| panic!("{e}"));
    (h, inv)
}

/// A simulated host from TOML and its inventory.
fn host_toml(text: &str) -> (SimHost, Inventory) {
    let h = SimHost::from_toml("test.toml", text).unwrap_or_else(|e| panic!("{e}"));
    let inv = discover(&h).unwrap_or_else(|e| panic!("{e}"));
    (h, inv)
}

/// The backend of `gpu`.
fn backend(h: &SimHost, inv: &Inventory, gpu: &str) -> Box<dyn Backend> {
    detect_gpu(h, inv, gpu).unwrap_or_else(|e| panic!("{e}"))
}

/// Requests of these weights for the next slots.
fn weights(ws: &[u32]) -> Vec<SchedRequest> {
    ws.iter().map(|w| SchedRequest::weight(*w)).collect()
}

/// The refusal codes of a plan.
fn codes(plan: &SchedPlan) -> Vec<&str> {
    plan.refusals.iter().map(|r| r.code.as_str()).collect()
}

fn opts() -> PlanOptions {
    PlanOptions::default()
}
