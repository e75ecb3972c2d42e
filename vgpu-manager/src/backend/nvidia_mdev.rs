//! NVIDIA classic mdev (vGPU host driver ≤ 16): types `nvidia-NNN` on the GPU's mdev parent, named like
//! `GRID T4-2Q`, described as `num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=…,
//! max_instance=8`. Time-sliced vGPUs on one GPU are all of one type (NVIDIA vGPU user guide,
//! "Homogeneous time-sliced vGPUs": once one exists every other type shows `available_instances` 0).
//! Scheduling is the GPU-wide `RmPVMRL` policy ([`super::nvidia_sched`]).

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, MdevType};
use mdev_types::parse::TypeDescription;
use vgpu_host::Host;

use super::common::{self, Slot};
use super::mdev_parent::{MdevParentBackend, MdevParentBase, MdevVendor};
use super::nvidia_sched::{self, NvGpu, NvSlotInfo};
use super::{BackendError, BackendKind, DetectResult, SchedCaps};
use crate::sched::{PlanOptions, SchedPlan, SchedRefusal, SchedRequest, SchedState};

/// NVIDIA's host driver (binds the GPU; nvidia-vgpu-vfio registers its mdev parent).
const DRIVER: &str = "nvidia";
/// Type directory names of nvidia-vgpu-vfio.
const TYPE_PREFIX: &str = "nvidia-";

/// An NVIDIA GPU with classic mdev types.
#[derive(Debug, Clone)]
pub(crate) struct NvidiaMdev {
    pci: PciAddress,
    /// How many SR-IOV VFs are its mdev parents (Ampere and later, one vGPU each); `None` when the
    /// parent is the GPU itself.
    vf_parents: Option<usize>,
}

/// A GPU on `nvidia` whose mdev parent offers `nvidia-NNN` types.
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pci) = common::pci_on(gpu, DRIVER) else {
        return Ok(None);
    };
    // On Ampere and later the VFs are the parents: they are driven as one parent of the GPU.
    let Some(parent) = inv.gpu_mdev_parent(gpu) else {
        return Ok(None);
    };
    if !parent
        .types
        .iter()
        .any(|t| t.id.as_str().starts_with(TYPE_PREFIX))
    {
        return Ok(None);
    }
    let vf_parents = Inventory::mdev_on_vfs(gpu).then(|| inv.gpu_parents(gpu).len());
    Ok(Some(MdevParentBackend::boxed(
        gpu,
        &parent,
        NvidiaMdev { pci, vf_parents },
    )))
}

fn info(t: &MdevType) -> NvSlotInfo {
    match &t.details {
        TypeDescription::Nvidia(d) => NvSlotInfo {
            framebuffer_mib: Some(d.framebuffer_mib),
            max_instances: Some(d.max_instance),
        },
        _ => NvSlotInfo::default(),
    }
}

impl NvidiaMdev {
    fn nv<'a>(&self, base: &'a MdevParentBase) -> NvGpu<'a> {
        NvGpu {
            gpu: &base.gpu,
            kind: Self::KIND,
            pci: self.pci,
            existing: base.existing(),
        }
    }

    /// What the scheduler knows of a slot: an instance's type, or for a new vGPU the type already on
    /// the GPU (homogeneous rule) or the one matching the requested framebuffer.
    fn slot_info(base: &MdevParentBase, slot: &Slot, req: &SchedRequest) -> NvSlotInfo {
        let types = &base.parent.types;
        let of_instance = |u: &str| {
            types
                .iter()
                .find(|t| t.instances.iter().any(|i| i.to_string() == u))
        };
        if let Some(t) = slot.device.as_deref().and_then(of_instance) {
            return info(t);
        }
        if let Some(t) = types.iter().find(|t| !t.instances.is_empty()) {
            return info(t);
        }
        req.framebuffer_mib
            .and_then(|fb| {
                types
                    .iter()
                    .map(info)
                    .find(|i| i.framebuffer_mib == Some(fb))
            })
            .unwrap_or(NvSlotInfo {
                framebuffer_mib: req.framebuffer_mib,
                max_instances: None,
            })
    }
}

impl MdevVendor for NvidiaMdev {
    const KIND: BackendKind = BackendKind::NvidiaMdev;
    const SLOT_NOUN: &'static str = "vGPU";

    fn interface(&self, base: &MdevParentBase) -> String {
        match self.vf_parents {
            Some(vfs) => format!(
                "NVIDIA classic mdev on the {vfs} SR-IOV VFs of {} ({} types, one vGPU per VF, one type at a time)",
                base.parent.name,
                base.parent.types.len()
            ),
            None => format!(
                "NVIDIA classic mdev parent {} ({} types, one type at a time)",
                base.parent.name,
                base.parent.types.len()
            ),
        }
    }

    fn scheduling(&self) -> SchedCaps {
        SchedCaps {
            knob: "RmPVMRL policy and time slice (NVreg_RegistryDwordsPerDevice)".to_string(),
            per_slot_weights: false,
            priorities: false,
            reserve: true,
            runtime: false,
        }
    }

    fn plan(
        &self,
        base: &MdevParentBase,
        pairs: &[(Slot, &SchedRequest)],
        refusals: Vec<SchedRefusal>,
        opts: &PlanOptions,
    ) -> SchedPlan {
        let infos: Vec<NvSlotInfo> = pairs
            .iter()
            .map(|(s, r)| Self::slot_info(base, s, r))
            .collect();
        nvidia_sched::plan(&self.nv(base), pairs, &infos, refusals, opts)
    }

    fn read_back(
        &self,
        base: &MdevParentBase,
        host: &dyn Host,
    ) -> Result<SchedState, BackendError> {
        nvidia_sched::read_back(host, &self.nv(base), base.instance_slots(0))
    }
}
