//! Whether this host can take an instance described by a [`Fingerprint`] (run on the target host).

use serde::Serialize;

use mdev_types::ids::MdevTypeId;
use mdev_types::model::Inventory;
use vgpu_host::Host;

use super::fingerprint::{
    FINGERPRINT_SCHEMA, Fingerprint, driver_version, kernel_release, parent_module, parent_numa,
};

/// One mdev parent here that offers the fingerprint's type, and what stops it from taking the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Candidate {
    /// The parent's device name.
    pub parent: String,
    /// The module behind it here (see [`Fingerprint::driver`]).
    pub driver: Option<String>,
    /// That driver's version here (see [`Fingerprint::driver_version`]).
    pub driver_version: Option<String>,
    /// How many more devices of the type it can create now.
    pub available: u32,
    /// Its NUMA node, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// Why the state cannot load here; empty when it can.
    pub problems: Vec<String>,
}

/// The answer of [`check`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    /// This host can take the instance: no host-wide reason and at least one candidate without
    /// problems.
    pub fits: bool,
    /// The type asked for.
    pub type_id: MdevTypeId,
    /// Reasons that hold for the whole host (schema, kernel release, no parent with the type).
    pub reasons: Vec<String>,
    /// Every parent offering the type, best first (no problems, then the most room).
    pub candidates: Vec<Candidate>,
    /// What the target must still do that cannot be checked before its device exists.
    pub notes: Vec<String>,
}

/// Checks `fp` against this host (`inv` is its discovery; `host` gives driver versions and the
/// kernel release). Reads only.
pub fn check(host: &dyn Host, inv: &Inventory, fp: &Fingerprint) -> Verdict {
    let mut reasons = Vec::new();
    let mut notes = Vec::new();
    if fp.schema != FINGERPRINT_SCHEMA {
        reasons.push(format!(
            "the fingerprint's schema is {:?}; this vgpu-manager reads {FINGERPRINT_SCHEMA:?} (make it with the same version on both hosts)",
            fp.schema
        ));
    }
    match (&fp.kernel_release, kernel_release(host)) {
        (Some(src), Some(here)) if *src != here => reasons.push(format!(
            "the kernel release differs: the source runs {src}, this host {here} (in-tree mdev drivers load only state of their own build)"
        )),
        (Some(_), Some(_)) => {}
        (src, here) => notes.push(format!(
            "the kernel release could not be compared (source: {}, here: {})",
            src.as_deref().unwrap_or("unknown"),
            here.as_deref().unwrap_or("unknown")
        )),
    }
    let faulted = |parent: &str| inv.faults.iter().any(|f| f.device == parent);
    let mut candidates: Vec<Candidate> = inv
        .mdev_parents
        .iter()
        .filter_map(|p| {
            let ty = p.types.iter().find(|t| t.id == fp.type_id)?;
            let module = parent_module(host, &p.name).ok().flatten();
            let version = module
                .as_deref()
                .and_then(|d| driver_version(host, d).ok().flatten());
            let mut problems = Vec::new();
            if module.as_deref() != Some(fp.driver.as_str()) {
                problems.push(format!(
                    "its driver is {}, the source's {}",
                    module.as_deref().unwrap_or("unknown"),
                    fp.driver
                ));
            } else if version != fp.driver_version {
                problems.push(format!(
                    "driver {} is version {} here, {} on the source (install the same driver version on both hosts)",
                    fp.driver,
                    version.as_deref().unwrap_or("unknown"),
                    fp.driver_version.as_deref().unwrap_or("unknown")
                ));
            }
            if ty.available_instances == 0 {
                problems.push(format!(
                    "it has no room for another {} (available_instances is 0)",
                    fp.type_id
                ));
            }
            if faulted(&p.name) {
                problems.push("it is faulted (`vgpuctl discover` names the fault)".to_string());
            }
            Some(Candidate {
                parent: p.name.clone(),
                driver: module,
                driver_version: version,
                available: ty.available_instances,
                numa_node: parent_numa(host, &p.name),
                problems,
            })
        })
        .collect();
    candidates.sort_by(|a, b| {
        (
            !a.problems.is_empty(),
            std::cmp::Reverse(a.available),
            &a.parent,
        )
            .cmp(&(
                !b.problems.is_empty(),
                std::cmp::Reverse(b.available),
                &b.parent,
            ))
    });
    if candidates.is_empty() {
        let by_driver: Vec<String> = inv
            .mdev_parents
            .iter()
            .filter(|p| {
                parent_module(host, &p.name).ok().flatten().as_deref() == Some(fp.driver.as_str())
            })
            .map(|p| p.name.clone())
            .collect();
        reasons.push(if by_driver.is_empty() {
            format!(
                "no mdev parent here offers type {} and none is driven by {} (load the driver, or choose another host)",
                fp.type_id, fp.driver
            )
        } else {
            format!(
                "no mdev parent here offers type {} ({} parents {} offer other types: the type may need another GPU model or driver configuration)",
                fp.type_id,
                fp.driver,
                by_driver.join(", ")
            )
        });
    }
    for (path, value) in &fp.vendor_params {
        notes.push(format!(
            "set {path} = {value:?} on the target device before the VM takes it, as on the source"
        ));
    }
    Verdict {
        fits: reasons.is_empty() && candidates.iter().any(|c| c.problems.is_empty()),
        type_id: fp.type_id.clone(),
        reasons,
        candidates,
        notes,
    }
}
