//! The concrete options one GPU offers, per backend: mdev types, SR-IOV VF configurations, NVIDIA
//! vendor-specific VFIO types and whole-GPU passthrough, each with what it gives a guest (framebuffer,
//! heads, resolution) and what in the host's current state stands in its way.

use std::collections::BTreeMap;
use std::fmt;

use mdev_types::ids::{IommuGroup, MdevTypeId, PciAddress};
use mdev_types::model::{
    Assignability, Gpu, Inventory, MdevParent, MdevType, PciDevice, SriovPf, Vendor,
};
use mdev_types::parse::{NvidiaSeries, Resolution, TypeDescription, parse_nvidia_vgpu_name};
use serde::Serialize;

use super::facts::{
    GVT_HEADS, NVIDIA_SRIOV_MANAGE, SAMPLE_HEADS, device_facts, mdpy_memory_mib,
    nvidia_name_framebuffer_mib, nvidia_series_display,
};
use super::reason::{Reason, Refusal, fmt_mib};
use super::spec::{Backend, VFIO_PCI};

/// What to create or hand over to give a guest its vGPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "backend", rename_all = "kebab-case")]
pub enum Target {
    /// Create an mdev of `type_id` on `parent`.
    Mdev {
        /// The parent's name (`0000:3b:00.0`, `mbochs`).
        parent: String,
        /// The type (`nvidia-231`).
        type_id: MdevTypeId,
        /// The type's `name`, when it has one (`GRID T4-2Q`).
        type_name: Option<String>,
    },
    /// Assign an SR-IOV VF of `pf` through vfio-pci.
    SriovVf {
        /// The physical function.
        pf: PciAddress,
        /// The VF to assign, when VFs exist; `None` when they must be enabled first.
        vf: Option<PciAddress>,
        /// The driver the chosen VF is bound to now (`vfio-pci`, `xe`, none).
        vf_driver: Option<String>,
        /// How many VFs are (or are to be) enabled: the device memory is split evenly over them.
        num_vfs: u32,
        /// Whether `num_vfs` VFs must be enabled first (SR-IOV is off now).
        enable_vfs: bool,
    },
    /// Write `type_id` to `vf`'s `nvidia/current_vgpu_type` and assign the VF (`managed='no'`).
    NvidiaVendorVfio {
        /// The physical function.
        pf: PciAddress,
        /// The VF to use.
        vf: PciAddress,
        /// The numeric vGPU type id.
        type_id: u32,
        /// The vGPU type name (`NVIDIA L40S-4Q`).
        type_name: String,
    },
    /// Assign the whole GPU through vfio-pci.
    Passthrough {
        /// The GPU.
        pci: PciAddress,
        /// Its IOMMU group (everything in it goes to the guest).
        iommu_group: IommuGroup,
    },
}

impl Target {
    /// The backend this target belongs to.
    pub fn backend(&self) -> Backend {
        match self {
            Target::Mdev { .. } => Backend::Mdev,
            Target::SriovVf { .. } => Backend::SriovVf,
            Target::NvidiaVendorVfio { .. } => Backend::NvidiaVendorVfio,
            Target::Passthrough { .. } => Backend::Passthrough,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Mdev {
                type_id,
                type_name: Some(n),
                ..
            } => write!(f, "{type_id} ({n})"),
            Target::Mdev { type_id, .. } => write!(f, "{type_id}"),
            Target::SriovVf {
                pf,
                num_vfs,
                enable_vfs: true,
                ..
            } => write!(f, "VF of {pf} after enabling {num_vfs} VFs"),
            Target::SriovVf {
                vf: Some(vf),
                num_vfs,
                ..
            } => write!(f, "VF {vf} (1 of {num_vfs} enabled)"),
            Target::SriovVf { pf, num_vfs, .. } => write!(f, "VF of {pf} ({num_vfs} enabled)"),
            Target::NvidiaVendorVfio {
                vf,
                type_id,
                type_name,
                ..
            } => write!(f, "{type_name} (type {type_id}) on VF {vf}"),
            Target::Passthrough { pci, iommu_group } => {
                write!(f, "whole GPU {pci} (IOMMU group {iommu_group})")
            }
        }
    }
}

/// A concrete option and what it gives a guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MatchOption {
    /// What to create or assign (its `backend` field says which kind).
    #[serde(flatten)]
    pub target: Target,
    /// Framebuffer in MiB, when known.
    pub framebuffer_mib: Option<u64>,
    /// Display heads, when known (0: none).
    pub heads: Option<u32>,
    /// Per-head maximum resolution, when known.
    pub max_resolution: Option<Resolution>,
    /// VFIO device API the guest sees.
    pub device_api: String,
    /// NVIDIA vGPU series, for NVIDIA types.
    pub series: Option<NvidiaSeries>,
    /// How many more of this option can be created now.
    pub capacity: u32,
    /// Framebuffer beyond the profile's minimum, MiB (set by matching; `None` when unknown).
    pub waste_mib: Option<u64>,
}

/// An option with the host-state problems that stop it now, independent of any profile.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub option: MatchOption,
    /// Problems of the host's current state (no instances left, no IOMMU group, …).
    pub blockers: Vec<Reason>,
    /// Why the framebuffer is `None`, for the refusal message.
    pub why_no_fb: String,
    /// Why heads or resolution are `None`, for the refusal message.
    pub why_no_display: String,
    /// How the framebuffer size came about, when that tells the operator what to change.
    pub fb_context: Option<String>,
}

/// Everything one GPU offers under the allowed backends.
#[derive(Debug, Default)]
pub(super) struct Offers {
    /// Backends the GPU has at all (allowed or not).
    pub offered: Vec<Backend>,
    /// Concrete options.
    pub candidates: Vec<Candidate>,
    /// Backends that are present but yield no option, with why.
    pub refusals: Vec<Refusal>,
}

/// Collects what `gpu` offers under `allowed` backends; `need_mib` sizes an SR-IOV split.
pub(super) fn offers(gpu: &Gpu, inv: &Inventory, allowed: &[Backend], need_mib: u64) -> Offers {
    let mut out = Offers::default();
    let device = gpu
        .pci
        .and_then(|a| inv.pci_devices.iter().find(|d| d.address == a));
    let parent = inv.mdev_parents.iter().find(|p| match gpu.pci {
        Some(a) => p.pci == Some(a),
        None => p.name == gpu.id,
    });
    let sriov_pf =
        device.and_then(|d| d.sriov.as_ref().filter(|s| s.total_vfs > 0).map(|s| (d, s)));

    if let Some(parent) = parent {
        out.offered.push(Backend::Mdev);
        if allowed.contains(&Backend::Mdev) {
            if parent.types.is_empty() {
                out.refusals.push(Refusal {
                    candidate: format!("mdev parent {}", parent.name),
                    reasons: vec![Reason::NoTypes {
                        parent: parent.name.clone(),
                    }],
                });
            }
            out.candidates.extend(mdev_candidates(gpu.vendor, parent));
        }
    }
    if let Some((pf, sriov)) = sriov_pf {
        let backend = if gpu.vendor == Vendor::Nvidia {
            Backend::NvidiaVendorVfio
        } else {
            Backend::SriovVf
        };
        out.offered.push(backend);
        if allowed.contains(&backend) {
            let r = if backend == Backend::SriovVf {
                Ok(vec![sriov_candidate(pf, sriov, inv, need_mib)])
            } else {
                nvidia_vfio_candidates(pf, sriov, inv)
            };
            match r {
                Ok(c) => out.candidates.extend(c),
                Err(reason) => out.refusals.push(Refusal {
                    candidate: format!("{backend} on {}", pf.address),
                    reasons: vec![reason],
                }),
            }
        }
    }
    if let Some(dev) = device {
        out.offered.push(Backend::Passthrough);
        if allowed.contains(&Backend::Passthrough) {
            match passthrough_candidate(gpu, dev, parent, inv) {
                Ok(c) => out.candidates.push(c),
                Err(r) => out.refusals.push(r),
            }
        }
    }
    out
}

/// Framebuffer, heads, resolution a type description gives, or why they are unknown.
type Described = (Option<u64>, Option<u32>, Option<Resolution>, String);

/// Framebuffer, heads and resolution a type description gives, or why they are unknown.
fn describe(t: &MdevType) -> Described {
    match &t.details {
        TypeDescription::Nvidia(d) => (
            Some(d.framebuffer_mib),
            Some(d.num_heads),
            Some(d.max_resolution),
            String::new(),
        ),
        // GVT-g graphics memory is the aperture (low) plus the hidden (high) GGTT range
        // (drivers/gpu/drm/i915/gvt/vgpu.c, `intel_vgpu_configs`).
        TypeDescription::Gvt(d) => (
            Some(d.low_gm_mib.saturating_add(d.high_gm_mib)),
            Some(GVT_HEADS),
            Some(d.resolution),
            String::new(),
        ),
        TypeDescription::SampleVideoMemory { mib } => (
            Some(*mib),
            Some(SAMPLE_HEADS),
            None,
            "an mbochs description gives video memory, not a resolution".to_string(),
        ),
        TypeDescription::SampleFramebuffer { resolution } => (
            Some(mdpy_memory_mib(*resolution)),
            Some(SAMPLE_HEADS),
            Some(*resolution),
            String::new(),
        ),
        TypeDescription::Unknown => {
            let why = match &t.description {
                None => format!("type {} has no description", t.id),
                Some(d) => format!(
                    "the description {:?} of {} is in no known format",
                    d.trim(),
                    t.id
                ),
            };
            (None, None, None, why)
        }
    }
}

fn mdev_candidates(vendor: Vendor, parent: &MdevParent) -> Vec<Candidate> {
    let with_instances: Vec<&MdevType> = parent
        .types
        .iter()
        .filter(|t| !t.instances.is_empty())
        .collect();
    parent
        .types
        .iter()
        .map(|t| {
            let (fb, heads, res, why) = describe(t);
            let series = t
                .name
                .as_deref()
                .filter(|_| vendor == Vendor::Nvidia)
                .and_then(|n| parse_nvidia_vgpu_name(n).ok())
                .map(|n| n.series);
            let mut blockers = Vec::new();
            if t.available_instances == 0 {
                let others: Vec<String> = with_instances
                    .iter()
                    .filter(|o| o.id != t.id)
                    .map(|o| o.id.to_string())
                    .collect();
                // NVIDIA time-sliced vGPUs on one GPU must all be of one type (NVIDIA vGPU User
                // Guide, "Homogeneous vGPUs"), so other types show 0 available once one exists.
                if vendor == Vendor::Nvidia && t.instances.is_empty() && !others.is_empty() {
                    blockers.push(Reason::Homogeneous {
                        existing_types: others,
                    });
                } else {
                    blockers.push(Reason::NoInstances {
                        existing: t.instances.len(),
                    });
                }
            }
            Candidate {
                option: MatchOption {
                    target: Target::Mdev {
                        parent: parent.name.clone(),
                        type_id: t.id.clone(),
                        type_name: t.name.clone(),
                    },
                    framebuffer_mib: fb,
                    heads,
                    max_resolution: res,
                    device_api: t.device_api.clone(),
                    series,
                    capacity: t.available_instances,
                    waste_mib: None,
                },
                blockers,
                why_no_fb: why.clone(),
                why_no_display: why,
                fb_context: None,
            }
        })
        .collect()
}

fn not_in_table(dev: &PciDevice) -> String {
    format!(
        "device {}:{} is not in the device table (vgpu-manager/src/profile/facts.rs)",
        dev.vendor, dev.device
    )
}

/// The SR-IOV VF option of a (non-NVIDIA) PF: a free VF when VFs exist, otherwise enabling as many
/// VFs as leave each at least `need_mib` (the least framebuffer wasted, the most guests served).
fn sriov_candidate(pf: &PciDevice, sriov: &SriovPf, inv: &Inventory, need_mib: u64) -> Candidate {
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
        let target = Target::SriovVf {
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
        let target = Target::SriovVf {
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
fn nvidia_vfio_candidates(
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
                target: Target::NvidiaVendorVfio {
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

fn passthrough_candidate(
    gpu: &Gpu,
    dev: &PciDevice,
    parent: Option<&MdevParent>,
    inv: &Inventory,
) -> Result<Candidate, Refusal> {
    let iommu_group = match &gpu.passthrough {
        Assignability::Yes { iommu_group } => *iommu_group,
        Assignability::No { reason } => {
            return Err(Refusal {
                candidate: format!("whole GPU {}", dev.address),
                reasons: vec![Reason::NotAssignable {
                    reason: reason.clone(),
                }],
            });
        }
    };
    let mut blockers = Vec::new();
    let mdevs: usize = parent
        .map(|p| p.types.iter().map(|t| t.instances.len()).sum())
        .unwrap_or(0);
    if mdevs > 0 {
        blockers.push(Reason::InUse {
            what: format!("{mdevs} mdev instances exist on it"),
        });
    }
    let vgpus = dev
        .sriov
        .iter()
        .flat_map(|s| &s.vfs)
        .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
        .filter(|d| {
            d.nvidia_vf
                .as_ref()
                .is_some_and(|n| n.current_type.is_some())
        })
        .count();
    if vgpus > 0 {
        blockers.push(Reason::InUse {
            what: format!("{vgpus} of its VFs hold a vGPU"),
        });
    }
    let memory = device_facts(dev.vendor, dev.device).and_then(|f| f.memory_mib);
    Ok(Candidate {
        option: MatchOption {
            target: Target::Passthrough {
                pci: dev.address,
                iommu_group,
            },
            framebuffer_mib: memory,
            heads: None,
            max_resolution: None,
            device_api: VFIO_PCI.to_string(),
            series: None,
            capacity: u32::from(blockers.is_empty()),
            waste_mib: None,
        },
        blockers,
        why_no_fb: not_in_table(dev),
        why_no_display: "a whole GPU's display heads depend on its outputs and the guest driver"
            .to_string(),
        fb_context: None,
    })
}
