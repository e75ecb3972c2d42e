//! [`host_offers`] on the shipped `demo` host: every GPU that is an mdev parent lists the profiles it
//! can serve when it has room, with the real occupancy beside each option.

use vgpu_host::discover::discover;
use vgpu_host::ops::create_mdev;
use vgpu_sim::SimHost;

use crate::profile::Catalog;
use crate::profile::offers::host_offers;
use vgpu_client::{GpuOffers, ProfileOffer};

const IGPU: &str = "0000:00:02.0";
const T4_1: &str = "0000:01:00.0";
const T4_2: &str = "0000:83:00.0";

fn offers(host: &SimHost) -> Vec<GpuOffers> {
    let inv = discover(host).unwrap();
    host_offers(&Catalog::builtin().unwrap(), &inv, |_| "ok".to_string())
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
fn only_mdev_parents_are_listed_with_their_shape() {
    let host = SimHost::builtin("demo").unwrap();
    let all = offers(&host);
    let ids: Vec<&str> = all.iter().map(|g| g.gpu.as_str()).collect();
    // The Flex 170 (SR-IOV), the L40S (vendor VFIO) and the MI300X (SR-IOV) are no mdev parents.
    assert_eq!(ids, [IGPU, T4_1, T4_2]);
    let t4 = gpu(&all, T4_1);
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
    let all = host_offers(&Catalog::builtin().unwrap(), &inv, |id| {
        if id == T4_2 {
            "faulted: test".to_string()
        } else {
            "ok".to_string()
        }
    });
    assert_eq!(gpu(&all, T4_2).health, "faulted: test");
    assert_eq!(gpu(&all, T4_1).health, "ok");
}
