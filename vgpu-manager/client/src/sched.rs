//! What a GPU's scheduling is now, as read back from the host: the `state` of the Gpu1 `Scheduling`
//! property ([`crate::SchedulingView`]) and of the daemon's scheduling reports. The daemon's vendor
//! backends fill it in; clients read it.

use serde::{Deserialize, Serialize};

/// What one slot is programmed with now (read back from the host).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlotState {
    /// The backend's slot name.
    pub slot: String,
    /// The device behind it (VF address, mdev UUID), when any.
    pub device: Option<String>,
    /// Execution quantum, ms, where the scheduler has one per slot.
    pub quantum_ms: Option<u32>,
    /// Preemption timeout, µs, where it has one per slot.
    pub preempt_timeout_us: Option<u32>,
    /// Priority as the kernel shows it, where it has one.
    pub priority: Option<String>,
    /// The weight the slot has (GVT-g type weight), where the weight is fixed.
    pub weight: Option<u32>,
    /// The share it gets when every slot is busy, when that follows from what was read.
    pub share: Option<f64>,
}

/// A GPU's scheduling as read back from the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SchedState {
    /// The GPU's id (PCI address or parent name).
    pub gpu: String,
    /// The name of the GPU's vendor backend (`nvidia-mdev`, `intel-xe-sriov`, …).
    pub backend: String,
    /// The policy in force (or configured for the next driver load), in the vendor's words.
    pub policy: String,
    /// Per slot.
    pub slots: Vec<SlotState>,
    /// Raw values read (attribute or option → value), for the record.
    pub raw: Vec<(String, String)>,
    /// What could not be read and what that means.
    pub notes: Vec<String>,
}

impl SchedState {
    /// An empty state for `gpu` by `backend`.
    pub fn new(gpu: &str, backend: &str, policy: &str) -> Self {
        Self {
            gpu: gpu.to_string(),
            backend: backend.to_string(),
            policy: policy.to_string(),
            slots: Vec::new(),
            raw: Vec::new(),
            notes: Vec::new(),
        }
    }
}
