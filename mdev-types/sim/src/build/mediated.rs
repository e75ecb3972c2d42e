//! mdev parents, their types, and the instances that exist at start.

use nix::errno::Errno;

use super::Ctx;
use crate::error::SimError;
use crate::mdev;
use crate::model::{Counting, MdevType, Model, Parent, ParentLoc};
use crate::spec::{CountingSpec, SimSpec};
use mdev_types::ids::PciAddress;

pub(super) fn parents(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
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
                    loaded: !p.unloaded,
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
                    full_errno: p
                        .full_errno
                        .map_or_else(|| mdev::default_full_errno(&p.mdev_driver), |e| e.0),
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

pub(super) fn instances(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
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
