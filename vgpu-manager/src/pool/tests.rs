//! Pool files, loading, and plans on the simulated demo host (including applying a plan to the
//! simulated kernel and planning again).

use std::path::Path;

use vgpu_host::discover::discover;
use vgpu_host::{Host, paths};
use vgpu_sim::SimHost;

use super::*;
use crate::profile::{Catalog, ProfileTarget};

fn cat() -> Catalog {
    Catalog::builtin().unwrap()
}

fn err(text: &str) -> String {
    Pool::from_toml("p.toml", text, &cat())
        .unwrap_err()
        .to_string()
}

#[test]
fn errors_name_file_line_field_and_what_is_allowed() {
    let e = err("name = \"x\"\npolicy = \"pack\"\n[profiles]\nvdi-2g = 1\n");
    assert_eq!(
        e,
        "p.toml:2: field `policy` has unknown value \"pack\"; allowed: consolidate, spread"
    );
    let e = err("name = \"x\"\n[profiles]\nvdi-9g = 1\n");
    assert!(
        e.starts_with("p.toml:3: field `profiles` names unknown profile \"vdi-9g\"; allowed: "),
        "{e}"
    );
    let e = err("name = \"x\"\n[profiles]\nvdi-2g = 0\n");
    assert!(
        e.starts_with(
            "p.toml:3: field `profiles` gives vdi-2g = 0; allowed: a count from 1 to 1024"
        ),
        "{e}"
    );
    let e = err("name = \"x\"\ncolour = 1\n[profiles]\nvdi-2g = 1\n");
    assert!(e.starts_with("p.toml:2:1: unknown field `colour`"), "{e}");
    let e = err("name = \"X Y\"\n[profiles]\nvdi-2g = 1\n");
    assert!(e.starts_with("p.toml:1: field `name`"), "{e}");
    let e = err("name = \"x\"\n[profiles]\nvdi-2g = 1\n[select]\nvendors = [\"3dfx\"]\n");
    assert!(
        e.starts_with("p.toml:5: field `select.vendors` has unknown vendor \"3dfx\""),
        "{e}"
    );
    let e = err("name = \"x\"\n[profiles]\nvdi-2g = 1\n[select]\ngpus = [\"zz:zz\"]\n");
    assert!(e.starts_with("p.toml:5: field `select.gpus`"), "{e}");
    let e = err("name = \"x\"\n[profiles]\nvdi-2g = 1\n[select]\nstrict_numa = true\n");
    assert!(
        e.contains("strict_numa = true together with numa_node"),
        "{e}"
    );
    let e = err("name = \"x\"\n[profiles]\n");
    assert!(e.contains("field `profiles` is empty"), "{e}");
}

#[test]
fn shipped_pools_load_and_short_addresses_are_canonical() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/pools.d");
    let pools = load_dir(&dir, &cat()).unwrap();
    let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["cad-node1", "vdi-floor"]);
    let p = Pool::from_toml(
        "s",
        "name = \"x\"\n[profiles]\nvdi-2g = 1\n[select]\ngpus = [\"83:00.0\"]\n",
        &cat(),
    )
    .unwrap();
    assert_eq!(p.select.gpus, ["0000:83:00.0"]);
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(
        tmp.path().join("a.toml"),
        "name = \"x\"\n[profiles]\nvdi-2g = 1\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("b.toml"),
        "name = \"x\"\n[profiles]\nvdi-1g = 1\n",
    )
    .unwrap();
    let e = load_dir(tmp.path(), &cat()).unwrap_err().to_string();
    assert!(
        e.contains("b.toml: pool name 'x' is already used by") && e.contains("a.toml"),
        "{e}"
    );
}

fn vdi_floor() -> Pool {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/pools.d/vdi-floor.toml");
    load_file(&dir, &cat()).unwrap()
}

#[test]
fn mixed_pool_plans_every_slot_on_the_demo_host() {
    let inv = discover(&SimHost::load("demo").unwrap()).unwrap();
    let plan = plan_pool(&vdi_floor(), &cat(), &inv, &[]).unwrap();
    assert!(plan.shortfall.is_empty(), "{:?}", plan.shortfall);
    assert_eq!(plan.creates(), 44);
    // The Flex 170 has SR-IOV off: one enable step comes before the creates.
    let enable = plan
        .steps
        .iter()
        .position(|s| matches!(s, PoolStep::EnableVfs { .. }))
        .unwrap();
    let first_create = plan
        .steps
        .iter()
        .position(|s| matches!(s, PoolStep::Create { .. }))
        .unwrap();
    assert!(enable < first_create);
    // Every create has its own slot UUID; vendor-VFIO creates each take their own VF.
    let mut uuids = std::collections::HashSet::new();
    let mut vfs = std::collections::HashSet::new();
    for s in &plan.steps {
        if let PoolStep::Create { slot, target, .. } = s {
            assert!(uuids.insert(slot.uuid));
            if let ProfileTarget::NvidiaVendorVfio { vf, .. } = target {
                assert!(vfs.insert(*vf), "VF {vf} twice");
            }
        }
    }
    assert_eq!(vfs.len(), 24);
    // Asking for more reports the exact shortfall. 50 desktops + 4 workstations: the most that fit is
    // 48 (all desktops: 1 GVT-g + 8 + 7 on the T4s + 24 on the L40S + 8 on the Flex), since each
    // workstation displaces two desktops from the first T4.
    let mut big = vdi_floor();
    big.profiles.insert("vdi-2g".into(), 50);
    let plan = plan_pool(&big, &cat(), &inv, &[]).unwrap();
    assert_eq!(plan.creates(), 48);
    let short: Vec<(&str, u32, u32)> = plan
        .shortfall
        .iter()
        .map(|s| (s.profile.as_str(), s.placed, s.missing))
        .collect();
    assert_eq!(short, [("vdi-2g", 48, 2), ("workstation-4g", 0, 4)]);
    assert!(
        plan.shortfall[1].reason.contains("other profiles"),
        "{}",
        plan.shortfall[1].reason
    );
}

/// Executes a plan's steps against the simulated kernel (mdev create/remove, vendor-VFIO type) and
/// returns the VF slots a daemon would record.
fn apply(host: &SimHost, plan: &PoolPlan, held: &mut Vec<HeldSlot>) {
    for s in &plan.steps {
        match s {
            PoolStep::Create {
                slot,
                gpu,
                target:
                    ProfileTarget::Mdev {
                        parent, type_id, ..
                    },
                ..
            } => {
                let _ = gpu;
                host.write(
                    &paths::mdev_type_dir(parent, type_id).join("create"),
                    &slot.uuid.to_string(),
                )
                .unwrap();
            }
            PoolStep::Create {
                slot,
                gpu,
                target: ProfileTarget::NvidiaVendorVfio { vf, type_id, .. },
                ..
            } => {
                host.write(
                    &paths::pci_device(vf).join("nvidia/current_vgpu_type"),
                    &type_id.to_string(),
                )
                .unwrap();
                held.push(HeldSlot {
                    slot: slot.clone(),
                    gpu: gpu.clone(),
                    vf: *vf,
                });
            }
            PoolStep::Remove { slot, holds, .. } if !holds.starts_with("VF ") => {
                host.write(
                    &Path::new("/sys/bus/mdev/devices")
                        .join(slot.uuid.to_string())
                        .join("remove"),
                    "1",
                )
                .unwrap();
            }
            other => panic!("step not simulated here: {other:?}"),
        }
    }
}

#[test]
fn applying_a_plan_then_planning_again_changes_nothing() {
    let host = SimHost::load("demo").unwrap();
    let mut pool = vdi_floor();
    pool.select.vendors = vec![mdev_types::model::Vendor::Nvidia];
    pool.profiles.insert("vdi-2g".into(), 30);
    let mut held = Vec::new();
    let plan = plan_pool(&pool, &cat(), &discover(&host).unwrap(), &held).unwrap();
    assert!(plan.shortfall.is_empty(), "{:?}", plan.shortfall);
    apply(&host, &plan, &mut held);
    let again = plan_pool(&pool, &cat(), &discover(&host).unwrap(), &held).unwrap();
    assert!(again.is_noop(), "{:?}", again.steps);
    assert_eq!(again.keep.len(), 34);
    // Shrinking removes the highest slots and keeps the rest.
    pool.profiles.insert("vdi-2g".into(), 25);
    let shrink = plan_pool(&pool, &cat(), &discover(&host).unwrap(), &held).unwrap();
    assert_eq!((shrink.removes(), shrink.creates()), (5, 0));
    for s in &shrink.steps {
        let PoolStep::Remove { slot, .. } = s else {
            unreachable!()
        };
        assert!(slot.index >= 25);
    }
}

/// A slot on a GPU that cannot be read is kept as it is, with the fault as the reason: not removed
/// (not even when the pool no longer wants it) and not placed again elsewhere.
#[test]
fn slots_on_a_faulted_gpu_are_kept_with_the_reason() {
    let host = SimHost::load("demo").unwrap();
    let mut pool = vdi_floor();
    pool.select.vendors = vec![mdev_types::model::Vendor::Nvidia];
    pool.profiles.insert("vdi-2g".into(), 30);
    let mut held = Vec::new();
    let plan = plan_pool(&pool, &cat(), &discover(&host).unwrap(), &held).unwrap();
    apply(&host, &plan, &mut held);
    let mut inv = discover(&host).unwrap();
    // The GPU holding the first kept mdev slot stops answering: discovery lists it as a fault.
    let healthy = plan_pool(&pool, &cat(), &inv, &held).unwrap();
    let victim = healthy
        .keep
        .iter()
        .find(|k| !k.holds.starts_with("VF "))
        .unwrap()
        .gpu
        .clone();
    let on_victim = healthy.keep.iter().filter(|k| k.gpu == victim).count();
    inv.gpus.retain(|g| g.id != victim);
    inv.faults.push(mdev_types::fault::DeviceFault {
        scope: mdev_types::fault::FaultScope::PciDevice,
        device: victim.clone(),
        path: format!("/sys/bus/pci/devices/{victim}/vendor").into(),
        cause: mdev_types::fault::FaultCause::AllOnes {
            text: "0xffff".into(),
        },
        fix: Some("reset it".into()),
    });
    let faulted = plan_pool(&pool, &cat(), &inv, &held).unwrap();
    assert!(faulted.is_noop(), "{:?}", faulted.steps);
    let kept: Vec<_> = faulted.keep.iter().filter(|k| k.gpu == victim).collect();
    assert_eq!(kept.len(), on_victim);
    for k in kept {
        let f = k.fault.as_deref().unwrap();
        assert!(
            f.contains(&victim) && f.contains("all ones") && f.contains("reset it"),
            "{f}"
        );
    }
    assert!(
        faulted
            .keep
            .iter()
            .filter(|k| k.gpu != victim)
            .all(|k| k.fault.is_none())
    );
    // Shrinking the pool removes no slot of the faulted GPU.
    pool.profiles.insert("vdi-2g".into(), 1);
    let shrink = plan_pool(&pool, &cat(), &inv, &held).unwrap();
    assert!(shrink.removes() > 0);
    assert!(
        shrink
            .steps
            .iter()
            .all(|s| !matches!(s, PoolStep::Remove { gpu, .. } if *gpu == victim)),
        "{:?}",
        shrink.steps
    );
}

/// A VF someone else bound (to vfio-pci for a guest of their own, or to a host driver) is not free: the
/// plan leaves it alone and places one slot fewer there.
#[test]
fn vfs_bound_by_others_are_not_taken() {
    let h = SimHost::builtin("vendors").unwrap();
    let pool = Pool::from_toml(
        "p.toml",
        "name = \"v\"\n[profiles]\nvdi-2g = 4\n[select]\ngpus = [\"0000:3b:00.0\"]\n",
        &cat(),
    )
    .unwrap();
    let vfs_of = |plan: &PoolPlan| -> Vec<String> {
        plan.steps
            .iter()
            .filter_map(|s| match s {
                PoolStep::Create {
                    target: ProfileTarget::SriovVf { vf: Some(v), .. },
                    ..
                } => Some(v.to_string()),
                _ => None,
            })
            .collect()
    };
    let before = plan_pool(&pool, &cat(), &discover(&h).unwrap(), &[]).unwrap();
    assert_eq!(
        vfs_of(&before),
        [
            "0000:3b:00.1",
            "0000:3b:00.2",
            "0000:3b:00.3",
            "0000:3b:00.4"
        ]
    );
    assert!(before.shortfall.is_empty());
    let taken: mdev_types::ids::PciAddress = "0000:3b:00.2".parse().unwrap();
    vgpu_host::ops::bind_driver(&h, &taken, "vfio-pci").unwrap();
    let after = plan_pool(&pool, &cat(), &discover(&h).unwrap(), &[]).unwrap();
    assert_eq!(
        vfs_of(&after),
        ["0000:3b:00.1", "0000:3b:00.3", "0000:3b:00.4"]
    );
    assert_eq!(after.shortfall.len(), 1, "{:?}", after.shortfall);
    assert_eq!(after.shortfall[0].missing, 1);
}
