//! Vendor backends: one [`Backend`] per way a GPU is virtualized, selected by the GPU's driver and the
//! sysfs layout it exposes. Everything vendor-specific — which attributes exist, what the vendor's
//! scheduler can do, how a weight becomes its knob — lives in the module of that interface:
//!
//! | module | interface | scheduling knob |
//! |---|---|---|
//! | [`nvidia_mdev`] | NVIDIA classic mdev (`nvidia-NNN` types) | `RmPVMRL` policy and time slice |
//! | [`nvidia_vfio`] | NVIDIA vendor-specific VFIO (`<vf>/nvidia/current_vgpu_type`) | `RmPVMRL` policy and time slice |
//! | [`xe`] | Intel xe SR-IOV (`<pf>/sriov_admin/`) | per-VF `exec_quantum_ms`, `preempt_timeout_us` |
//! | [`i915_iov`] | Intel i915 SR-IOV, out of tree (`cardN/prelim_iov/`) | per-VF `exec_quantum_ms`, `preempt_timeout_us` |
//! | [`gvt`] | Intel GVT-g (`i915-GVTg_V5_N` types) | the type's fixed weight |
//! | [`gim`] | AMD GIM (MxGPU SR-IOV) | `sch_policy`, `sched_interval` |
//! | [`generic_mdev`] | any other mdev parent (kernel samples) | none |
//!
//! Two bases hold what every backend of one kind does the same way, so a vendor module holds only
//! what is its own: `mdev_parent` (instances as slots, create and remove through the parent) and
//! `sriov_pf` (VFs as slots, assignment through vfio-pci); a vendor module implements their
//! `MdevVendor` or `PfVendor` trait.
//!
//! The daemon calls [`detect`] (or [`detect_gpu`]) on a discovered [`Inventory`], then per GPU
//! [`Backend::plan`] with the weights of the vGPUs that run there, [`Backend::apply`] and
//! [`Backend::read_back`]; every result is plain serializable data ([`crate::sched`]).
//!
//! ```
//! use vgpu_host::discover::discover;
//! use vgpu_sim::SimHost;
//! use vgpu_manager::backend::detect_gpu;
//! use vgpu_manager::sched::{PlanOptions, SchedRequest};
//!
//! let host = SimHost::builtin("demo").unwrap();
//! let inv = discover(&host).unwrap();
//! let flex = detect_gpu(&host, &inv, "0000:03:00.0").unwrap();
//! let plan = flex.plan(&[SchedRequest::weight(10), SchedRequest::weight(30)], &PlanOptions::default());
//! assert!(plan.honoured());
//! assert_eq!(plan.slots[1].quantum_ms, Some(24));
//! ```

use std::fmt;

use mdev_types::ids::PciAddress;
use mdev_types::model::Inventory;
use serde::{Deserialize, Serialize};
use vgpu_host::Host;
use vgpu_host::ops::BindRecord;

use crate::profile::{MatchOption, Profile, ProfileTarget, match_profile};
use crate::sched::{ApplyReport, PlanOptions, SchedPlan, SchedRequest, SchedState};
use crate::spelling::spelled;

mod common;
mod error;
pub mod generic_mdev;
pub mod gim;
pub mod gvt;
pub mod i915_iov;
mod intel_quanta;
mod mdev_parent;
pub mod nvidia_mdev;
pub mod nvidia_sched;
pub mod nvidia_vfio;
mod sriov_pf;
pub mod xe;

#[cfg(test)]
mod tests;

pub use error::BackendError;

/// Which vendor interface a backend drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendKind {
    /// NVIDIA classic mdev (vGPU ≤ 16 host driver).
    NvidiaMdev,
    /// NVIDIA vendor-specific VFIO on SR-IOV VFs (vGPU 17+, kernel ≥ 6.8).
    NvidiaVfio,
    /// Intel xe SR-IOV with `sriov_admin`.
    IntelXeSriov,
    /// Intel i915 SR-IOV with `prelim_iov` (out-of-tree driver).
    IntelI915Iov,
    /// Intel GVT-g mediated vGPUs.
    IntelGvtG,
    /// AMD GIM (MxGPU SR-IOV).
    AmdGim,
    /// Any other mdev parent (the kernel's mtty/mdpy/mbochs samples).
    GenericMdev,
}

spelled!("backend kind", BackendKind {
    NvidiaMdev => "nvidia-mdev",
    NvidiaVfio => "nvidia-vfio",
    IntelXeSriov => "intel-xe-sriov",
    IntelI915Iov => "intel-i915-iov",
    IntelGvtG => "intel-gvt-g",
    AmdGim => "amd-gim",
    GenericMdev => "generic-mdev",
});

/// What a backend's scheduler can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedCaps {
    /// The knob, in the vendor's words (`per-VF exec_quantum_ms and preempt_timeout_us`).
    pub knob: String,
    /// Unequal weights can be honoured.
    pub per_slot_weights: bool,
    /// Priorities other than normal can be honoured (for all slots alike, or per slot).
    pub priorities: bool,
    /// A share can be reserved while others idle.
    pub reserve: bool,
    /// `apply` changes it at runtime (otherwise it writes configuration for the next driver load).
    pub runtime: bool,
}

/// What a backend offers on its GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// Which backend drives the GPU.
    pub backend: BackendKind,
    /// The GPU (`Gpu::id`).
    pub gpu: String,
    /// The interface, in a line (`SR-IOV VFs through vfio-pci, provisioned in sriov_admin`).
    pub interface: String,
    /// The profile backends its options fall under.
    pub offers: Vec<crate::profile::Delivery>,
    /// The slots it has now (VF names, vGPU instances), in order.
    pub slots: Vec<String>,
    /// How many slots it could have at most.
    pub max_slots: u32,
    /// What its scheduler knob can honour (weights, priorities, reserve, runtime change).
    pub scheduling: SchedCaps,
}

/// What to create: an option [`Backend::options`] returned, and the UUID for an mdev.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewVgpu {
    /// The option's target.
    pub target: ProfileTarget,
}

/// A created vGPU, with what [`Backend::destroy`] needs to undo it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Created {
    /// A VF bound to vfio-pci.
    Vf {
        /// The PCI address of the PF the VF belongs to.
        pf: PciAddress,
        /// The PCI address of the VF that was bound to vfio-pci.
        vf: PciAddress,
        /// What it was bound to before.
        bind: BindRecord,
    },
    /// A vGPU type set on a VF through NVIDIA's vendor-specific VFIO interface.
    NvidiaVgpu {
        /// The PCI address of the PF the VF belongs to.
        pf: PciAddress,
        /// The PCI address of the VF whose `nvidia/current_vgpu_type` was set.
        vf: PciAddress,
        /// The numeric vGPU type id written to `nvidia/current_vgpu_type`.
        type_id: u32,
    },
}

/// One vendor interface on one GPU.
pub trait Backend: fmt::Debug + Send + Sync {
    /// Which interface.
    fn kind(&self) -> BackendKind;

    /// The GPU it drives (`Gpu::id`).
    fn gpu(&self) -> &str;

    /// What it offers.
    fn capabilities(&self) -> Capabilities;

    /// The options it offers for `profile` (the profile matcher's, limited to this GPU and interface),
    /// best first.
    fn options(&self, profile: &Profile, inv: &Inventory) -> Vec<MatchOption> {
        let offers = self.capabilities().offers;
        let report = match_profile(profile, inv);
        report
            .gpu(self.gpu())
            .map(|g| {
                g.best
                    .iter()
                    .chain(&g.alternatives)
                    .filter(|o| offers.contains(&o.target.backend()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Creates a VF-backed vGPU for `req` (a VF bound to vfio-pci, or a vGPU type set on a VF
    /// through NVIDIA's vendor-specific VFIO interface). mdev instances are not made here: the daemon
    /// creates them itself, ledger entry first, on its executor (`vgpu_host::ops::create_mdev`), so
    /// mdev-parent backends refuse.
    fn create(&self, host: &dyn Host, req: &NewVgpu) -> Result<Created, BackendError>;

    /// Undoes [`Backend::create`].
    fn destroy(&self, host: &dyn Host, created: &Created) -> Result<(), BackendError>;

    /// Enables `num_vfs` SR-IOV VFs on its PF (before creates that assign them), leaving them without
    /// a host driver. Backends whose VFs come into existence otherwise refuse with the way to do it.
    fn enable_vfs(&self, host: &dyn Host, num_vfs: u32) -> Result<(), BackendError> {
        let _ = host;
        Err(BackendError::Unsupported {
            gpu: self.gpu().to_string(),
            backend: self.kind().to_string(),
            what: format!("enable {num_vfs} VFs"),
            why: "this interface has no SR-IOV VFs to enable".into(),
        })
    }

    /// One request per slot that exists now, all of weight 1 (what `plan` is given when the operator
    /// names no weights).
    fn default_requests(&self) -> Vec<SchedRequest> {
        self.capabilities()
            .slots
            .iter()
            .map(|s| SchedRequest {
                slot: Some(s.clone()),
                ..SchedRequest::weight(1)
            })
            .collect()
    }

    /// The scheduling plan for `requests` (one per vGPU that will run on this GPU). Pure: reads only
    /// what detection captured.
    fn plan(&self, requests: &[SchedRequest], opts: &PlanOptions) -> SchedPlan;

    /// Writes the plan's runtime settings, reads them back and checks them; settings that take effect
    /// later are returned as pending. Refuses a plan with refusals or for another GPU.
    fn apply(&self, host: &dyn Host, plan: &SchedPlan) -> Result<ApplyReport, BackendError> {
        common::apply_settings(self, host, plan)
    }

    /// Reads the scheduling the driver has programmed now, per slot.
    fn read_back(&self, host: &dyn Host) -> Result<SchedState, BackendError>;
}

/// The backends found for one GPU.
#[derive(Debug)]
pub struct Detected {
    /// The GPU (`Gpu::id`).
    pub gpu: String,
    /// Its backend, or `None`.
    pub backend: Option<Box<dyn Backend>>,
    /// Why there is none (driver and layout found).
    pub why_none: Option<String>,
}

/// A detector: the backend for a GPU when its driver and layout match, else `None`.
type Detector = fn(&dyn Host, &Inventory, &mdev_types::model::Gpu) -> DetectResult;

/// What a detector returns.
pub(crate) type DetectResult = Result<Option<Box<dyn Backend>>, vgpu_host::HostError>;

/// Detectors in precedence order: specific vendor interfaces first, the generic mdev parent last.
const DETECTORS: &[Detector] = &[
    nvidia_vfio::detect,
    nvidia_mdev::detect,
    xe::detect,
    i915_iov::detect,
    gvt::detect,
    gim::detect,
    generic_mdev::detect,
];

/// The backend of every GPU of `inv`, in inventory order.
pub fn detect(host: &dyn Host, inv: &Inventory) -> Result<Vec<Detected>, BackendError> {
    inv.gpus.iter().map(|g| detect_one(host, inv, g)).collect()
}

fn detect_one(
    host: &dyn Host,
    inv: &Inventory,
    gpu: &mdev_types::model::Gpu,
) -> Result<Detected, BackendError> {
    for d in DETECTORS {
        if let Some(b) = d(host, inv, gpu).map_err(|e| BackendError::host(&gpu.id, e))? {
            return Ok(Detected {
                gpu: gpu.id.clone(),
                backend: Some(b),
                why_none: None,
            });
        }
    }
    let reason = format!(
        "driver {} with {} matches no vendor interface (mdev parent, xe sriov_admin, i915 prelim_iov, \
         NVIDIA VF interface or GIM); it can only be passed through whole",
        gpu.driver.as_deref().unwrap_or("none"),
        if gpu.capabilities.is_empty() {
            "no virtualization capability".to_string()
        } else {
            format!("{} capabilities", gpu.capabilities.len())
        }
    );
    Ok(Detected {
        gpu: gpu.id.clone(),
        backend: None,
        why_none: Some(reason),
    })
}

/// The backend of the GPU named `id` (its PCI address in any accepted spelling, or a parent name).
pub fn detect_gpu(
    host: &dyn Host,
    inv: &Inventory,
    id: &str,
) -> Result<Box<dyn Backend>, BackendError> {
    let addr = id.parse::<PciAddress>().ok();
    let gpu = inv
        .gpus
        .iter()
        .find(|g| g.id == id || (addr.is_some() && g.pci == addr))
        .ok_or_else(|| BackendError::UnknownGpu {
            gpu: id.to_string(),
            host: inv.host.clone(),
        })?;
    let d = detect_one(host, inv, gpu)?;
    d.backend.ok_or_else(|| BackendError::NoBackend {
        gpu: d.gpu,
        reason: d.why_none.unwrap_or_default(),
    })
}
