//! Turns a [`SimSpec`] into the simulated kernel's state, checking that it describes a possible host.
//! Every error names the schema path (and, with source text, the line) and what to change.

use std::collections::BTreeMap;

use super::error::SimError;
use super::locate::Locator;
use super::model::{Driver, DriverKind, IdMatch, Model};
use super::spec::{DriverKindSpec, SimSpec};

mod devices;
mod mediated;
mod vendor;

/// Builds errors that point into the description.
pub(super) struct Ctx<'a> {
    file: &'a str,
    locator: Option<Locator>,
}

impl Ctx<'_> {
    pub(super) fn err(&self, field: impl Into<String>, message: impl Into<String>) -> SimError {
        let field = field.into();
        SimError::Invalid {
            file: self.file.to_string(),
            line: self.locator.as_ref().and_then(|l| l.line_of(&field)),
            field,
            message: message.into(),
        }
    }
}

/// Parses a driver `match` entry: `VVVV:DDDD` (either may be `*`) or `class:0xCCCCCC`.
fn parse_match(s: &str) -> Option<IdMatch> {
    if let Some(c) = s.strip_prefix("class:") {
        let c = c.trim_start_matches("0x");
        let class = u32::from_str_radix(c, 16)
            .ok()
            .filter(|c| *c <= 0xff_ffff)?;
        return Some(IdMatch::Class {
            class,
            mask: 0xff_ffff,
        });
    }
    let (v, d) = s.split_once(':')?;
    let part = |p: &str| -> Option<Option<u16>> {
        if p == "*" {
            Some(None)
        } else if p.len() == 4 {
            u16::from_str_radix(p, 16).ok().map(Some)
        } else {
            None
        }
    };
    Some(IdMatch::Id {
        vendor: part(v)?,
        device: part(d)?,
    })
}

/// Builds and validates the model. `text` (the TOML source) lets errors carry line numbers.
pub(crate) fn build(
    name: &str,
    file: &str,
    text: Option<&str>,
    spec: &SimSpec,
) -> Result<Model, SimError> {
    let cx = Ctx {
        file,
        locator: text.map(Locator::new),
    };
    let mut model = Model {
        name: name.to_string(),
        iommu_domain_type: spec
            .host
            .iommu_domain_type
            .clone()
            .unwrap_or_else(|| "DMA".to_string()),
        numa_nodes: spec.host.numa_nodes,
        pci: BTreeMap::new(),
        drivers: Vec::new(),
        parents: Vec::new(),
        mdevs: BTreeMap::new(),
        nvidia: BTreeMap::new(),
        xe: BTreeMap::new(),
        i915: BTreeMap::new(),
        modules: Vec::new(),
    };
    drivers(&cx, spec, &mut model)?;
    devices::pci_devices(&cx, spec, &mut model)?;
    mediated::parents(&cx, spec, &mut model)?;
    vendor::nvidia_gpus(&cx, spec, &mut model)?;
    vendor::xe_pfs(&cx, spec, &mut model)?;
    super::i915_iov::build(&cx, &spec.i915_iov, &mut model)?;
    super::modules::build(&cx, &spec.modules, &mut model)?;
    // VFs enabled at start are probed like later ones, so vendor state must exist first.
    devices::initial_vfs(&cx, spec, &mut model)?;
    mediated::instances(&cx, spec, &mut model)?;
    vendor::vgpus(&cx, spec, &mut model)?;
    Ok(model)
}

fn drivers(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, d) in spec.drivers.iter().enumerate() {
        let at = |f: &str| format!("driver[{i}].{f}");
        if d.name.is_empty() || d.name.contains('/') {
            return Err(cx.err(at("name"), "a driver name must be non-empty without '/'"));
        }
        if model.driver(&d.name).is_some() {
            return Err(cx.err(
                at("name"),
                format!("driver '{}' is declared twice; keep one", d.name),
            ));
        }
        let kind = match d.kind {
            DriverKindSpec::Generic => DriverKind::Generic,
            DriverKindSpec::VfioPci => DriverKind::VfioPci,
            DriverKindSpec::PciStub => DriverKind::PciStub,
        };
        if kind != DriverKind::Generic && !d.matches.is_empty() {
            return Err(cx.err(
                at("match"),
                format!(
                    "driver '{}' is {:?}: it matches only through driver_override or new_id; remove `match`",
                    d.name, d.kind
                ),
            ));
        }
        let ids = d
            .matches
            .iter()
            .map(|m| {
                parse_match(m).ok_or_else(|| {
                    cx.err(
                        at("match"),
                        format!("'{m}' is not a match: use \"10de:1eb8\", \"10de:*\" or \"class:0x010802\""),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        model.drivers.push(Driver {
            name: d.name.clone(),
            kind,
            ids,
            dynids: Vec::new(),
            sriov_configure: d.sriov_configure,
            sriov_max_vfs: d.sriov_max_vfs,
            disable_sriov_on_unbind: d.disable_sriov_on_unbind.unwrap_or(true),
            vf_probe_errno: d.vf_probe_errno.map(|e| e.0),
        });
    }
    Ok(())
}
