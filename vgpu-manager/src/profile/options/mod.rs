//! The concrete options one GPU offers, per backend: mdev types, SR-IOV VF configurations, NVIDIA
//! vendor-specific VFIO types and whole-GPU passthrough, each with what it gives a guest (framebuffer,
//! heads, resolution) and what in the host's current state stands in its way.

use std::fmt;

use mdev_types::ids::{IommuGroup, MdevTypeId, PciAddress};
use mdev_types::model::{Gpu, Inventory, PciDevice, Vendor};
use mdev_types::parse::{NvidiaSeries, Resolution};
use serde::Serialize;

use super::reason::{Reason, Refusal};
use super::spec::Delivery;

mod mdev;
mod passthrough;
mod vf;

use mdev::mdev_candidates;
pub(crate) use mdev::vf_capacity;
use passthrough::passthrough_candidate;
use vf::{nvidia_vfio_candidates, sriov_candidate};

/// What to create or hand over to give a guest its vGPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "backend", rename_all = "kebab-case")]
pub enum ProfileTarget {
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
        /// The PCI address of the PF whose VF is assigned.
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
        /// The PCI address of the PF the VF belongs to.
        pf: PciAddress,
        /// The PCI address of the VF that gets the type and is assigned.
        vf: PciAddress,
        /// The numeric vGPU type id written to `nvidia/current_vgpu_type`.
        type_id: u32,
        /// The vGPU type name (`NVIDIA L40S-4Q`).
        type_name: String,
    },
    /// Assign the whole GPU through vfio-pci.
    Passthrough {
        /// The GPU's PCI address.
        pci: PciAddress,
        /// Its IOMMU group (everything in it goes to the guest).
        iommu_group: IommuGroup,
    },
}

impl ProfileTarget {
    /// The backend this target belongs to.
    pub fn backend(&self) -> Delivery {
        match self {
            ProfileTarget::Mdev { .. } => Delivery::Mdev,
            ProfileTarget::SriovVf { .. } => Delivery::SriovVf,
            ProfileTarget::NvidiaVendorVfio { .. } => Delivery::NvidiaVendorVfio,
            ProfileTarget::Passthrough { .. } => Delivery::Passthrough,
        }
    }
}

impl fmt::Display for ProfileTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The samples and GVT-g print their type id (or most of it) as `name`: show it once.
            ProfileTarget::Mdev {
                type_id,
                type_name: Some(n),
                ..
            } if !type_id.as_str().ends_with(n.as_str()) => write!(f, "{type_id} ({n})"),
            ProfileTarget::Mdev { type_id, .. } => write!(f, "{type_id}"),
            ProfileTarget::SriovVf {
                pf,
                num_vfs,
                enable_vfs: true,
                ..
            } => write!(f, "VF of {pf} after enabling {num_vfs} VFs"),
            ProfileTarget::SriovVf {
                vf: Some(vf),
                num_vfs,
                ..
            } => write!(f, "VF {vf} (1 of {num_vfs} enabled)"),
            ProfileTarget::SriovVf { pf, num_vfs, .. } => {
                write!(f, "VF of {pf} ({num_vfs} enabled)")
            }
            ProfileTarget::NvidiaVendorVfio {
                vf,
                type_id,
                type_name,
                ..
            } => write!(f, "{type_name} (type {type_id}) on VF {vf}"),
            ProfileTarget::Passthrough { pci, iommu_group } => {
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
    pub target: ProfileTarget,
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
    pub offered: Vec<Delivery>,
    /// Concrete options.
    pub candidates: Vec<Candidate>,
    /// Backends that are present but yield no option, with why.
    pub refusals: Vec<Refusal>,
}

/// Collects what `gpu` offers under `allowed` backends; `need_mib` sizes an SR-IOV split.
pub(super) fn offers(gpu: &Gpu, inv: &Inventory, allowed: &[Delivery], need_mib: u64) -> Offers {
    let mut out = Offers::default();
    let device = gpu
        .pci
        .and_then(|a| inv.pci_devices.iter().find(|d| d.address == a));
    let parents = inv.gpu_parents(gpu);
    let sriov_pf =
        device.and_then(|d| d.sriov.as_ref().filter(|s| s.total_vfs > 0).map(|s| (d, s)));

    let parent = parents.first().copied();
    if let Some(parent) = parent {
        out.offered.push(Delivery::Mdev);
        if allowed.contains(&Delivery::Mdev) {
            if parents.iter().all(|p| p.types.is_empty()) {
                out.refusals.push(Refusal {
                    candidate: format!("mdev parent {}", parent.name),
                    reasons: vec![Reason::NoTypes {
                        parent: parent.name.clone(),
                    }],
                });
            }
            // An instance goes to the parent itself, or to the first VF that can take its type.
            let target = |id: &MdevTypeId| {
                parents
                    .iter()
                    .find(|p| {
                        p.types
                            .iter()
                            .any(|t| &t.id == id && t.available_instances > 0)
                    })
                    .unwrap_or(&parent)
                    .name
                    .clone()
            };
            if let Some(merged) = inv.gpu_mdev_parent(gpu) {
                out.candidates.extend(mdev_candidates(
                    gpu.vendor,
                    &merged,
                    Inventory::mdev_on_vfs(gpu),
                    &target,
                ));
            }
        }
    }
    // VFs that are mdev parents offer their types above, not a VF interface of their own.
    if let Some((pf, sriov)) = sriov_pf.filter(|_| !Inventory::mdev_on_vfs(gpu)) {
        let backend = if gpu.vendor == Vendor::Nvidia {
            Delivery::NvidiaVendorVfio
        } else {
            Delivery::SriovVf
        };
        out.offered.push(backend);
        if allowed.contains(&backend) {
            let r = if backend == Delivery::SriovVf {
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
        out.offered.push(Delivery::Passthrough);
        if allowed.contains(&Delivery::Passthrough) {
            match passthrough_candidate(gpu, dev, &parents, inv) {
                Ok(c) => out.candidates.push(c),
                Err(r) => out.refusals.push(r),
            }
        }
    }
    out
}

pub(super) fn not_in_table(dev: &PciDevice) -> String {
    format!(
        "device {}:{} is not in the device table (vgpu-manager/src/profile/facts.rs)",
        dev.vendor, dev.device
    )
}
