//! What the host families say, gathered once from the engine's views ([`Snapshot`]) and written at
//! every scrape ([`Snapshot::write`]) without reading the host. Every label value is text here
//! already, so writing a sample is copying.

use std::collections::BTreeMap;

use super::text::{Exposition, Kind};
use crate::daemon::api::InstanceState;

/// The host as the host families show it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Every GPU, in discovery order.
    pub gpus: Vec<GpuRow>,
    /// Every instance, by UUID.
    pub instances: Vec<InstanceRow>,
    /// Every applied pool, by name.
    pub pools: Vec<PoolRow>,
}

/// One GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuRow {
    /// The GPU id (PCI address or parent name).
    pub id: String,
    /// Vendor (`nvidia`, `intel`, …).
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Its driver, `""` for none.
    pub driver: String,
    /// Its NUMA node, `""` when unknown.
    pub numa_node: String,
    /// Its vendor backend (`nvidia-mdev`, `intel-xe-sriov`, …), `""` for none.
    pub backend: String,
    /// False when discovery could not read it whole (`Gpu1.Health` is `faulted: …`).
    pub healthy: bool,
    /// Its mdev types.
    pub types: Vec<TypeRow>,
    /// Its SR-IOV VFs, for a physical function that has the capability.
    pub vfs: Option<VfCounts>,
    /// Per shipped profile, how many more instances the placement model fits on it now.
    pub profile_capacity: Vec<(String, u32)>,
    /// Scheduling shares of its instances, where its backend reports them.
    pub shares: Vec<ShareRow>,
}

/// One mdev type of a GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TypeRow {
    /// The type id (`nvidia-231`).
    pub id: String,
    /// Its name (`GRID T4-2B`), `""` when the type has none.
    pub name: String,
    /// `available_instances` as last read.
    pub available: u32,
    /// Instances of the type that exist.
    pub created: u32,
}

/// A physical function's VFs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VfCounts {
    /// `sriov_totalvfs`.
    pub total: u32,
    /// `sriov_numvfs`.
    pub enabled: u32,
    /// VFs vgpud holds for pool slots.
    pub in_use: u32,
}

/// The scheduling share of one instance.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShareRow {
    /// The instance (or VF) the slot serves.
    pub device: String,
    /// The share its weight asks for, as a fraction of the GPU (weight over the sum of weights).
    pub requested: Option<f64>,
    /// The share the backend reports it gets when every slot is busy.
    pub effective: Option<f64>,
}

/// One instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRow {
    /// Its UUID.
    pub uuid: String,
    /// Its GPU.
    pub gpu: String,
    /// Its mdev type.
    pub type_id: String,
    /// The profile it was made from, `""` for none.
    pub profile: String,
    /// The pool whose slot it is, `""` for none.
    pub pool: String,
    /// Its label, `""` for none.
    pub label: String,
    /// `daemon`, `adopted` or `foreign`.
    pub owner: &'static str,
    /// The libvirt domain it serves, where the hook's label names it, `""` otherwise.
    pub domain: String,
    /// Its state.
    pub state: InstanceState,
}

/// One applied pool.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolRow {
    /// The pool's name.
    pub name: String,
    /// Slots wanted.
    pub wanted: u32,
    /// Slots per state (`running`, `stopped`, `waiting-for-parent`, `missing`).
    pub slots: BTreeMap<String, u32>,
}

/// Every slot state `vgpu_pool_slots` reports (0 when none is in it).
pub const SLOT_STATES: [&str; 4] = ["running", "stopped", "waiting-for-parent", "missing"];

impl Snapshot {
    /// The number of bytes a scrape of this snapshot takes, about, for sizing the buffer.
    pub fn estimated_bytes(&self) -> usize {
        4096 + self.instances.len() * 700
            + self
                .gpus
                .iter()
                .map(|g| 600 + g.types.len() * 250 + g.profile_capacity.len() * 90)
                .sum::<usize>()
            + self.pools.len() * 400
    }

    /// Writes the host families.
    pub fn write(&self, e: &mut Exposition) {
        self.write_gpus(e);
        self.write_instances(e);
        self.write_pools(e);
    }

    fn write_gpus(&self, e: &mut Exposition) {
        let mut f = e.family(
            "vgpu_gpu",
            Kind::Info,
            "A GPU vgpud sees; labels say what it is.",
        );
        for g in &self.gpus {
            f.sample(
                &[
                    ("gpu", &g.id),
                    ("vendor", &g.vendor),
                    ("model", &g.model),
                    ("driver", &g.driver),
                    ("numa_node", &g.numa_node),
                    ("backend", &g.backend),
                ],
                1.0,
            );
        }
        let mut f = e.family(
            "vgpu_gpu_healthy",
            Kind::Gauge,
            "1 when discovery read the GPU whole, 0 when it is faulted (nothing is placed on it; Gpu1.Health says why).",
        );
        for g in &self.gpus {
            f.sample(&[("gpu", &g.id)], if g.healthy { 1.0 } else { 0.0 });
        }
        let mut f = e.family(
            "vgpu_type_available_instances",
            Kind::Gauge,
            "How many more instances of the mdev type the GPU accepts now (its available_instances).",
        );
        for g in &self.gpus {
            for t in &g.types {
                f.sample(
                    &[("gpu", &g.id), ("type", &t.id), ("name", &t.name)],
                    f64::from(t.available),
                );
            }
        }
        let mut f = e.family(
            "vgpu_type_instances",
            Kind::Gauge,
            "Instances of the mdev type that exist on the GPU.",
        );
        for g in &self.gpus {
            for t in &g.types {
                f.sample(&[("gpu", &g.id), ("type", &t.id)], f64::from(t.created));
            }
        }
        let vfs: Vec<(&str, VfCounts)> = self
            .gpus
            .iter()
            .filter_map(|g| Some((g.id.as_str(), g.vfs?)))
            .collect();
        for (name, help, pick) in [
            (
                "vgpu_vfs_supported",
                "VFs the SR-IOV physical function supports (sriov_totalvfs; not named _total, which marks counters).",
                (|v: &VfCounts| v.total) as fn(&VfCounts) -> u32,
            ),
            (
                "vgpu_vfs_enabled",
                "VFs enabled on the SR-IOV physical function (sriov_numvfs).",
                |v: &VfCounts| v.enabled,
            ),
            (
                "vgpu_vfs_in_use",
                "VFs of the SR-IOV physical function that vgpud holds for pool slots.",
                |v: &VfCounts| v.in_use,
            ),
        ] {
            let mut f = e.family(name, Kind::Gauge, help);
            for (gpu, v) in &vfs {
                f.sample(&[("gpu", gpu)], f64::from(pick(v)));
            }
        }
        let mut f = e.family(
            "vgpu_profile_capacity",
            Kind::Gauge,
            "How many more instances of the profile the GPU could take now, as the pool planner counts (NVIDIA's one-type-per-GPU rule and shared framebuffer included).",
        );
        for g in &self.gpus {
            for (profile, n) in &g.profile_capacity {
                f.sample(&[("gpu", &g.id), ("profile", profile)], f64::from(*n));
            }
        }
    }

    fn write_instances(&self, e: &mut Exposition) {
        let mut f = e.family(
            "vgpu_instance",
            Kind::Info,
            "An instance (created, defined or foreign); labels say where it is and who it is for.",
        );
        for i in &self.instances {
            f.sample(
                &[
                    ("uuid", &i.uuid),
                    ("gpu", &i.gpu),
                    ("type", &i.type_id),
                    ("profile", &i.profile),
                    ("pool", &i.pool),
                    ("label", &i.label),
                    ("owner", i.owner),
                    ("domain", &i.domain),
                ],
                1.0,
            );
        }
        let mut f = e.family(
            "vgpu_instance_state",
            Kind::Gauge,
            "1 for the state the instance is in, 0 for the others (running, stopped, waiting-for-parent).",
        );
        for i in &self.instances {
            for st in InstanceState::ALL {
                f.sample(
                    &[("uuid", &i.uuid), ("state", st.as_str())],
                    if st == i.state { 1.0 } else { 0.0 },
                );
            }
        }
        let mut f = e.family(
            "vgpu_instance_scheduling_share",
            Kind::Gauge,
            "The fraction of its GPU's time the instance asks for (requested: its weight over the sum) and gets when every instance is busy (effective), where the backend reports it.",
        );
        for g in &self.gpus {
            for s in &g.shares {
                for (kind, v) in [("requested", s.requested), ("effective", s.effective)] {
                    if let Some(v) = v {
                        f.sample(&[("uuid", &s.device), ("kind", kind)], v);
                    }
                }
            }
        }
    }

    fn write_pools(&self, e: &mut Exposition) {
        let mut f = e.family(
            "vgpu_pool_slots",
            Kind::Gauge,
            "Slots of an applied pool by the state of their instance (missing: no instance).",
        );
        for p in &self.pools {
            for st in SLOT_STATES {
                let n = p.slots.get(st).copied().unwrap_or(0);
                f.sample(&[("pool", &p.name), ("state", st)], f64::from(n));
            }
        }
        let mut f = e.family(
            "vgpu_pool_slots_wanted",
            Kind::Gauge,
            "Slots the applied pool file asks for.",
        );
        for p in &self.pools {
            f.sample(&[("pool", &p.name)], f64::from(p.wanted));
        }
    }
}
