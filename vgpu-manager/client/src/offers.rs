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
}

/// How one GPU serves one profile: the option vgpud's matching would choose on it if it had room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileOffer {
    /// The profile's name.
    pub profile: String,
    /// How it is delivered: `mdev` (the only kind listed today).
    pub backend: String,
    /// The mdev type (`nvidia-231`, `mbochs-4`; `type` in JSON).
    #[serde(rename = "type")]
    pub type_id: String,
    /// The type's `name` attribute (`GRID T4-2Q`), when it has one.
    pub type_name: Option<String>,
    /// The type's framebuffer in MiB, when its description tells.
    pub framebuffer_mib: Option<u64>,
    /// How many more the kernel would create now (`available_instances`).
    pub available: u32,
    /// How many instances of the type exist on the GPU now.
    pub in_use: u32,
    /// How many the GPU holds of this type alone: the NVIDIA description's `max_instance`, else
    /// `available + in_use` (exact when no other type has instances on the GPU, a lower bound
    /// otherwise).
    pub max_instances: u32,
}
