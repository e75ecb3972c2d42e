//! Whole-GPU passthrough, the real H200 capture, and the report as a whole (order, JSON).

use mdev_types::model::{Gpu, Vendor};

use crate::profile::match_profile;

use super::build::*;
use super::hosts::*;

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
    use vgpu_host::SysfsHost;
    use vgpu_host::discover::discover;
    let root =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/h200-passthrough");
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

// ---- the report as a whole ----
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
