//! Instance views: what clients see, derived from the store (definitions, ledger) and the host, kept in
//! a cache so listing never walks sysfs. Every change to the cache emits the matching [`Event`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Host, HostExt, paths};

use super::instances::Instances;
use super::lock;
use crate::daemon::api::{Event, InstanceState, InstanceView, Ownership};
use crate::daemon::store::{StateDir, unix_now};

/// Parent and type of an existing device, from two links: the bus's link to the device, whose directory
/// sits in its parent's (drivers/vfio/mdev/mdev_core.c: `mdev->dev.parent = parent->dev`), and the
/// device's `mdev_type` link into that parent's `mdev_supported_types/<type>` (mdev_sysfs.c). Two
/// readlinks rather than resolving every component of the path: this runs after every create and for
/// every instance at start.
pub(super) fn device_identity(host: &dyn Host, uuid: &MdevUuid) -> Option<(String, MdevTypeId)> {
    let dev = paths::mdev_device(uuid);
    let place = host.read_link(&dev).ok()?;
    let parent = normal_name(place.parent()?.file_name())?;
    let type_link = host.read_link(&dev.join("mdev_type")).ok()?;
    let ty = normal_name(type_link.file_name())?;
    if normal_name(type_link.parent()?.file_name())? != "mdev_supported_types" {
        return None;
    }
    Some((parent, ty.parse().ok()?))
}

/// A link target's component as text, if it is a plain name (not `..`, not empty).
fn normal_name(name: Option<&std::ffi::OsStr>) -> Option<String> {
    let name = name?.to_str()?;
    (!name.is_empty() && name != "..").then(|| name.to_string())
}

impl Instances {
    /// Computes the view of one UUID from the store and the host; `None` when nothing of it exists.
    fn compute_view(
        &self,
        store: &StateDir,
        uuid: &MdevUuid,
        first_seen: Option<u64>,
    ) -> Option<InstanceView> {
        let def = store.get_definition(uuid);
        let led = store.get_ledger(uuid);
        let device = device_identity(self.host.as_ref(), uuid);
        let running = device.is_some();
        let (parent, type_id) = match (&device, def, led) {
            (Some((p, t)), _, _) => (p.clone(), t.clone()),
            (None, Some(d), _) => (d.parent.clone(), d.type_id.clone()),
            // A ledger entry without device or definition is stale: reconcile drops it.
            (None, None, _) => return None,
        };
        let ownership = match (led, running) {
            (Some(l), _) => l.ownership.into(),
            (None, true) => Ownership::Foreign,
            (None, false) => Ownership::Daemon,
        };
        let state = if running {
            InstanceState::Running
        } else if def.is_some_and(|d| d.autostart) && !self.parent_exists(&parent) {
            InstanceState::WaitingForParent
        } else {
            InstanceState::Stopped
        };
        Some(InstanceView {
            uuid: *uuid,
            gpu: def
                .map(|d| d.gpu.clone())
                .or_else(|| led.and_then(|l| l.gpu.clone()))
                .unwrap_or_else(|| parent.clone()),
            parent,
            type_id,
            profile: def
                .and_then(|d| d.profile.clone())
                .or_else(|| led.and_then(|l| l.profile.clone())),
            state,
            defined: def.is_some(),
            autostart: def.is_some_and(|d| d.autostart),
            ownership,
            label: def
                .and_then(|d| d.label.clone())
                .or_else(|| led.and_then(|l| l.label.clone())),
            iommu_group: if running { self.read_group(uuid) } else { None },
            created_at: def
                .map(|d| d.created_at)
                .or_else(|| led.map(|l| l.created_at))
                .or(first_seen)
                .unwrap_or_else(unix_now),
            attrs: def.map(|d| d.attrs.clone()).unwrap_or_default(),
        })
    }

    /// Recomputes one instance's view and emits what changed.
    ///
    /// The store stays locked from computing the view until it is stored and its event sent: the
    /// uevent thread refreshes concurrently with commands, and a view computed from an older state
    /// must not overwrite a newer one (a destroyed instance listed as running again).
    pub(super) fn refresh_one(&self, uuid: &MdevUuid) -> Option<InstanceView> {
        let store = lock(&self.store);
        let first_seen = lock(&self.views).get(uuid).map(|v| v.created_at);
        let new = self.compute_view(&store, uuid, first_seen);
        let mut views = lock(&self.views);
        let old = match &new {
            Some(v) => views.insert(*uuid, v.clone()),
            None => views.remove(uuid),
        };
        drop(views);
        self.emit_diff(old, new.clone(), uuid);
        drop(store);
        new
    }

    /// Recomputes every view (after start-up, reconcile or a kernel event).
    pub(super) fn refresh_all(&self) {
        let mut uuids: BTreeSet<MdevUuid> = BTreeSet::new();
        for name in self
            .host
            .list_optional(Path::new(paths::MDEV_DEVICES))
            .unwrap_or_default()
        {
            if let Ok(u) = name.parse() {
                uuids.insert(u);
            }
        }
        // As in `refresh_one`, the store stays locked until the views are replaced and the events
        // sent, so a concurrent command's newer view is never overwritten by this snapshot.
        let store = lock(&self.store);
        uuids.extend(store.definitions().map(|d| d.uuid));
        uuids.extend(store.ledger().map(|l| l.uuid));
        let mut views = lock(&self.views);
        let new: BTreeMap<MdevUuid, InstanceView> = uuids
            .iter()
            .filter_map(|u| {
                self.compute_view(&store, u, views.get(u).map(|v| v.created_at))
                    .map(|v| (*u, v))
            })
            .collect();
        let old = std::mem::replace(&mut *views, new.clone());
        drop(views);
        let all: BTreeSet<&MdevUuid> = old.keys().chain(new.keys()).collect();
        for u in all {
            self.emit_diff(old.get(u).cloned(), new.get(u).cloned(), u);
        }
        drop(store);
    }

    /// Emits the event of one view change; called after the view itself was replaced.
    fn emit_diff(&self, old: Option<InstanceView>, new: Option<InstanceView>, uuid: &MdevUuid) {
        let ev = match (old, new) {
            (None, Some(n)) => Event::InstanceAdded(n),
            (Some(_), None) => Event::InstanceRemoved(*uuid),
            (Some(o), Some(n)) if o != n => Event::InstanceChanged(n),
            _ => return,
        };
        self.views_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // No receiver is fine: nobody listens yet.
        let _ = self.events.send(ev);
    }
}
