//! Hand-built hosts for matching tests, one per vendor path, and helpers to read a report.

use mdev_types::model::{Assignability, Inventory, MdevType, NvidiaVfState, PciDevice};

use super::build::*;
use crate::profile::{GpuMatch, MatchOption, ProfileTarget, Reason, match_profile};

pub fn one(inv: &Inventory, profile: &str, gpu: &str) -> GpuMatch {
    let report = match_profile(&shipped(profile), inv);
    report.gpu(gpu).unwrap().clone()
}

pub fn best(m: &GpuMatch) -> &MatchOption {
    m.best
        .as_ref()
        .unwrap_or_else(|| panic!("{} cannot serve: {:?}", m.gpu, m.why_not()))
}

pub fn mdev_type_of(o: &MatchOption) -> &str {
    match &o.target {
        ProfileTarget::Mdev { type_id, .. } => type_id.as_str(),
        other => panic!("not an mdev option: {other:?}"),
    }
}

/// The reasons given for the candidate whose label starts with `prefix`.
pub fn refused<'a>(m: &'a GpuMatch, prefix: &str) -> &'a [Reason] {
    &m.refused
        .iter()
        .find(|r| r.candidate.starts_with(prefix))
        .unwrap_or_else(|| panic!("no refusal for {prefix} in {:#?}", m.refused))
        .reasons
}

pub fn messages(m: &GpuMatch) -> String {
    m.why_not().unwrap_or_default()
}

pub const T4: &str = "0000:3b:00.0";

pub fn t4_host(types: Vec<MdevType>) -> Inventory {
    let mut b = InvBuilder::new();
    b.mdev_gpu(bound(dev(T4, 0x10de, 0x1eb8), "nvidia"), "NVIDIA T4", types);
    b.build()
}

pub const IGPU: &str = "0000:00:02.0";

pub fn gvt_host() -> Inventory {
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

pub const FLEX: &str = "0000:4d:00.0";

pub fn flex_host(
    num_vfs: u32,
    driver: Option<&str>,
    vf: impl FnMut(u32, &mut PciDevice),
) -> Inventory {
    let mut pf = dev(FLEX, 0x8086, 0x56c0);
    pf.driver = driver.map(str::to_string);
    let mut b = InvBuilder::new();
    b.sriov_gpu(pf, "Intel Data Center GPU Flex 170", 31, num_vfs, vf);
    b.build()
}

pub fn sriov_target(o: &MatchOption) -> (Option<String>, u32, bool) {
    match &o.target {
        ProfileTarget::SriovVf {
            vf,
            num_vfs,
            enable_vfs,
            ..
        } => (vf.map(|a| a.to_string()), *num_vfs, *enable_vfs),
        other => panic!("not a VF option: {other:?}"),
    }
}

pub const MI300X: &str = "0000:c1:00.0";

pub fn mi300x_host() -> Inventory {
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

pub const L40S: &str = "0000:41:00.0";

pub fn l40s_host(vfs: u32, mut vf: impl FnMut(u32) -> Option<NvidiaVfState>) -> Inventory {
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

pub fn vfio_target(o: &MatchOption) -> (String, u32, &str) {
    match &o.target {
        ProfileTarget::NvidiaVendorVfio {
            vf,
            type_id,
            type_name,
            ..
        } => (vf.to_string(), *type_id, type_name.as_str()),
        other => panic!("not a vendor-VFIO option: {other:?}"),
    }
}

pub fn samples_host() -> Inventory {
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

pub fn mixed_host() -> Inventory {
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
