//! `vgpuctl export nova`: the nova.conf fragment for the pools' slots.
//!
//! Option names and meanings are Nova's (nova/conf/devices.py, nova/conf/pci.py; the docs'
//! "Attaching virtual GPU devices to guests" and "Attaching physical PCI devices to guests"):
//! - `[devices] enabled_mdev_types`: the mdev type ids Nova's libvirt driver offers; per type a group
//!   `[mdev_<type>]` (registered by `nova.conf.devices.register_dynamic_opts`) with
//!   `device_addresses` (the mdev parents given that type: one type per parent, or nova-compute
//!   refuses to start), `mdev_class` (`VGPU`, or `CUSTOM_…` to tell types apart in flavors; Nova
//!   24.0.0, 2021.2) and `max_instances` (at most that many mdevs of the type; Nova 29.0.0, 2024.1).
//!   Nova uses mdevs of an enabled type that exist and are unassigned before it creates new ones
//!   (through libvirt's node-device API, which reaches vgpud through `vgpuctl mdevctl`).
//! - `[pci] device_spec` (JSON, one per line): the PCI functions Nova may assign, with the tags
//!   `managed` (`no`: libvirt does not detach or reattach the device) and `live_migratable` (Nova
//!   31.0.0, 2025.1, both); `[pci] alias` (JSON): the name flavors request with
//!   `pci_passthrough:alias`, which must also be set for nova-api.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use mdev_types::ids::PciAddress;
use mdev_types::vfio_api::VfioTarget;
use serde_json::json;

use super::{Holds, PciIds, SlotSource, Slots, squash};
use crate::cli::{CliError, HostArgs};

/// `vgpuctl export nova` options.
#[derive(Debug, clap::Args)]
pub(in crate::cli) struct NovaArgs {
    #[command(flatten)]
    pub(super) source: SlotSource,
    /// The `live_migratable` tag of the VF slots' `device_spec`: `auto` asks each VF through VFIO
    /// whether it can migrate (live kernel only; a VF a VM holds cannot be asked and gets no tag),
    /// `yes` or `no` says so for all of them.
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = LiveMigratable::Auto)]
    live_migratable: LiveMigratable,
}

/// `--live-migratable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LiveMigratable {
    /// Ask each VF (live kernel only).
    Auto,
    /// Every VF can migrate.
    Yes,
    /// No VF can migrate.
    No,
}

/// One `[mdev_<type>]` group.
#[derive(Debug, Default)]
struct MdevGroup {
    type_name: Option<String>,
    parents: BTreeSet<String>,
    slots: u32,
    profiles: BTreeSet<String>,
    pools: BTreeSet<String>,
}

/// One VF slot's `device_spec`.
#[derive(Debug)]
struct VfSpec {
    ids: PciIds,
    /// The VF, or (planned, VFs not enabled yet) its PF, which matches every VF of it.
    address: String,
    live_migratable: Option<bool>,
    comment: String,
    alias: String,
}

pub(super) fn run(
    a: &NovaArgs,
    slots: &Slots,
    host: &HostArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mut notes = slots.notes.clone();
    let mut groups: BTreeMap<String, MdevGroup> = BTreeMap::new();
    let mut specs: Vec<VfSpec> = Vec::new();
    let aliases = alias_names(slots);
    let offline = host.sim.is_some() || host.sysfs_root.is_some();
    let live_host = (a.live_migratable == LiveMigratable::Auto && !offline)
        .then(|| host.open())
        .transpose()?;
    let mut unprobed = 0;
    for s in &slots.slots {
        match &s.holds {
            Holds::Mdev {
                parent,
                type_id,
                type_name,
            } => {
                if parent.parse::<PciAddress>().is_err() {
                    notes.push(format!(
                        "{}/{}: its mdev parent {parent} is no PCI device, which [mdev_<type>] device_addresses cannot name here: left out",
                        s.pool, s.profile
                    ));
                    continue;
                }
                let g = groups.entry(type_id.clone()).or_default();
                g.type_name = type_name.clone();
                g.parents.insert(parent.clone());
                g.slots += 1;
                g.profiles.insert(s.profile.clone());
                g.pools.insert(s.pool.clone());
            }
            Holds::Vf {
                vf,
                pf,
                ids,
                vgpu_type,
            } => {
                let address = match (vf, pf) {
                    (Some(v), _) => v.to_string(),
                    (None, Some(p)) => p.to_string(),
                    (None, None) => continue,
                };
                let live_migratable = match a.live_migratable {
                    LiveMigratable::Yes => Some(true),
                    LiveMigratable::No => Some(false),
                    LiveMigratable::Auto => {
                        let probed = match (&live_host, vf) {
                            (Some(h), Some(v)) => {
                                vgpu_vfio::migration_support(h.as_ref(), &VfioTarget::Pci(*v), None)
                                    .ok()
                                    .map(|m| m.migratable)
                            }
                            _ => None,
                        };
                        if probed.is_none() {
                            unprobed += 1;
                        }
                        probed
                    }
                };
                let what = match vgpu_type {
                    Some(t) => format!("{t} on VF {address}"),
                    None if vf.is_none() => {
                        format!("the VFs of PF {address} (enabled when the pool applies)")
                    }
                    None => format!("VF {address}"),
                };
                specs.push(VfSpec {
                    ids: *ids,
                    address,
                    live_migratable,
                    comment: format!("{}/{}: {what}", s.pool, s.profile),
                    alias: aliases.get(ids).cloned().unwrap_or_default(),
                });
            }
        }
    }
    if unprobed > 0 {
        notes.push(format!(
            "{unprobed} VF device_spec without live_migratable (Nova then takes \"no\"): {} (give --live-migratable yes|no)",
            if offline {
                "a simulated or captured host cannot be asked through VFIO"
            } else {
                "the VF could not be opened through VFIO (held by a VM, or not on vfio-pci)"
            }
        ));
    }
    check_one_type_per_parent(&groups)?;
    if groups.is_empty() && specs.is_empty() {
        return Err(CliError::BadArgument(format!(
            "the pools {} have no slot with an instance to export{}",
            slots.pools.join(", "),
            if notes.is_empty() {
                String::new()
            } else {
                format!(": {}", notes.join("; "))
            }
        )));
    }
    write!(out, "{}", render(&groups, &specs, slots, &notes))?;
    Ok(())
}

/// Nova refuses a parent listed under two types (`InvalidLibvirtMdevConfig`, "duplicate types for PCI
/// ID", nova/virt/libvirt/driver.py `_get_supported_vgpu_types`).
fn check_one_type_per_parent(groups: &BTreeMap<String, MdevGroup>) -> Result<(), CliError> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    for (ty, g) in groups {
        for p in &g.parents {
            if let Some(other) = seen.insert(p, ty) {
                return Err(CliError::BadArgument(format!(
                    "mdev parent {p} holds slots of two types ({other} and {ty}), but Nova gives each parent one type ([mdev_<type>] device_addresses): export the pools separately, or give the parent's slots one profile"
                )));
            }
        }
    }
    Ok(())
}

/// The `mdev_class` of type `ty`: `CUSTOM_` and its name (or id) upper-cased, other characters `_`
/// (Nova's regex `^(VGPU|CUSTOM_[A-Z0-9_]+)$`, at most 255 characters).
fn mdev_class(ty: &str, g: &MdevGroup) -> String {
    let base = squash(&g.type_name.as_deref().unwrap_or(ty).to_uppercase(), |c| {
        c.is_ascii_uppercase() || c.is_ascii_digit()
    });
    let mut class = format!("CUSTOM_{base}");
    class.truncate(255);
    class
}

/// The alias name of each VF PCI id: its one vGPU type, or its model and `vf`, lower-case with `-`.
fn alias_names(slots: &Slots) -> BTreeMap<PciIds, String> {
    let mut types: BTreeMap<PciIds, (BTreeSet<Option<String>>, String)> = BTreeMap::new();
    for s in &slots.slots {
        if let Holds::Vf { ids, vgpu_type, .. } = &s.holds {
            let e = types
                .entry(*ids)
                .or_insert_with(|| (BTreeSet::new(), s.model.clone()));
            e.0.insert(vgpu_type.clone());
        }
    }
    types
        .into_iter()
        .map(|(ids, (t, model))| {
            let base = match t.into_iter().collect::<Vec<_>>().as_slice() {
                [Some(one)] => one.clone(),
                _ => format!("{model} vf"),
            };
            let name =
                squash(&base.to_lowercase(), |c| c.is_ascii_alphanumeric()).replace('_', "-");
            (ids, name)
        })
        .collect()
}

fn hex(v: u16) -> String {
    format!("{v:04x}")
}

/// A JSON object of string values, keys in the order given (the order Nova's docs write them).
fn json_object(fields: &[(&str, String)]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}: {}", json!(k), json!(v)))
        .collect();
    format!("{{{}}}", parts.join(", "))
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The fragment's text.
fn render(
    groups: &BTreeMap<String, MdevGroup>,
    specs: &[VfSpec],
    slots: &Slots,
    notes: &[String],
) -> String {
    let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let mut o = format!(
        "# nova.conf fragment for the vGPU pools {} on this host, from vgpuctl export nova.\n",
        slots.pools.join(", ")
    );
    o.push_str(
        "# For nova-compute here; [pci] alias also for nova-api. max_instances needs Nova 2024.1 (29.0.0),\n\
         # \"managed\" and \"live_migratable\" in device_spec Nova 2025.1 (31.0.0).\n",
    );
    if slots.planned {
        o.push_str(
            "# Planned from pool files: what the pools provide once applied on this host.\n",
        );
    }
    for n in notes {
        o.push_str(&format!("# note: {n}\n"));
    }
    if !groups.is_empty() {
        let types: Vec<&str> = groups.keys().map(String::as_str).collect();
        o.push_str(&format!(
            "\n[devices]\nenabled_mdev_types = {}\n",
            types.join(", ")
        ));
        let several = groups.len() > 1;
        for (ty, g) in groups {
            o.push_str(&format!(
                "\n# {}: {} slot{} of {} ({}): vgpud made the mdevs, Nova assigns them (and makes none past max_instances)\n",
                g.type_name.as_deref().unwrap_or(ty),
                g.slots,
                if g.slots == 1 { "" } else { "s" },
                list(&g.pools),
                list(&g.profiles),
            ));
            o.push_str(&format!(
                "[mdev_{ty}]\ndevice_addresses = {}\n",
                list(&g.parents)
            ));
            if several {
                o.push_str(&format!(
                    "# flavors ask for this type with resources:{}=1\nmdev_class = {}\n",
                    mdev_class(ty, g),
                    mdev_class(ty, g)
                ));
            }
            o.push_str(&format!("max_instances = {}\n", g.slots));
        }
    }
    if !specs.is_empty() {
        o.push_str(
            "\n[pci]\n# managed \"no\": vgpud bound the VF to vfio-pci, or NVIDIA's driver holds it (vendor-VFIO);\n\
             # libvirt must not detach or reattach it.\n",
        );
        for s in specs {
            let mut spec = vec![
                ("vendor_id", hex(s.ids.vendor)),
                ("product_id", hex(s.ids.device)),
                ("address", s.address.clone()),
                ("managed", "no".to_string()),
            ];
            if let Some(m) = s.live_migratable {
                spec.push(("live_migratable", yes_no(m).to_string()));
            }
            o.push_str(&format!("# {}\n", s.comment));
            o.push_str(&format!("device_spec = {}\n", json_object(&spec)));
        }
        let mut done = BTreeSet::new();
        for s in specs {
            if !done.insert(s.ids) {
                continue;
            }
            let mut alias = vec![
                ("name", s.alias.clone()),
                ("vendor_id", hex(s.ids.vendor)),
                ("product_id", hex(s.ids.device)),
                ("device_type", "type-VF".to_string()),
            ];
            let same: Vec<&VfSpec> = specs.iter().filter(|x| x.ids == s.ids).collect();
            if same.iter().all(|x| x.live_migratable == Some(true)) {
                alias.push(("live_migratable", "yes".to_string()));
            }
            o.push_str(&format!(
                "# flavors ask for one with pci_passthrough:alias={}:1\nalias = {}\n",
                s.alias,
                json_object(&alias)
            ));
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_novas_pattern() {
        let g = MdevGroup {
            type_name: Some("GRID T4-2Q".into()),
            ..MdevGroup::default()
        };
        assert_eq!(mdev_class("nvidia-231", &g), "CUSTOM_GRID_T4_2Q");
        let unnamed = MdevGroup::default();
        assert_eq!(
            mdev_class("i915-GVTg_V5_4", &unnamed),
            "CUSTOM_I915_GVTG_V5_4"
        );
    }

    #[test]
    fn a_parent_under_two_types_is_refused() {
        let group = |parent: &str| MdevGroup {
            parents: BTreeSet::from([parent.to_string()]),
            ..MdevGroup::default()
        };
        let mut groups = BTreeMap::from([
            ("i915-GVTg_V5_4".to_string(), group("0000:00:02.0")),
            ("i915-GVTg_V5_8".to_string(), group("0000:00:03.0")),
        ]);
        assert!(check_one_type_per_parent(&groups).is_ok());
        groups.insert("i915-GVTg_V5_1".into(), group("0000:00:02.0"));
        let e = check_one_type_per_parent(&groups).unwrap_err().to_string();
        assert!(
            e.starts_with("mdev parent 0000:00:02.0 holds slots of two types (i915-GVTg_V5_1 and i915-GVTg_V5_4)"),
            "{e}"
        );
    }

    #[test]
    fn aliases_are_named_after_the_one_vgpu_type_or_the_model() {
        use crate::cli::export::Slot;
        let vf = |model: &str, device: u16, t: Option<&str>| Slot {
            pool: "p".into(),
            profile: "x".into(),
            gpu: "0000:85:00.0".into(),
            vendor: "nvidia".into(),
            model: model.into(),
            holds: Holds::Vf {
                vf: None,
                pf: None,
                ids: PciIds {
                    vendor: 0x10de,
                    device,
                },
                vgpu_type: t.map(Into::into),
            },
        };
        let slots = Slots {
            slots: vec![
                vf("NVIDIA L40S", 1, Some("NVIDIA L40S-2Q")),
                vf("NVIDIA L40S", 1, Some("NVIDIA L40S-2Q")),
                vf("NVIDIA A16", 2, Some("NVIDIA A16-1B")),
                vf("NVIDIA A16", 2, Some("NVIDIA A16-2B")),
            ],
            ..Slots::default()
        };
        let names = alias_names(&slots);
        assert_eq!(
            names[&PciIds {
                vendor: 0x10de,
                device: 1
            }],
            "nvidia-l40s-2q"
        );
        assert_eq!(
            names[&PciIds {
                vendor: 0x10de,
                device: 2
            }],
            "nvidia-a16-vf"
        );
    }
}
