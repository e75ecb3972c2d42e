//! Reading mdev parents, their supported types and existing instances.

use std::collections::HashMap;
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

/// The parent and type whose `devices` directory lists each instance, from `parents` as
/// [`read_parents`] read them. The kernel makes an instance's entry there and its `mdev_type` link
/// together and removes them together (drivers/vfio/mdev/mdev_sysfs.c `mdev_create_sysfs_files`,
/// `mdev_remove_sysfs_files`), so a listed instance's identity needs no read of its own links.
pub(super) fn listed(parents: &[MdevParent]) -> HashMap<MdevUuid, (String, String)> {
    parents
        .iter()
        .flat_map(|p| {
            p.types.iter().flat_map(move |t| {
                t.instances
                    .iter()
                    .map(move |u| (*u, (p.name.clone(), t.id.to_string())))
            })
        })
        .collect()
}

/// Reads every instance under `/sys/bus/mdev/devices`, each on its own (see [`read_parents`]); the
/// parent and type of one that `listed` names are taken from there.
pub(super) fn read_instances(
    host: &dyn Host,
    listed: &HashMap<MdevUuid, (String, String)>,
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
            read_instance(host, uuid, &dir, listed.get(&uuid)),
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

/// Reads one instance, whose parent and type are `listed` when its type's `devices` directory
/// names it (see [`listed`]); `None` when it is being removed.
fn read_instance(
    host: &dyn Host,
    uuid: MdevUuid,
    dir: &Path,
    listed: Option<&(String, String)>,
) -> Result<Option<MdevInstance>, DiscoverError> {
    let (parent, type_id) = match listed {
        Some(found) => found.clone(),
        None => match identity_from_links(host, uuid, dir) {
            Ok(Some(found)) => found,
            // The kernel removes the `mdev_type` link before the directory itself during teardown.
            Err(e) if e.is_not_found() => return Ok(None),
            Ok(None) | Err(_) => match identity_resolved(host, dir)? {
                Some(found) => found,
                None => return Ok(None),
            },
        },
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

/// The parent and type of the mdev `uuid` in `dir`, from its two links as the kernel makes them: its
/// entry in `/sys/bus/mdev/devices` points to `…/<parent>/<uuid>`, and its `mdev_type` to
/// `../mdev_supported_types/<type>` (drivers/vfio/mdev/mdev_core.c puts the device below its parent;
/// mdev_sysfs.c links `mdev_type` to the type's directory in its parent's `mdev_supported_types`).
/// Two `readlink`s; resolving the whole path walks every component instead. `Ok(None)` when a link
/// reads otherwise (a tree that is not the kernel's): the caller resolves the path then.
fn identity_from_links(
    host: &dyn Host,
    uuid: MdevUuid,
    dir: &Path,
) -> Result<Option<(String, String)>, crate::HostError> {
    let type_link = host.read_link(&dir.join("mdev_type"))?;
    let device_link = host.read_link(dir)?;
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .map(str::to_string)
    };
    let (Some(type_id), Some(mst)) = (name(Some(&type_link)), name(type_link.parent())) else {
        return Ok(None);
    };
    let (Some(own), Some(parent)) = (name(Some(&device_link)), name(device_link.parent())) else {
        return Ok(None);
    };
    // Exactly `../mdev_supported_types/<type>`: the type is its own parent's.
    let shape: Vec<Component<'_>> = type_link.components().collect();
    let expected = shape.len() == 3
        && shape.first() == Some(&Component::ParentDir)
        && mst == "mdev_supported_types";
    let matches = own == uuid.to_string() && !parent.is_empty() && parent != "..";
    Ok((expected && matches).then_some((parent, type_id)))
}

/// [`identity_from_links`] by resolving `mdev_type` to `…/<parent>/mdev_supported_types/<type>`;
/// `None` when the instance is being removed while we walk (skipped, like a PCI device that
/// disappears).
fn identity_resolved(
    host: &dyn Host,
    dir: &Path,
) -> Result<Option<(String, String)>, DiscoverError> {
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
    match comps.as_slice() {
        [.., parent, mst, ty] if mst == "mdev_supported_types" => {
            Ok(Some((parent.clone(), ty.clone())))
        }
        _ => Err(malformed(
            &dir.join("mdev_type"),
            &type_dir.to_string_lossy(),
            "a link to <parent>/mdev_supported_types/<type>",
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::SysfsHost;

    const UUID: &str = "6d0c5a4e-7b1f-4c1e-9a55-766770757465";

    /// A tree with one mdev on `mbochs`, linked as the kernel links it, its `mdev_type` link
    /// pointing to `type_target`.
    fn tree(type_target: &str) -> (tempfile::TempDir, SysfsHost) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let parent = root.join("sys/devices/virtual/mbochs/mbochs");
        std::fs::create_dir_all(parent.join("mdev_supported_types/mbochs-small")).unwrap();
        std::fs::create_dir_all(parent.join(UUID)).unwrap();
        symlink(type_target, parent.join(UUID).join("mdev_type")).unwrap();
        let bus = root.join("sys/bus/mdev/devices");
        std::fs::create_dir_all(&bus).unwrap();
        symlink(
            format!("../../../devices/virtual/mbochs/mbochs/{UUID}"),
            bus.join(UUID),
        )
        .unwrap();
        let host = SysfsHost::new(root).unwrap();
        (dir, host)
    }

    fn device_dir() -> std::path::PathBuf {
        Path::new(paths::MDEV_DEVICES).join(UUID)
    }

    #[test]
    fn the_kernels_links_name_parent_and_type_as_resolving_them_does() {
        let (_d, host) = tree("../mdev_supported_types/mbochs-small");
        let uuid: MdevUuid = UUID.parse().unwrap();
        let fast = identity_from_links(&host, uuid, &device_dir()).unwrap();
        let resolved = identity_resolved(&host, &device_dir()).unwrap();
        assert_eq!(fast, Some(("mbochs".into(), "mbochs-small".into())));
        assert_eq!(fast, resolved);
        let i = read_instance(&host, uuid, &device_dir(), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (i.parent.as_str(), i.type_id.as_str()),
            ("mbochs", "mbochs-small")
        );
    }

    #[test]
    fn links_of_another_shape_are_resolved_instead() {
        // Not `../mdev_supported_types/<type>`: the links alone do not say; the walk does.
        let (_d, host) = tree("../../mbochs/mdev_supported_types/mbochs-small");
        let uuid: MdevUuid = UUID.parse().unwrap();
        assert_eq!(
            identity_from_links(&host, uuid, &device_dir()).unwrap(),
            None
        );
        let i = read_instance(&host, uuid, &device_dir(), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (i.parent.as_str(), i.type_id.as_str()),
            ("mbochs", "mbochs-small")
        );
        // A device link that names another UUID is not taken at its word either.
        let other: MdevUuid = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61".parse().unwrap();
        let (_d, host) = tree("../mdev_supported_types/mbochs-small");
        assert_eq!(
            identity_from_links(&host, other, &device_dir()).unwrap(),
            None
        );
    }

    #[test]
    fn an_instance_whose_type_link_is_gone_is_being_removed() {
        let (d, host) = tree("../mdev_supported_types/mbochs-small");
        std::fs::remove_file(
            d.path()
                .join("sys/devices/virtual/mbochs/mbochs")
                .join(UUID)
                .join("mdev_type"),
        )
        .unwrap();
        let uuid: MdevUuid = UUID.parse().unwrap();
        assert!(
            read_instance(&host, uuid, &device_dir(), None)
                .unwrap()
                .is_none()
        );
    }
}
