//! NVIDIA classic mdev (vGPU host driver ≤ 16): types `nvidia-NNN` on the GPU's mdev parent, named like
//! `GRID T4-2Q`, described as `num_heads=4, frl_config=60, framebuffer=2048M, max_resolution=…,
//! max_instance=8`. Time-sliced vGPUs on one GPU are all of one type (NVIDIA vGPU user guide,
//! "Homogeneous time-sliced vGPUs": once one exists every other type shows `available_instances` 0).
//! Scheduling is the GPU-wide `RmPVMRL` policy ([`super::nvidia_sched`]).

use mdev_types::ids::PciAddress;
use mdev_types::model::{Gpu, Inventory, MdevParent, MdevType};
use mdev_types::parse::TypeDescription;
use vgpu_host::Host;

use super::common::{self, Slot, assign};
use super::generic_mdev::{instance_slots, parent_of};
use super::nvidia_sched::{self, NvGpu, NvSlotInfo};
use super::{
    Backend, BackendError, BackendKind, Capabilities, CreateRequest, Created, DetectResult,
    SchedCaps,
};
use crate::profile;
use crate::sched::{PlanOptions, SchedPlan, SchedRequest, SchedState};

/// NVIDIA's host driver (binds the GPU; nvidia-vgpu-vfio registers its mdev parent).
const DRIVER: &str = "nvidia";
/// Type directory names of nvidia-vgpu-vfio.
const TYPE_PREFIX: &str = "nvidia-";

/// An NVIDIA GPU with classic mdev types.
#[derive(Debug, Clone)]
pub struct NvidiaMdevBackend {
    gpu: String,
    pci: PciAddress,
    parent: MdevParent,
}

/// A GPU on `nvidia` whose mdev parent offers `nvidia-NNN` types.
pub(crate) fn detect(_host: &dyn Host, inv: &Inventory, gpu: &Gpu) -> DetectResult {
    let Some(pci) = gpu.pci else { return Ok(None) };
    if gpu.driver.as_deref() != Some(DRIVER) {
        return Ok(None);
    }
    let Some(parent) = parent_of(inv, gpu) else {
        return Ok(None);
    };
    if !parent
        .types
        .iter()
        .any(|t| t.id.as_str().starts_with(TYPE_PREFIX))
    {
        return Ok(None);
    }
    Ok(Some(Box::new(NvidiaMdevBackend {
        gpu: gpu.id.clone(),
        pci,
        parent: parent.clone(),
    })))
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

impl NvidiaMdevBackend {
    fn existing(&self) -> usize {
        self.parent.types.iter().map(|t| t.instances.len()).sum()
    }

    fn free(&self) -> u32 {
        self.parent
            .types
            .iter()
            .map(|t| t.available_instances)
            .max()
            .unwrap_or(0)
    }

    fn nv(&self) -> NvGpu<'_> {
        NvGpu {
            gpu: &self.gpu,
            kind: self.kind(),
            pci: self.pci,
            existing: self.existing(),
        }
    }

    /// What the scheduler knows of a slot: an instance's type, or for a new vGPU the type already on
    /// the GPU (homogeneous rule) or the one matching the requested framebuffer.
    fn slot_info(&self, slot: &Slot, req: &SchedRequest) -> NvSlotInfo {
        let of_instance = |u: &str| {
            self.parent
                .types
                .iter()
                .find(|t| t.instances.iter().any(|i| i.to_string() == u))
        };
        if let Some(t) = slot.device.as_deref().and_then(of_instance) {
            return info(t);
        }
        if let Some(t) = self.parent.types.iter().find(|t| !t.instances.is_empty()) {
            return info(t);
        }
        req.framebuffer_mib
            .and_then(|fb| {
                self.parent
                    .types
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

impl Backend for NvidiaMdevBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::NvidiaMdev
    }

    fn gpu(&self) -> &str {
        &self.gpu
    }

    fn capabilities(&self) -> Capabilities {
        let slots = instance_slots(&self.parent, 0);
        Capabilities {
            backend: self.kind(),
            gpu: self.gpu.clone(),
            interface: format!(
                "NVIDIA classic mdev parent {} ({} types, one type at a time)",
                self.parent.name,
                self.parent.types.len()
            ),
            offers: vec![profile::Backend::Mdev],
            max_slots: u32::try_from(slots.len()).unwrap_or(u32::MAX) + self.free(),
            slots: slots.into_iter().map(|s| s.name).collect(),
            scheduling: SchedCaps {
                knob: "RmPVMRL policy and time slice (NVreg_RegistryDwordsPerDevice)".to_string(),
                per_slot_weights: false,
                priorities: false,
                reserve: true,
                runtime: false,
            },
        }
    }

    fn create(&self, host: &dyn Host, req: &CreateRequest) -> Result<Created, BackendError> {
        common::create_mdev_target(host, &self.parent.name, req, self)
    }

    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError> {
        common::destroy_mdev(host, created, self)
    }

    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan {
        let slots = instance_slots(&self.parent, self.free());
        let (pairs, refusals) = assign(requests, &slots, "vGPU");
        let infos: Vec<NvSlotInfo> = pairs.iter().map(|(s, r)| self.slot_info(s, r)).collect();
        nvidia_sched::plan(&self.nv(), &pairs, &infos, refusals, opts)
    }

    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError> {
        nvidia_sched::read_back(host, &self.nv(), instance_slots(&self.parent, 0))
    }
}
