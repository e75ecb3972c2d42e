//! The ResourceSlices (`resource.k8s.io/v1`) that describe this node's vGPUs to the scheduler, built
//! from vgpud's offers ([`vgpu_client::GpuOffers`]): one device per profile slot per GPU, and per GPU
//! a counter set the devices draw from, so the scheduler itself keeps every allocation within what
//! the GPU holds — mixed profile sizes on one card included.
//!
//! The model (KEP-4815, partitionable devices):
//! - Each GPU has a counter set named after it (`gpu-0000-3b-00-0`) with the counter `share`: the
//!   GPU's capacity in units of `1/L`, where `L` is the least common multiple of the offered types'
//!   capacities alone (`max_instances`). A device of a type that fits `m` times alone draws `L/m`.
//!   Where every offered type's framebuffer is known the set also has `framebuffer` (MiB), each
//!   device drawing its type's framebuffer.
//! - The counters published are what remains for this driver: for each offered type, what the kernel
//!   would still create (`available`) times its draw, the smallest over the types (a conservative
//!   estimate when types share the GPU unevenly), plus what the vGPUs this driver made draw (the
//!   scheduler counts those against its own allocations).
//! - A homogeneous GPU (NVIDIA time-sliced vGPU: one type at a time) that holds vGPUs publishes only
//!   the devices of the type it holds. Counters cannot say "one type at a time" (a linear limit cannot
//!   forbid 1 + 1 of two types while allowing `m` of one), so two claims for different types on an
//!   empty GPU may both be allocated before the next publication; vgpud refuses the second at prepare
//!   and the kubelet retries the pod elsewhere.
//! - Counter sets and devices go in separate slices of one pool (named after the node), as
//!   Kubernetes ≥ 1.35 requires; at most [`MAX_DEVICES_PER_SLICE`] devices and
//!   [`MAX_COUNTER_SETS_PER_SLICE`] counter sets per slice. Every slice carries the pool's generation and
//!   slice count.
//! - A GPU whose health is not `ok` keeps its devices, with a `NoSchedule` taint
//!   ([`FAULTED_TAINT`]) so no new claim lands on it.
//! - A GPU whose options are VF-backed (an SR-IOV VF, an NVIDIA vGPU type on a VF) has the counter
//!   `vfs` too: the VFs still free for this driver (vgpud's `vfs.free` plus the VF slots this driver
//!   holds there), every VF-backed device drawing one, so the scheduler never allocates more VFs than
//!   the PF has. While SR-IOV is off, each profile's devices are as many as the split enabling would
//!   make for it, and `share` keeps a mix within one split; the first slot made fixes the split,
//!   after which only the profiles one of its VFs serves are published.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use vgpu_client::{GpuOffers, InstanceInfo, PoolStatus, ProfileOffer};

use crate::device_name::{DeviceName, canonical_pci, gpu_prefix, virtual_parent};

/// The most devices in one slice whose devices draw from counters (`ResourceSliceSpec.devices`: at
/// most 128 entries, "If any device uses taints or consumes counters the limit is 64").
pub const MAX_DEVICES_PER_SLICE: usize = 64;
/// The most counter sets in one slice (`ResourceSliceSpec.sharedCounters`: at most 8 sets, each of
/// at most 32 counters; a GPU's set has two).
pub const MAX_COUNTER_SETS_PER_SLICE: usize = 8;
/// The taint of the devices of a GPU vgpud reports faulted.
pub const FAULTED_TAINT: &str = "vgpu-manager.io/gpu-faulted";
/// The counter of a VF-backed GPU's free VFs.
pub const VFS: &str = "vfs";
/// The backend word of an mdev option; every other backend is VF-backed.
const MDEV: &str = "mdev";
/// The longest string attribute (`DeviceAttribute.string`: "Must not be longer than 64 characters").
const MAX_ATTRIBUTE_STRING: usize = 64;
/// The largest `L` used for the `share` counter; a GPU whose types' capacities multiply past it is
/// published without counters for `share` (its devices then draw only framebuffer, if known).
const MAX_SHARE_UNITS: u64 = 1 << 40;

/// A `resource.k8s.io/v1` ResourceSlice, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceSlice {
    /// `resource.k8s.io/v1`.
    pub api_version: String,
    /// `ResourceSlice`.
    pub kind: String,
    /// Its name (and, once stored, resource version).
    pub metadata: ObjectMeta,
    /// What it publishes.
    pub spec: SliceSpec,
}

/// The part of `metadata` the plugin sets and reads back.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// The slice's name.
    pub name: String,
    /// The API server's version of the object, sent back on update.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

/// `spec` of a ResourceSlice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    /// The DRA driver name.
    pub driver: String,
    /// The pool it belongs to.
    pub pool: Pool,
    /// The node that has the devices.
    pub node_name: String,
    /// Its devices (empty in a counters slice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<Device>,
    /// Its counter sets (empty in a devices slice).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_counters: Vec<CounterSet>,
}

/// `spec.pool`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pool {
    /// The pool's name: the node's.
    pub name: String,
    /// Bumped whenever anything in the pool changes; consumers use the highest.
    pub generation: i64,
    /// How many slices the pool has at this generation.
    pub resource_slice_count: i64,
}

/// One device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Its name, unique in the pool ([`DeviceName`]).
    pub name: String,
    /// Its attributes, by name.
    pub attributes: BTreeMap<String, Attribute>,
    /// Its capacities, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub capacity: BTreeMap<String, Quantity>,
    /// What it draws from its GPU's counter set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consumes_counters: Vec<CounterConsumption>,
    /// Its taints (a faulted GPU's devices).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<Taint>,
}

/// A `DeviceAttribute`: exactly one value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Attribute {
    /// A string of at most 64 characters.
    String(String),
    /// A number.
    Int(i64),
    /// A truth value.
    Bool(bool),
}

/// A quantity (`DeviceCapacity` or `Counter`): `{"value": "2048Mi"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quantity {
    /// The value in Kubernetes' quantity notation.
    pub value: String,
}

impl Quantity {
    fn count(n: u64) -> Self {
        Quantity {
            value: n.to_string(),
        }
    }

    fn mib(n: u64) -> Self {
        Quantity {
            value: format!("{n}Mi"),
        }
    }
}

/// A `CounterSet`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterSet {
    /// Its name, unique in the pool.
    pub name: String,
    /// Its counters.
    pub counters: BTreeMap<String, Quantity>,
}

/// A `DeviceCounterConsumption`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CounterConsumption {
    /// The counter set drawn from.
    pub counter_set: String,
    /// How much of each counter.
    pub counters: BTreeMap<String, Quantity>,
}

/// A `DeviceTaint`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    /// Its key.
    pub key: String,
    /// Its value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`.
    pub effect: String,
}

/// What the slices are built from.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The DRA driver name.
    pub driver: &'a str,
    /// The node's name, which is also the pool's.
    pub node: &'a str,
    /// vgpud's offers.
    pub offers: &'a [GpuOffers],
    /// Every instance vgpud knows.
    pub instances: &'a [InstanceInfo],
    /// The UUIDs of the vGPUs this driver made (its checkpoint's).
    pub ours: &'a HashSet<String>,
    /// Every pool vgpud has applied.
    pub pools: &'a [PoolStatus],
    /// The pools of the VF-backed devices this driver made (its checkpoint's).
    pub our_pools: &'a HashSet<String>,
}

/// The counter set of one GPU and its devices, before they are cut into slices.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuPart {
    counters: Option<CounterSet>,
    devices: Vec<Device>,
}

/// The pool's slices at `generation`: counter slices first, then device slices, each within the
/// per-slice limits; none when no GPU offers anything.
pub fn build(inputs: Inputs<'_>, generation: i64) -> Vec<ResourceSlice> {
    let parts: Vec<GpuPart> = inputs
        .offers
        .iter()
        .filter_map(|g| gpu_part(g, inputs))
        .collect();
    let sets: Vec<CounterSet> = parts.iter().filter_map(|p| p.counters.clone()).collect();
    let counter_chunks: Vec<Vec<CounterSet>> = sets
        .chunks(MAX_COUNTER_SETS_PER_SLICE)
        .map(<[CounterSet]>::to_vec)
        .collect();
    let devices: Vec<Device> = parts.into_iter().flat_map(|p| p.devices).collect();
    let device_chunks: Vec<Vec<Device>> = devices
        .chunks(MAX_DEVICES_PER_SLICE)
        .map(<[Device]>::to_vec)
        .collect();
    let count = counter_chunks.len() + device_chunks.len();
    let Ok(count_i64) = i64::try_from(count) else {
        return Vec::new();
    };
    let slice = |kind: &str, i: usize, devices, shared_counters| ResourceSlice {
        api_version: "resource.k8s.io/v1".to_string(),
        kind: "ResourceSlice".to_string(),
        metadata: ObjectMeta {
            name: slice_name(inputs.node, inputs.driver, kind, i),
            resource_version: None,
        },
        spec: SliceSpec {
            driver: inputs.driver.to_string(),
            pool: Pool {
                name: inputs.node.to_string(),
                generation,
                resource_slice_count: count_i64,
            },
            node_name: inputs.node.to_string(),
            devices,
            shared_counters,
        },
    };
    let mut out = Vec::with_capacity(count);
    for (i, sets) in counter_chunks.into_iter().enumerate() {
        out.push(slice("counters", i, Vec::new(), sets));
    }
    for (i, devs) in device_chunks.into_iter().enumerate() {
        out.push(slice("devices", i, devs, Vec::new()));
    }
    out
}

/// `<node>-<first label of the driver>-<kind>-<i>`, the node part shortened to keep the name within
/// a DNS subdomain's 253 characters.
pub fn slice_name(node: &str, driver: &str, kind: &str, i: usize) -> String {
    let label = driver.split('.').next().unwrap_or(driver);
    let tail = format!("-{label}-{kind}-{i}");
    let room = 253usize.saturating_sub(tail.len());
    let mut head: String = node.chars().take(room).collect();
    while head.ends_with(['-', '.']) {
        head.pop();
    }
    format!("{head}{tail}")
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The least common multiple of the options' capacities, if it stays within [`MAX_SHARE_UNITS`].
fn share_units(options: &[&ProfileOffer]) -> Option<u64> {
    options.iter().try_fold(1u64, |l, o| {
        let m = u64::from(o.max_instances);
        let next = l.checked_mul(m / gcd(l, m))?;
        (next <= MAX_SHARE_UNITS).then_some(next)
    })
}

/// The options a GPU publishes: all of them, or on a homogeneous GPU that holds vGPUs, only those
/// of the type it holds.
fn published_options<'a>(g: &'a GpuOffers, instances: &[&InstanceInfo]) -> Vec<&'a ProfileOffer> {
    let held: HashSet<&str> = instances.iter().map(|i| i.type_id.as_str()).collect();
    g.options
        .iter()
        .filter(|o| o.max_instances > 0)
        .filter(|o| !g.homogeneous || held.is_empty() || held.contains(o.type_id.as_str()))
        .collect()
}

fn gpu_part(g: &GpuOffers, inputs: Inputs<'_>) -> Option<GpuPart> {
    // A PCI GPU by its canonical address, a virtual parent (the kernel's samples) by its name.
    let pci = match g.pci.as_deref() {
        Some(p) => canonical_pci(p)?,
        None => virtual_parent(&g.gpu).then(|| g.gpu.clone())?,
    };
    let on_gpu: Vec<&InstanceInfo> = inputs
        .instances
        .iter()
        .filter(|i| i.gpu == pci || canonical_pci(&i.gpu).as_deref() == Some(pci.as_str()))
        .collect();
    let options = published_options(g, &on_gpu);
    if options.is_empty() {
        return None;
    }
    // The counter set is named as the GPU's part of its device names (`gpu-0000-3b-00-0`).
    let set = gpu_prefix(&pci);
    let units = share_units(&options);
    let fb_known = options.iter().all(|o| o.framebuffer_mib.is_some());
    let draw_of = |type_id: &str| options.iter().find(|o| o.type_id == type_id);
    // The VF slots this driver holds on the GPU, by profile (they are no instances).
    let our_vf_slots: Vec<&str> = inputs
        .pools
        .iter()
        .filter(|p| inputs.our_pools.contains(&p.pool))
        .flat_map(|p| &p.slots)
        .filter(|r| r.state == "running" && r.vf.is_some())
        .filter(|r| {
            r.gpu
                .as_deref()
                .is_some_and(|x| x == pci || canonical_pci(x).as_deref() == Some(pci.as_str()))
        })
        .map(|r| r.profile.as_str())
        .collect();
    let vf_draw_of = |profile: &str| {
        options
            .iter()
            .find(|o| o.profile == profile && o.backend != MDEV)
    };
    // What remains of a counter for this driver: the kernel's available instances times their draw
    // (the least over the types), plus what this driver's own vGPUs draw (the scheduler counts those
    // against their allocations); never more than `total`.
    let remaining = |draw: &dyn Fn(&ProfileOffer) -> u64, total: u64| {
        let free = options
            .iter()
            .map(|o| u64::from(o.available) * draw(o))
            .min()
            .unwrap_or(0);
        let ours: u64 = on_gpu
            .iter()
            .filter(|i| inputs.ours.contains(&i.uuid))
            .filter_map(|i| draw_of(&i.type_id))
            .map(|o| draw(o))
            .sum();
        let ours_vf: u64 = our_vf_slots
            .iter()
            .filter_map(|p| vf_draw_of(p))
            .map(|o| draw(o))
            .sum();
        (free + ours + ours_vf).min(total)
    };
    let mut counters = BTreeMap::new();
    if let Some(l) = units {
        let share = |o: &ProfileOffer| l / u64::from(o.max_instances);
        counters.insert("share".to_string(), Quantity::count(remaining(&share, l)));
    }
    if fb_known {
        let fb = |o: &ProfileOffer| o.framebuffer_mib.unwrap_or(0);
        let total = options
            .iter()
            .map(|o| u64::from(o.max_instances) * fb(o))
            .max()
            .unwrap_or(0);
        counters.insert(
            "framebuffer".to_string(),
            Quantity::mib(remaining(&fb, total)),
        );
    }
    let vf_backed = g.vfs.filter(|_| options.iter().any(|o| o.backend != MDEV));
    if let Some(v) = vf_backed {
        let total = if v.enabled > 0 { v.enabled } else { v.free };
        let ours = u32::try_from(our_vf_slots.len()).unwrap_or(u32::MAX);
        let left = v.free.saturating_add(ours).min(total);
        counters.insert(VFS.to_string(), Quantity::count(u64::from(left)));
    }
    let taints = if g.health == "ok" {
        Vec::new()
    } else {
        vec![Taint {
            key: FAULTED_TAINT.to_string(),
            value: None,
            effect: "NoSchedule".to_string(),
        }]
    };
    let mut devices = Vec::new();
    for o in &options {
        let mut draw = BTreeMap::new();
        if let Some(l) = units {
            draw.insert(
                "share".to_string(),
                Quantity::count(l / u64::from(o.max_instances)),
            );
        }
        if fb_known && let Some(fb) = o.framebuffer_mib {
            draw.insert("framebuffer".to_string(), Quantity::mib(fb));
        }
        if vf_backed.is_some() && o.backend != MDEV {
            draw.insert(VFS.to_string(), Quantity::count(1));
        }
        let consumes = if draw.is_empty() {
            Vec::new()
        } else {
            vec![CounterConsumption {
                counter_set: set.clone(),
                counters: draw,
            }]
        };
        for index in 0..o.max_instances {
            let Ok(name) = DeviceName::new(&pci, &o.profile, index) else {
                tracing::warn!(gpu = %pci, profile = %o.profile, "profile name cannot be part of a device name; not published");
                break;
            };
            devices.push(Device {
                name: name.to_string(),
                attributes: attributes(g, o, &pci),
                capacity: o
                    .framebuffer_mib
                    .map(|fb| BTreeMap::from([("framebuffer".to_string(), Quantity::mib(fb))]))
                    .unwrap_or_default(),
                consumes_counters: consumes.clone(),
                taints: taints.clone(),
            });
        }
    }
    let counters = (!counters.is_empty()).then_some(CounterSet {
        name: set,
        counters,
    });
    Some(GpuPart { counters, devices })
}

/// A string attribute, cut to 64 characters.
fn text(s: &str) -> Attribute {
    Attribute::String(s.chars().take(MAX_ATTRIBUTE_STRING).collect())
}

fn attributes(g: &GpuOffers, o: &ProfileOffer, pci: &str) -> BTreeMap<String, Attribute> {
    let mut a = BTreeMap::new();
    a.insert("profile".to_string(), text(&o.profile));
    a.insert("type".to_string(), text(&o.type_id));
    if let Some(n) = &o.type_name {
        a.insert("typeName".to_string(), text(n));
    }
    a.insert("backend".to_string(), text(&o.backend));
    a.insert("vendor".to_string(), text(&g.vendor));
    a.insert("model".to_string(), text(&g.model));
    a.insert("gpu".to_string(), text(pci));
    a.insert("homogeneous".to_string(), Attribute::Bool(g.homogeneous));
    if let Some(n) = g.numa_node {
        a.insert("numaNode".to_string(), Attribute::Int(i64::from(n)));
    }
    if let Some(fb) = o.framebuffer_mib
        && let Ok(fb) = i64::try_from(fb)
    {
        a.insert("framebufferMiB".to_string(), Attribute::Int(fb));
    }
    a
}

/// The slices' content without what changes at every publication (generation, slice count,
/// resource version): equal when nothing needs publishing.
pub fn content(slices: &[ResourceSlice]) -> Vec<(String, Vec<Device>, Vec<CounterSet>)> {
    let mut v: Vec<_> = slices
        .iter()
        .map(|s| {
            (
                s.metadata.name.clone(),
                s.spec.devices.clone(),
                s.spec.shared_counters.clone(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[cfg(test)]
mod tests;
