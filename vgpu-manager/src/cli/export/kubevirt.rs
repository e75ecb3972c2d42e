//! `vgpuctl export kubevirt`: the KubeVirt CR fragment for the pools' slots.
//!
//! KubeVirt's virt-handler runs a device plugin per entry of `spec.configuration.permittedHostDevices`
//! (pkg/virt-handler/device-manager/device_controller.go):
//! - `mediatedDevices`: `mdevNameSelector` is matched against each mdev's `mdev_type/name` attribute,
//!   spaces on both sides turned into `_` (the type id when the type has no name; `getMdevTypeName` in
//!   mediated_device.go), and the plugin offers the mdevs it finds as `resourceName`;
//! - `pciHostDevices`: `pciVendorSelector` is the `vendor:device` id (compared lower-cased), and the
//!   plugin offers the functions of that id bound to vfio-pci, or to `nvidia` when they are VFs with a
//!   vGPU type (`nvidia/current_vgpu_type` not 0: nvidia.go, pci_device.go).
//!
//! virt-launcher finds the devices a pod was given in the variable `MDEV_PCI_RESOURCE_<NAME>` or
//! `PCI_RESOURCE_<NAME>`, NAME being the resource name upper-cased with `/` and `.` turned into `_`
//! (`ResourceNameToEnvVar` in pkg/util/util.go; the prefixes are `MDevResourcePrefix` and
//! `PCIResourcePrefix` of staging/src/kubevirt.io/api/core/v1/types.go).
//!
//! vgpud makes the mdevs, so KubeVirt's own mdev handling must be off: while it is on, virt-handler
//! deletes every mdev whose type is not in its `mediatedDeviceTypes` (kubevirt/kubevirt pull request
//! 19099 describes the sweep). KubeVirt 1.8 turns it off with `mediatedDevicesConfiguration.enabled:
//! false`; before, with the `DisableMDEVConfiguration` feature gate (deprecated in 1.8, still read:
//! `MediatedDevicesHandlingDisabled` in pkg/virt-config/virt-config.go).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;

use serde::Serialize;
use serde_json::{Value, json};

use super::{Holds, SlotSource, Slots, squash};
use crate::cli::{CliError, Table, write_json};

/// `vgpuctl export kubevirt` options.
#[derive(Debug, clap::Args)]
pub(in crate::cli) struct KubevirtArgs {
    #[command(flatten)]
    pub(super) source: SlotSource,
    /// The KubeVirt release the fragment is for (`1.9`, `v1.7.4`): from 1.8 on, KubeVirt's mdev
    /// handling is turned off with `mediatedDevicesConfiguration.enabled: false`, before with the
    /// `DisableMDEVConfiguration` feature gate.
    #[arg(long, value_name = "VERSION", default_value = "1.9")]
    kubevirt_version: String,
    /// The domain of every resource name (default: the GPU vendor's: nvidia.com, intel.com, amd.com;
    /// vgpu-manager.io for others).
    #[arg(long, value_name = "DOMAIN")]
    resource_domain: Option<String>,
    /// Print the fragment and the resources as JSON (docs/json.md).
    #[arg(long, conflicts_with = "yaml")]
    json: bool,
    /// Print the fragment as YAML, with comments (for `kubectl patch --type merge --patch-file`).
    #[arg(long)]
    yaml: bool,
}

/// The first KubeVirt release with `mediatedDevicesConfiguration.enabled`.
const ENABLED_FIELD_SINCE: (u32, u32) = (1, 8);

/// The feature gate that turns KubeVirt's mdev handling off before 1.8
/// (pkg/virt-config/featuregate/inactive.go, `DisableMediatedDevicesHandling`).
pub(crate) const DISABLE_MDEV_GATE: &str = "DisableMDEVConfiguration";

/// One device-plugin resource: what KubeVirt is told to offer, and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(super) struct Resource {
    /// `mdev` (a `mediatedDevices` entry) or `pci` (a `pciHostDevices` entry).
    kind: &'static str,
    /// The `mdevNameSelector` or `pciVendorSelector`.
    selector: String,
    /// The `resourceName` pods request.
    resource_name: String,
    /// The variable virt-launcher reads the allocated devices from.
    env: String,
    /// How many slots it offers.
    slots: u32,
    /// The GPUs they are on.
    gpus: BTreeSet<String>,
    /// The slots' profiles.
    profiles: BTreeSet<String>,
    /// The mdev type ids (mdev) or NVIDIA vGPU types (pci) behind it.
    types: BTreeSet<String>,
    /// The pools the slots belong to.
    pools: BTreeSet<String>,
}

/// virt-launcher's variable for `resource` with `prefix` (`ResourceNameToEnvVar`).
pub(super) fn env_var(prefix: &str, resource: &str) -> String {
    format!(
        "{prefix}_{}",
        resource.to_uppercase().replace(['/', '.'], "_")
    )
}

/// The resource-name domain of a GPU vendor (`nvidia` → `nvidia.com`).
fn vendor_domain(vendor: &str) -> &'static str {
    match vendor {
        "nvidia" => "nvidia.com",
        "intel" => "intel.com",
        "amd" => "amd.com",
        _ => "vgpu-manager.io",
    }
}

/// The name part of a resource name: a Kubernetes qualified name (at most 63 characters of
/// `[A-Za-z0-9_.-]`, alphanumeric at both ends; k8s.io/apimachinery validation `IsQualifiedName`).
fn name_part(s: &str) -> String {
    let n = squash(s, |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'));
    let n: String = n.chars().take(63).collect();
    n.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Whether `d` is a DNS-1123 subdomain (what a resource name's domain must be).
fn valid_domain(d: &str) -> bool {
    !d.is_empty()
        && d.len() <= 253
        && d.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `1.9`, `v1.7.4` → (major, minor).
fn parse_version(v: &str) -> Option<(u32, u32)> {
    let mut parts = v.trim().trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The resources for `slots`: one per mdev type name and one per VF PCI id.
pub(super) fn resources(slots: &Slots, domain: Option<&str>) -> Vec<Resource> {
    let mut by_key: BTreeMap<(&'static str, String), Resource> = BTreeMap::new();
    for s in &slots.slots {
        let (kind, selector, name, prefix, ty) = match &s.holds {
            Holds::Mdev {
                type_id, type_name, ..
            } => {
                // KubeVirt compares names with spaces turned into `_`: two names equal that way are one.
                let sel = type_name.clone().unwrap_or_else(|| type_id.clone());
                let key = sel.replace(' ', "_");
                ("mdev", sel, key, "MDEV_PCI_RESOURCE", type_id.clone())
            }
            Holds::Vf { ids, vgpu_type, .. } => {
                let sel = format!("{:04X}:{:04X}", ids.vendor, ids.device);
                let name = match vgpu_type {
                    Some(t) => t.clone(),
                    None => format!("{} VF", s.model),
                };
                (
                    "pci",
                    sel,
                    name,
                    "PCI_RESOURCE",
                    vgpu_type.clone().unwrap_or_default(),
                )
            }
        };
        let key = (
            kind,
            if kind == "mdev" {
                name.clone()
            } else {
                selector.clone()
            },
        );
        let r = by_key.entry(key).or_insert_with(|| {
            let resource_name = format!(
                "{}/{}",
                domain.unwrap_or(vendor_domain(&s.vendor)),
                name_part(&name)
            );
            Resource {
                kind,
                selector,
                env: env_var(prefix, &resource_name),
                resource_name,
                slots: 0,
                gpus: BTreeSet::new(),
                profiles: BTreeSet::new(),
                types: BTreeSet::new(),
                pools: BTreeSet::new(),
            }
        });
        r.slots += 1;
        r.gpus.insert(s.gpu.clone());
        r.profiles.insert(s.profile.clone());
        if !ty.is_empty() {
            r.types.insert(ty);
        }
        r.pools.insert(s.pool.clone());
    }
    let mut out: Vec<Resource> = by_key.into_values().collect();
    // VFs of one PCI id holding several vGPU types are one resource: name it after the model instead.
    for r in out
        .iter_mut()
        .filter(|r| r.kind == "pci" && r.types.len() > 1)
    {
        let model = slots
            .slots
            .iter()
            .find(|s| matches!(&s.holds, Holds::Vf { ids, .. } if format!("{:04X}:{:04X}", ids.vendor, ids.device) == r.selector))
            .map(|s| (s.model.clone(), s.vendor.clone()))
            .unwrap_or_default();
        r.resource_name = format!(
            "{}/{}",
            domain.unwrap_or(vendor_domain(&model.1)),
            name_part(&format!("{} VF", model.0))
        );
        r.env = env_var("PCI_RESOURCE", &r.resource_name);
    }
    out
}

/// The KubeVirt CR fragment for `resources`, for KubeVirt `version`.
pub(super) fn fragment(resources: &[Resource], version: (u32, u32)) -> Value {
    let mdevs: Vec<Value> = resources
        .iter()
        .filter(|r| r.kind == "mdev")
        .map(|r| json!({"mdevNameSelector": r.selector, "resourceName": r.resource_name}))
        .collect();
    let pcis: Vec<Value> = resources
        .iter()
        .filter(|r| r.kind == "pci")
        .map(|r| json!({"pciVendorSelector": r.selector, "resourceName": r.resource_name}))
        .collect();
    let mut permitted = serde_json::Map::new();
    if !mdevs.is_empty() {
        permitted.insert("mediatedDevices".into(), Value::Array(mdevs));
    }
    if !pcis.is_empty() {
        permitted.insert("pciHostDevices".into(), Value::Array(pcis));
    }
    let mut configuration = serde_json::Map::new();
    if version >= ENABLED_FIELD_SINCE {
        configuration.insert(
            "mediatedDevicesConfiguration".into(),
            json!({"enabled": false}),
        );
    } else {
        configuration.insert(
            "developerConfiguration".into(),
            json!({"featureGates": [DISABLE_MDEV_GATE]}),
        );
    }
    configuration.insert("permittedHostDevices".into(), Value::Object(permitted));
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": configuration},
    })
}

/// The JSON of `--json` (docs/json.md).
#[derive(Debug, Serialize)]
struct Report<'a> {
    kubevirt_version: String,
    pools: &'a [String],
    patch: Value,
    resources: &'a [Resource],
    notes: &'a [String],
}

pub(super) fn run(a: &KubevirtArgs, slots: &Slots, out: &mut dyn Write) -> Result<(), CliError> {
    let version = parse_version(&a.kubevirt_version).ok_or_else(|| {
        CliError::BadArgument(format!(
            "--kubevirt-version {}: give a release as MAJOR.MINOR (1.9, v1.7.4)",
            a.kubevirt_version
        ))
    })?;
    if let Some(d) = &a.resource_domain
        && !valid_domain(d)
    {
        return Err(CliError::BadArgument(format!(
            "--resource-domain {d}: a resource name's domain is a DNS subdomain (lower-case letters, digits, '-' and '.'), such as example.com"
        )));
    }
    let res = resources(slots, a.resource_domain.as_deref());
    if res.is_empty() {
        return Err(CliError::BadArgument(format!(
            "the pools {} have no slot with an instance to export{}",
            slots.pools.join(", "),
            notes_suffix(&slots.notes)
        )));
    }
    let patch = fragment(&res, version);
    if a.json {
        return write_json(
            out,
            &Report {
                kubevirt_version: format!("{}.{}", version.0, version.1),
                pools: &slots.pools,
                patch,
                resources: &res,
                notes: &slots.notes,
            },
        );
    }
    if a.yaml {
        write!(out, "{}", yaml(&res, version, slots))?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "RESOURCE",
        "KIND",
        "SELECTOR",
        "SLOTS",
        "GPUS",
        "VIRT-LAUNCHER VARIABLE",
    ]);
    for r in &res {
        t.row(vec![
            r.resource_name.clone(),
            r.kind.into(),
            r.selector.clone(),
            r.slots.to_string(),
            r.gpus.iter().cloned().collect::<Vec<_>>().join(","),
            r.env.clone(),
        ]);
    }
    write!(out, "{}", t.render())?;
    for n in &slots.notes {
        writeln!(out, "note: {n}")?;
    }
    writeln!(out, "(--yaml prints the KubeVirt CR fragment)")?;
    Ok(())
}

fn notes_suffix(notes: &[String]) -> String {
    if notes.is_empty() {
        String::new()
    } else {
        format!(": {}", notes.join("; "))
    }
}

/// A YAML double-quoted scalar (a JSON string is one).
fn q(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Where a resource's slots are, for its comment.
fn origin(r: &Resource) -> String {
    let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
    let mut o = format!(
        "{} slot{} of {} ({}) on {}",
        r.slots,
        if r.slots == 1 { "" } else { "s" },
        list(&r.pools),
        list(&r.profiles),
        list(&r.gpus)
    );
    if r.kind == "pci" && !r.types.is_empty() {
        o.push_str(&format!("; vGPU types {}", list(&r.types)));
    }
    o
}

/// The fragment as commented YAML: the same document as [`fragment`].
fn yaml(res: &[Resource], version: (u32, u32), slots: &Slots) -> String {
    let mut y = String::new();
    y.push_str(&format!(
        "# KubeVirt {}.{} configuration for the vGPU pools {}, from vgpuctl export kubevirt.\n",
        version.0,
        version.1,
        slots.pools.join(", ")
    ));
    y.push_str(
        "# Apply: kubectl patch kubevirt kubevirt -n kubevirt --type merge --patch-file THIS_FILE\n\
         # A merge patch replaces whole lists: first add the entries your CR already has (other\n\
         # permitted devices, feature gates) to the lists below.\n",
    );
    if slots.planned {
        y.push_str(
            "# Planned from pool files: what the pools provide once applied on this host.\n",
        );
    }
    for n in &slots.notes {
        y.push_str(&format!("# note: {n}\n"));
    }
    y.push_str(
        "apiVersion: kubevirt.io/v1\nkind: KubeVirt\nmetadata:\n  name: kubevirt\n  namespace: kubevirt\nspec:\n  configuration:\n",
    );
    y.push_str(
        "    # vgpud makes and removes the mdevs. While KubeVirt's own mdev handling is on, virt-handler\n\
         \x20   # deletes every mdev whose type is not in its mediatedDeviceTypes (the sweep that\n\
         \x20   # kubevirt/kubevirt pull request 19099 describes), so it is turned off.\n",
    );
    if version >= ENABLED_FIELD_SINCE {
        y.push_str("    mediatedDevicesConfiguration:\n      enabled: false\n");
    } else {
        y.push_str(&format!(
            "    developerConfiguration:\n      featureGates:\n        - {}\n",
            q(DISABLE_MDEV_GATE)
        ));
    }
    y.push_str("    permittedHostDevices:\n");
    for (kind, list, sel) in [
        ("mdev", "mediatedDevices", "mdevNameSelector"),
        ("pci", "pciHostDevices", "pciVendorSelector"),
    ] {
        let entries: Vec<&Resource> = res.iter().filter(|r| r.kind == kind).collect();
        if entries.is_empty() {
            continue;
        }
        y.push_str(&format!("      {list}:\n"));
        for r in entries {
            y.push_str(&format!("        # {}\n", origin(r)));
            y.push_str(&format!("        # virt-launcher reads {}\n", r.env));
            y.push_str(&format!("        - {sel}: {}\n", q(&r.selector)));
            y.push_str(&format!(
                "          resourceName: {}\n",
                q(&r.resource_name)
            ));
        }
    }
    y
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_follow_kubevirts_rule() {
        // pkg/util/util.go ResourceNameToEnvVar: upper case, `/` and `.` to `_`, `-` kept.
        assert_eq!(
            env_var("MDEV_PCI_RESOURCE", "nvidia.com/GRID_T4-2Q"),
            "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q"
        );
        assert_eq!(
            env_var("PCI_RESOURCE", "intel.com/Flex.170_VF"),
            "PCI_RESOURCE_INTEL_COM_FLEX_170_VF"
        );
    }

    #[test]
    fn names_are_qualified_names() {
        assert_eq!(name_part("GRID T4-2Q"), "GRID_T4-2Q");
        assert_eq!(
            name_part("  Intel (R) Flex / 170 VF "),
            "Intel_R_Flex_170_VF"
        );
        assert_eq!(name_part(&"x".repeat(80)).len(), 63);
        assert!(valid_domain("example.com"));
        assert!(!valid_domain("Example.com") && !valid_domain("a..b") && !valid_domain("-a.b"));
        assert_eq!(parse_version("v1.7.4"), Some((1, 7)));
        assert_eq!(parse_version("1.10"), Some((1, 10)));
        assert_eq!(parse_version("one"), None);
    }

    fn slot(model: &str, holds: Holds) -> crate::cli::export::Slot {
        crate::cli::export::Slot {
            pool: "p".into(),
            profile: "x".into(),
            gpu: "0000:85:00.0".into(),
            vendor: "nvidia".into(),
            model: model.into(),
            holds,
        }
    }

    #[test]
    fn one_resource_per_type_name_and_per_vf_id() {
        use crate::cli::export::PciIds;
        let mdev = |id: &str, name: Option<&str>| Holds::Mdev {
            parent: "0000:83:00.0".into(),
            type_id: id.into(),
            type_name: name.map(Into::into),
        };
        let vf = |device: u16, t: &str| Holds::Vf {
            vf: None,
            pf: None,
            ids: PciIds {
                vendor: 0x10de,
                device,
            },
            vgpu_type: Some(t.into()),
        };
        let slots = Slots {
            slots: vec![
                slot("NVIDIA T4", mdev("nvidia-231", Some("GRID T4-2Q"))),
                slot("NVIDIA T4", mdev("nvidia-231", Some("GRID T4-2Q"))),
                slot("mbochs", mdev("mbochs-4", None)),
                slot("NVIDIA A16", vf(0x25b6, "NVIDIA A16-1B")),
                slot("NVIDIA A16", vf(0x25b6, "NVIDIA A16-2B")),
            ],
            ..Slots::default()
        };
        let r = resources(&slots, None);
        let names: Vec<(&str, &str, u32)> = r
            .iter()
            .map(|r| (r.selector.as_str(), r.resource_name.as_str(), r.slots))
            .collect();
        assert_eq!(
            names,
            [
                ("GRID T4-2Q", "nvidia.com/GRID_T4-2Q", 2),
                ("mbochs-4", "nvidia.com/mbochs-4", 1),
                // Two vGPU types behind one id: KubeVirt cannot tell them apart, so the model names it.
                ("10DE:25B6", "nvidia.com/NVIDIA_A16_VF", 2),
            ]
        );
        assert_eq!(r[2].env, "PCI_RESOURCE_NVIDIA_COM_NVIDIA_A16_VF");
        let own = resources(&slots, Some("gpu.example.com"));
        assert_eq!(own[0].resource_name, "gpu.example.com/GRID_T4-2Q");
    }
}
