//! Instance views: what clients see, derived from the store (definitions, ledger) and the host, kept in
//! a cache so listing never walks sysfs. Every change to the cache emits the matching [`Event`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::thread::ThreadId;

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

/// What the host shows of one mdev device: its parent, its type and, while a driver has it, its
/// IOMMU group.
struct SeenDevice {
    parent: String,
    type_id: MdevTypeId,
    iommu_group: Option<u32>,
}

impl Instances {
    /// Computes the view of one UUID from the store and the host; `None` when nothing of it exists.
    fn compute_view(
        &self,
        store: &StateDir,
        uuid: &MdevUuid,
        first_seen: Option<u64>,
    ) -> Option<InstanceView> {
        self.view_of(store, uuid, first_seen, self.device_now(uuid))
    }

    /// Device `uuid` as the host shows it now (`None`: there is none).
    fn device_now(&self, uuid: &MdevUuid) -> Option<SeenDevice> {
        let (parent, type_id) = device_identity(self.host.as_ref(), uuid)?;
        Some(SeenDevice {
            parent,
            type_id,
            iommu_group: self.read_group(uuid),
        })
    }

    /// The view of one UUID from the store and what the host shows of its `device`.
    fn view_of(
        &self,
        store: &StateDir,
        uuid: &MdevUuid,
        first_seen: Option<u64>,
        device: Option<SeenDevice>,
    ) -> Option<InstanceView> {
        let def = store.get_definition(uuid);
        let led = store.get_ledger(uuid);
        let running = device.is_some();
        let iommu_group = device.as_ref().and_then(|d| d.iommu_group);
        let (parent, type_id) = match (device, def, led) {
            (Some(d), _, _) => (d.parent, d.type_id),
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
                .unwrap_or_else(|| self.gpu_of_parent(&parent)),
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
            iommu_group,
            created_at: def
                .map(|d| d.created_at)
                .or_else(|| led.map(|l| l.created_at))
                .or(first_seen)
                .unwrap_or_else(unix_now),
            attrs: def.map(|d| d.attrs.clone()).unwrap_or_default(),
        })
    }

    /// Recomputes one instance's view and emits what changed.
    pub(super) fn refresh_one(&self, uuid: &MdevUuid) -> Option<InstanceView> {
        self.refresh_with(uuid, || self.device_now(uuid))
    }

    /// [`Instances::refresh_one`] of a device this daemon just made with a write to `parent`'s
    /// `type_id` create file (the caller holds the parent's lock): the kernel made it there, so
    /// its parent and type are those, and only its IOMMU group is read back. A device that shows
    /// no group (gone again, or made without one) is read back whole.
    pub(super) fn refresh_made(
        &self,
        uuid: &MdevUuid,
        parent: &str,
        type_id: &MdevTypeId,
    ) -> Option<InstanceView> {
        self.refresh_with(uuid, || match self.read_group(uuid) {
            Some(group) => Some(SeenDevice {
                parent: parent.to_string(),
                type_id: type_id.clone(),
                iommu_group: Some(group),
            }),
            None => self.device_now(uuid),
        })
    }

    /// Recomputes one instance's view from the store and `read` (what the host shows of its
    /// device), stores it and emits what changed.
    ///
    /// The store stays locked from reading the host until the view is stored and its event sent:
    /// the uevent thread refreshes concurrently with commands, and a view computed from an older
    /// state must not overwrite a newer one (a destroyed instance listed as running again).
    fn refresh_with(
        &self,
        uuid: &MdevUuid,
        read: impl FnOnce() -> Option<SeenDevice>,
    ) -> Option<InstanceView> {
        let store = lock(&self.store);
        let first_seen = lock(&self.views).get(uuid).map(|v| v.created_at);
        let new = self.view_of(&store, uuid, first_seen, read());
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

    /// Emits the event of one view change; called after the view itself was replaced. On a thread
    /// that holds its events ([`Instances::hold_events`]) the change is noted instead, keeping the
    /// view from before the first change of the UUID.
    fn emit_diff(&self, old: Option<InstanceView>, new: Option<InstanceView>, uuid: &MdevUuid) {
        if old == new {
            return;
        }
        self.views_generation
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Some(held) = lock(&self.held).get_mut(&std::thread::current().id()) {
            held.entry(*uuid).or_insert(old);
            return;
        }
        self.send_diff(old, new, uuid);
    }

    /// Sends the event that takes a subscriber from `old` to `new`, if they differ.
    fn send_diff(&self, old: Option<InstanceView>, new: Option<InstanceView>, uuid: &MdevUuid) {
        let ev = match (old, new) {
            (None, Some(n)) => Event::InstanceAdded(n),
            (Some(_), None) => Event::InstanceRemoved(*uuid),
            (Some(o), Some(n)) if o != n => Event::InstanceChanged(n),
            _ => return,
        };
        self.events.send(ev);
    }

    /// Holds back the instance events of the changes this thread makes until the guard is
    /// dropped, then sends one event per UUID changed meanwhile, from its view before the first
    /// change to its view then: a pool step that defines and starts a slot announces one running
    /// instance, not a stopped one and then its start. Subscribers still learn every instance that
    /// came, went or changed, with its current view. Changes made on other threads (the uevent
    /// thread, other commands) are sent as they happen; the held ones, sent later under the store
    /// lock with the view current then, can never overtake them with an older view. Nested holds
    /// send at the outermost guard's drop.
    pub(super) fn hold_events(&self) -> EventHold<'_> {
        let mut held = lock(&self.held);
        let outermost = !held.contains_key(&std::thread::current().id());
        if outermost {
            held.insert(std::thread::current().id(), BTreeMap::new());
        }
        EventHold {
            instances: self,
            outermost,
        }
    }

    /// Sends the events held for this thread and stops holding them.
    fn release_events(&self) {
        // Locked in refresh_one's order (store, then views): no view change comes in between.
        let store = lock(&self.store);
        let held = lock(&self.held)
            .remove(&std::thread::current().id())
            .unwrap_or_default();
        let now: Vec<(MdevUuid, Option<InstanceView>, Option<InstanceView>)> = {
            let views = lock(&self.views);
            held.into_iter()
                .map(|(uuid, before)| (uuid, before, views.get(&uuid).cloned()))
                .collect()
        };
        for (uuid, before, after) in now {
            self.send_diff(before, after, &uuid);
        }
        drop(store);
    }
}

/// Per thread, the UUIDs whose events are held and each one's view before its first held change.
pub(super) type HeldEvents = HashMap<ThreadId, BTreeMap<MdevUuid, Option<InstanceView>>>;

/// Holds instance events back while it lives (see [`Instances::hold_events`]).
#[must_use = "events are held only while the guard lives"]
pub(super) struct EventHold<'a> {
    instances: &'a Instances,
    outermost: bool,
}

impl Drop for EventHold<'_> {
    fn drop(&mut self) {
        if self.outermost {
            self.instances.release_events();
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use vgpu_host::Host;
    use vgpu_sim::SimHost;

    use super::super::Core;
    use crate::daemon::api::{
        CreateInstance, DefineInstance, InstanceSpec, InstanceState, InstanceTarget,
    };
    use crate::profile::Catalog;

    fn spec(type_id: &str, parent: &str, label: Option<&str>) -> InstanceSpec {
        InstanceSpec {
            target: InstanceTarget::Type(type_id.parse().unwrap()),
            gpu: Some(parent.into()),
            uuid: None,
            autostart: true,
            label: label.map(str::to_string),
            attrs: Vec::new(),
        }
    }

    /// A core over the simulated `samples` host, with its state in a fresh directory.
    fn samples_core() -> (tempfile::TempDir, Core) {
        let host = Arc::new(SimHost::builtin("samples").unwrap());
        let dir = tempfile::tempdir().unwrap();
        let core = Core::open(
            host as Arc<dyn Host>,
            dir.path(),
            Catalog::builtin().unwrap(),
        )
        .unwrap();
        (dir, core)
    }

    /// The view a create reads back from the IOMMU group alone is the one a whole read of the
    /// device gives; for a UUID with no device it falls back to that whole read.
    #[test]
    fn a_made_device_reads_back_as_a_whole_read_shows_it() {
        let (_dir, core) = samples_core();
        let i = &core.instances;
        let made = core
            .execute(CreateInstance(spec("mtty-2", "mtty", Some("vm-1"))))
            .unwrap();
        assert_eq!(made.state, InstanceState::Running);
        assert!(made.iommu_group.is_some(), "{made:?}");
        let whole = i.refresh_one(&made.uuid).unwrap();
        assert_eq!(made, whole);
        let again = i
            .refresh_made(&made.uuid, &made.parent, &made.type_id)
            .unwrap();
        assert_eq!(again, whole);

        let defined = core
            .execute(DefineInstance(spec("mtty-1", "mtty", None)))
            .unwrap();
        assert_eq!(defined.state, InstanceState::Stopped);
        let read = i
            .refresh_made(&defined.uuid, &defined.parent, &defined.type_id)
            .unwrap();
        assert_eq!(
            read, defined,
            "no device: the whole read, not a running view"
        );
    }
}
