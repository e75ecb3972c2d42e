//! Options of an SR-IOV physical function: a VF through vfio-pci (Intel xe/i915, AMD MxGPU), or a
//! vGPU type on a VF through NVIDIA's vendor-specific VFIO interface.

use std::collections::BTreeMap;

use mdev_types::model::{Inventory, PciDevice, SriovPf};

use super::{Candidate, MatchOption, ProfileTarget, not_in_table};
use crate::profile::facts::{
    NVIDIA_SRIOV_MANAGE, device_facts, nvidia_name_framebuffer_mib, nvidia_series_display,
};
use crate::profile::reason::{Reason, fmt_mib};
use crate::profile::spec::VFIO_PCI;
use mdev_types::parse::parse_nvidia_vgpu_name;

/// The SR-IOV VF option of a (non-NVIDIA) PF: a free VF when VFs exist, otherwise enabling as many
/// VFs as leave each at least `need_mib` (the least framebuffer wasted, the most guests served).
pub(super) fn sriov_candidate(
    pf: &PciDevice,
    sriov: &SriovPf,
    inv: &Inventory,
    need_mib: u64,
) -> Candidate {
    let facts = device_facts(pf.vendor, pf.device);
    let memory = facts.and_then(|f| f.memory_mib);
    let why_no_fb = match (facts, memory) {
        (None, _) => not_in_table(pf),
        (Some(_), None) => format!("device {}:{} shares system memory", pf.vendor, pf.device),
        _ => String::new(),
    };
    let mut blockers = Vec::new();
    let (target, num_vfs, capacity, context) = if sriov.num_vfs == 0 {
        let n = match memory {
            Some(m) if need_mib > 0 => (m / need_mib).clamp(1, u64::from(sriov.total_vfs)),
            _ => u64::from(sriov.total_vfs),
        };
        let n = u32::try_from(n).unwrap_or(sriov.total_vfs);
        if pf.driver.is_none() {
            blockers.push(Reason::PfDriverMissing { pf: pf.address });
        }
        if pf.iommu_group.is_none() {
            blockers.push(Reason::NoIommuGroup { device: pf.address });
        }
        let target = ProfileTarget::SriovVf {
            pf: pf.address,
            vf: None,
            vf_driver: None,
            num_vfs: n,
            enable_vfs: true,
        };
        let context = memory.map(|m| {
            format!(
                "{} split over {n} VFs; at most {} VFs",
                fmt_mib(m),
                sriov.total_vfs
            )
        });
        (target, n, n, context)
    } else {
        // Which VFs a running guest holds is the daemon's allocation state, not sysfs; here every
        // VF VFIO can isolate counts, and an unbound one is chosen first.
        let vfs: Vec<&PciDevice> = sriov
            .vfs
            .iter()
            .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
            .filter(|d| d.iommu_group.is_some())
            .collect();
        let chosen = vfs
            .iter()
            .find(|d| d.driver.is_none())
            .or_else(|| vfs.first());
        if chosen.is_none() {
            let device = sriov.vfs.first().copied().unwrap_or(pf.address);
            blockers.push(Reason::NoIommuGroup { device });
        }
        let target = ProfileTarget::SriovVf {
            pf: pf.address,
            vf: chosen.map(|d| d.address),
            vf_driver: chosen.and_then(|d| d.driver.clone()),
            num_vfs: sriov.num_vfs,
            enable_vfs: false,
        };
        let context = memory.map(|m| {
            format!(
                "{} split evenly over the {} enabled VFs; the split is fixed while VFs exist \
                 (write 0 to sriov_numvfs to change it)",
                fmt_mib(m),
                sriov.num_vfs
            )
        });
        let capacity = u32::try_from(vfs.len()).unwrap_or(u32::MAX);
        (target, sriov.num_vfs, capacity, context)
    };
    let heads = facts.map(|f| f.vf_heads);
    let why_no_display = match facts {
        None => not_in_table(pf),
        Some(f) => format!(
            "the device table gives {} heads per VF of {}:{} but no resolution",
            f.vf_heads, pf.vendor, pf.device
        ),
    };
    Candidate {
        option: MatchOption {
            target,
            framebuffer_mib: memory.map(|m| m / u64::from(num_vfs.max(1))),
            heads,
            max_resolution: None,
            device_api: VFIO_PCI.to_string(),
            series: None,
            capacity,
            waste_mib: None,
        },
        blockers,
        why_no_fb,
        why_no_display,
        fb_context: context,
    }
}

/// NVIDIA vendor-specific VFIO: one option per vGPU type creatable on a free VF.
pub(super) fn nvidia_vfio_candidates(
    pf: &PciDevice,
    sriov: &SriovPf,
    inv: &Inventory,
) -> Result<Vec<Candidate>, Reason> {
    let vfs: Vec<&PciDevice> = sriov
        .vfs
        .iter()
        .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
        .filter(|d| d.nvidia_vf.is_some())
        .collect();
    if vfs.is_empty() {
        return Err(if sriov.num_vfs == 0 {
            Reason::VfsNotEnabled {
                pf: pf.address,
                how: NVIDIA_SRIOV_MANAGE.to_string(),
            }
        } else {
            Reason::NoVendorInterface { pf: pf.address }
        });
    }
    let (free, occupied): (Vec<&PciDevice>, Vec<&PciDevice>) = vfs.iter().partition(|d| {
        d.nvidia_vf
            .as_ref()
            .is_some_and(|n| n.current_type.is_none())
    });
    if free.is_empty() {
        return Err(Reason::NoFreeVf {
            num_vfs: sriov.num_vfs,
        });
    }
    // Names of every type id any VF lists, to size the vGPUs that exist.
    let mut names: BTreeMap<u32, &str> = BTreeMap::new();
    for d in &vfs {
        for t in d.nvidia_vf.iter().flat_map(|n| &n.creatable) {
            names.entry(t.id).or_insert(&t.name);
        }
    }
    // Framebuffer left on the GPU, when every existing vGPU's size is known: all VFs share the
    // GPU's framebuffer, so counting free VFs alone overstates capacity.
    let memory = device_facts(pf.vendor, pf.device).and_then(|f| f.memory_mib);
    let used: Option<u64> = occupied
        .iter()
        .map(|d| {
            let id = d.nvidia_vf.as_ref()?.current_type?;
            let n = parse_nvidia_vgpu_name(names.get(&id)?).ok()?;
            Some(nvidia_name_framebuffer_mib(n.framebuffer_gib))
        })
        .sum();
    let left = memory.zip(used).map(|(m, u)| m.saturating_sub(u));

    // Per type: the free VFs listing it, in address order.
    let mut by_type: BTreeMap<u32, (String, Vec<&PciDevice>)> = BTreeMap::new();
    for d in &free {
        for t in d.nvidia_vf.iter().flat_map(|n| &n.creatable) {
            by_type
                .entry(t.id)
                .or_insert_with(|| (t.name.clone(), Vec::new()))
                .1
                .push(d);
        }
    }
    if by_type.is_empty() {
        return Err(Reason::FramebufferExhausted {
            occupied: occupied.len(),
        });
    }
    let mut out = Vec::new();
    for (id, (name, on)) in by_type {
        let parsed = parse_nvidia_vgpu_name(&name).ok();
        let fb = parsed
            .as_ref()
            .map(|n| nvidia_name_framebuffer_mib(n.framebuffer_gib));
        let display = parsed.as_ref().map(|n| {
            let (heads, res) = nvidia_series_display(n.series);
            (n.heads.unwrap_or(heads), res)
        });
        // Only VFs VFIO can isolate count; the first of them is the one to use.
        let usable: Vec<&PciDevice> = on
            .iter()
            .copied()
            .filter(|d| d.iommu_group.is_some())
            .collect();
        let Some(vf) = usable.first().or(on.first()).copied() else {
            continue;
        };
        let mut blockers = Vec::new();
        if usable.is_empty() {
            blockers.push(Reason::NoIommuGroup { device: vf.address });
        }
        let mut capacity = u32::try_from(usable.len()).unwrap_or(u32::MAX);
        if let (Some(left), Some(fb)) = (left, fb.filter(|&f| f > 0)) {
            capacity = capacity.min(u32::try_from(left / fb).unwrap_or(u32::MAX));
        }
        if capacity == 0 && !usable.is_empty() {
            blockers.push(Reason::FramebufferExhausted {
                occupied: occupied.len(),
            });
        }
        out.push(Candidate {
            option: MatchOption {
                target: ProfileTarget::NvidiaVendorVfio {
                    pf: pf.address,
                    vf: vf.address,
                    type_id: id,
                    type_name: name.clone(),
                },
                framebuffer_mib: fb,
                heads: display.map(|d| d.0),
                max_resolution: display.map(|d| d.1),
                device_api: VFIO_PCI.to_string(),
                series: parsed.map(|n| n.series),
                capacity,
                waste_mib: None,
            },
            blockers,
            why_no_fb: format!("type name {name:?} is not in NVIDIA's naming scheme"),
            why_no_display: format!("type name {name:?} is not in NVIDIA's naming scheme"),
            fb_context: None,
        });
    }
    Ok(out)
}
