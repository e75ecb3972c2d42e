//! The JSON reports of the pool and scheduling methods (`Apply`, `PoolStatus`, the Gpu1 `Scheduling`
//! property). D-Bus carries them as JSON strings because they nest optional values D-Bus cannot
//! express; these types are their one definition, used by the daemon to write them and by clients to
//! read them. `Plan`, `PlanScheduling` and `ApplyScheduling` return vgpu-manager's `PoolPlan`,
//! `SchedPlan` and `ApplyReport` (types of its planners, not of this crate). docs/json.md shows every
//! shape.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::sched::SchedState;

/// One slot of a pool and the instance behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotRow {
    /// The name of the profile the slot is for.
    pub profile: String,
    /// 0-based index among the pool's slots of this profile.
    pub index: u32,
    /// The slot's stable UUID (UUIDv5 of pool, profile and index; vgpu-manager's `pool::identity` makes it).
    pub uuid: String,
    /// The GPU its instance is on; `None` when the slot has no instance.
    pub gpu: Option<String>,
    /// That GPU's NUMA node, when known.
    pub numa_node: Option<u32>,
    /// The mdev type id of its instance (`type` in JSON), when it has one.
    #[serde(rename = "type")]
    pub type_id: Option<String>,
    /// The mdev parent its instance is on (a PCI address such as `0000:3b:00.0`, or a parent name such
    /// as `mbochs`), which is not always the GPU (an SR-IOV GPU's mdevs sit on its VFs); `None` for VF
    /// slots, slots without an instance, and from older vgpud.
    #[serde(default)]
    pub parent: Option<String>,
    /// The human name of what it holds: the mdev type's `name` attribute (`GRID T4-2Q`, what KubeVirt's
    /// `mdevNameSelector` matches) or the NVIDIA vGPU type of a vendor-VFIO VF (`NVIDIA L40S-2Q`);
    /// `None` when the type has no name, for a plain SR-IOV VF, and from older vgpud.
    #[serde(default)]
    pub type_name: Option<String>,
    /// `running`, `stopped`, `waiting-for-parent`, or `missing` (no instance).
    pub state: String,
    /// For a slot held by an SR-IOV VF (xe/i915/GIM VF on vfio-pci, NVIDIA vendor-VFIO vGPU): the VF's
    /// PCI address, which a guest is given (`<hostdev type='pci' managed='no'>`: vgpud bound it, or the
    /// NVIDIA driver owns it, so libvirt must not rebind it); `None` for mdev slots.
    #[serde(default)]
    pub vf: Option<String>,
    /// For a VF slot: the VF's PCI `vendor:device` id in lower-case hex (`10de:26b9`), what KubeVirt's
    /// `pciVendorSelector` and Nova's `vendor_id`/`product_id` match; `None` for mdev slots and from
    /// older vgpud.
    #[serde(default)]
    pub pci_id: Option<String>,
    /// The IOMMU group a guest's VFIO device node (`/dev/vfio/<group>`) is in: the VF's for a VF slot,
    /// the instance's for an mdev slot; `None` when the slot has no device now, and from older vgpud.
    #[serde(default)]
    pub iommu_group: Option<u32>,
    /// Why the slot's GPU cannot be read, when it is faulted (the path, the problem and the fix): the
    /// slot is kept as it is until the GPU reads again; `None` on a healthy GPU (and from older vgpud).
    #[serde(default)]
    pub fault: Option<String>,
}

/// The slots of a pool on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolGpu {
    /// The GPU's id (PCI address or parent name).
    pub gpu: String,
    /// Its human model name (e.g. `NVIDIA T4`).
    pub model: String,
    /// Its NUMA node, when known.
    pub numa_node: Option<u32>,
    /// Slots of the pool on it, per profile.
    pub profiles: BTreeMap<String, u32>,
}

/// What `Apply` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSummary {
    /// The name of the pool that was applied.
    pub pool: String,
    /// The host (as discovery names it).
    pub host: String,
    /// False when the host already matched the pool (nothing was done).
    pub changed: bool,
    /// Steps executed.
    pub steps: u32,
    /// Slots whose instance this apply created or started.
    pub created: Vec<String>,
    /// Slot instances this apply removed (no longer wanted, or on a GPU the selectors exclude).
    pub removed: Vec<String>,
    /// Slots that existed and stayed.
    pub kept: u32,
    /// Every slot of the pool after the apply.
    pub slots: Vec<SlotRow>,
    /// Where the slots are, per GPU.
    pub gpus: Vec<PoolGpu>,
}

/// What `RemovePool` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRemoval {
    /// The pool's name.
    pub pool: String,
    /// Whether vgpud had the pool applied (false: it knew no such pool, or only slots of it).
    pub applied: bool,
    /// The slots given back (`profile/index`): mdev instances destroyed, VFs released.
    pub removed: Vec<String>,
}

/// A pool vgpud has applied, and its slots now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStatus {
    /// The pool's name.
    pub pool: String,
    /// Its free-text `description` from the pool file.
    pub description: String,
    /// `consolidate` or `spread`.
    pub policy: String,
    /// Whether its slots start with the daemon.
    pub autostart: bool,
    /// When it was last applied (seconds since the Unix epoch).
    pub applied_at: u64,
    /// Slots wanted per profile.
    pub wanted: BTreeMap<String, u32>,
    /// True when every slot has a running instance.
    pub in_sync: bool,
    /// Every slot.
    pub slots: Vec<SlotRow>,
    /// Where the slots are, per GPU.
    pub gpus: Vec<PoolGpu>,
}

/// A GPU's scheduling as the Gpu1 `Scheduling` property reports it (the same shape as one entry of
/// `vgpuctl sched show --json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedulingView {
    /// The GPU's id (PCI address or parent name).
    pub gpu: String,
    /// Its vendor backend (`nvidia-mdev`, `intel-xe-sriov`, …), when it has one.
    pub backend: Option<String>,
    /// What is programmed now, read back from the host.
    pub state: Option<SchedState>,
    /// Why there is no state: no backend for this GPU, or the read failed.
    pub reason: Option<String>,
}
