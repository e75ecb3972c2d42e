//! The planner on the simulated demo host, built from discovery and matching: its capacity per GPU
//! agrees with what the (simulated) kernel reports, and a mixed VDI pool (vdi-2g desktops and
//! workstation-4g workstations) fits.

use mdev_types::model::Inventory;
use vgpu_host::discover::discover;
use vgpu_sim::SimHost;

use super::super::convert::{DemandInput, HostUse, build};
use super::super::{Policy, plan};
use crate::profile::{Catalog, MatchReport, ProfileTarget, match_profile};

fn demo() -> Inventory {
    discover(&SimHost::load("demo").unwrap()).unwrap()
}

fn report(inv: &Inventory, name: &str) -> MatchReport {
    let cat = Catalog::builtin().unwrap();
    match_profile(cat.get(name).unwrap(), inv)
}

#[test]
fn capacity_per_gpu_agrees_with_the_kernel_and_matching() {
    let inv = demo();
    for profile in ["vdi-2g", "workstation-4g", "vdi-1g"] {
        let r = report(&inv, profile);
        let need = Catalog::builtin()
            .unwrap()
            .get(profile)
            .unwrap()
            .framebuffer_mib;
        for g in r.servable() {
            let only = g.gpu.clone();
            let c = build(
                &inv,
                &[DemandInput {
                    report: &r,
                    need_mib: need,
                    count: 200,
                    numa: None,
                }],
                &|gpu| gpu.id == only,
                HostUse::default(),
            );
            let s = plan(&c.problem, Policy::Consolidate).unwrap();
            let best = g.best.as_ref().unwrap();
            // Matching's capacity is that of its best option alone; the planner may use the
            // alternatives too, so it places at least as many. For a homogeneous or fixed-split GPU
            // the best option's count is the most.
            assert!(
                s.placed >= u64::from(best.capacity),
                "{profile} on {only}: planner {} < matching {}",
                s.placed,
                best.capacity
            );
            match &best.target {
                ProfileTarget::Mdev { .. }
                | ProfileTarget::NvidiaVendorVfio { .. }
                | ProfileTarget::SriovVf { .. }
                    if g.vendor == mdev_types::model::Vendor::Nvidia
                        || matches!(best.target, ProfileTarget::SriovVf { .. }) =>
                {
                    assert_eq!(s.placed, u64::from(best.capacity), "{profile} on {only}");
                }
                _ => {}
            }
        }
    }
}

#[test]
fn mixed_vdi_pool_of_desktops_and_workstations_fits_the_demo_host() {
    let inv = demo();
    let vdi = report(&inv, "vdi-2g");
    let ws = report(&inv, "workstation-4g");
    let c = build(
        &inv,
        &[
            DemandInput {
                report: &vdi,
                need_mib: 2048,
                count: 40,
                numa: None,
            },
            DemandInput {
                report: &ws,
                need_mib: 4096,
                count: 4,
                numa: None,
            },
        ],
        &|_| true,
        HostUse::default(),
    );
    for policy in [Policy::Consolidate, Policy::Spread] {
        let s = plan(&c.problem, policy).unwrap();
        assert_eq!(s.placed, 44, "{policy:?}: {:?}", s.shortfall);
        assert!(s.shortfall.is_empty());
        // The only way: the four workstations fill the first T4 (T4-4Q); the L40S stays at 2 GiB
        // (equal-size mode) for 24 desktops.
        for a in s.assignments.iter().filter(|a| a.demand == 1) {
            assert_eq!(c.problem.gpus[a.gpu].id, "0000:01:00.0");
        }
    }
    // 48 desktops and 4 workstations do not fit: exactly 4 desktops short.
    let c = build(
        &inv,
        &[
            DemandInput {
                report: &vdi,
                need_mib: 2048,
                count: 44,
                numa: None,
            },
            DemandInput {
                report: &ws,
                need_mib: 4096,
                count: 4,
                numa: None,
            },
        ],
        &|_| true,
        HostUse::default(),
    );
    let s = plan(&c.problem, Policy::Spread).unwrap();
    assert_eq!(s.placed, 44);
    let missing: u32 = s.shortfall.iter().map(|x| x.missing).sum();
    assert_eq!(missing, 4);
}
