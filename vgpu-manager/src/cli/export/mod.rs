//! `vgpuctl export kubevirt|nova [POOL…]`: the configuration a fleet engine needs to hand this host's
//! pool slots to its guests — the KubeVirt CR fragment of its device plugins ([`kubevirt`]) or the
//! nova.conf fragment of Nova's libvirt driver ([`nova`]).
//!
//! The slots come from vgpud (Manager1 `PoolStatus`: the pools it has applied, every slot with an
//! instance, its mdev parent, type and type name, or its VF and PCI id), as `vgpuctl pool status` and
//! `vgpuctl xml POOL` read them. With `--pool-file FILE` they come from planning the pool file on the
//! selected host instead (`--sim`, `--sysfs-root` or the live kernel), as `vgpuctl pool plan` does:
//! what the pool will provide once applied, with no daemon needed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use mdev_types::ids::PciAddress;
use mdev_types::model::Inventory;
use vgpu_client::blocking;
use vgpu_client::{BusAddress, PoolStatus};
use vgpu_host::discover::discover as discover_host;

use super::daemon_cmds::BusArgs;
use super::profiles::catalog;
use super::{CliError, HostArgs};
use crate::pool::{PoolStep, load_file, plan_pool};
use crate::profile::ProfileTarget;

mod kubevirt;
mod nova;

/// `vgpuctl export …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum ExportCommand {
    /// The KubeVirt CR fragment (`spec.configuration`) that lets KubeVirt's device plugins offer the
    /// pools' mdevs and VFs: a table of resources and the variables virt-launcher reads, `--yaml` for
    /// the fragment, `--json` for both (docs/kubernetes.md).
    Kubevirt(kubevirt::KubevirtArgs),
    /// The nova.conf fragment (`[devices]`, `[mdev_<type>]`, `[pci]`) that lets Nova's libvirt driver
    /// use the pools' mdevs and VFs (docs/openstack.md).
    Nova(nova::NovaArgs),
}

/// Where the slots come from: applied pools (vgpud) or pool files planned on the selected host.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct SlotSource {
    /// Applied pools to export (`vgpuctl pool status`); every applied pool when none is given.
    #[arg(value_name = "POOL")]
    pools: Vec<String>,
    /// Plan this pool file on the selected host (--sim, --sysfs-root or the live kernel) instead of
    /// asking vgpud: what it provides once applied. Repeat for more pools.
    #[arg(long = "pool-file", value_name = "FILE", conflicts_with = "pools")]
    files: Vec<PathBuf>,
    /// With --pool-file: also load the profiles in this directory (overriding shipped ones).
    #[arg(long, value_name = "DIR", requires = "files")]
    profiles_dir: Option<PathBuf>,
}

/// A PCI `vendor:device` id pair (`10de:26b9`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct PciIds {
    /// The vendor id.
    pub(super) vendor: u16,
    /// The device id.
    pub(super) device: u16,
}

impl PciIds {
    /// Reads `vvvv:dddd` (hex), as vgpud's `pci_id` gives it.
    fn parse(s: &str) -> Option<PciIds> {
        let (v, d) = s.split_once(':')?;
        let hex = |t: &str| (t.len() == 4).then(|| u16::from_str_radix(t, 16).ok())?;
        Some(PciIds {
            vendor: hex(v)?,
            device: hex(d)?,
        })
    }
}

/// What a slot's instance is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Holds {
    /// An mdev of `type_id` on `parent`.
    Mdev {
        /// The mdev parent's name (a PCI address, or `mbochs` and the like).
        parent: String,
        /// The mdev type id (`nvidia-231`).
        type_id: String,
        /// The type's `name` attribute (`GRID T4-2Q`), when it has one.
        type_name: Option<String>,
    },
    /// An SR-IOV VF given to the guest as a PCI device.
    Vf {
        /// The VF's address; `None` when the plan enables the VFs first (not known before).
        vf: Option<PciAddress>,
        /// The PF the VF belongs to.
        pf: Option<PciAddress>,
        /// The VF's PCI ids.
        ids: PciIds,
        /// The NVIDIA vGPU type the VF holds (vendor-VFIO: the VF stays on the `nvidia` driver);
        /// `None` for a VF on vfio-pci.
        vgpu_type: Option<String>,
    },
}

/// One pool slot with an instance, as the exports need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Slot {
    /// The pool's name.
    pub(super) pool: String,
    /// The slot's profile.
    pub(super) profile: String,
    /// The GPU its instance is on.
    pub(super) gpu: String,
    /// The GPU's vendor (`nvidia`, `intel`, `amd`, …).
    pub(super) vendor: String,
    /// The GPU's model name.
    pub(super) model: String,
    /// What the instance is.
    pub(super) holds: Holds,
}

/// The slots to export, and what could not be exported (each a sentence for the output's comments).
#[derive(Debug, Default)]
pub(super) struct Slots {
    /// The slots, in pool and slot order.
    pub(super) slots: Vec<Slot>,
    /// The pools they come from.
    pub(super) pools: Vec<String>,
    /// Slots left out and why.
    pub(super) notes: Vec<String>,
    /// True when the slots come from planning pool files (the VFs to enable are not known yet).
    pub(super) planned: bool,
}

pub(super) fn run(
    cmd: &ExportCommand,
    host: &HostArgs,
    bus: &BusArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match cmd {
        ExportCommand::Kubevirt(a) => {
            let slots = gather(&a.source, host, bus)?;
            kubevirt::run(a, &slots, out)
        }
        ExportCommand::Nova(a) => {
            let slots = gather(&a.source, host, bus)?;
            nova::run(a, &slots, host, out)
        }
    }
}

/// The slots of `source`: from vgpud, or planned from pool files on `host`.
fn gather(source: &SlotSource, host: &HostArgs, bus: &BusArgs) -> Result<Slots, CliError> {
    if source.files.is_empty() {
        let bus: BusAddress = bus.bus.parse()?;
        let daemon = blocking::Client::connect(&bus)?;
        let status = daemon.pool_status()?;
        let gpus: BTreeMap<String, (String, String)> = daemon
            .list_gpus()?
            .into_iter()
            .map(|g| (g.id, (g.vendor, g.model)))
            .collect();
        from_status(&status, &source.pools, &gpus)
    } else {
        let cat = catalog(source.profiles_dir.as_deref())?;
        let h = host.open()?;
        let inv = discover_host(h.as_ref())?;
        let mut all = Slots {
            planned: true,
            ..Slots::default()
        };
        for file in &source.files {
            let pool = load_file(file, &cat).map_err(|e| CliError::BadArgument(e.to_string()))?;
            let plan = plan_pool(&pool, &cat, &inv, &[])
                .map_err(|e| CliError::BadArgument(e.to_string()))?;
            for s in &plan.shortfall {
                all.notes.push(format!(
                    "pool {}: {} of {} {} slots do not fit on this host ({})",
                    pool.name, s.missing, s.wanted, s.profile, s.reason
                ));
            }
            let mut planned = from_plan(&pool.name, &plan, &inv);
            all.slots.append(&mut planned.slots);
            all.notes.append(&mut planned.notes);
            all.pools.push(pool.name);
        }
        Ok(all)
    }
}

/// The slots of the applied pools named in `wanted` (all when empty); `gpus` gives each GPU's vendor
/// and model.
pub(super) fn from_status(
    status: &[PoolStatus],
    wanted: &[String],
    gpus: &BTreeMap<String, (String, String)>,
) -> Result<Slots, CliError> {
    let applied: Vec<&str> = status.iter().map(|p| p.pool.as_str()).collect();
    if let Some(unknown) = wanted.iter().find(|w| !applied.contains(&w.as_str())) {
        return Err(CliError::BadArgument(format!(
            "pool '{unknown}' is not applied (applied pools: {}): name one from `vgpuctl pool status`, or plan a file with --pool-file",
            if applied.is_empty() {
                "none".to_string()
            } else {
                applied.join(", ")
            }
        )));
    }
    if status.is_empty() {
        return Err(CliError::BadArgument(
            "vgpud has applied no pool: apply one with `vgpuctl pool apply FILE`, or plan a file with --pool-file".into(),
        ));
    }
    let mut out = Slots::default();
    for p in status
        .iter()
        .filter(|p| wanted.is_empty() || wanted.contains(&p.pool))
    {
        out.pools.push(p.pool.clone());
        let mut missing = 0;
        for s in &p.slots {
            let Some(gpu) = &s.gpu else {
                missing += 1;
                continue;
            };
            let label = format!("{}/{}/{}", p.pool, s.profile, s.index);
            let holds = match (&s.vf, &s.parent, &s.type_id) {
                (Some(vf), _, _) => {
                    let Some(ids) = s.pci_id.as_deref().and_then(PciIds::parse) else {
                        out.notes.push(format!(
                            "slot {label}: vgpud does not report its VF's PCI id (a vgpud older than this vgpuctl?): left out"
                        ));
                        continue;
                    };
                    Holds::Vf {
                        vf: vf.parse().ok(),
                        pf: gpu.parse().ok(),
                        ids,
                        vgpu_type: s.type_name.clone(),
                    }
                }
                (None, Some(parent), Some(type_id)) => Holds::Mdev {
                    parent: parent.clone(),
                    type_id: type_id.clone(),
                    type_name: s.type_name.clone(),
                },
                _ => {
                    out.notes.push(format!(
                        "slot {label}: vgpud does not report its mdev parent (a vgpud older than this vgpuctl?): left out"
                    ));
                    continue;
                }
            };
            let (vendor, model) = gpus.get(gpu).cloned().unwrap_or_default();
            out.slots.push(Slot {
                pool: p.pool.clone(),
                profile: s.profile.clone(),
                gpu: gpu.clone(),
                vendor,
                model,
                holds,
            });
        }
        if missing > 0 {
            out.notes.push(format!(
                "pool {}: {missing} slots have no instance and are left out (`vgpuctl pool apply` its file again)",
                p.pool
            ));
        }
    }
    Ok(out)
}

/// The slots pool `name`'s plan on `inv` leaves: those it creates and those it keeps.
fn from_plan(name: &str, plan: &crate::pool::PoolPlan, inv: &Inventory) -> Slots {
    let mut out = Slots::default();
    let gpu_of = |id: &str| {
        inv.gpus
            .iter()
            .find(|g| g.id == id)
            .map(|g| (g.vendor.as_str().to_string(), g.model.clone()))
            .unwrap_or_default()
    };
    let pci_ids = |addr: PciAddress, of_vf_of_pf: bool| {
        let d = inv.pci_devices.iter().find(|d| d.address == addr)?;
        let device = if of_vf_of_pf {
            d.sriov.as_ref()?.vf_device?
        } else {
            d.device
        };
        Some(PciIds {
            vendor: d.vendor.0,
            device: device.0,
        })
    };
    let mut push = |profile: &str, gpu: &str, holds: Option<Holds>, what: String| {
        let (vendor, model) = gpu_of(gpu);
        match holds {
            Some(holds) => out.slots.push(Slot {
                pool: name.to_string(),
                profile: profile.to_string(),
                gpu: gpu.to_string(),
                vendor,
                model,
                holds,
            }),
            None => out.notes.push(what),
        }
    };
    for step in &plan.steps {
        let PoolStep::Create {
            slot, gpu, target, ..
        } = step
        else {
            continue;
        };
        let label = format!("slot {}", slot.name());
        let holds = match target {
            ProfileTarget::Mdev {
                parent,
                type_id,
                type_name,
            } => Some(Holds::Mdev {
                parent: parent.clone(),
                type_id: type_id.to_string(),
                type_name: type_name.clone(),
            }),
            ProfileTarget::SriovVf { pf, vf, .. } => {
                let ids = match vf {
                    Some(v) => pci_ids(*v, false),
                    None => pci_ids(*pf, true),
                };
                ids.map(|ids| Holds::Vf {
                    vf: *vf,
                    pf: Some(*pf),
                    ids,
                    vgpu_type: None,
                })
            }
            ProfileTarget::NvidiaVendorVfio {
                pf, vf, type_name, ..
            } => pci_ids(*vf, false).map(|ids| Holds::Vf {
                vf: Some(*vf),
                pf: Some(*pf),
                ids,
                vgpu_type: Some(type_name.clone()),
            }),
            ProfileTarget::Passthrough { pci, .. } => {
                push(
                    &slot.profile,
                    gpu,
                    None,
                    format!("{label}: a whole GPU ({pci}) is no vGPU slot: left out"),
                );
                continue;
            }
        };
        push(
            &slot.profile,
            gpu,
            holds,
            format!("{label}: the PCI ids of its VF cannot be read: left out"),
        );
    }
    for k in &plan.keep {
        let mdev = inv
            .mdev_instances
            .iter()
            .find(|m| m.uuid == k.slot.uuid)
            .map(|m| {
                let type_name = inv
                    .mdev_parents
                    .iter()
                    .find(|p| p.name == m.parent)
                    .and_then(|p| p.types.iter().find(|t| t.id == m.type_id))
                    .and_then(|t| t.name.clone());
                Holds::Mdev {
                    parent: m.parent.clone(),
                    type_id: m.type_id.to_string(),
                    type_name,
                }
            });
        push(
            &k.slot.profile,
            &k.gpu,
            mdev,
            format!(
                "slot {}: kept as {}, which this host does not show as an mdev: left out",
                k.slot.name(),
                k.holds
            ),
        );
    }
    out
}

/// Kubernetes' and Nova's names accept fewer characters than a model or type name has: every run of
/// characters `keep` refuses becomes one `_`, with none at either end.
pub(super) fn squash(s: &str, keep: impl Fn(char) -> bool) -> String {
    let mut o = String::new();
    for c in s.trim().chars() {
        if keep(c) {
            o.push(c);
        } else if !o.ends_with('_') && !o.is_empty() {
            o.push('_');
        }
    }
    o.trim_end_matches('_').to_string()
}

#[cfg(test)]
mod tests;
