//! Matching mdev types: NVIDIA classic vGPU, Intel GVT-g and the kernel's sample drivers.

use crate::profile::{Delivery, ProfileTarget, Reason, match_profile};

use super::build::*;
use super::hosts::*;

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
    assert_eq!(b.target.backend(), Delivery::Mdev);
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
    assert!(
        matches!(b.target, ProfileTarget::Passthrough { .. }),
        "{b:?}"
    );
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

// ---- kernel sample drivers ----
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
