//! Turns a [`SimSpec`] into the simulated kernel's state, checking that it describes a possible host.
//! Every error names the schema path (and, with source text, the line) and what to change.

use std::collections::{BTreeMap, BTreeSet};

use nix::errno::Errno;

use super::error::SimError;
use super::locate::Locator;
use super::model::{
    Counting, Driver, DriverKind, IdMatch, MdevType, Model, NvidiaGpu, Parent, ParentLoc, PciDev,
    Sriov, VfIommu, VgpuType, XeFunc, XePf,
};
use super::spec::{CountingSpec, DriverKindSpec, SimSpec, VfIommuSpec};
use super::{mdev, nvidia, pci, sriov};
use crate::ids::PciAddress;

/// Builds errors that point into the description.
struct Ctx<'a> {
    file: &'a str,
    locator: Option<Locator>,
}

impl Ctx<'_> {
    fn err(&self, field: impl Into<String>, message: impl Into<String>) -> SimError {
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
    };
    drivers(&cx, spec, &mut model)?;
    pci_devices(&cx, spec, &mut model)?;
    parents(&cx, spec, &mut model)?;
    nvidia_gpus(&cx, spec, &mut model)?;
    xe_pfs(&cx, spec, &mut model)?;
    initial_vfs(&cx, spec, &mut model)?;
    instances(&cx, spec, &mut model)?;
    vgpus(&cx, spec, &mut model)?;
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
        });
    }
    Ok(())
}

fn pci_devices(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.pci.iter().enumerate() {
        let at = |f: &str| format!("pci[{i}].{f}");
        if model.pci.contains_key(&p.address) {
            return Err(cx.err(
                at("address"),
                format!("{} is listed twice; keep one entry", p.address),
            ));
        }
        if p.class > 0xff_ffff {
            return Err(cx.err(at("class"), "a class code has 24 bits, e.g. 0x030200"));
        }
        if let Some(n) = p.numa_node {
            let too_big = spec
                .host
                .numa_nodes
                .is_some_and(|max| u32::try_from(n).is_ok_and(|n| n >= max));
            if n < -1 || too_big {
                return Err(cx.err(
                    at("numa_node"),
                    format!("{n} is not an online node: use -1 or 0..host.numa_nodes"),
                ));
            }
        }
        let sriov = match &p.sriov {
            None => None,
            Some(s) => {
                if s.stride == 0 && s.total_vfs > 1 {
                    return Err(cx.err(at("sriov.stride"), "VF stride must be at least 1"));
                }
                Some(Sriov {
                    total: s.total_vfs,
                    num: 0,
                    autoprobe: s.drivers_autoprobe.unwrap_or(true),
                    offset: s.offset,
                    stride: s.stride,
                    vf_device: s.vf_device.0,
                    vf_subsystem_device: s
                        .vf_subsystem_device
                        .or(p.subsystem_device)
                        .map_or(0, |id| id.0),
                    vf_iommu: match s.vf_iommu {
                        VfIommuSpec::Own => VfIommu::Own,
                        VfIommuSpec::Pf => VfIommu::Pf,
                    },
                })
            }
        };
        let dev = PciDev {
            addr: p.address,
            vendor: p.vendor.0,
            device: p.device.0,
            subsystem_vendor: p.subsystem_vendor.map_or(0, |id| id.0),
            subsystem_device: p.subsystem_device.map_or(0, |id| id.0),
            class: p.class,
            revision: p.revision.unwrap_or(0),
            numa_node: p.numa_node.unwrap_or(-1),
            boot_vga: p.boot_vga.unwrap_or(false),
            parent: p.parent,
            driver: None,
            driver_override: p.driver_override.clone(),
            iommu_group: p.iommu_group,
            sriov,
            vf_of: None,
        };
        if p.boot_vga.is_some() && !dev.is_vga() {
            return Err(cx.err(
                at("boot_vga"),
                format!(
                    "class 0x{:06x} is not a VGA controller (0x0300xx): the kernel shows boot_vga only on VGA devices; remove it",
                    p.class
                ),
            ));
        }
        model.pci.insert(p.address, dev);
    }
    // Bridges, drivers and VF address ranges need every device known.
    for (i, p) in spec.pci.iter().enumerate() {
        let at = |f: &str| format!("pci[{i}].{f}");
        if let Some(up) = p.parent {
            match model.pci.get(&up) {
                None => {
                    return Err(cx.err(
                        at("parent"),
                        format!("bridge {up} is not listed; add it under [[pci]] or drop `parent`"),
                    ));
                }
                Some(b) if !b.is_bridge() => {
                    return Err(cx.err(
                        at("parent"),
                        format!("{up} has class 0x{:06x}, not a bridge (0x06xxxx)", b.class),
                    ));
                }
                Some(_) => {}
            }
            let mut seen = BTreeSet::new();
            let mut cur = p.address;
            while let Some(next) = model.pci.get(&cur).and_then(|d| d.parent) {
                if !seen.insert(cur) {
                    return Err(cx.err(at("parent"), "bridges form a loop"));
                }
                cur = next;
            }
        }
        if let Some(drv) = &p.driver {
            let Some(d) = model.driver(drv) else {
                return Err(cx.err(
                    at("driver"),
                    format!("driver '{drv}' is not declared; add a [[driver]] named '{drv}'"),
                ));
            };
            let dev = &model.pci[&p.address];
            if !pci::driver_matches(model, dev, &d.name) {
                return Err(cx.err(
                    at("driver"),
                    format!(
                        "driver '{drv}' does not match {:04x}:{:04x} (class 0x{:06x}); extend its `match` or set driver_override = \"{drv}\"",
                        dev.vendor, dev.device, dev.class
                    ),
                ));
            }
            if let Some(d) = model.pci.get_mut(&p.address) {
                d.driver = Some(drv.clone());
            }
        }
        if let Some(s) = &model.pci[&p.address].sriov {
            for idx in 0..s.total {
                match Model::vf_address(&p.address, s, idx) {
                    None => {
                        return Err(cx.err(
                            at("sriov.offset"),
                            format!(
                                "VF {idx} would lie beyond bus ff; lower offset/stride/total_vfs"
                            ),
                        ));
                    }
                    Some(a) if model.pci.contains_key(&a) => {
                        return Err(cx.err(
                            at("sriov.offset"),
                            format!("VF {idx} would be at {a}, which is already a listed device"),
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    Ok(())
}

fn parents(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.mdev_parent.iter().enumerate() {
        let at = |f: &str| format!("mdev_parent[{i}].{f}");
        if model.parents.iter().any(|q| q.name == p.device) {
            return Err(cx.err(
                at("device"),
                format!("mdev parent '{}' is listed twice", p.device),
            ));
        }
        let loc = match &p.virtual_class {
            Some(class) => {
                if class.is_empty() || class.contains('/') || p.device.contains('/') {
                    return Err(cx.err(
                        at("virtual_class"),
                        "class and device names must be non-empty without '/'",
                    ));
                }
                ParentLoc::Virtual {
                    class: class.clone(),
                }
            }
            None => {
                let addr: PciAddress = p.device.parse().map_err(|e| {
                    cx.err(
                        at("device"),
                        format!("{e}; or set virtual_class for a virtual parent"),
                    )
                })?;
                let Some(dev) = model.pci.get(&addr) else {
                    return Err(cx.err(at("device"), format!("{addr} is not listed under [[pci]]")));
                };
                let Some(driver) = dev.driver.clone() else {
                    return Err(cx.err(
                        at("device"),
                        format!("{addr} has no driver; the driver that registers the mdev parent must be bound"),
                    ));
                };
                ParentLoc::Pci { addr, driver }
            }
        };
        let pools: Vec<(String, u64)> = p.pools.iter().map(|(k, v)| (k.clone(), *v)).collect();
        let counting = match p.counting {
            CountingSpec::Core => {
                let Some(max) = p.max_instances else {
                    return Err(cx.err(
                        at("max_instances"),
                        "core counting needs max_instances (the mdev driver's max_instances)",
                    ));
                };
                if p.full_errno.is_some() || !pools.is_empty() {
                    return Err(cx.err(
                        at("counting"),
                        "with core counting the mdev core answers EUSERS when full; drop full_errno and pools",
                    ));
                }
                Counting::Core { max }
            }
            CountingSpec::Driver => {
                if p.max_instances.is_some() {
                    return Err(cx.err(
                        at("max_instances"),
                        "max_instances is for counting = \"core\"; give types max_instances or uses",
                    ));
                }
                Counting::Driver {
                    pools: pools.clone(),
                    full_errno: p.full_errno.map_or(Errno::ENOSPC, |e| e.0),
                    create_limit: p.create_limit,
                }
            }
        };
        let mut types: Vec<MdevType> = Vec::new();
        for (j, t) in p.types.iter().enumerate() {
            let tat = |f: &str| format!("mdev_parent[{i}].type[{j}].{f}");
            if types.iter().any(|u| u.id == t.id) {
                return Err(cx.err(tat("id"), format!("type '{}' is listed twice", t.id)));
            }
            let mut uses = Vec::new();
            for (pool, n) in &t.uses {
                let Some(k) = pools.iter().position(|(name, _)| name == pool) else {
                    return Err(cx.err(
                        format!("mdev_parent[{i}].type[{j}].uses.{pool}"),
                        format!("pool '{pool}' is not declared in this parent's pools"),
                    ));
                };
                if *n == 0 {
                    return Err(cx.err(
                        format!("mdev_parent[{i}].type[{j}].uses.{pool}"),
                        "an instance must use at least 1",
                    ));
                }
                uses.push((k, *n));
            }
            if matches!(counting, Counting::Driver { .. })
                && uses.is_empty()
                && t.max_instances.is_none()
            {
                return Err(cx.err(
                    tat("uses"),
                    "a driver-counted type needs max_instances or uses, or it has no limit",
                ));
            }
            types.push(MdevType {
                id: t.id.clone(),
                name: t.name.clone(),
                description: t.description.clone(),
                device_api: t
                    .device_api
                    .clone()
                    .unwrap_or_else(|| "vfio-pci".to_string()),
                max_instances: t.max_instances,
                uses,
            });
        }
        model.parents.push(Parent {
            name: p.device.clone(),
            loc,
            mdev_driver: p.mdev_driver.clone(),
            counting,
            homogeneous: p.homogeneous,
            types,
        });
    }
    Ok(())
}

fn nvidia_gpus(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, g) in spec.nvidia_vfio.iter().enumerate() {
        let at = |f: &str| format!("nvidia_vfio[{i}].{f}");
        let ok = model.pci.get(&g.pf).is_some_and(|d| d.sriov.is_some());
        if !ok {
            return Err(cx.err(
                at("pf"),
                format!(
                    "{} must be a listed PCI device with an [pci.sriov] table",
                    g.pf
                ),
            ));
        }
        if model.nvidia.contains_key(&g.pf) {
            return Err(cx.err(at("pf"), format!("{} is listed twice", g.pf)));
        }
        let mut types: Vec<VgpuType> = Vec::new();
        for (j, t) in g.types.iter().enumerate() {
            if t.id == 0 || types.iter().any(|u| u.id == t.id) {
                return Err(cx.err(
                    format!("nvidia_vfio[{i}].type[{j}].id"),
                    format!(
                        "type id {} must be non-zero and unique (0 clears a VF)",
                        t.id
                    ),
                ));
            }
            types.push(VgpuType {
                id: t.id,
                name: t.name.clone(),
                framebuffer_mib: t.framebuffer_mib,
            });
        }
        model.nvidia.insert(
            g.pf,
            NvidiaGpu {
                framebuffer_mib: g.framebuffer_mib,
                heterogeneous: g.heterogeneous,
                types,
                vgpus: BTreeMap::new(),
                params: BTreeMap::new(),
            },
        );
    }
    Ok(())
}

fn xe_pfs(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, x) in spec.xe_sriov.iter().enumerate() {
        let at = |f: &str| format!("xe_sriov[{i}].{f}");
        let Some(dev) = model.pci.get(&x.pf).filter(|d| d.sriov.is_some()) else {
            return Err(cx.err(
                at("pf"),
                format!(
                    "{} must be a listed PCI device with an [pci.sriov] table",
                    x.pf
                ),
            ));
        };
        let driver = x.driver.clone().unwrap_or_else(|| "xe".to_string());
        if model.driver(&driver).is_none() {
            return Err(cx.err(at("driver"), format!("driver '{driver}' is not declared")));
        }
        // One directory per possible VF: vf1 … vf<sriov_totalvfs> (pf_setup_tree).
        let total = model.total_vfs(dev);
        model.xe.insert(
            x.pf,
            XePf {
                driver,
                vram_bytes: x.vram_bytes,
                funcs: vec![XeFunc::default(); usize::from(total) + 1],
            },
        );
    }
    Ok(())
}

fn initial_vfs(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.pci.iter().enumerate() {
        let Some(s) = &p.sriov else { continue };
        if s.num_vfs == 0 {
            continue;
        }
        let total = model.pci.get(&p.address).map_or(0, |d| model.total_vfs(d));
        if s.num_vfs > total {
            return Err(cx.err(
                format!("pci[{i}].sriov.num_vfs"),
                format!("{} VFs exceed sriov_totalvfs {total}", s.num_vfs),
            ));
        }
        sriov::add_vfs(model, &p.address, s.num_vfs).map_err(|e| {
            cx.err(
                format!("pci[{i}].sriov.num_vfs"),
                format!("enabling the VFs failed: {e}"),
            )
        })?;
    }
    Ok(())
}

fn instances(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, m) in spec.mdev.iter().enumerate() {
        let at = |f: &str| format!("mdev[{i}].{f}");
        let Some(p) = model.parents.iter().position(|p| p.name == m.parent) else {
            return Err(cx.err(
                at("parent"),
                format!(
                    "mdev parent '{}' is not listed under [[mdev_parent]]",
                    m.parent
                ),
            ));
        };
        let Some(t) = model.parents[p]
            .types
            .iter()
            .position(|t| t.id == m.mdev_type)
        else {
            return Err(cx.err(
                at("type"),
                format!("parent '{}' has no type '{}'", m.parent, m.mdev_type),
            ));
        };
        mdev::create(model, p, t, &m.uuid.to_string()).map_err(|e| {
            let why = match e {
                Errno::EEXIST => "this UUID is already used".to_string(),
                e => format!("the type has no instance left ({e})"),
            };
            cx.err(at("uuid"), why)
        })?;
    }
    Ok(())
}

fn vgpus(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, g) in spec.nvidia_vfio.iter().enumerate() {
        for (j, v) in g.vgpus.iter().enumerate() {
            let at = |f: &str| format!("nvidia_vfio[{i}].vgpu[{j}].{f}");
            let vf = model
                .vfs_of(&g.pf)
                .into_iter()
                .find(|(idx, _)| *idx == v.vf)
                .map(|(_, a)| a);
            let Some(vf) = vf else {
                return Err(cx.err(
                    at("vf"),
                    format!(
                        "VF {} of {} is not enabled; raise sriov.num_vfs",
                        v.vf, g.pf
                    ),
                ));
            };
            if !nvidia::vf_bound_to_pf_driver(model, &vf) {
                return Err(cx.err(
                    at("vf"),
                    format!("VF {vf} is not bound to its PF's driver, so it has no nvidia/ directory; set the PF's driver to match the VF device id"),
                ));
            }
            nvidia::store_current(model, &vf, &v.type_id.to_string()).map_err(|e| {
                cx.err(
                    at("type"),
                    format!(
                        "type {} cannot be created on VF {} ({e}): unknown type, VF not bound to the PF's driver, or framebuffer used up",
                        v.type_id, v.vf
                    ),
                )
            })?;
        }
    }
    Ok(())
}
