//! What a backend operation can fail with; every message names the GPU or path and the fix.

use thiserror::Error;
use vgpu_host::HostError;
use vgpu_host::ops::LifecycleError;

/// A failed backend operation.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BackendError {
    /// Reading or writing the host failed outside a lifecycle operation.
    #[error("{gpu}: {source}")]
    Host {
        /// The GPU's id (`Gpu::id`) whose host access failed.
        gpu: String,
        /// The kernel's answer.
        source: HostError,
    },
    /// A lifecycle operation (mdev create, VF enable, driver bind) failed.
    #[error(transparent)]
    Lifecycle(#[from] LifecycleError),
    /// The plan has refusals, so applying it would not give what was asked.
    #[error(
        "the scheduling plan for {gpu} cannot be applied: {reasons}; change the weights or options (`vgpuctl sched plan` shows why)"
    )]
    Refused {
        /// The GPU's id (`Gpu::id`) the plan is for.
        gpu: String,
        /// The refusals, joined.
        reasons: String,
    },
    /// The plan was made for another GPU or backend.
    #[error(
        "the plan is for {plan_gpu} ({plan_backend}) but this backend drives {gpu} ({backend}): plan again for {gpu}"
    )]
    WrongGpu {
        /// The plan's GPU.
        plan_gpu: String,
        /// The plan's backend.
        plan_backend: String,
        /// This backend's GPU.
        gpu: String,
        /// This backend.
        backend: String,
    },
    /// A written value did not read back.
    #[error(
        "{path} reads {actual:?} after writing {expected:?}: the driver did not take the value (out of range, or VFs not provisioned); check `dmesg`"
    )]
    NotApplied {
        /// The sysfs path of the attribute that was written and read back.
        path: String,
        /// What was written.
        expected: String,
        /// What it reads now.
        actual: String,
    },
    /// The backend cannot do what was asked, for this reason.
    #[error("{gpu} ({backend}) cannot {what}: {why}")]
    Unsupported {
        /// The GPU's id (`Gpu::id`).
        gpu: String,
        /// The name of the GPU's backend, which lacks the operation.
        backend: String,
        /// What was asked (`create an mdev`, `enable VFs`).
        what: String,
        /// Why, and what to do instead.
        why: String,
    },
    /// No GPU of that name.
    #[error("no GPU {gpu} on {host}: `vgpuctl discover` lists the GPUs")]
    UnknownGpu {
        /// What was asked for.
        gpu: String,
        /// The description of the host that was searched (the live kernel or a simulated one).
        host: String,
    },
    /// The GPU has no virtualization backend.
    #[error("{gpu} has no vGPU backend: {reason}")]
    NoBackend {
        /// The GPU's id (`Gpu::id`) for which no backend was detected.
        gpu: String,
        /// Why (driver and layout found).
        reason: String,
    },
}

impl BackendError {
    /// A host error on `gpu`.
    pub fn host(gpu: &str, source: HostError) -> Self {
        BackendError::Host {
            gpu: gpu.to_string(),
            source,
        }
    }
}
