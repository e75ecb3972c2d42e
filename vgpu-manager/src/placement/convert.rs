//! Building a [`Problem`] from discovery and matching: each GPU's [`Rule`] from what sysfs shows, each
//! demand's [`Choice`]s from the match report's options (best first).
//!
//! The per-backend facts are kept apart here, one function per backend, so they can later move behind
//! the backend trait:
//! * classic NVIDIA mdev (`nvidia_mdev`): framebuffer of the whole GPU, homogeneous;
//! * other mdev parents (`other_mdev`): the pools a type description states (GVT-g graphics memory
//!   and fences, mbochs memory), or one type at a time when it states none;
//! * NVIDIA vendor-specific VFIO (`nvidia_vfio`): framebuffer shared by all VFs, one free VF per vGPU,
//!   equal-size mode;
//! * SR-IOV VFs (`sriov_vfs`): a fixed split while VFs exist, a split to choose while they do not;
//! * whole-GPU passthrough: one slot.
//!
//! A GPU takes the rule of its vGPU backend (mdev, else SR-IOV, else passthrough); options of another
//! backend on the same GPU are left out of one plan.

use mdev_types::ids::{MdevUuid, PciAddress};
use mdev_types::model::{Gpu, Inventory, MdevParent, PciDevice, SriovPf, Vendor};
use mdev_types::parse::{TypeDescription, parse_nvidia_vgpu_name};

use super::model::{Choice, Cost, Demand, GpuCap, Problem, Rule};
use crate::profile::facts::{device_facts, nvidia_name_framebuffer_mib};
use crate::profile::{MatchReport, ProfileTarget};

/// One profile to place.
#[derive(Debug, Clone, Copy)]
pub struct DemandInput<'a> {
    /// The profile matched against the same inventory.
    pub report: &'a MatchReport,
    /// The profile's minimum framebuffer (sizes an SR-IOV split).
    pub need_mib: u64,
    /// How many instances.
    pub count: u32,
    /// The NUMA node to prefer for its instances; `None` for no preference.
    pub numa: Option<u32>,
}

/// What the host holds already, beyond what sysfs shows.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostUse<'a> {
    /// mdev instances to be removed before the new ones are created: their room counts as free
    /// (classic NVIDIA mdev and parents whose types state their costs; elsewhere not credited).
    pub released: &'a [MdevUuid],
    /// VFs already handed to guests (sysfs cannot tell a VF in use from a free one).
    pub claimed_vfs: &'a [PciAddress],
}

/// A problem and, per GPU, the free VFs in the order instances take them.
#[derive(Debug, Clone)]
pub struct Converted {
    /// The planner input; GPU `i` is `inv.gpus[gpu_index[i]]`.
    pub problem: Problem,
    /// Index of each problem GPU in the inventory.
    pub gpu_index: Vec<usize>,
    /// Per problem GPU: its free VFs (empty for mdev parents and passthrough).
    pub free_vfs: Vec<Vec<PciAddress>>,
}

/// How a GPU's capacity is counted: the planner's rule for it, its free VFs, and what each of its
/// options costs.
struct CapacityModel {
    rule: Rule,
    /// The free VFs (VF-backed GPUs), in the order they are handed out.
    vfs: Vec<PciAddress>,
    costs: Costing,
}

enum Costing {
    /// mdev types: per type id, cost and class.
    Mdev(Vec<(String, Vec<u64>, Option<u32>)>),
    /// Vendor VFIO: framebuffer per type id.
    NvidiaVfio(Vec<(u32, u64)>),
    /// VFs exist: one slot each.
    Vfs,
    /// VFs to be enabled: the profile's need.
    Split,
    /// Passthrough: the whole GPU is one slot.
    Whole,
}

/// Builds the planner input for `demands` on the GPUs of `inv` that `allowed` accepts and that are
/// not faulted ([`Inventory::fault_of`]).
pub fn build(
    inv: &Inventory,
    demands: &[DemandInput<'_>],
    allowed: &dyn Fn(&Gpu) -> bool,
    used: HostUse<'_>,
) -> Converted {
    let mut out = Converted {
        problem: Problem::default(),
        gpu_index: Vec::new(),
        free_vfs: Vec::new(),
    };
    let mut backends = Vec::new();
    for (i, gpu) in inv.gpus.iter().enumerate() {
        // A GPU discovery could not read whole (its PCI function or its mdev parent) takes nothing.
        if !allowed(gpu) || inv.fault_of(&gpu.id).is_some() {
            continue;
        }
        let b = capacity_model(gpu, inv, used);
        out.problem.gpus.push(GpuCap {
            id: gpu.id.clone(),
            numa_node: gpu.numa_node,
            rule: b.rule.clone(),
        });
        out.gpu_index.push(i);
        out.free_vfs.push(b.vfs.clone());
        backends.push(b);
    }
    for d in demands {
        let choices = out
            .problem
            .gpus
            .iter()
            .zip(&backends)
            .map(|(g, b)| {
                let Some(m) = d.report.gpu(&g.id) else {
                    return Vec::new();
                };
                m.best
                    .iter()
                    .chain(&m.alternatives)
                    .filter_map(|o| choice(&o.target, b, d.need_mib))
                    .collect()
            })
            .collect();
        out.problem.demands.push(Demand {
            profile: d.report.profile.clone(),
            count: d.count,
            numa: d.numa,
            choices,
        });
    }
    out
}

fn choice(target: &ProfileTarget, b: &CapacityModel, need_mib: u64) -> Option<Choice> {
    let (key, cost) = match (target, &b.costs) {
        (ProfileTarget::Mdev { type_id, .. }, Costing::Mdev(types)) => {
            let (_, uses, limit) = types.iter().find(|(t, _, _)| t == type_id.as_str())?;
            (
                type_id.to_string(),
                Cost::Pools {
                    uses: uses.clone(),
                    class: type_id.to_string(),
                    limit: *limit,
                },
            )
        }
        (ProfileTarget::NvidiaVendorVfio { type_id, .. }, Costing::NvidiaVfio(types)) => {
            let fb = types.iter().find(|(t, _)| t == type_id).map(|(_, f)| *f)?;
            (
                type_id.to_string(),
                Cost::Pools {
                    uses: vec![fb],
                    class: format!("{fb} MiB"),
                    limit: None,
                },
            )
        }
        (
            ProfileTarget::SriovVf {
                enable_vfs: false, ..
            },
            Costing::Vfs,
        ) => (
            "vf".to_string(),
            Cost::Pools {
                uses: Vec::new(),
                class: "vf".into(),
                limit: None,
            },
        ),
        (
            ProfileTarget::SriovVf {
                enable_vfs: true, ..
            },
            Costing::Split,
        ) => ("vf".to_string(), Cost::Split { need_mib }),
        (ProfileTarget::Passthrough { .. }, Costing::Whole) => (
            "whole".to_string(),
            Cost::Pools {
                uses: Vec::new(),
                class: "whole".into(),
                limit: None,
            },
        ),
        _ => return None,
    };
    Some(Choice {
        key,
        cost,
        target: target.clone(),
    })
}

fn capacity_model(gpu: &Gpu, inv: &Inventory, used: HostUse<'_>) -> CapacityModel {
    let device = gpu
        .pci
        .and_then(|a| inv.pci_devices.iter().find(|d| d.address == a));
    let parents = inv.gpu_parents(gpu);
    if Inventory::mdev_on_vfs(gpu) {
        return nvidia_mdev_on_vfs(&parents, inv, used.released);
    }
    if let Some(&parent) = parents.first() {
        let live: Vec<(&str, bool)> = inv
            .mdev_instances
            .iter()
            .filter(|m| m.parent == parent.name)
            .map(|m| (m.type_id.as_str(), used.released.contains(&m.uuid)))
            .collect();
        if gpu.vendor == Vendor::Nvidia
            && let Some(b) = nvidia_mdev(parent, &live)
        {
            return b;
        }
        return other_mdev(parent, &live);
    }
    if let Some((pf, sriov)) = device.and_then(|d| d.sriov.as_ref().map(|s| (d, s)))
        && sriov.total_vfs > 0
    {
        let vfs: Vec<&PciDevice> = sriov
            .vfs
            .iter()
            .filter_map(|a| inv.pci_devices.iter().find(|d| d.address == *a))
            .collect();
        if vfs.iter().any(|v| v.nvidia_vf.is_some()) {
            return nvidia_vfio(pf, &vfs, used.claimed_vfs);
        }
        return sriov_vfs(pf, sriov, &vfs, used.claimed_vfs);
    }
    CapacityModel {
        rule: Rule::Pools {
            free: Vec::new(),
            slots: Some(1),
            homogeneous: false,
            locked: None,
        },
        vfs: Vec::new(),
        costs: Costing::Whole,
    }
}

/// Classic NVIDIA mdev: every type uses its framebuffer out of the GPU's, the GPU's framebuffer is
/// `max_instance × framebuffer` of any type (nvidia-vgpu-vfio's description: `max_instance` is the
/// count on an empty GPU), and instances are homogeneous (NVIDIA vGPU User Guide, "Homogeneous
/// time-sliced vGPUs"). `None` when a type's description is not NVIDIA's.
fn nvidia_mdev(parent: &MdevParent, live: &[(&str, bool)]) -> Option<CapacityModel> {
    let mut types = Vec::new();
    let mut total = 0u64;
    for t in &parent.types {
        let TypeDescription::Nvidia(d) = &t.details else {
            return None;
        };
        total = total.max(u64::from(d.max_instance).saturating_mul(d.framebuffer_mib));
        let existing = live.iter().filter(|(ty, r)| *ty == t.id.as_str() && !r);
        let existing = u32::try_from(existing.count()).unwrap_or(u32::MAX);
        types.push((
            t.id.to_string(),
            vec![d.framebuffer_mib],
            Some(d.max_instance.saturating_sub(existing)),
        ));
    }
    let fb_of = |ty: &str| {
        types
            .iter()
            .find(|(t, _, _)| t == ty)
            .and_then(|(_, u, _)| u.first().copied())
            .unwrap_or(0)
    };
    let kept: Vec<&str> = live.iter().filter(|(_, r)| !r).map(|(t, _)| *t).collect();
    let used: u64 = kept.iter().map(|t| fb_of(t)).sum();
    Some(CapacityModel {
        rule: Rule::Pools {
            free: vec![total.saturating_sub(used)],
            slots: None,
            homogeneous: true,
            locked: kept.first().map(|t| t.to_string()),
        },
        vfs: Vec::new(),
        costs: Costing::Mdev(types),
    })
}

/// Classic NVIDIA mdev on SR-IOV VFs (Ampere and later): the rule of [`nvidia_mdev`] over the
/// instances of all VFs, and one vGPU per VF, so the free VFs — those without an instance, or whose
/// instance is to be released — are the slots, handed out in VF order (NVIDIA vGPU User Guide 13–16,
/// "Creating an NVIDIA vGPU on a Linux with KVM Hypervisor", GPUs that support SR-IOV).
fn nvidia_mdev_on_vfs(
    parents: &[&MdevParent],
    inv: &Inventory,
    released: &[MdevUuid],
) -> CapacityModel {
    let on = |p: &MdevParent| -> Vec<(&str, bool)> {
        inv.mdev_instances
            .iter()
            .filter(|m| m.parent == p.name)
            .map(|m| (m.type_id.as_str(), released.contains(&m.uuid)))
            .collect()
    };
    let live: Vec<(&str, bool)> = parents.iter().flat_map(|p| on(p)).collect();
    let free_vfs: Vec<PciAddress> = parents
        .iter()
        .filter(|p| on(p).iter().all(|(_, r)| *r))
        .filter_map(|p| p.pci)
        .collect();
    let template = parents.iter().find(|p| !p.types.is_empty()).copied();
    let mut model = template
        .and_then(|t| nvidia_mdev(t, &live))
        .unwrap_or_else(|| CapacityModel {
            rule: Rule::Pools {
                free: Vec::new(),
                slots: None,
                homogeneous: true,
                locked: None,
            },
            vfs: Vec::new(),
            costs: Costing::Mdev(Vec::new()),
        });
    if let Rule::Pools { slots, .. } = &mut model.rule {
        *slots = Some(u32::try_from(free_vfs.len()).unwrap_or(u32::MAX));
    }
    model.vfs = free_vfs;
    model
}

/// Other mdev parents. When every type states its costs (GVT-g: low and high graphics memory and
/// fences, drivers/gpu/drm/i915/gvt/vgpu.c `intel_vgpu_configs`; mbochs: memory), the free amount of
/// each pool is at least `available_instances × cost` of every type (the driver computes
/// `available_instances` as the minimum over pools of free / cost), so the largest such product is a
/// safe estimate. Otherwise the types' sharing is unknown: one type per GPU, at most its
/// `available_instances`.
fn other_mdev(parent: &MdevParent, live: &[(&str, bool)]) -> CapacityModel {
    let costs: Option<Vec<Vec<u64>>> = parent
        .types
        .iter()
        .map(|t| match &t.details {
            TypeDescription::Gvt(d) => Some(vec![d.low_gm_mib, d.high_gm_mib, u64::from(d.fence)]),
            TypeDescription::SampleVideoMemory { mib } => Some(vec![*mib]),
            _ => None,
        })
        .collect();
    let same_dims = costs.as_ref().is_some_and(|c| {
        c.first()
            .is_some_and(|f| c.iter().all(|x| x.len() == f.len()))
    });
    match costs.filter(|_| same_dims) {
        Some(costs) => {
            let dims = costs.first().map_or(0, Vec::len);
            let free = (0..dims)
                .map(|d| {
                    parent
                        .types
                        .iter()
                        .zip(&costs)
                        .map(|(t, c)| u64::from(t.available_instances).saturating_mul(c[d]))
                        .max()
                        .unwrap_or(0)
                })
                .collect();
            CapacityModel {
                rule: Rule::Pools {
                    free,
                    slots: None,
                    homogeneous: false,
                    locked: None,
                },
                vfs: Vec::new(),
                costs: Costing::Mdev(
                    parent
                        .types
                        .iter()
                        .zip(costs)
                        .map(|(t, c)| (t.id.to_string(), c, Some(t.available_instances)))
                        .collect(),
                ),
            }
        }
        None => {
            let released = |ty: &str| {
                let n = live.iter().filter(|(t, r)| *t == ty && *r).count();
                u32::try_from(n).unwrap_or(u32::MAX)
            };
            CapacityModel {
                rule: Rule::Pools {
                    free: Vec::new(),
                    slots: None,
                    homogeneous: true,
                    locked: live.iter().find(|(_, r)| !r).map(|(t, _)| (*t).to_string()),
                },
                vfs: Vec::new(),
                costs: Costing::Mdev(
                    parent
                        .types
                        .iter()
                        .map(|t| {
                            let limit = t
                                .available_instances
                                .saturating_add(released(t.id.as_str()));
                            (t.id.to_string(), Vec::new(), Some(limit))
                        })
                        .collect(),
                ),
            }
        }
    }
}

/// NVIDIA vendor-specific VFIO: one vGPU per VF, all VFs share the GPU's framebuffer (the device
/// table's memory, else the largest type any VF lists), and in the default equal-size mode all vGPUs
/// of a GPU have one framebuffer size (NVIDIA vGPU User Guide, "Homogeneous/heterogeneous vGPUs";
/// NVML `NVML_VGPU_PGPU_HOMOGENEOUS_MODE`).
fn nvidia_vfio(pf: &PciDevice, vfs: &[&PciDevice], claimed: &[PciAddress]) -> CapacityModel {
    let mut types: Vec<(u32, u64)> = Vec::new();
    for t in vfs
        .iter()
        .filter_map(|v| v.nvidia_vf.as_ref())
        .flat_map(|n| &n.creatable)
    {
        if types.iter().all(|(id, _)| *id != t.id)
            && let Ok(name) = parse_nvidia_vgpu_name(&t.name)
        {
            types.push((t.id, nvidia_name_framebuffer_mib(name.framebuffer_gib)));
        }
    }
    let occupied: Vec<u64> = vfs
        .iter()
        .filter_map(|v| v.nvidia_vf.as_ref()?.current_type)
        .map(|id| {
            types
                .iter()
                .find(|(t, _)| *t == id)
                .map_or(0, |(_, fb)| *fb)
        })
        .collect();
    let total = device_facts(pf.vendor, pf.device)
        .and_then(|f| f.memory_mib)
        .unwrap_or_else(|| {
            occupied.iter().sum::<u64>() + types.iter().map(|(_, fb)| *fb).max().unwrap_or(0)
        });
    let free_vfs: Vec<PciAddress> = vfs
        .iter()
        .filter(|v| {
            v.iommu_group.is_some()
                && !claimed.contains(&v.address)
                && v.nvidia_vf
                    .as_ref()
                    .is_some_and(|n| n.current_type.is_none())
        })
        .map(|v| v.address)
        .collect();
    CapacityModel {
        rule: Rule::Pools {
            free: vec![total.saturating_sub(occupied.iter().sum())],
            slots: Some(u32::try_from(free_vfs.len()).unwrap_or(u32::MAX)),
            homogeneous: true,
            locked: occupied.first().map(|fb| format!("{fb} MiB")),
        },
        vfs: free_vfs,
        costs: Costing::NvidiaVfio(types),
    }
}

/// SR-IOV VFs through vfio-pci (Intel xe/i915, AMD MxGPU): with VFs enabled, each free VF serves one
/// instance (their split is fixed: drivers/pci/iov.c `sriov_numvfs_store` refuses a change while VFs
/// exist); with none, the VF count is chosen at enable time (device memory from the device table).
fn sriov_vfs(
    pf: &PciDevice,
    s: &SriovPf,
    vfs: &[&PciDevice],
    claimed: &[PciAddress],
) -> CapacityModel {
    if s.num_vfs == 0 {
        return CapacityModel {
            rule: Rule::SplitOnEnable {
                memory_mib: device_facts(pf.vendor, pf.device).and_then(|f| f.memory_mib),
                max_vfs: s.total_vfs,
            },
            vfs: Vec::new(),
            costs: Costing::Split,
        };
    }
    // A VF bound to any driver is someone's: a host driver uses it, or vfio-pci holds it for a guest
    // that vgpu-manager did not start (its own slots are in `claimed`). Only driverless VFs are taken,
    // as VFs enabled with `sriov_drivers_autoprobe=0` are.
    let free: Vec<PciAddress> = vfs
        .iter()
        .filter(|v| v.iommu_group.is_some() && v.driver.is_none() && !claimed.contains(&v.address))
        .map(|v| v.address)
        .collect();
    CapacityModel {
        rule: Rule::Pools {
            free: Vec::new(),
            slots: Some(u32::try_from(free.len()).unwrap_or(u32::MAX)),
            homogeneous: false,
            locked: None,
        },
        vfs: free,
        costs: Costing::Vfs,
    }
}
