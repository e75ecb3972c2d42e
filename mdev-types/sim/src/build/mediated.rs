//! mdev parents, their types, and the instances that exist at start.

use nix::errno::Errno;

use super::Ctx;
use crate::error::SimError;
use crate::mdev;
use crate::model::{Counting, MdevType, Model, Parent, ParentLoc};
use crate::spec::{CountingSpec, MdevParentSpec, SimSpec};
use mdev_types::ids::PciAddress;

pub(super) fn parents(cx: &Ctx, spec: &SimSpec, model: &mut Model) -> Result<(), SimError> {
    for (i, p) in spec.mdev_parent.iter().enumerate() {
        let at = |f: &str| format!("mdev_parent[{i}].{f}");
        let taken = model
            .parents
            .iter()
            .any(|q| q.name == p.device || q.shares_gpu.is_some_and(|g| g.to_string() == p.device));
        if taken {
            return Err(cx.err(
                at("device"),
                format!(
                    "mdev parent '{}' is listed twice (on the device itself or on its VFs); keep one",
                    p.device
                ),
            ));
        }
        let places = if p.on_vfs {
            vf_places(cx, spec, model, i, p)?
        } else {
            vec![(p.device.clone(), own_place(cx, model, i, p)?, None)]
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
        for (name, loc, shares_gpu) in places {
            model.parents.push(Parent {
                name,
                loc,
                mdev_driver: p.mdev_driver.clone(),
                counting: counting.clone(),
                homogeneous: p.homogeneous,
                types: types.clone(),
                shares_gpu,
            });
        }
    }
    Ok(())
}

/// A parent's name, where it lives, and the physical GPU whose resources it shares.
type Place = (String, ParentLoc, Option<PciAddress>);

/// Where a parent on the device itself lives: a virtual class device, or a listed PCI function with
/// the driver that registers it bound.
fn own_place(cx: &Ctx, model: &Model, i: usize, p: &MdevParentSpec) -> Result<ParentLoc, SimError> {
    let at = |f: &str| format!("mdev_parent[{i}].{f}");
    if let Some(class) = &p.virtual_class {
        if class.is_empty() || class.contains('/') || p.device.contains('/') {
            return Err(cx.err(
                at("virtual_class"),
                "class and device names must be non-empty without '/'",
            ));
        }
        return Ok(ParentLoc::Virtual {
            class: class.clone(),
            loaded: !p.unloaded,
        });
    }
    let hint = "or set virtual_class for a virtual parent";
    let (addr, driver) = bound_pci(cx, model, i, p, hint)?;
    Ok(ParentLoc::Pci { addr, driver })
}

/// `device` as a listed PCI function with its bound driver.
fn bound_pci(
    cx: &Ctx,
    model: &Model,
    i: usize,
    p: &MdevParentSpec,
    hint: &str,
) -> Result<(PciAddress, String), SimError> {
    let at = |f: &str| format!("mdev_parent[{i}].{f}");
    let addr: PciAddress = p
        .device
        .parse()
        .map_err(|e| cx.err(at("device"), format!("{e}; {hint}")))?;
    let Some(dev) = model.pci.get(&addr) else {
        return Err(cx.err(at("device"), format!("{addr} is not listed under [[pci]]")));
    };
    let Some(driver) = dev.driver.clone() else {
        return Err(cx.err(
            at("device"),
            format!(
                "{addr} has no driver; the driver that registers the mdev parent must be bound"
            ),
        ));
    };
    Ok((addr, driver))
}

/// `on_vfs`: one parent per possible VF of the PF `device`, named by the VF's address and registered
/// while that VF exists and is bound to the PF's driver (NVIDIA vGPU User Guide 13–16, "Creating an
/// NVIDIA vGPU on a Linux with KVM Hypervisor": on GPUs that support SR-IOV, `sriov-manage -e` enables
/// the VFs and each VF's `mdev_supported_types` creates the vGPU).
fn vf_places(
    cx: &Ctx,
    spec: &SimSpec,
    model: &Model,
    i: usize,
    p: &MdevParentSpec,
) -> Result<Vec<Place>, SimError> {
    let at = |f: &str| format!("mdev_parent[{i}].{f}");
    if p.virtual_class.is_some() {
        return Err(cx.err(
            at("on_vfs"),
            "on_vfs puts the parents on the VFs of a PCI PF; remove virtual_class (or on_vfs)",
        ));
    }
    if p.counting == CountingSpec::Core {
        return Err(cx.err(
            at("on_vfs"),
            "on_vfs parents are counted by the driver per physical GPU; remove counting = \"core\" and max_instances (or on_vfs)",
        ));
    }
    let hint = "with on_vfs, device is the SR-IOV PF's PCI address";
    let (pf, driver) = bound_pci(cx, model, i, p, hint)?;
    let Some(sriov) = model.pci.get(&pf).and_then(|d| d.sriov.as_ref()) else {
        return Err(cx.err(
            at("on_vfs"),
            format!("{pf} has no [pci.sriov] table, so it has no VFs to host the mdev parents; add one or remove on_vfs"),
        ));
    };
    if spec.nvidia_vfio.iter().any(|g| g.pf == pf) {
        return Err(cx.err(
            at("on_vfs"),
            format!("{pf} is also listed under [[nvidia_vfio]]: a GPU's VFs use either classic mdev (vGPU ≤ 16) or the vendor-specific VFIO interface (vGPU ≥ 17); remove one"),
        ));
    }
    (0..sriov.total)
        .map(|idx| {
            let vf = Model::vf_address(&pf, sriov, idx).ok_or_else(|| {
                cx.err(
                    at("device"),
                    format!("VF {idx} of {pf} would lie beyond bus ff; lower its sriov offset/stride/total_vfs"),
                )
            })?;
            let loc = ParentLoc::Pci {
                addr: vf,
                driver: driver.clone(),
            };
            Ok((vf.to_string(), loc, Some(pf)))
        })
        .collect()
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
        let parent = &model.parents[p];
        if let Some(pf) = parent.shares_gpu
            && !model.parent_registered(parent)
        {
            return Err(cx.err(
                at("parent"),
                format!(
                    "VF {} of {pf} is not enabled or not bound to {pf}'s driver, so it is no mdev parent; raise the PF's sriov.num_vfs",
                    m.parent
                ),
            ));
        }
        mdev::create(model, p, t, &m.uuid.to_string()).map_err(|e| {
            let why = match e {
                Errno::EEXIST => "this UUID is already used".to_string(),
                e if model.parents[p].shares_gpu.is_some() => format!(
                    "the VF already holds a vGPU, or its GPU cannot create this type now ({e})"
                ),
                e => format!("the type has no instance left ({e})"),
            };
            cx.err(at("uuid"), why)
        })?;
    }
    Ok(())
}
