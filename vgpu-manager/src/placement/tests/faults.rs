//! Placement skips a GPU discovery could not read whole: with its mdev parent faulted, the T4 that takes
//! vdi-2g desktops on a healthy demo host takes none.

use std::path::PathBuf;

use mdev_types::fault::{DeviceFault, FaultCause, FaultScope};
use vgpu_host::discover::discover;
use vgpu_sim::SimHost;

use super::super::convert::{DemandInput, HostUse, build};
use crate::profile::{Catalog, match_profile};

const T4: &str = "0000:01:00.0";

fn problem_gpus(faulted: bool) -> Vec<String> {
    let mut inv = discover(&SimHost::load("demo").unwrap()).unwrap();
    if faulted {
        inv.faults.push(DeviceFault {
            scope: FaultScope::MdevParent,
            device: T4.into(),
            path: PathBuf::from(format!("/sys/class/mdev_bus/{T4}/mdev_supported_types")),
            cause: FaultCause::Errno {
                op: "listing".into(),
                errno: "EIO".into(),
                code: 5,
            },
            fix: None,
        });
    }
    let cat = Catalog::builtin().unwrap();
    let r = match_profile(cat.get("vdi-2g").unwrap(), &inv);
    let c = build(
        &inv,
        &[DemandInput {
            report: &r,
            need_mib: 2048,
            count: 8,
            numa: None,
        }],
        &|_| true,
        HostUse::default(),
    );
    c.problem.gpus.iter().map(|g| g.id.clone()).collect()
}

#[test]
fn a_faulted_gpu_takes_no_placement() {
    assert!(problem_gpus(false).iter().any(|g| g == T4));
    let with_fault = problem_gpus(true);
    assert!(!with_fault.iter().any(|g| g == T4), "{with_fault:?}");
    assert!(
        !with_fault.is_empty(),
        "the other GPUs still take placements"
    );
}
