//! The JSON report of `ListOffers`: what each GPU can give each profile of vgpud's catalog, for
//! placement engines above vgpud (a Kubernetes DRA driver publishing devices per profile option, a
//! scheduler weighing hosts). One definition, written by the daemon and read by clients;
//! docs/json.md shows the shape.

use serde::{Deserialize, Serialize};

/// One GPU and the profiles it can serve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuOffers {
    /// The GPU id: its PCI address (`0000:3b:00.0`) or, for a virtual mdev parent, the parent name
    /// (`mbochs`).
    pub gpu: String,
    /// Its PCI address, `None` for a virtual parent.
    pub pci: Option<String>,
    /// Vendor word (`nvidia`, `intel`, `amd`, `virtual`, …).
    pub vendor: String,
    /// Human model name (`NVIDIA T4`).
    pub model: String,
    /// NUMA node, when the kernel reports one.
    pub numa_node: Option<u32>,
    /// `ok`, or `faulted: ` and why discovery could not read it; nothing is placed on a faulted GPU.
    pub health: String,
    /// Every vGPU on the GPU must be of one type at a time (NVIDIA time-sliced vGPU, NVIDIA vGPU
    /// User Guide, "Homogeneous vGPUs"): once one exists, other types show 0 available.
    pub homogeneous: bool,
    /// One entry per catalog profile the GPU can serve when it has room, sorted by profile name.
    pub options: Vec<ProfileOffer>,
    /// The GPU's SR-IOV VFs, when it serves by VFs (`sriov-vf`, `nvidia-vendor-vfio`; an SR-IOV PF
    /// that is no mdev parent does, also when no profile fits now); `None` otherwise and from older
    /// vgpud.
    #[serde(default)]
    pub vfs: Option<VfOffers>,
}

/// The VFs of an SR-IOV GPU whose options are VF-backed. Each VF-backed slot takes one VF; which one
/// is chosen when the slot is made (a pool slot), so no VF address is offered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VfOffers {
    /// VFs enabled now (`sriov_numvfs`); 0 while SR-IOV is off.
    pub enabled: u32,
    /// The most VFs the PF can have (`sriov_totalvfs`).
    pub total: u32,
    /// How many more slots the VFs can take: the enabled VFs that no slot holds and nothing uses
    /// (no driver bound, or no NVIDIA vGPU type set); while SR-IOV is off, the most VFs enabling
    /// would make for one of the offered profiles (the first slot made fixes the split).
    pub free: u32,
}

/// How one GPU serves one profile: the option vgpud's matching would choose on it if it had room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileOffer {
    /// The profile's name.
    pub profile: String,
    /// How it is delivered: `mdev` (an mdev on the GPU, made by `Create`), `sriov-vf` (an SR-IOV VF
    /// on vfio-pci: Intel xe/i915, AMD MxGPU) or `nvidia-vendor-vfio` (an NVIDIA vGPU type on a VF);
    /// the VF-backed ones are made as pool slots (`Apply`).
    pub backend: String,
    /// What a slot holds (`type` in JSON): the mdev type (`nvidia-231`, `mbochs-4`), the NVIDIA vGPU
    /// type id of a vendor-VFIO VF (`1146`), or `vf-<n>` for one VF of a PF split into `n` VFs.
    #[serde(rename = "type")]
    pub type_id: String,
    /// The type's name (`GRID T4-2Q`, `NVIDIA L40S-2B`), when it has one.
    pub type_name: Option<String>,
    /// The type's framebuffer in MiB, when its description tells.
    pub framebuffer_mib: Option<u64>,
    /// How many more the kernel would create now (`available_instances`; for a VF-backed option, the
    /// free VFs that can take it).
    pub available: u32,
    /// How many instances of the type exist on the GPU now (for `sriov-vf`, the enabled VFs that are
    /// not free).
    pub in_use: u32,
    /// How many the GPU holds of this type alone: the NVIDIA description's `max_instance`, else
    /// `available + in_use` (exact when no other type has instances on the GPU, a lower bound
    /// otherwise). For `sriov-vf`, the VFs of the split (enabled, or that enabling would make); for
    /// `nvidia-vendor-vfio`, the VFs the type's framebuffer fits on the GPU.
    pub max_instances: u32,
}
