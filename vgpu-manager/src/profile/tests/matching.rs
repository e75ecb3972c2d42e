//! Matching on hand-built hosts: every vendor path and every refusal reason.

use mdev_types::model::{Assignability, Gpu, Inventory, Vendor};

use super::build::*;
use crate::profile::{Backend, GpuMatch, MatchOption, Reason, Target, match_profile};

/// The match for the only (or the named) GPU.
fn one(inv: &Inventory, profile: &str, gpu: &str) -> GpuMatch {
    let report = match_profile(&shipped(profile), inv);
    report.gpu(gpu).unwrap().clone()
}

fn best(m: &GpuMatch) -> &MatchOption {
    m.best
        .as_ref()
        .unwrap_or_else(|| panic!("{} cannot serve: {:?}", m.gpu, m.why_not()))
}

fn mdev_type_of(o: &MatchOption) -> &str {
    match &o.target {
        Target::Mdev { type_id, .. } => type_id.as_str(),
        other => panic!("not an mdev option: {other:?}"),
    }
}

/// The reasons given for the candidate whose label starts with `prefix`.
fn refused<'a>(m: &'a GpuMatch, prefix: &str) -> &'a [Reason] {
    &m.refused
        .iter()
        .find(|r| r.candidate.starts_with(prefix))
        .unwrap_or_else(|| panic!("no refusal for {prefix} in {:#?}", m.refused))
        .reasons
}

fn messages(m: &GpuMatch) -> String {
    m.why_not().unwrap_or_default()
}

const T4: &str = "0000:3b:00.0";

fn t4_host(types: Vec<mdev_types::model::MdevType>) -> Inventory {
    let mut b = InvBuilder::new();
    b.mdev_gpu(bound(dev(T4, 0x10de, 0x1eb8), "nvidia"), "NVIDIA T4", types);
    b.build()
}

// ---- NVIDIA classic mdev ----

#[test]
fn t4_vdi_2g_takes_the_smallest_b_series_type() {
    let m = one(&t4_host(t4_types(8)), "vdi-2g", T4);
    let b = best(&m);
    // 2 GiB with no waste: T4-2B, T4-2B4, T4-2Q, T4-2A; B ranks first for vdi, then the name.
    assert_eq!(mdev_type_of(b), "nvidia-223");
    assert_eq!(b.framebuffer_mib, Some(2048));
    assert_eq!(b.waste_mib, Some(0));
    assert_eq!(b.capacity, 8);
    assert_eq!(b.target.backend(), Backend::Mdev);
    let alts: Vec<&str> = m.alternatives.iter().map(mdev_type_of).collect();
    assert_eq!(
        alts,
        [
            "nvidia-224",
            "nvidia-231",
            "nvidia-226",
            "nvidia-232",
            "nvidia-319",
            "nvidia-233",
            "nvidia-320"
        ]
    );
    for t in ["nvidia-222", "nvidia-225", "nvidia-230"] {
        let r = refused(&m, t);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].to_string(), "framebuffer 1 GiB < 2 GiB required");
    }
}

#[test]
fn t4_workstation_needs_q_heads_and_resolution() {
    let m = one(&t4_host(t4_types(8)), "workstation-4g", T4);
    assert_eq!(mdev_type_of(best(&m)), "nvidia-232");
    assert_eq!(
        refused(&m, "nvidia-319")[0].to_string(),
        "1 display heads < 2 required"
    );
    // Both shortfalls of T4-2A are named; the resolution is not asked once heads already fail.
    let r = refused(&m, "nvidia-226");
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(matches!(
        r[0],
        Reason::FramebufferTooSmall {
            have_mib: 2048,
            need_mib: 4096,
            ..
        }
    ));
    assert!(matches!(r[1], Reason::HeadsTooFew { have: 1, need: 2 }));
}

#[test]
fn t4_compute_prefers_c_over_q_of_equal_size() {
    let m = one(&t4_host(t4_types(8)), "compute-8g", T4);
    assert_eq!(mdev_type_of(best(&m)), "nvidia-320");
    assert_eq!(mdev_type_of(&m.alternatives[0]), "nvidia-233");
}

#[test]
fn capacity_breaks_ties_of_size_and_series() {
    let types = vec![
        nv_type("nvidia-223", "GRID T4-2B", 2048, 4, "5120x2880", 2),
        nv_type("nvidia-224", "GRID T4-2B4", 2048, 4, "5120x2880", 8),
    ];
    let m = one(&t4_host(types), "vdi-2g", T4);
    assert_eq!(mdev_type_of(best(&m)), "nvidia-224");
}

#[test]
fn homogeneous_rule_is_named() {
    let types: Vec<_> = t4_types(8)
        .into_iter()
        .map(|mut t| {
            if t.id.as_str() == "nvidia-231" {
                t.available_instances = 6;
                with_instances(t, 2)
            } else {
                t.available_instances = 0;
                t
            }
        })
        .collect();
    let m = one(&t4_host(types), "vdi-2g", T4);
    assert_eq!(mdev_type_of(best(&m)), "nvidia-231");
    assert_eq!(best(&m).capacity, 6);
    assert_eq!(
        refused(&m, "nvidia-223")[0].to_string(),
        "homogeneous: nvidia-231 instances exist, other types unavailable"
    );
}

#[test]
fn full_and_empty_types_say_0_available() {
    let types: Vec<_> = t4_types(8)
        .into_iter()
        .map(|mut t| {
            t.available_instances = 0;
            if t.id.as_str() == "nvidia-231" {
                with_instances(t, 8)
            } else {
                t
            }
        })
        .collect();
    let m = one(&t4_host(types), "vdi-2g", T4);
    assert!(m.best.is_none());
    assert_eq!(
        refused(&m, "nvidia-231")[0].to_string(),
        "0 instances available (8 exist)"
    );
    assert!(matches!(
        refused(&m, "nvidia-223")[0],
        Reason::Homogeneous { .. }
    ));

    let types: Vec<_> = t4_types(0);
    let m = one(&t4_host(types), "vdi-2g", T4);
    assert!(m.best.is_none());
    assert_eq!(
        refused(&m, "nvidia-223")[0].to_string(),
        "0 instances available"
    );
    assert!(messages(&m).contains("nvidia-223 (GRID T4-2B): 0 instances available"));
}

#[test]
fn unknown_descriptions_cannot_show_a_framebuffer() {
    let types = vec![
        odd_type("nvidia-999", Some("a fast vGPU\n"), 4),
        odd_type("nvidia-998", None, 4),
    ];
    let inv = t4_host(types);
    let m = one(&inv, "vdi-2g", T4);
    assert!(m.best.is_none());
    let r = refused(&m, "nvidia-999")[0].to_string();
    assert!(r.starts_with("framebuffer unknown (the description \"a fast vGPU\" of nvidia-999 is in no known format)"), "{r}");
    assert!(
        refused(&m, "nvidia-998")[0]
            .to_string()
            .contains("has no description")
    );
    // A profile without minimums takes it.
    let p = profile(
        "name = \"any\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\nbackends = [\"mdev\"]\n",
    );
    let report = match_profile(&p, &inv);
    let b = report.gpus[0].best.as_ref().unwrap();
    assert_eq!(b.framebuffer_mib, None);
    assert_eq!(b.waste_mib, None);
}

#[test]
fn device_api_must_match() {
    let mut t = nv_type("nvidia-223", "GRID T4-2B", 2048, 4, "5120x2880", 4);
    t.device_api = "vfio-ccw".to_string();
    let m = one(&t4_host(vec![t]), "vdi-2g", T4);
    assert_eq!(
        refused(&m, "nvidia-223")[0].to_string(),
        "device_api vfio-ccw, profile needs vfio-pci"
    );
}

#[test]
fn vendor_and_backend_filters_apply_first() {
    let inv = t4_host(t4_types(8));
    let p = profile(
        "name = \"amd-only\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\nvendors = [\"amd\"]\n",
    );
    let m = match_profile(&p, &inv).gpus[0].clone();
    assert_eq!(
        messages(&m),
        "NVIDIA T4: vendor nvidia not allowed by profile (allows amd)"
    );
    let p = profile(
        "name = \"vf\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\nbackends = [\"nvidia-vendor-vfio\"]\n",
    );
    let m = match_profile(&p, &inv).gpus[0].clone();
    assert_eq!(
        messages(&m),
        "NVIDIA T4: offers mdev, passthrough, none of the profile's backends (nvidia-vendor-vfio)"
    );
}

#[test]
fn prefer_ranks_backends_before_fit() {
    let inv = t4_host(t4_types(8));
    let p = profile(
        "name = \"p\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\nframebuffer = \"8G\"\nbackends = [\"mdev\", \"passthrough\"]\nprefer = [\"passthrough\"]\n",
    );
    let m = match_profile(&p, &inv).gpus[0].clone();
    let b = best(&m);
    assert!(matches!(b.target, Target::Passthrough { .. }), "{b:?}");
    assert_eq!(b.waste_mib, Some(8192));
    assert_eq!(mdev_type_of(&m.alternatives[0]), "nvidia-320");
    // Without prefer the least waste wins.
    let p = profile(
        "name = \"p\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\nframebuffer = \"8G\"\nbackends = [\"mdev\", \"passthrough\"]\n",
    );
    let m = match_profile(&p, &inv).gpus[0].clone();
    assert_eq!(mdev_type_of(best(&m)), "nvidia-320");
}

// ---- Intel GVT-g ----

const IGPU: &str = "0000:00:02.0";

fn gvt_host() -> Inventory {
    let mut igpu = bound(dev(IGPU, 0x8086, 0x3e92), "i915");
    igpu.boot_vga = true;
    let mut b = InvBuilder::new();
    // drivers/gpu/drm/i915/gvt/vgpu.c: V5_8 64+384 MB 1024x768 weight 2 … V5_1 512+2048 MB weight 16.
    b.mdev_gpu(
        igpu,
        "Intel UHD Graphics 630",
        vec![
            gvt_type("i915-GVTg_V5_1", 512, 2048, "1920x1200", 16, 1),
            gvt_type("i915-GVTg_V5_2", 256, 1024, "1920x1200", 8, 2),
            gvt_type("i915-GVTg_V5_4", 128, 512, "1920x1200", 4, 4),
            gvt_type("i915-GVTg_V5_8", 64, 384, "1024x768", 2, 8),
        ],
    );
    b.last_gpu().passthrough = Assignability::No {
        reason: "it is the boot VGA device: the host console runs on it".to_string(),
    };
    b.build()
}

#[test]
fn gvt_types_are_sized_by_aperture_plus_hidden_memory() {
    let inv = gvt_host();
    let m = one(&inv, "vdi-1g", IGPU);
    assert_eq!(mdev_type_of(best(&m)), "i915-GVTg_V5_2");
    assert_eq!(best(&m).framebuffer_mib, Some(1280));
    assert_eq!(best(&m).heads, Some(1));
    assert_eq!(
        refused(&m, "i915-GVTg_V5_4")[0].to_string(),
        "framebuffer 640 MiB < 1 GiB required"
    );
    assert_eq!(
        mdev_type_of(best(&one(&inv, "vdi-2g", IGPU))),
        "i915-GVTg_V5_1"
    );
    let m = one(&inv, "workstation-4g", IGPU);
    assert!(m.best.is_none());
}

#[test]
fn resolution_below_the_minimum_is_named() {
    let p = profile(
        "name = \"r\"\ndescription = \"d\"\nclass = \"vdi\"\nweight = 1\nframebuffer = \"256M\"\nheads = 1\nmax_resolution = \"1920x1080\"\n",
    );
    let m = match_profile(&p, &gvt_host()).gpus[0].clone();
    assert_eq!(mdev_type_of(best(&m)), "i915-GVTg_V5_4");
    assert_eq!(
        refused(&m, "i915-GVTg_V5_8")[0].to_string(),
        "max resolution 1024x768 < 1920x1080 required"
    );
}

#[test]
fn boot_vga_is_not_passed_through() {
    let m = one(&gvt_host(), "passthrough", IGPU);
    assert!(m.best.is_none());
    assert_eq!(
        messages(&m),
        "whole GPU 0000:00:02.0: not assignable: it is the boot VGA device: the host console runs on it"
    );
}

// ---- SR-IOV VFs (Intel xe, AMD MxGPU) ----

const FLEX: &str = "0000:4d:00.0";

fn flex_host(
    num_vfs: u32,
    driver: Option<&str>,
    vf: impl FnMut(u32, &mut mdev_types::model::PciDevice),
) -> Inventory {
    let mut pf = dev(FLEX, 0x8086, 0x56c0);
    pf.driver = driver.map(str::to_string);
    let mut b = InvBuilder::new();
    b.sriov_gpu(pf, "Intel Data Center GPU Flex 170", 31, num_vfs, vf);
    b.build()
}

fn sriov_target(o: &MatchOption) -> (Option<String>, u32, bool) {
    match &o.target {
        Target::SriovVf {
            vf,
            num_vfs,
            enable_vfs,
            ..
        } => (vf.map(|a| a.to_string()), *num_vfs, *enable_vfs),
        other => panic!("not a VF option: {other:?}"),
    }
}

#[test]
fn flex_without_vfs_splits_memory_for_the_profile() {
    let inv = flex_host(0, Some("xe"), |_, _| {});
    // 16 GiB / 2 GiB = 8 VFs of exactly 2 GiB.
    let b = best(&one(&inv, "vdi-2g", FLEX)).clone();
    assert_eq!(sriov_target(&b), (None, 8, true));
    assert_eq!(
        (b.framebuffer_mib, b.waste_mib, b.capacity),
        (Some(2048), Some(0), 8)
    );
    assert_eq!(
        b.target.to_string(),
        "VF of 0000:4d:00.0 after enabling 8 VFs"
    );
    assert_eq!(
        sriov_target(best(&one(&inv, "vdi-1g", FLEX))),
        (None, 16, true)
    );
    assert_eq!(
        sriov_target(best(&one(&inv, "compute-8g", FLEX))),
        (None, 2, true)
    );
    // No minimum: as many VFs as the device has.
    let p = profile("name = \"any\"\ndescription = \"d\"\nclass = \"compute\"\nweight = 1\n");
    let b = match_profile(&p, &inv).gpus[0].best.clone().unwrap();
    assert_eq!(sriov_target(&b), (None, 31, true));
    assert_eq!(b.framebuffer_mib, Some(16384 / 31));
    // A Flex VF has no display engine: a workstation that wants two heads cannot use it.
    let m = one(&inv, "workstation-4g", FLEX);
    assert_eq!(
        refused(&m, "VF of 0000:4d:00.0")[0].to_string(),
        "0 display heads < 2 required"
    );
}

#[test]
fn flex_with_vfs_uses_the_fixed_split() {
    let inv = flex_host(4, Some("xe"), |i, vf| {
        if i == 0 {
            vf.driver = Some("vfio-pci".to_string());
        }
    });
    let m = one(&inv, "vdi-2g", FLEX);
    let b = best(&m);
    // The unbound VF is chosen before one already on vfio-pci.
    assert_eq!(
        sriov_target(b),
        (Some("0000:4d:01.1".to_string()), 4, false)
    );
    assert_eq!(
        (b.framebuffer_mib, b.waste_mib, b.capacity),
        (Some(4096), Some(2048), 4)
    );
    let m = one(&inv, "compute-8g", FLEX);
    assert!(m.best.is_none());
    let msg = messages(&m);
    assert!(
        msg.contains("framebuffer 4 GiB < 8 GiB required (16 GiB split evenly over the 4 enabled VFs; the split is fixed while VFs exist"),
        "{msg}"
    );
}

#[test]
fn sriov_prerequisites_are_named() {
    let inv = flex_host(0, None, |_, _| {});
    let msg = messages(&one(&inv, "vdi-2g", FLEX));
    assert!(msg.contains("0000:4d:00.0 has no driver bound"), "{msg}");

    let inv = flex_host(2, Some("xe"), |_, vf| vf.iommu_group = None);
    let m = one(&inv, "vdi-2g", FLEX);
    assert!(m.best.is_none());
    assert!(
        messages(&m).contains("no IOMMU group: 0000:4d:01.0 has none"),
        "{}",
        messages(&m)
    );

    let mut pf = bound(dev(FLEX, 0x8086, 0x56c0), "xe");
    pf.iommu_group = None;
    let mut b = InvBuilder::new();
    b.sriov_gpu(pf, "Flex", 31, 0, |_, _| {});
    let msg = messages(&one(&b.build(), "vdi-2g", FLEX));
    assert!(msg.contains("no IOMMU group: 0000:4d:00.0"), "{msg}");
}

#[test]
fn unknown_sriov_device_has_no_known_memory() {
    let mut b = InvBuilder::new();
    b.sriov_gpu(
        bound(dev(FLEX, 0x8086, 0x0bd5), "xe"),
        "Intel device",
        63,
        0,
        |_, _| {},
    );
    let msg = messages(&one(&b.build(), "vdi-2g", FLEX));
    assert!(
        msg.contains("framebuffer unknown (device 0x8086:0x0bd5 is not in the device table"),
        "{msg}"
    );
}

const MI300X: &str = "0000:c1:00.0";

fn mi300x_host() -> Inventory {
    let mut b = InvBuilder::new();
    b.sriov_gpu(
        bound(dev(MI300X, 0x1002, 0x74a1), "gim"),
        "AMD Instinct MI300X",
        8,
        0,
        |_, _| {},
    );
    b.build()
}

#[test]
fn mi300x_serves_compute_not_desktops() {
    let inv = mi300x_host();
    let b = best(&one(&inv, "compute-8g", MI300X)).clone();
    // 192 GiB / 8 GiB would be 24 VFs; the device offers 8, so 24 GiB each.
    assert_eq!(sriov_target(&b), (None, 8, true));
    assert_eq!(b.framebuffer_mib, Some(24 * 1024));
    let m = one(&inv, "vdi-2g", MI300X);
    assert_eq!(
        messages(&m),
        "AMD Instinct MI300X: AMD Instinct MI300X is a compute accelerator without a graphics engine; class vdi needs one"
    );
}

// ---- NVIDIA vendor-specific VFIO ----

const L40S: &str = "0000:41:00.0";

fn l40s_host(
    vfs: u32,
    mut vf: impl FnMut(u32) -> Option<mdev_types::model::NvidiaVfState>,
) -> Inventory {
    let mut b = InvBuilder::new();
    b.sriov_gpu(
        bound(dev(L40S, 0x10de, 0x26b9), "nvidia"),
        "NVIDIA L40S",
        32,
        vfs,
        |i, d| {
            d.driver = Some("nvidia".to_string());
            d.nvidia_vf = vf(i);
        },
    );
    b.build()
}

fn vfio_target(o: &MatchOption) -> (String, u32, &str) {
    match &o.target {
        Target::NvidiaVendorVfio {
            vf,
            type_id,
            type_name,
            ..
        } => (vf.to_string(), *type_id, type_name.as_str()),
        other => panic!("not a vendor-VFIO option: {other:?}"),
    }
}

#[test]
fn l40s_vendor_vfio_types_by_name() {
    let inv = l40s_host(16, |_| Some(nvidia_vf(L40S_TYPES, None)));
    let b = best(&one(&inv, "vdi-2g", L40S)).clone();
    assert_eq!(
        vfio_target(&b),
        ("0000:41:01.0".to_string(), 1156, "NVIDIA L40S-2B")
    );
    assert_eq!((b.framebuffer_mib, b.capacity), (Some(2048), 16));
    assert_eq!(b.target.backend(), Backend::NvidiaVendorVfio);
    let b = best(&one(&inv, "compute-8g", L40S)).clone();
    // 48 GiB hold six 8 GiB vGPUs, whatever the number of free VFs.
    assert_eq!((vfio_target(&b).1, b.capacity), (1171, 6));
    let m = one(&inv, "workstation-4g", L40S);
    assert_eq!(vfio_target(best(&m)).2, "NVIDIA L40S-4Q");
    assert_eq!(best(&m).heads, Some(4));
    assert_eq!(
        refused(&m, "NVIDIA L40S-4C")[0].to_string(),
        "1 display heads < 2 required"
    );
}

#[test]
fn l40s_capacity_counts_framebuffer_already_used() {
    // Two VFs hold a 16Q each: 32 of 48 GiB used, so two 8 GiB vGPUs fit although 14 VFs are free.
    let inv = l40s_host(16, |i| Some(nvidia_vf(L40S_TYPES, (i < 2).then_some(1164))));
    let b = best(&one(&inv, "compute-8g", L40S)).clone();
    assert_eq!(
        vfio_target(&b),
        ("0000:41:01.2".to_string(), 1171, "NVIDIA L40S-8C")
    );
    assert_eq!(b.capacity, 2);
    let m = one(&inv, "passthrough", L40S);
    assert!(
        messages(&m).contains("in use: 2 of its VFs hold a vGPU"),
        "{}",
        messages(&m)
    );
}

#[test]
fn l40s_refusals() {
    let inv = l40s_host(0, |_| None);
    let msg = messages(&one(&inv, "vdi-2g", L40S));
    assert_eq!(
        msg,
        "nvidia-vendor-vfio on 0000:41:00.0: SR-IOV VFs are not enabled on 0000:41:00.0; enable them with `/usr/lib/nvidia/sriov-manage -e 0000:41:00.0`"
    );
    let inv = l40s_host(4, |_| None);
    assert!(messages(&one(&inv, "vdi-2g", L40S)).contains("have no nvidia/ directory"));
    let inv = l40s_host(2, |_| Some(nvidia_vf(L40S_TYPES, Some(1164))));
    assert!(messages(&one(&inv, "vdi-2g", L40S)).ends_with("all 2 VFs already hold a vGPU"));
    let inv = l40s_host(4, |i| {
        Some(nvidia_vf(
            if i == 0 { L40S_TYPES } else { &[] },
            (i == 0).then_some(1161),
        ))
    });
    let msg = messages(&one(&inv, "vdi-2g", L40S));
    assert!(
        msg.ends_with("creatable_vgpu_types lists no type: the framebuffer is used up by 1 vGPUs"),
        "{msg}"
    );
}

// ---- whole-GPU passthrough ----

#[test]
fn passthrough_of_an_assignable_gpu() {
    let mut b = InvBuilder::new();
    b.plain_gpu(bound(dev(T4, 0x10de, 0x1eb8), "vfio-pci"), "NVIDIA T4");
    let inv = b.build();
    let m = one(&inv, "passthrough", T4);
    let o = best(&m);
    assert_eq!(
        o.target.to_string(),
        "whole GPU 0000:3b:00.0 (IOMMU group 15104)"
    );
    assert_eq!((o.framebuffer_mib, o.capacity), (Some(16384), 1));
    // A T4 with vGPUs on it is in use.
    let types = vec![with_instances(
        nv_type("nvidia-231", "GRID T4-2Q", 2048, 4, "5120x2880", 6),
        2,
    )];
    let m = one(&t4_host(types), "passthrough", T4);
    assert_eq!(
        messages(&m),
        "whole GPU 0000:3b:00.0 (IOMMU group 15104): in use: 2 mdev instances exist on it"
    );
}

/// The real H200 capture: no IOMMU, so not even passthrough.
#[test]
fn h200_capture_cannot_serve_anything() {
    use mdev_types::discover::discover;
    use mdev_types::host::SysfsHost;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/fixtures/h200-passthrough");
    let inv = discover(&SysfsHost::new(&root).unwrap()).unwrap();
    let m = one(&inv, "passthrough", "0000:00:06.0");
    assert!(m.best.is_none());
    assert!(
        messages(&m).contains("not assignable: it has no IOMMU group"),
        "{}",
        messages(&m)
    );
    let m = one(&inv, "compute-8g", "0000:00:06.0");
    assert_eq!(
        messages(&m),
        "NVIDIA H200: offers passthrough, none of the profile's backends (mdev, sriov-vf, nvidia-vendor-vfio)"
    );
    let m = one(&inv, "vdi-1g", "0000:00:06.0");
    assert!(
        messages(&m).contains("compute accelerator"),
        "{}",
        messages(&m)
    );
}

// ---- kernel sample drivers ----

fn samples_host() -> Inventory {
    let mut b = InvBuilder::new();
    b.virtual_parent(
        "mbochs",
        vec![
            mbochs_type("mbochs-small", 4, 64),
            mbochs_type("mbochs-medium", 16, 16),
            mbochs_type("mbochs-large", 64, 4),
        ],
    );
    b.virtual_parent(
        "mdpy",
        vec![
            mdpy_type("mdpy-vga", "640x480", 4),
            mdpy_type("mdpy-xga", "1024x768", 4),
            mdpy_type("mdpy-hd", "1920x1080", 4),
        ],
    );
    b.build()
}

#[test]
fn sample_profiles_pick_the_sample_types() {
    let inv = samples_host();
    let m = one(&inv, "sample-display-16m", "mbochs");
    assert_eq!(mdev_type_of(best(&m)), "mbochs-medium");
    assert_eq!(
        refused(&m, "mbochs-small")[0].to_string(),
        "framebuffer 4 MiB < 16 MiB required"
    );
    // mdpy-hd allocates roundup_pow_of_two(1920*1080*4) = 8 MiB, too little for 16 MB.
    let m = one(&inv, "sample-display-16m", "mdpy");
    assert!(m.best.is_none());
    assert_eq!(
        refused(&m, "mdpy-hd")[0].to_string(),
        "framebuffer 8 MiB < 16 MiB required"
    );

    let m = one(&inv, "sample-display-1080p", "mdpy");
    assert_eq!(mdev_type_of(best(&m)), "mdpy-hd");
    assert_eq!(
        refused(&m, "mdpy-xga")
            .iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>(),
        [
            "framebuffer 4 MiB < 8 MiB required",
            "max resolution 1024x768 < 1920x1080 required"
        ]
    );
    let m = one(&inv, "sample-display-1080p", "mbochs");
    assert!(m.best.is_none());
    assert!(
        refused(&m, "mbochs-medium")[0]
            .to_string()
            .contains("an mbochs description gives video memory, not a resolution")
    );
    // Real-hardware profiles do not take virtual parents.
    assert!(messages(&one(&inv, "vdi-1g", "mbochs")).contains("vendor virtual not allowed"));
}

// ---- the report as a whole ----

fn mixed_host() -> Inventory {
    let mut inv = t4_host(t4_types(8));
    for other in [
        gvt_host(),
        flex_host(0, Some("xe"), |_, _| {}),
        mi300x_host(),
        samples_host(),
    ] {
        inv.pci_devices.extend(other.pci_devices);
        inv.mdev_parents.extend(other.mdev_parents);
        inv.gpus.extend(other.gpus);
    }
    inv
}

#[test]
fn report_has_one_entry_per_gpu_in_order() {
    let inv = mixed_host();
    let r = match_profile(&shipped("vdi-2g"), &inv);
    let ids: Vec<&str> = r.gpus.iter().map(|g| g.gpu.as_str()).collect();
    let want: Vec<&str> = inv.gpus.iter().map(|g: &Gpu| g.id.as_str()).collect();
    assert_eq!(ids, want);
    let servable: Vec<&str> = r.servable().map(|g| g.gpu.as_str()).collect();
    assert_eq!(servable, [T4, IGPU, FLEX]);
    assert_eq!(r.profile, "vdi-2g");
    assert_eq!(r.host, "hand-built");
    assert_eq!(r.gpu(MI300X).unwrap().vendor, Vendor::Amd);
}

#[test]
fn json_field_names_are_stable() {
    let r = match_profile(&shipped("vdi-2g"), &mixed_host());
    let v = serde_json::to_value(&r).unwrap();
    let t4 = &v["gpus"][0];
    assert_eq!(t4["gpu"], T4);
    assert_eq!(t4["pci"], T4);
    assert_eq!(t4["vendor"], "nvidia");
    assert_eq!(t4["numa_node"], 0);
    let best = &t4["best"];
    assert_eq!(best["backend"], "mdev");
    assert_eq!(best["parent"], T4);
    assert_eq!(best["type_id"], "nvidia-223");
    assert_eq!(best["type_name"], "GRID T4-2B");
    assert_eq!(best["framebuffer_mib"], 2048);
    assert_eq!(best["heads"], 4);
    assert_eq!(best["max_resolution"]["width"], 5120);
    assert_eq!(best["device_api"], "vfio-pci");
    assert_eq!(best["series"], "B");
    assert_eq!(best["capacity"], 8);
    assert_eq!(best["waste_mib"], 0);
    assert!(t4["alternatives"].is_array());
    let refusal = &t4["refused"][0];
    assert_eq!(refusal["candidate"], "nvidia-222 (GRID T4-1B)");
    assert_eq!(refusal["reasons"][0]["code"], "framebuffer-too-small");
    assert_eq!(
        refusal["reasons"][0]["message"],
        "framebuffer 1 GiB < 2 GiB required"
    );
    let flex = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gpu"] == FLEX)
        .unwrap();
    assert_eq!(flex["best"]["backend"], "sriov-vf");
    assert_eq!(flex["best"]["pf"], FLEX);
    assert_eq!(flex["best"]["num_vfs"], 8);
    assert_eq!(flex["best"]["enable_vfs"], true);
    assert!(flex["best"]["vf"].is_null());
    let mi = v["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["gpu"] == MI300X)
        .unwrap();
    assert!(mi["best"].is_null());
    assert_eq!(mi["refused"][0]["reasons"][0]["code"], "no-graphics");
}
