//! Placement tests: the capacity rules per backend, MIG geometry with the real H200 table, the
//! planner against an exhaustive oracle, and the planner on the simulated demo host.

use mdev_types::ids::MdevTypeId;

use crate::profile::ProfileTarget;

mod capacity;
mod faults;
mod mig;
mod random;
mod sim;

/// A placeholder target for synthetic choices (the planner never looks into targets).
pub(crate) fn target(key: &str) -> ProfileTarget {
    ProfileTarget::Mdev {
        parent: "synthetic".into(),
        type_id: key
            .parse()
            .unwrap_or_else(|_| "x".parse::<MdevTypeId>().unwrap()),
        type_name: None,
    }
}
