//! [`host_offers`] on the shipped `demo` host: every GPU that is an mdev parent or an SR-IOV PF lists
//! the profiles it can serve when it has room, with the real occupancy beside each option (for a
//! VF-backed option, its VFs).

use vgpu_host::discover::discover;
use vgpu_host::ops::{bind_vfio, create_mdev, set_sriov_autoprobe, set_sriov_numvfs};
use vgpu_host::{Host, HostExt};
use vgpu_sim::SimHost;

use crate::profile::Catalog;
use crate::profile::offers::host_offers;
use vgpu_client::{GpuOffers, ProfileOffer};

const IGPU: &str = "0000:00:02.0";
const T4_1: &str = "0000:01:00.0";
const T4_2: &str = "0000:83:00.0";
const FLEX: &str = "0000:03:00.0";
const L40S: &str = "0000:85:00.0";
const MI300X: &str = "0000:86:00.0";

fn offers(host: &SimHost) -> Vec<GpuOffers> {
    let inv = discover(host).unwrap();
    host_offers(&Catalog::builtin().unwrap(), &inv, &[], |_| {
        "ok".to_string()
    })
}

fn gpu<'a>(all: &'a [GpuOffers], id: &str) -> &'a GpuOffers {
    all.iter()
        .find(|g| g.gpu == id)
        .unwrap_or_else(|| panic!("no GPU {id} in {all:?}"))
}

fn option<'a>(g: &'a GpuOffers, profile: &str) -> &'a ProfileOffer {
    g.options
        .iter()
        .find(|o| o.profile == profile)
        .unwrap_or_else(|| panic!("{} offers no {profile}: {:?}", g.gpu, g.options))
}

#[test]
fn mdev_parents_are_listed_with_their_shape() {
    let host = SimHost::builtin("demo").unwrap();
    let all = offers(&host);
    let ids: Vec<&str> = all.iter().map(|g| g.gpu.as_str()).collect();
    // The Flex 170 (SR-IOV), the L40S (vendor VFIO) and the MI300X (SR-IOV) are listed for their VFs.
    assert_eq!(ids, [IGPU, T4_1, FLEX, T4_2, L40S, MI300X]);
    let t4 = gpu(&all, T4_1);
    assert_eq!(t4.vfs, None, "an mdev parent has no VF-backed option");
    assert!(t4.homogeneous, "NVIDIA time-sliced vGPUs are homogeneous");
    assert!(!gpu(&all, IGPU).homogeneous, "GVT-g mixes types");
    assert_eq!(t4.vendor, "nvidia");
    assert_eq!(t4.pci.as_deref(), Some(T4_1));
    let vdi = option(t4, "vdi-2g");
    assert_eq!(vdi.type_id, "nvidia-223");
    assert_eq!(vdi.backend, "mdev");
    assert_eq!(vdi.framebuffer_mib, Some(2048));
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (8, 0, 8));
    let names: Vec<&str> = t4.options.iter().map(|o| o.profile.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted, "options are sorted by profile");
}

#[test]
fn a_full_or_blocked_type_is_still_offered_with_its_occupancy() {
    let host = SimHost::builtin("demo").unwrap();
    // T4 #2 holds one nvidia-231 (2Q): the homogeneous rule leaves only that type, so vdi-2g is
    // offered as nvidia-231, which serves it; every option there is of that type.
    let all = offers(&host);
    let t4b = gpu(&all, T4_2);
    let vdi = option(t4b, "vdi-2g");
    assert_eq!(vdi.type_id, "nvidia-231");
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (7, 1, 8));
    assert!(
        t4b.options.iter().all(|o| o.type_id == "nvidia-231"),
        "{t4b:?}"
    );

    // Fill T4 #1 with nvidia-223: still offered, 0 available, 8 in use (a full type is still a shape
    // of the GPU).
    let t = "nvidia-223".parse().unwrap();
    for i in 0..8u32 {
        let uuid = format!("00000000-0000-4000-8000-{i:012}").parse().unwrap();
        create_mdev(&host, T4_1, &t, &uuid).unwrap();
    }
    let all = offers(&host);
    let vdi = option(gpu(&all, T4_1), "vdi-2g");
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (0, 8, 8));
}

#[test]
fn health_is_the_callers_word_per_gpu() {
    let host = SimHost::builtin("demo").unwrap();
    let inv = discover(&host).unwrap();
    let all = host_offers(&Catalog::builtin().unwrap(), &inv, &[], |id| {
        if id == T4_2 {
            "faulted: test".to_string()
        } else {
            "ok".to_string()
        }
    });
    assert_eq!(gpu(&all, T4_2).health, "faulted: test");
    assert_eq!(gpu(&all, T4_1).health, "ok");
}

#[test]
fn an_sriov_gpu_without_vfs_offers_each_profile_the_split_enabling_would_make() {
    let host = SimHost::builtin("demo").unwrap();
    let all = offers(&host);
    let flex = gpu(&all, FLEX);
    // 16 GiB split for the profile: 16 VFs of 1 GiB, 8 of 2 GiB, 2 of 8 GiB; none enabled yet.
    let v = flex.vfs.unwrap();
    assert_eq!((v.enabled, v.total, v.free), (0, 31, 16));
    let vdi = option(flex, "vdi-2g");
    assert_eq!(vdi.backend, "sriov-vf");
    assert_eq!(vdi.type_id, "vf-8");
    assert_eq!(vdi.framebuffer_mib, Some(2048));
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (8, 0, 8));
    let one = option(flex, "vdi-1g");
    assert_eq!((one.type_id.as_str(), one.max_instances), ("vf-16", 16));
    assert_eq!(option(flex, "compute-8g").max_instances, 2);
    // The MI300X (GIM) has 4 of 8 VFs enabled at module load: one compute profile, 4 free VFs.
    let mi = gpu(&all, MI300X);
    let v = mi.vfs.unwrap();
    assert_eq!((v.enabled, v.total, v.free), (4, 8, 4));
    let c = option(mi, "compute-8g");
    assert_eq!(
        (c.backend.as_str(), c.type_id.as_str()),
        ("sriov-vf", "vf-4")
    );
    assert_eq!((c.available, c.in_use, c.max_instances), (4, 0, 4));
    assert_eq!(mi.options.len(), 1, "{:?}", mi.options);
}

#[test]
fn enabled_vfs_count_as_free_unless_a_driver_or_a_slot_holds_them() {
    let host = SimHost::builtin("demo").unwrap();
    let pf = FLEX.parse().unwrap();
    set_sriov_autoprobe(&host, &pf, false).unwrap();
    set_sriov_numvfs(&host, &pf, 8).unwrap();
    let inv = discover(&host).unwrap();
    let vfs = inv
        .pci_devices
        .iter()
        .find(|d| d.address == pf)
        .and_then(|d| d.sriov.clone())
        .unwrap()
        .vfs;
    assert_eq!(vfs.len(), 8);
    // One VF on vfio-pci (a slot made), one held by a slot record whose VF is unbound (a reboot).
    bind_vfio(&host, &vfs[0]).unwrap();
    let inv = discover(&host).unwrap();
    let all = host_offers(&Catalog::builtin().unwrap(), &inv, &vfs[1..2], |_| {
        "ok".to_string()
    });
    let flex = gpu(&all, FLEX);
    let v = flex.vfs.unwrap();
    assert_eq!((v.enabled, v.total, v.free), (8, 31, 6));
    // Every profile a 2 GiB VF serves is offered on the fixed split; bigger ones are not.
    let vdi = option(flex, "vdi-2g");
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (6, 2, 8));
    assert_eq!(vdi.type_id, "vf-8");
    assert_eq!(option(flex, "vdi-1g").framebuffer_mib, Some(2048));
    assert!(
        flex.options.iter().all(|o| o.profile != "compute-8g"),
        "{:?}",
        flex.options
    );
}

#[test]
fn nvidia_vendor_vfio_counts_vfs_and_the_types_they_hold() {
    let host = SimHost::builtin("demo").unwrap();
    let all = offers(&host);
    let l40s = gpu(&all, L40S);
    let v = l40s.vfs.unwrap();
    assert_eq!((v.enabled, v.total, v.free), (32, 32, 32));
    let vdi = option(l40s, "vdi-2g");
    assert_eq!(vdi.backend, "nvidia-vendor-vfio");
    assert_eq!(
        (vdi.type_id.as_str(), vdi.type_name.as_deref()),
        ("1146", Some("NVIDIA L40S-2B"))
    );
    // 48 GiB: 24 of 2 GiB; 32 VFs bound the 1 GiB type.
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (24, 0, 24));
    assert_eq!(option(l40s, "vdi-1g").max_instances, 32);

    // One VF takes the 2 GiB type (what a slot's backend writes): one VF less, one in use.
    let inv = discover(&host).unwrap();
    let vf = inv
        .pci_devices
        .iter()
        .find(|d| d.nvidia_vf.is_some())
        .unwrap()
        .address;
    let cur = format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
    host.write(std::path::Path::new(&cur), "1146").unwrap();
    assert_eq!(
        host.read_trimmed(std::path::Path::new(&cur)).unwrap(),
        "1146"
    );
    let all = offers(&host);
    let l40s = gpu(&all, L40S);
    assert_eq!(l40s.vfs.unwrap().free, 31);
    let vdi = option(l40s, "vdi-2g");
    assert_eq!((vdi.available, vdi.in_use, vdi.max_instances), (23, 1, 24));
}
