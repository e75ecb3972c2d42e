//! The shipped profiles on the shipped simulated hosts (`demo`, `samples`), read through discovery
//! exactly as `vgpuctl --sim demo match PROFILE` does; then acting on a chosen option through the
//! lifecycle ops and matching again.

use mdev_types::ids::MdevUuid;
use mdev_types::model::Inventory;
use vgpu_host::discover::discover;
use vgpu_host::ops::{create_mdev, set_sriov_numvfs};
use vgpu_sim::SimHost;

use super::build::shipped;
use super::hosts::{best, mdev_type_of, messages, refused, sriov_target, vfio_target};
use crate::profile::{GpuMatch, MatchReport, ProfileTarget, Reason, match_profile};

const IGPU: &str = "0000:00:02.0";
const T4_1: &str = "0000:01:00.0";
const FLEX: &str = "0000:03:00.0";
const T4_2: &str = "0000:83:00.0";
const L40S: &str = "0000:85:00.0";
const MI300X: &str = "0000:86:00.0";

fn sim(name: &str) -> SimHost {
    SimHost::builtin(name).unwrap()
}

fn inventory(host: &SimHost) -> Inventory {
    discover(host).unwrap()
}

fn report(inv: &Inventory, profile: &str) -> MatchReport {
    match_profile(&shipped(profile), inv)
}

fn gpu<'a>(r: &'a MatchReport, id: &str) -> &'a GpuMatch {
    r.gpu(id)
        .unwrap_or_else(|| panic!("no GPU {id} in {:?}", r.gpus))
}

#[test]
fn demo_vdi_2g_per_gpu() {
    let inv = inventory(&sim("demo"));
    let r = report(&inv, "vdi-2g");
    assert_eq!(r.host, "simulated host 'demo'");
    assert_eq!(r.gpus.len(), 6);
    // GVT-g: V5_1 is the only type with 2 GiB (512 + 2048 MB).
    assert_eq!(mdev_type_of(best(gpu(&r, IGPU))), "i915-GVTg_V5_1");
    // T4 #1, empty: 2 GiB exactly, B series before Q for desktops.
    let b = best(gpu(&r, T4_1));
    assert_eq!(mdev_type_of(b), "nvidia-223");
    assert_eq!(b.capacity, 8);
    // T4 #2 holds one nvidia-231 (2Q): the homogeneous rule leaves only that type.
    let m = gpu(&r, T4_2);
    assert_eq!(mdev_type_of(best(m)), "nvidia-231");
    assert_eq!(best(m).capacity, 7);
    assert_eq!(
        refused(m, "nvidia-223")[0].to_string(),
        "homogeneous: nvidia-231 instances exist, other types unavailable"
    );
    // Flex 170 with SR-IOV off: eight VFs of 2 GiB.
    let b = best(gpu(&r, FLEX));
    assert_eq!(sriov_target(b), (None, 8, true));
    assert_eq!(b.framebuffer_mib, Some(2048));
    // L40S vendor VFIO: the 2B type; 48 GiB hold 24 of them although 32 VFs are free.
    let b = best(gpu(&r, L40S));
    assert_eq!(vfio_target(b).1, 1146);
    assert_eq!(vfio_target(b).2, "NVIDIA L40S-2B");
    assert_eq!(b.capacity, 24);
    // MI300X: no graphics engine.
    let m = gpu(&r, MI300X);
    assert!(m.best.is_none());
    assert!(matches!(m.refused[0].reasons[0], Reason::NoGraphics { .. }));
}

#[test]
fn demo_compute_8g_per_gpu() {
    let inv = inventory(&sim("demo"));
    let r = report(&inv, "compute-8g");
    assert_eq!(mdev_type_of(best(gpu(&r, T4_1))), "nvidia-320");
    assert_eq!(sriov_target(best(gpu(&r, FLEX))), (None, 2, true));
    let b = best(gpu(&r, L40S));
    assert_eq!(vfio_target(b).2, "NVIDIA L40S-8C");
    assert_eq!(b.capacity, 6);
    // MI300X has 4 of 8 VFs enabled: each is a quarter of 192 GiB.
    let b = best(gpu(&r, MI300X));
    let (vf, num_vfs, enable) = sriov_target(b);
    assert_eq!((num_vfs, enable), (4, false));
    assert!(vf.is_some());
    assert_eq!(b.framebuffer_mib, Some(48 * 1024));
    // T4 #2 cannot give 8 GiB while a 2Q exists; GVT-g has at most 2.5 GiB.
    assert!(gpu(&r, T4_2).best.is_none());
    assert!(messages(gpu(&r, IGPU)).contains("framebuffer 2.5 GiB < 8 GiB required"));
}

#[test]
fn demo_workstation_and_passthrough() {
    let inv = inventory(&sim("demo"));
    let r = report(&inv, "workstation-4g");
    assert_eq!(mdev_type_of(best(gpu(&r, T4_1))), "nvidia-232");
    assert_eq!(vfio_target(best(gpu(&r, L40S))).2, "NVIDIA L40S-4Q");
    assert!(messages(gpu(&r, FLEX)).ends_with("0 display heads < 2 required"));

    let r = report(&inv, "passthrough");
    for id in [T4_1, FLEX] {
        assert!(
            matches!(best(gpu(&r, id)).target, ProfileTarget::Passthrough { .. }),
            "{id}"
        );
    }
    // vfio-pci refuses a PF whose VFs are enabled (vfio_pci_core_register_device: -EBUSY).
    for id in [L40S, MI300X] {
        assert!(messages(gpu(&r, id)).contains("VFs are enabled"), "{id}");
    }
    assert!(messages(gpu(&r, IGPU)).contains("boot VGA"));
    // T4 #2 shares IOMMU group 11 with the host's NIC.
    assert!(messages(gpu(&r, T4_2)).contains("0000:84:00.0 (driver igb)"));
}

#[test]
fn samples_serve_the_sample_profiles() {
    let inv = inventory(&sim("samples"));
    let r = report(&inv, "sample-display-16m");
    assert_eq!(mdev_type_of(best(gpu(&r, "mbochs"))), "mbochs-medium");
    assert!(gpu(&r, "mdpy").best.is_none());
    let r = report(&inv, "sample-display-1080p");
    assert_eq!(mdev_type_of(best(gpu(&r, "mdpy"))), "mdpy-hd");
    assert!(gpu(&r, "mbochs").best.is_none());
}

/// Creating the chosen mdev lowers its capacity by one and, on NVIDIA, shuts the other types.
#[test]
fn creating_the_chosen_mdev_is_seen_by_the_next_match() {
    let host = sim("demo");
    let r = report(&inventory(&host), "vdi-2g");
    let chosen = best(gpu(&r, T4_1)).clone();
    let ProfileTarget::Mdev {
        parent, type_id, ..
    } = &chosen.target
    else {
        panic!("{chosen:?}");
    };
    create_mdev(&host, parent, type_id, &MdevUuid::new_random()).unwrap();
    let r = report(&inventory(&host), "vdi-2g");
    let m = gpu(&r, T4_1);
    assert_eq!(mdev_type_of(best(m)), "nvidia-223");
    assert_eq!(best(m).capacity, chosen.capacity - 1);
    assert!(m.alternatives.is_empty(), "{:?}", m.alternatives);
    assert_eq!(
        refused(m, "nvidia-231")[0].to_string(),
        "homogeneous: nvidia-223 instances exist, other types unavailable"
    );

    let host = sim("samples");
    let r = report(&inventory(&host), "sample-display-16m");
    let chosen = best(gpu(&r, "mbochs")).clone();
    let ProfileTarget::Mdev {
        parent, type_id, ..
    } = &chosen.target
    else {
        panic!("{chosen:?}");
    };
    create_mdev(&host, parent, type_id, &MdevUuid::new_random()).unwrap();
    let r = report(&inventory(&host), "sample-display-16m");
    assert_eq!(best(gpu(&r, "mbochs")).capacity, chosen.capacity - 1);
}

/// Enabling the VFs the match asked for turns the plan into concrete VFs of the promised size.
#[test]
fn enabling_the_planned_vfs_gives_vfs_of_the_planned_size() {
    let host = sim("demo");
    let r = report(&inventory(&host), "vdi-2g");
    let planned = best(gpu(&r, FLEX)).clone();
    let ProfileTarget::SriovVf { pf, num_vfs, .. } = planned.target else {
        panic!("{planned:?}");
    };
    set_sriov_numvfs(&host, &pf, num_vfs).unwrap();
    let inv = inventory(&host);
    let r = report(&inv, "vdi-2g");
    let b = best(gpu(&r, FLEX));
    let (vf, n, enable) = sriov_target(b);
    assert_eq!((n, enable), (num_vfs, false));
    let vf = vf.unwrap();
    let vf_dev = inv
        .pci_devices
        .iter()
        .find(|d| d.address.to_string() == vf)
        .unwrap();
    assert_eq!(vf_dev.physfn, Some(pf));
    assert_eq!(b.framebuffer_mib, planned.framebuffer_mib);
    assert_eq!(b.capacity, num_vfs);
    // The split is now fixed: 8 GiB no longer fits.
    let r = report(&inv, "compute-8g");
    assert!(messages(gpu(&r, FLEX)).contains("split evenly over the 8 enabled VFs"));
}
