//! A pool plan: the difference between a pool's desired slots and what exists — what to remove, which
//! VFs to enable, what to create where, what to keep — as steps a caller executes in order and can
//! serialize. Planning changes nothing; planning a pool that is fully applied gives no steps.
//!
//! Which slots exist: an mdev whose UUID is a slot UUID of the pool (see [`super::identity`]) found in
//! the inventory, plus VF slots the caller holds ([`HeldSlot`], from the daemon's records: sysfs does
//! not say which guest holds a VF). A slot is kept when its profile still has that index and its GPU
//! still passes the selectors; other slots of the pool are removed, and their room is reused.

use mdev_types::fault::FaultScope;
use mdev_types::ids::PciAddress;
use mdev_types::model::Inventory;
use serde::Serialize;

use super::error::PoolError;
use super::identity::{self, SlotId};
use super::spec::Pool;
use crate::placement::convert::{DemandInput, HostUse, build};
use crate::placement::{Policy, plan};
use crate::profile::{Catalog, ProfileTarget, match_profile};

/// A VF slot the daemon records as held by this pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldSlot {
    /// The pool slot the VF is held for.
    pub slot: SlotId,
    /// The GPU (PF) it is on.
    pub gpu: String,
    /// The PCI address of the VF the slot holds.
    pub vf: PciAddress,
}

/// One step of applying a plan, in execution order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum PoolStep {
    /// Destroy a slot's instance (an mdev by UUID, or release a VF).
    Remove {
        /// The pool slot whose instance goes.
        slot: SlotId,
        /// The id of the GPU its instance is on.
        gpu: String,
        /// The mdev type or VF it holds now.
        holds: String,
    },
    /// Enable `num_vfs` SR-IOV VFs on a PF (before the creates that use them).
    EnableVfs {
        /// The GPU (PF).
        gpu: String,
        /// The PF's PCI address, whose `sriov_numvfs` is written.
        pf: PciAddress,
        /// How many VFs.
        num_vfs: u32,
    },
    /// Create a slot's instance.
    Create {
        /// The slot (its UUID names the mdev).
        slot: SlotId,
        /// The id of the GPU to create it on.
        gpu: String,
        /// That GPU's NUMA node, when known.
        numa_node: Option<u32>,
        /// What to create; for VFs of a PF enabled by this plan, `vf` is `null` (take a free one).
        target: ProfileTarget,
        /// For MIG-backed placements: the first memory slice of its GPU instance.
        start: Option<u32>,
    },
}

/// A step in a line, for progress and errors.
impl std::fmt::Display for PoolStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolStep::Remove { slot, gpu, holds } => {
                write!(f, "remove {} ({holds}) from {gpu}", slot.name())
            }
            PoolStep::EnableVfs { gpu, num_vfs, .. } => {
                write!(f, "enable {num_vfs} SR-IOV VFs on {gpu}")
            }
            PoolStep::Create {
                slot, gpu, target, ..
            } => write!(f, "create {} on {gpu} as {target}", slot.name()),
        }
    }
}

/// A slot that exists and stays.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Kept {
    /// The pool slot that stays.
    pub slot: SlotId,
    /// The id of the GPU its instance is on.
    pub gpu: String,
    /// The mdev type id or VF address its instance holds.
    pub holds: String,
    /// Why its GPU cannot be read, when it is faulted: the slot is kept as it is (neither removed nor
    /// placed elsewhere) until the GPU reads again; `None` on a healthy GPU.
    pub fault: Option<String>,
}

/// A profile whose slots do not all fit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolShortfall {
    /// The name of the profile whose slots do not all fit.
    pub profile: String,
    /// Slots wanted.
    pub wanted: u32,
    /// Slots that exist or are placed.
    pub placed: u32,
    /// `wanted - placed`.
    pub missing: u32,
    /// Why, in one sentence.
    pub reason: String,
}

/// Instances per GPU after the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuLoad {
    /// The GPU's id (PCI address or parent name).
    pub gpu: String,
    /// Its human model name (e.g. `NVIDIA T4`).
    pub model: String,
    /// Its NUMA node, when known.
    pub numa_node: Option<u32>,
    /// Slots of this pool kept on it.
    pub kept: u32,
    /// Slots to be created on it.
    pub created: u32,
}

/// The plan for one pool on one host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolPlan {
    /// The pool's name.
    pub pool: String,
    /// The host (`Inventory::host`).
    pub host: String,
    /// Its placement policy (consolidate or spread).
    pub policy: Policy,
    /// Steps in execution order: removes, then VF enables, then creates.
    pub steps: Vec<PoolStep>,
    /// Slots that exist and stay.
    pub keep: Vec<Kept>,
    /// Profiles not fully placed.
    pub shortfall: Vec<PoolShortfall>,
    /// Per selected GPU with slots.
    pub gpus: Vec<GpuLoad>,
    /// Whether the number placed is proven to be the most possible.
    pub proven_optimal: bool,
}

impl PoolPlan {
    /// True when applying the plan would change nothing.
    pub fn is_noop(&self) -> bool {
        self.steps.is_empty()
    }

    /// Number of creates.
    pub fn creates(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, PoolStep::Create { .. }))
            .count()
    }

    /// Number of removes.
    pub fn removes(&self) -> usize {
        self.steps
            .iter()
            .filter(|s| matches!(s, PoolStep::Remove { .. }))
            .count()
    }
}

/// Every slot of `pool`'s name that exists now: mdevs with a slot UUID (for any profile of the
/// catalog, index below [`MAX_SLOTS`]) and held VFs. Each with its GPU and what it holds.
fn existing(
    pool: &Pool,
    catalog: &Catalog,
    inv: &Inventory,
    held: &[HeldSlot],
) -> Vec<(SlotId, String, String)> {
    let profiles: Vec<&str> = catalog.profiles().iter().map(|p| p.name.as_str()).collect();
    let mut out: Vec<(SlotId, String, String)> = inv
        .mdev_instances
        .iter()
        .filter_map(|m| {
            let slot = identity::slot_of(&pool.name, profiles.iter().copied(), &m.uuid)?;
            // A VF's parent counts for its physical GPU.
            let gpu = inv
                .gpu_of_parent(&m.parent)
                .map(|g| g.id.clone())
                .unwrap_or_else(|| m.parent.clone());
            Some((slot, gpu, m.type_id.to_string()))
        })
        .collect();
    out.extend(
        held.iter()
            .filter(|h| h.slot.pool == pool.name)
            .map(|h| (h.slot.clone(), h.gpu.clone(), format!("VF {}", h.vf))),
    );
    out.sort();
    out
}

/// Plans `pool` on the host `inv` describes. `held` lists the VF slots the daemon records (empty
/// offline). Changes nothing.
pub fn plan_pool(
    pool: &Pool,
    catalog: &Catalog,
    inv: &Inventory,
    held: &[HeldSlot],
) -> Result<PoolPlan, PoolError> {
    let gpu_ok = |id: &str| {
        inv.gpus
            .iter()
            .find(|g| g.id == id)
            .is_some_and(|g| pool.select.accepts(g))
    };
    let mut keep = Vec::new();
    let mut steps = Vec::new();
    let mut released = Vec::new();
    let mut released_vfs = Vec::new();
    for (slot, gpu, holds) in existing(pool, catalog, inv, held) {
        let wanted = pool
            .profiles
            .get(&slot.profile)
            .is_some_and(|n| slot.index < *n);
        // A slot on a GPU that cannot be read stays where it is, wanted or not: its device may still
        // exist there (a removal would fail or hit a device in a bad state), and placing it elsewhere
        // would make a second device of its UUID. Once the GPU reads again, the next apply decides.
        let fault = gpu_fault(inv, &gpu);
        if fault.is_some() || (wanted && gpu_ok(&gpu)) {
            keep.push(Kept {
                slot,
                gpu,
                holds,
                fault,
            });
        } else {
            released.push(slot.uuid);
            if let Some(h) = held.iter().find(|h| h.slot == slot) {
                released_vfs.push(h.vf);
            }
            steps.push(PoolStep::Remove { slot, gpu, holds });
        }
    }
    // VFs held by slots that stay are in use; released ones are free again.
    let claimed: Vec<PciAddress> = held
        .iter()
        .map(|h| h.vf)
        .filter(|vf| !released_vfs.contains(vf))
        .collect();

    // The missing slots per profile, lowest indices first.
    let mut missing: Vec<(String, Vec<u32>)> = Vec::new();
    for (profile, n) in &pool.profiles {
        let have: Vec<u32> = keep
            .iter()
            .filter(|k| &k.slot.profile == profile)
            .map(|k| k.slot.index)
            .collect();
        let idx: Vec<u32> = (0..*n).filter(|i| !have.contains(i)).collect();
        missing.push((profile.clone(), idx));
    }
    let reports: Vec<_> = missing
        .iter()
        .filter_map(|(name, _)| catalog.get(name).map(|p| (p, match_profile(p, inv))))
        .collect();
    let inputs: Vec<DemandInput<'_>> = reports
        .iter()
        .zip(&missing)
        .map(|((p, r), (_, idx))| DemandInput {
            report: r,
            need_mib: p.framebuffer_mib,
            count: u32::try_from(idx.len()).unwrap_or(u32::MAX),
            numa: pool.select.numa_node,
        })
        .collect();
    let converted = build(
        inv,
        &inputs,
        &|g| pool.select.accepts(g),
        HostUse {
            released: &released,
            claimed_vfs: &claimed,
        },
    );
    let solution = plan(&converted.problem, pool.policy).map_err(|source| PoolError::Model {
        pool: pool.name.clone(),
        source,
    })?;

    for &(g, num_vfs) in &solution.enable_vfs {
        let gpu = &converted.problem.gpus[g];
        if let Some(pf) = inv.gpus.get(converted.gpu_index[g]).and_then(|x| x.pci) {
            steps.push(PoolStep::EnableVfs {
                gpu: gpu.id.clone(),
                pf,
                num_vfs,
            });
        }
    }
    let mut next_vf = vec![0usize; converted.problem.gpus.len()];
    let mut next_slot = vec![0usize; missing.len()];
    for a in &solution.assignments {
        let Some(choice) = solution.choice(&converted.problem, a) else {
            continue;
        };
        let gpu = &converted.problem.gpus[a.gpu];
        let (profile, idx) = &missing[a.demand];
        let Some(&index) = idx.get(next_slot[a.demand]) else {
            continue;
        };
        next_slot[a.demand] += 1;
        let mut target = choice.target.clone();
        // Hand out concrete VFs in address order; the matching option named only the first free one.
        match &mut target {
            ProfileTarget::NvidiaVendorVfio { vf, .. }
            | ProfileTarget::SriovVf { vf: Some(vf), .. } => {
                if let Some(free) = converted.free_vfs[a.gpu].get(next_vf[a.gpu]) {
                    *vf = *free;
                }
                next_vf[a.gpu] += 1;
            }
            // A GPU whose VFs are its mdev parents holds one vGPU per VF: each slot its own VF.
            ProfileTarget::Mdev { parent, .. } if !converted.free_vfs[a.gpu].is_empty() => {
                if let Some(free) = converted.free_vfs[a.gpu].get(next_vf[a.gpu]) {
                    *parent = free.to_string();
                }
                next_vf[a.gpu] += 1;
            }
            ProfileTarget::SriovVf {
                vf,
                vf_driver,
                enable_vfs: true,
                num_vfs,
                ..
            } => {
                *vf = None;
                *vf_driver = None;
                if let Some((_, n)) = solution.enable_vfs.iter().find(|(g, _)| *g == a.gpu) {
                    *num_vfs = *n;
                }
            }
            _ => {}
        }
        steps.push(PoolStep::Create {
            slot: SlotId::new(&pool.name, profile, index),
            gpu: gpu.id.clone(),
            numa_node: gpu.numa_node,
            target,
            start: a.start,
        });
    }

    let shortfall = solution
        .shortfall
        .iter()
        .map(|s| {
            let wanted = pool.profiles.get(&s.profile).copied().unwrap_or(s.wanted);
            let kept = wanted - s.wanted;
            let reason = if s.alone_at_most == 0 {
                let why = reports
                    .iter()
                    .find(|(p, _)| p.name == s.profile)
                    .and_then(|(_, r)| {
                        r.gpus
                            .iter()
                            .filter(|g| {
                                inv.gpus
                                    .iter()
                                    .any(|x| x.id == g.gpu && pool.select.accepts(x))
                            })
                            .filter_map(|g| g.why_not().map(|w| format!("{}: {w}", g.gpu)))
                            .next()
                    });
                match why {
                    Some(w) => format!("no selected GPU can take it now ({w})"),
                    None => "no selected GPU can take it now".to_string(),
                }
            } else if s.alone_at_most < u64::from(s.wanted) {
                format!(
                    "the selected GPUs hold at most {} more even with no other profile",
                    s.alone_at_most
                )
            } else {
                "the other profiles of the pool take the room it would need".to_string()
            };
            let reason = match faulted_gpus(inv) {
                Some(f) => format!("{reason}; skipped as faulted: {f}"),
                None => reason,
            };
            PoolShortfall {
                profile: s.profile.clone(),
                wanted,
                placed: kept + s.placed,
                missing: s.missing,
                reason,
            }
        })
        .collect();

    let mut gpus: Vec<GpuLoad> = Vec::new();
    for g in inv.gpus.iter().filter(|g| pool.select.accepts(g)) {
        let kept = keep.iter().filter(|k| k.gpu == g.id).count();
        let created = steps
            .iter()
            .filter(|s| matches!(s, PoolStep::Create { gpu, .. } if *gpu == g.id))
            .count();
        if kept + created > 0 {
            gpus.push(GpuLoad {
                gpu: g.id.clone(),
                model: g.model.clone(),
                numa_node: g.numa_node,
                kept: u32::try_from(kept).unwrap_or(u32::MAX),
                created: u32::try_from(created).unwrap_or(u32::MAX),
            });
        }
    }
    Ok(PoolPlan {
        pool: pool.name.clone(),
        host: inv.host.clone(),
        policy: pool.policy,
        steps,
        keep,
        shortfall,
        gpus,
        proven_optimal: solution.proven_optimal,
    })
}

/// The GPUs discovery could not read (and placement skipped), each with its cause; `None` when none.
fn faulted_gpus(inv: &Inventory) -> Option<String> {
    let list: Vec<String> = inv
        .faults
        .iter()
        .filter(|f| matches!(f.scope, FaultScope::PciDevice | FaultScope::MdevParent))
        .map(|f| format!("{} ({}: {})", f.device, f.path.display(), f.cause))
        .collect();
    (!list.is_empty()).then(|| list.join(", "))
}

/// Why GPU `gpu` (or its mdev parent) cannot be read, if it cannot.
fn gpu_fault(inv: &Inventory, gpu: &str) -> Option<String> {
    inv.fault_of(gpu).map(|f| match &f.fix {
        Some(fix) => format!("{} ({}: {}; {fix})", f.device, f.path.display(), f.cause),
        None => format!("{} ({}: {})", f.device, f.path.display(), f.cause),
    })
}
