//! The planner's input: GPUs with a capacity rule each, and demands (a profile, a count, a preferred
//! NUMA node) with the choices every GPU offers them.
//!
//! The rules are backend-neutral shapes; [`super::convert`] fills them from discovery and matching, and
//! each rule names the backends it models. Every rule is *monotone*: a subset of a set of instances
//! that fits also fits. The planner, the exhaustive oracle and the bound rely on that.

use serde::Serialize;
use thiserror::Error;

use crate::profile::ProfileTarget;

/// A half-open range `[start, start + size)` of slots (MIG memory slices, vGPU placement slots).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Span {
    /// First slot.
    pub start: u32,
    /// Number of slots.
    pub size: u32,
}

impl Span {
    /// Whether the two ranges share a slot (the only way two placements conflict).
    pub fn overlaps(&self, other: &Span) -> bool {
        self.start < other.start.saturating_add(other.size)
            && other.start < self.start.saturating_add(self.size)
    }
}

/// How instances share one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum Rule {
    /// Instances draw from shared amounts (framebuffer; GVT-g graphics memory and fences) and, when
    /// `slots` is set, each takes one of a fixed number of slots (free VFs, the whole GPU).
    ///
    /// Models NVIDIA classic mdev (one dimension: framebuffer of the whole GPU), NVIDIA
    /// vendor-specific VFIO (framebuffer shared by all VFs of the GPU — counting per VF would
    /// overstate — plus one free VF per vGPU), enabled SR-IOV VFs (slots only: the split is fixed
    /// while VFs exist), whole-GPU passthrough (one slot) and other mdev parents.
    Pools {
        /// Free amount per dimension, in the unit of the dimension (MiB, fences).
        free: Vec<u64>,
        /// Free slots, when instances also need one each.
        slots: Option<u32>,
        /// All instances on the GPU must be of one class ([`Cost::Pools::class`]): NVIDIA's
        /// homogeneous rule (NVIDIA vGPU User Guide, "Homogeneous time-sliced vGPUs": one type per
        /// GPU for classic mdev; one framebuffer size per GPU in the vendor-VFIO equal-size mode).
        homogeneous: bool,
        /// The class existing instances hold the GPU to, when any exist.
        locked: Option<String>,
    },
    /// Instances occupy ranges of a line of slots at legal start positions; two instances conflict
    /// when their ranges overlap. Models MIG GPU instances (memory slices; NVML
    /// `nvmlDeviceGetGpuInstancePossiblePlacements`) and NVIDIA mixed-size vGPU mode (placement ids
    /// and placement size; NVML `nvmlVgpuPlacementList_v2_t`).
    Geometry {
        /// Number of slots (at most 64).
        span: u32,
        /// Ranges existing instances hold.
        occupied: Vec<Span>,
        /// Existing instances per key (profile id or type), for per-key instance limits.
        existing: Vec<(String, u32)>,
    },
    /// An SR-IOV PF with VFs not yet enabled: enabling `n` VFs splits `memory_mib` evenly, so `k`
    /// instances fit when `k ≤ max_vfs` and `k × (largest need) ≤ memory_mib` (the split is fixed
    /// once enabled: drivers/pci/iov.c refuses a new `sriov_numvfs` while VFs exist).
    SplitOnEnable {
        /// Device memory to split; `None` when the GPU uses system memory (only the VF count limits).
        memory_mib: Option<u64>,
        /// `sriov_totalvfs`.
        max_vfs: u32,
    },
}

/// What one instance of a choice takes from its GPU's [`Rule`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "rule", rename_all = "kebab-case")]
pub enum Cost {
    /// Under [`Rule::Pools`].
    Pools {
        /// Amount per dimension (same length as the rule's `free`).
        uses: Vec<u64>,
        /// Homogeneity class: choices of one class must have equal `uses` (the type id for classic
        /// NVIDIA mdev, the framebuffer size for vendor-VFIO equal-size mode).
        class: String,
        /// At most this many more instances of this choice's key (e.g. an mdev type's
        /// `available_instances` when its costs are unknown).
        limit: Option<u32>,
    },
    /// Under [`Rule::Geometry`].
    Geometry {
        /// Slots one instance spans.
        size: u32,
        /// Legal first slots.
        starts: Vec<u32>,
        /// At most this many instances of this key on the GPU, existing ones included.
        limit: Option<u32>,
    },
    /// Under [`Rule::SplitOnEnable`].
    Split {
        /// Memory one instance needs from its VF.
        need_mib: u64,
    },
}

/// One way a GPU can serve one instance of a demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Choice {
    /// The key instance limits count by (mdev type id, MIG profile name, vGPU type).
    pub key: String,
    /// What an instance takes.
    pub cost: Cost,
    /// What to create (from matching).
    pub target: ProfileTarget,
}

/// One GPU as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuCap {
    /// The GPU's id (`Gpu::id`).
    pub id: String,
    /// Its NUMA node, when known.
    pub numa_node: Option<u32>,
    /// How instances share it.
    pub rule: Rule,
}

/// A number of instances of one profile to place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Demand {
    /// The profile's name.
    pub profile: String,
    /// How many instances.
    pub count: u32,
    /// The NUMA node to prefer, when one is asked for.
    pub numa: Option<u32>,
    /// Per GPU (same order as [`Problem::gpus`]), the choices that serve this profile, best first.
    pub choices: Vec<Vec<Choice>>,
}

/// GPUs and demands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// The GPUs instances can be placed on; each demand's `choices` follow this order.
    pub gpus: Vec<GpuCap>,
    /// The demands, in the order the caller listed them.
    pub demands: Vec<Demand>,
}

/// Largest [`Rule::Geometry`] span (the planner keeps occupancy in a 64-bit mask; MIG has 8 memory
/// slices).
pub const MAX_SPAN: u32 = 64;

/// Why a [`Problem`] is malformed (a caller's bug, reported instead of a panic).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ModelError {
    /// A demand's choice list does not have one entry per GPU.
    #[error(
        "demand '{profile}' lists choices for {have} GPUs but the problem has {gpus}; give one (possibly empty) list per GPU"
    )]
    ChoiceRows {
        /// The demand's profile.
        profile: String,
        /// Lists given.
        have: usize,
        /// GPUs.
        gpus: usize,
    },
    /// A choice's cost does not fit its GPU's rule.
    #[error("choice {key} of demand '{profile}' on GPU {gpu}: {problem}")]
    Cost {
        /// The demand's profile.
        profile: String,
        /// The id of the GPU the choice is on.
        gpu: String,
        /// The choice's key.
        key: String,
        /// What is wrong and what would be right.
        problem: String,
    },
    /// Two choices on one GPU share a key (or a homogeneity class) but not the cost.
    #[error(
        "GPU {gpu}: choices with {what} '{name}' have different costs; a key's instances are counted together and a class's instances must cost the same, so give them one cost or different names"
    )]
    Inconsistent {
        /// The id of the GPU whose choices disagree.
        gpu: String,
        /// `key` or `class`.
        what: &'static str,
        /// The shared key or homogeneity class name.
        name: String,
    },
    /// A geometry is larger than the planner handles.
    #[error("GPU {gpu}: geometry of {span} slots exceeds the maximum of {MAX_SPAN}")]
    Span {
        /// The id of the GPU whose geometry is too large.
        gpu: String,
        /// The number of slots in the geometry given.
        span: u32,
    },
}

impl Problem {
    /// Checks that every choice's cost fits its GPU's rule.
    pub fn validate(&self) -> Result<(), ModelError> {
        for g in &self.gpus {
            if let Rule::Geometry { span, .. } = g.rule
                && span > MAX_SPAN
            {
                return Err(ModelError::Span {
                    gpu: g.id.clone(),
                    span,
                });
            }
        }
        for d in &self.demands {
            if d.choices.len() != self.gpus.len() {
                return Err(ModelError::ChoiceRows {
                    profile: d.profile.clone(),
                    have: d.choices.len(),
                    gpus: self.gpus.len(),
                });
            }
            for (g, row) in self.gpus.iter().zip(&d.choices) {
                for c in row {
                    if let Some(problem) = cost_problem(&g.rule, &c.cost) {
                        return Err(ModelError::Cost {
                            profile: d.profile.clone(),
                            gpu: g.id.clone(),
                            key: c.key.clone(),
                            problem,
                        });
                    }
                }
            }
        }
        for (g, gpu) in self.gpus.iter().enumerate() {
            let mut keys: Vec<(&str, &Cost)> = Vec::new();
            let mut classes: Vec<(&str, &[u64])> = Vec::new();
            let all = self
                .demands
                .iter()
                .filter_map(|d| d.choices.get(g))
                .flatten();
            for c in all {
                let conflict = |what, name: &str| ModelError::Inconsistent {
                    gpu: gpu.id.clone(),
                    what,
                    name: name.to_string(),
                };
                // Split choices have no per-key limit: their needs may differ per demand.
                let split = matches!(c.cost, Cost::Split { .. });
                match keys.iter().find(|(k, _)| *k == c.key) {
                    _ if split => {}
                    Some((_, cost)) if *cost != &c.cost => return Err(conflict("key", &c.key)),
                    Some(_) => {}
                    None => keys.push((&c.key, &c.cost)),
                }
                if let Cost::Pools { uses, class, .. } = &c.cost {
                    match classes.iter().find(|(k, _)| k == class) {
                        Some((_, u)) if *u != uses.as_slice() => {
                            return Err(conflict("class", class));
                        }
                        Some(_) => {}
                        None => classes.push((class, uses)),
                    }
                }
            }
        }
        Ok(())
    }

    /// Instances asked for in all.
    pub fn requested(&self) -> u64 {
        self.demands.iter().map(|d| u64::from(d.count)).sum()
    }
}

fn cost_problem(rule: &Rule, cost: &Cost) -> Option<String> {
    match (rule, cost) {
        (Rule::Pools { free, .. }, Cost::Pools { uses, .. }) if uses.len() != free.len() => {
            Some(format!(
                "uses {} dimensions but the GPU has {}",
                uses.len(),
                free.len()
            ))
        }
        (Rule::Pools { .. }, Cost::Pools { .. }) => None,
        (Rule::Geometry { span, .. }, Cost::Geometry { size, starts, .. }) => {
            if *size == 0 {
                return Some("size 0; an instance spans at least one slot".into());
            }
            starts
                .iter()
                .find(|s| s.saturating_add(*size) > *span)
                .map(|s| format!("start {s} + size {size} runs past the {span} slots"))
        }
        (Rule::SplitOnEnable { .. }, Cost::Split { .. }) => None,
        _ => Some("the cost is for another rule than the GPU's".into()),
    }
}
