//! The uevents the kernel would broadcast for a change of the simulated state, found by comparing the
//! state before and after (lib/kobject_uevent.c; `bind`/`unbind` from drivers/base/dd.c
//! driver_bound/__device_release_driver; module `add` after its init ran, kernel/module/main.c
//! do_init_module).

use std::collections::BTreeMap;

use super::model::{Model, ParentLoc};
use mdev_types::ids::{MdevUuid, PciAddress};
use vgpu_host::uevent::Uevent;

/// What uevents are derived from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Snapshot {
    pci: BTreeMap<PciAddress, (String, Option<String>)>,
    mdevs: BTreeMap<MdevUuid, (String, String)>,
    modules: BTreeMap<String, (String, bool)>,
}

/// Strips the `/sys` prefix: DEVPATH is relative to the sysfs mount.
fn devpath(dir: &str) -> String {
    dir.strip_prefix("/sys").unwrap_or(dir).to_string()
}

pub(super) fn snapshot(model: &Model) -> Snapshot {
    let pci = model
        .pci
        .iter()
        .map(|(a, d)| (*a, (devpath(&model.dev_dir(a)), d.driver.clone())))
        .collect();
    let mdevs = model
        .mdevs
        .iter()
        .filter_map(|(u, m)| {
            let p = model.parents.get(m.parent)?;
            let t = p.types.get(m.ty)?;
            Some((
                *u,
                (
                    format!("{}/{u}", devpath(&model.parent_dir(p))),
                    t.id.to_string(),
                ),
            ))
        })
        .collect();
    let modules = model
        .parents
        .iter()
        .filter_map(|p| match &p.loc {
            ParentLoc::Virtual { class, loaded } => {
                Some((class.clone(), (devpath(&model.parent_dir(p)), *loaded)))
            }
            ParentLoc::Pci { .. } => None,
        })
        .collect();
    Snapshot {
        pci,
        mdevs,
        modules,
    }
}

fn with(mut ev: Uevent, key: &str, value: &str) -> Uevent {
    ev.env.insert(key.to_string(), value.to_string());
    ev
}

/// The uevents between two snapshots, in the order the kernel sends them.
pub(super) fn diff(before: &Snapshot, after: &Snapshot) -> Vec<Uevent> {
    let mut out = Vec::new();
    // Instances go before their parents do.
    for (u, (path, ty)) in &before.mdevs {
        if !after.mdevs.contains_key(u) {
            out.push(with(
                Uevent::new("remove", path, Some("mdev")),
                "MDEV_TYPE",
                ty,
            ));
        }
    }
    for (a, (path, drv)) in &before.pci {
        match after.pci.get(a) {
            None => {
                if let Some(d) = drv {
                    out.push(with(Uevent::new("unbind", path, Some("pci")), "DRIVER", d));
                }
                out.push(Uevent::new("remove", path, Some("pci")));
            }
            Some((_, now)) if now != drv => {
                if let Some(d) = drv {
                    out.push(with(Uevent::new("unbind", path, Some("pci")), "DRIVER", d));
                }
            }
            Some(_) => {}
        }
    }
    for (class, (path, loaded)) in &before.modules {
        if *loaded && !after.modules.get(class).is_some_and(|(_, l)| *l) {
            out.push(Uevent::new("remove", path, Some(class)));
            out.push(Uevent::new(
                "remove",
                &format!("/module/{class}"),
                Some("module"),
            ));
        }
    }
    for (a, (path, drv)) in &after.pci {
        let old = before.pci.get(a);
        if old.is_none() {
            out.push(Uevent::new("add", path, Some("pci")));
        }
        if let Some(d) = drv
            && old.is_none_or(|(_, o)| o.as_ref() != Some(d))
        {
            out.push(with(Uevent::new("bind", path, Some("pci")), "DRIVER", d));
        }
    }
    for (class, (path, loaded)) in &after.modules {
        if *loaded && !before.modules.get(class).is_some_and(|(_, l)| *l) {
            out.push(Uevent::new("add", path, Some(class)));
            out.push(Uevent::new(
                "add",
                &format!("/module/{class}"),
                Some("module"),
            ));
        }
    }
    for (u, (path, ty)) in &after.mdevs {
        if !before.mdevs.contains_key(u) {
            out.push(with(
                Uevent::new("add", path, Some("mdev")),
                "MDEV_TYPE",
                ty,
            ));
        }
    }
    out
}
