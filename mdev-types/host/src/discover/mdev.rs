//! Reading mdev parents, their supported types and existing instances.

use std::path::{Component, Path};

use super::DiscoverError;
use super::fault::{Outcome, classify};
use super::pci::attr;
use crate::{Host, HostExt, paths};
use mdev_types::fault::{DeviceFault, FaultScope};
use mdev_types::ids::{IommuGroup, MdevTypeId, MdevUuid, PciAddress};
use mdev_types::model::{MdevInstance, MdevParent, MdevType};
use mdev_types::parse;
use tracing::{debug, warn};

fn malformed(path: &Path, text: &str, expected: &'static str) -> DiscoverError {
    DiscoverError::Malformed {
        path: path.to_path_buf(),
        source: parse::ParseError::Invalid {
            what: "sysfs entry name",
            text: text.chars().take(80).collect(),
            expected,
        },
    }
}

/// Reads every registered parent under `/sys/class/mdev_bus`, each on its own: one that cannot be read
/// is a fault, one that went away meanwhile is absent.
pub(super) fn read_parents(
    host: &dyn Host,
) -> Result<(Vec<MdevParent>, Vec<DeviceFault>), DiscoverError> {
    let mut parents = Vec::new();
    let mut faults = Vec::new();
    for name in host.list_optional(Path::new(paths::MDEV_BUS_CLASS))? {
        let dir = paths::mdev_parent(&name);
        match classify(
            host,
            FaultScope::MdevParent,
            &name,
            &dir,
            read_parent(host, &name, &dir),
        ) {
            Outcome::Read(p) => parents.push(p),
            Outcome::Gone => debug!(parent = %name, "mdev parent disappeared during discovery"),
            Outcome::Faulted(f) => {
                warn!(parent = %name, "{f}");
                faults.push(f);
            }
        }
    }
    parents.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((parents, faults))
}

/// The fault of registered parent `name`, read on its own as [`read_parents`] reads it; `None` when it
/// reads, is not registered, or went away meanwhile.
pub(super) fn parent_fault(host: &dyn Host, name: &str) -> Option<DeviceFault> {
    let dir = paths::mdev_parent(name);
    if !host.exists(&dir) {
        return None;
    }
    match classify(
        host,
        FaultScope::MdevParent,
        name,
        &dir,
        read_parent(host, name, &dir),
    ) {
        Outcome::Faulted(f) => Some(f),
        Outcome::Read(_) | Outcome::Gone => None,
    }
}

fn read_parent(host: &dyn Host, name: &str, dir: &Path) -> Result<MdevParent, DiscoverError> {
    let mut types = Vec::new();
    for ty in host.list_optional(&dir.join("mdev_supported_types"))? {
        let tdir = dir.join("mdev_supported_types").join(&ty);
        let id: MdevTypeId = ty
            .parse()
            .map_err(|_| malformed(&tdir, &ty, "an mdev type directory name such as nvidia-231"))?;
        let description = host.read_optional(&tdir.join("description"))?;
        let mut instances = Vec::new();
        for u in host.list_optional(&tdir.join("devices"))? {
            // Not a device the kernel made (its names are UUIDs: drivers/vfio/mdev/mdev_sysfs.c
            // `create_store`): skipped, as mdevctl skips it (src/environment.rs, "Can't determine
            // uuid for file").
            let Ok(uuid) = u.parse::<MdevUuid>() else {
                warn!(entry = %tdir.join("devices").join(&u).display(), "ignoring an mdev type's devices entry that is not a UUID");
                continue;
            };
            instances.push(uuid);
        }
        instances.sort();
        types.push(MdevType {
            id,
            name: host.read_optional(&tdir.join("name"))?,
            details: parse::parse_type_description(description.as_deref()),
            description,
            device_api: host.read_trimmed(&tdir.join("device_api"))?,
            available_instances: attr(host, &tdir.join("available_instances"), parse::parse_u32)?,
            instances,
        });
    }
    types.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(MdevParent {
        pci: name.parse::<PciAddress>().ok(),
        driver: host.link_name(&dir.join("driver"))?,
        name: name.to_string(),
        types,
    })
}

/// Reads every instance under `/sys/bus/mdev/devices`, each on its own (see [`read_parents`]).
pub(super) fn read_instances(
    host: &dyn Host,
) -> Result<(Vec<MdevInstance>, Vec<DeviceFault>), DiscoverError> {
    let mut out = Vec::new();
    let mut faults = Vec::new();
    for name in host.list_optional(Path::new(paths::MDEV_DEVICES))? {
        let dir = Path::new(paths::MDEV_DEVICES).join(&name);
        // The kernel names every mdev by its UUID; anything else here is skipped with a warning, as
        // mdevctl skips it (src/environment.rs `get_active_devices`), so one stray entry does not
        // hide every other device.
        let Ok(uuid) = name.parse::<MdevUuid>() else {
            warn!(entry = %dir.display(), "ignoring a /sys/bus/mdev/devices entry that is not an mdev UUID");
            continue;
        };
        match classify(
            host,
            FaultScope::MdevInstance,
            &name,
            &dir,
            read_instance(host, uuid, &dir),
        ) {
            Outcome::Read(Some(i)) => out.push(i),
            Outcome::Read(None) | Outcome::Gone => {
                debug!(%uuid, "mdev instance disappeared during discovery");
            }
            Outcome::Faulted(f) => {
                warn!(%uuid, "{f}");
                faults.push(f);
            }
        }
    }
    out.sort_by_key(|a| a.uuid);
    Ok((out, faults))
}

/// Reads one instance; `None` when it is being removed.
fn read_instance(
    host: &dyn Host,
    uuid: MdevUuid,
    dir: &Path,
) -> Result<Option<MdevInstance>, DiscoverError> {
    // `mdev_type` resolves to …/<parent>/mdev_supported_types/<type>. An instance being removed
    // while we walk is skipped, like a PCI device that disappears.
    let type_dir = match host.canonicalize(&dir.join("mdev_type")) {
        Ok(d) => d,
        // The kernel removes the `mdev_type` link before the directory itself during teardown.
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let comps: Vec<String> = type_dir
        .components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect();
    let (parent, type_id) = match comps.as_slice() {
        [.., parent, mst, ty] if mst == "mdev_supported_types" => (parent.clone(), ty.clone()),
        _ => {
            return Err(malformed(
                &dir.join("mdev_type"),
                &type_dir.to_string_lossy(),
                "a link to <parent>/mdev_supported_types/<type>",
            ));
        }
    };
    let group = match host.link_name(&dir.join("iommu_group"))? {
        Some(g) => Some(
            g.parse::<IommuGroup>()
                .map_err(|_| malformed(&dir.join("iommu_group"), &g, "a link to an IOMMU group"))?,
        ),
        None => None,
    };
    Ok(Some(MdevInstance {
        uuid,
        parent,
        type_id: type_id
            .parse()
            .map_err(|_| malformed(&dir.join("mdev_type"), &type_id, "an mdev type id"))?,
        iommu_group: group,
        driver: host.link_name(&dir.join("driver"))?,
    }))
}
