//! The instance events of a pool apply, read from the core's event stream on the simulated demo
//! host: each step announces each slot it changed once, with its view after the step, before the
//! step's progress event; commands outside a pool keep one event per change.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use core_common::{SlowWrites, open};

use mdev_types::ids::MdevUuid;
use tokio::sync::broadcast::Receiver;
use vgpu_host::Host;
use vgpu_manager::daemon::api::{
    ApplyPool, DefineInstance, Event, GetPoolStatus, InstanceSpec, InstanceState, InstanceTarget,
    ListInstances, StartInstance,
};
use vgpu_manager::daemon::engine::{Core, FinishedApply};
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

fn pool(desktops: u32, workstations: u32) -> String {
    let mut profiles = String::new();
    for (name, n) in [("vdi-2g", desktops), ("workstation-4g", workstations)] {
        if n > 0 {
            profiles.push_str(&format!("{name} = {n}\n"));
        }
    }
    format!(
        "name = \"ev\"\nautostart = true\n\n[profiles]\n{profiles}\n[select]\nmodels = [\"NVIDIA T4\"]\n"
    )
}

/// Every event already sent.
fn drain(events: &mut Receiver<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(e) = events.try_recv() {
        out.push(e);
    }
    out
}

/// What a subscriber that applies `events` in order ends up knowing.
fn known_after(events: &[Event]) -> BTreeMap<MdevUuid, InstanceState> {
    known_from(BTreeMap::new(), events)
}

/// What a subscriber that knew `known` and then applies `events` in order ends up knowing.
fn known_from(
    mut known: BTreeMap<MdevUuid, InstanceState>,
    events: &[Event],
) -> BTreeMap<MdevUuid, InstanceState> {
    for e in events {
        match e {
            Event::InstanceAdded(v) | Event::InstanceChanged(v) => {
                known.insert(v.uuid, v.state);
            }
            Event::InstanceRemoved(u) => {
                known.remove(u);
            }
            Event::PoolProgress { .. } => {}
        }
    }
    known
}

#[test]
fn a_pool_apply_announces_each_slot_once_with_its_state_after_the_step() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let before = core.execute(ListInstances).unwrap();
    let mut events = core.subscribe();

    let grown = core.execute(ApplyPool { toml: pool(6, 2) }).unwrap();
    assert_eq!(grown.created.len(), 8, "{grown:?}");
    let seen = drain(&mut events);
    // One InstanceAdded per slot, already running and serving its profile, then the step's
    // progress; no separate "defined, stopped" announcement and no start after it.
    let mut added = 0;
    let mut last_was_added = false;
    for e in &seen {
        match e {
            Event::InstanceAdded(v) => {
                assert_eq!(v.state, InstanceState::Running, "{v:?}");
                assert!(v.profile.is_some(), "{v:?}");
                assert!(v.defined && v.autostart, "{v:?}");
                added += 1;
                last_was_added = true;
            }
            Event::PoolProgress { done, total, .. } => {
                assert!(
                    last_was_added,
                    "step {done}/{total} reported before its slot was announced: {seen:?}"
                );
                last_was_added = false;
            }
            other => panic!("a create step sent {other:?}; all events: {seen:?}"),
        }
    }
    assert_eq!(added, 8, "{seen:?}");
    // A subscriber knows exactly what the core lists.
    let listed: BTreeMap<MdevUuid, InstanceState> = core
        .execute(ListInstances)
        .unwrap()
        .into_iter()
        .filter(|v| !before.iter().any(|b| b.uuid == v.uuid))
        .map(|v| (v.uuid, v.state))
        .collect();
    assert_eq!(known_after(&seen), listed);

    // Nothing to do: no event at all.
    core.execute(ApplyPool { toml: pool(6, 2) }).unwrap();
    assert!(drain(&mut events).is_empty());

    // A shrink: each removed slot goes in one InstanceRemoved (its stop is not announced apart).
    let shrunk = core.execute(ApplyPool { toml: pool(1, 0) }).unwrap();
    assert_eq!(shrunk.removed.len(), 7, "{shrunk:?}");
    let seen = drain(&mut events);
    let removed: Vec<MdevUuid> = seen
        .iter()
        .filter_map(|e| match e {
            Event::InstanceRemoved(u) => Some(*u),
            Event::PoolProgress { .. } => None,
            other => panic!("a remove step sent {other:?}; all events: {seen:?}"),
        })
        .collect();
    assert_eq!(removed.len(), 7, "{seen:?}");
    let progress = seen
        .iter()
        .filter(|e| matches!(e, Event::PoolProgress { .. }))
        .count();
    assert_eq!(progress, 7, "{seen:?}");
}

#[test]
fn commands_outside_a_pool_still_announce_every_change() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let mut events = core.subscribe();
    let v = core
        .execute(DefineInstance(InstanceSpec {
            target: InstanceTarget::Profile("vdi-2g".into()),
            gpu: None,
            uuid: None,
            autostart: false,
            label: None,
            attrs: Vec::new(),
        }))
        .unwrap();
    core.execute(StartInstance { uuid: v.uuid }).unwrap();
    let seen = drain(&mut events);
    assert!(
        matches!(&seen[..], [Event::InstanceAdded(a), Event::InstanceChanged(b)]
            if a.state == InstanceState::Stopped && b.state == InstanceState::Running),
        "{seen:?}"
    );
}

#[test]
fn an_in_progress_record_left_after_the_pool_was_recorded_is_dropped_at_the_next_start() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    core.execute(ApplyPool { toml: pool(3, 1) }).unwrap();
    drop(core);
    // What a kill between recording the pool and removing its in-progress record leaves.
    let applying = dir.path().join("applying");
    std::fs::create_dir_all(&applying).unwrap();
    std::fs::copy(dir.path().join("pools/ev.toml"), applying.join("ev.toml")).unwrap();

    let core = open(&host, dir.path());
    let finished = core.finish_interrupted_applies();
    assert!(
        matches!(&finished[..], [FinishedApply::Applied { pool, steps: 0 }] if pool == "ev"),
        "{finished:?}"
    );
    assert!(
        !applying.join("ev.toml").exists(),
        "the in-progress record is still there: every start would apply the pool again"
    );
    drop(core);
    let core = open(&host, dir.path());
    assert!(core.finish_interrupted_applies().is_empty());
}

#[test]
fn the_kernel_event_of_a_slot_being_removed_does_not_announce_it_stopped_first() {
    let sim = Arc::new(SimHost::builtin("demo").unwrap());
    let uevents = sim.subscribe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let core = Arc::new(
        Core::open(
            // Every removal lingers after its uevent: time for the uevent thread to look.
            Arc::new(SlowWrites {
                sim: sim.clone(),
                file: "remove",
                before: Duration::ZERO,
                after: Duration::from_millis(50),
            }) as Arc<dyn Host>,
            dir.path(),
            Catalog::builtin().unwrap(),
        )
        .unwrap(),
    );
    core.execute(ApplyPool { toml: pool(3, 0) }).unwrap();
    while uevents.try_recv().is_ok() {}
    // The daemon's uevent thread, handling each event as it comes.
    let forwarder = {
        let core = Arc::clone(&core);
        std::thread::spawn(move || {
            let mut handled = 0;
            while let Ok(ev) = uevents.recv_timeout(Duration::from_secs(2)) {
                core.handle_uevent(&ev);
                handled += 1;
            }
            handled
        })
    };
    let mut events = core.subscribe();
    let shrunk = core.execute(ApplyPool { toml: pool(1, 0) }).unwrap();
    assert_eq!(shrunk.removed.len(), 2, "{shrunk:?}");
    let handled = forwarder.join().unwrap();
    assert!(handled >= 2, "the removals sent {handled} kernel events");
    let seen = drain(&mut events);
    let changed: Vec<&Event> = seen
        .iter()
        .filter(|e| matches!(e, Event::InstanceChanged(_)))
        .collect();
    assert!(changed.is_empty(), "{changed:?} in {seen:?}");
    assert_eq!(
        seen.iter()
            .filter(|e| matches!(e, Event::InstanceRemoved(_)))
            .count(),
        2,
        "{seen:?}"
    );
}

/// A simulated host on whose kernel the `refuse`-th write of a file named `file` (`create`,
/// `remove`; counting from 1) meets someone else's doing ([`Meddle`]).
#[derive(Debug)]
struct Refuses {
    sim: Arc<SimHost>,
    file: &'static str,
    refuse: usize,
    /// The writes of `file` so far.
    writes: std::sync::atomic::AtomicUsize,
    /// What meets that write.
    meddle: Meddle,
}

/// What meets the chosen write.
#[derive(Debug)]
enum Meddle {
    /// The kernel refuses it with `ENOSPC` (a `create`) or `EBUSY` (a `remove`), as a GPU whose
    /// memory ran out between the plan and the create, or a device still in use, does.
    Refuse,
    /// Another tool removes these devices just before it, which then goes through.
    RemoveFirst(std::sync::Mutex<Vec<MdevUuid>>),
}

impl Host for Refuses {
    fn read(&self, path: &std::path::Path) -> Result<String, vgpu_host::HostError> {
        self.sim.read(path)
    }
    fn write(&self, path: &std::path::Path, value: &str) -> Result<(), vgpu_host::HostError> {
        if path.ends_with(self.file) {
            let n = self
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
                + 1;
            if n == self.refuse
                && let Meddle::RemoveFirst(others) = &self.meddle
            {
                for uuid in others.lock().unwrap().drain(..) {
                    vgpu_host::ops::remove_mdev(self.sim.as_ref(), &uuid).unwrap();
                }
            } else if n == self.refuse {
                let errno = if self.file == "create" {
                    nix::errno::Errno::ENOSPC
                } else {
                    nix::errno::Errno::EBUSY
                };
                return Err(vgpu_host::HostError::write(path, value, errno));
            }
        }
        self.sim.write(path, value)
    }
    fn list(&self, path: &std::path::Path) -> Result<Vec<String>, vgpu_host::HostError> {
        self.sim.list(path)
    }
    fn read_link(
        &self,
        path: &std::path::Path,
    ) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        self.sim.read_link(path)
    }
    fn canonicalize(
        &self,
        path: &std::path::Path,
    ) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        self.sim.canonicalize(path)
    }
    fn exists(&self, path: &std::path::Path) -> bool {
        self.sim.exists(path)
    }
    fn describe(&self) -> String {
        self.sim.describe()
    }
}

/// A core on the demo host whose kernel refuses the `refuse`-th write of `file` ([`Refuses`]), with
/// the simulated kernel and the state directory.
fn refusing(file: &'static str, refuse: usize) -> (Arc<SimHost>, tempfile::TempDir, Core) {
    let sim = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let host = Arc::new(Refuses {
        sim: sim.clone(),
        file,
        refuse,
        writes: Default::default(),
        meddle: Meddle::Refuse,
    });
    let core = Core::open(
        host as Arc<dyn Host>,
        dir.path(),
        Catalog::builtin().unwrap(),
    )
    .unwrap();
    (sim, dir, core)
}

#[test]
fn a_create_the_kernel_refuses_in_a_run_of_slots_undoes_the_apply_and_names_that_slot() {
    let (sim, dir, core) = refusing("create", 4);
    let before = core.execute(ListInstances).unwrap();
    let mut events = core.subscribe();
    let err = core.execute(ApplyPool { toml: pool(6, 0) }).unwrap_err();
    let msg = err.to_string();
    // The kind is the cause's: the kernel refused.
    assert_eq!(err.kind(), "Kernel", "{msg}");
    // The fourth slot's create is step 4 of 6, and the kernel's words are kept.
    assert!(msg.contains("step 4/6"), "{msg}");
    assert!(msg.contains("create vdi-2g/3"), "{msg}");
    assert!(msg.to_lowercase().contains("no space"), "{msg}");
    // Nothing is left: no device, no definition, no ledger entry (a restart finds nothing either).
    assert_eq!(core.execute(ListInstances).unwrap(), before);
    let seen = drain(&mut events);
    assert_eq!(
        known_after(&seen),
        BTreeMap::new(),
        "a subscriber still knows of slots: {seen:?}"
    );
    drop(core);
    let core = open(&sim, dir.path());
    // (A foreign device's first-seen time is the new core's own.)
    let uuids = |v: Vec<vgpu_manager::daemon::api::InstanceView>| -> Vec<MdevUuid> {
        v.into_iter().map(|v| v.uuid).collect()
    };
    assert_eq!(
        uuids(core.execute(ListInstances).unwrap()),
        uuids(before.clone())
    );
    assert!(core.finish_interrupted_applies().is_empty());
    let definitions = std::fs::read_dir(dir.path().join("definitions")).unwrap();
    assert_eq!(definitions.count(), 0);
}

#[test]
fn a_removal_the_kernel_refuses_in_a_run_of_slots_brings_back_the_ones_removed() {
    // Slot 3 of the shrink below (the third removal) is busy.
    let (_sim, _dir, core) = refusing("remove", 3);
    core.execute(ApplyPool { toml: pool(6, 0) }).unwrap();
    let before = core.execute(ListInstances).unwrap();
    let mut events = core.subscribe();
    let err = core.execute(ApplyPool { toml: pool(1, 0) }).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("step 3/5"), "{msg}");
    assert!(msg.contains("remove vdi-2g/3"), "{msg}");
    assert!(msg.contains("EBUSY"), "{msg}");
    // The two slots removed before it are back, running, as they were.
    let states =
        |v: Vec<vgpu_manager::daemon::api::InstanceView>| -> BTreeMap<MdevUuid, InstanceState> {
            v.into_iter().map(|v| (v.uuid, v.state)).collect()
        };
    let after = core.execute(ListInstances).unwrap();
    assert_eq!(states(after.clone()), states(before.clone()));
    for v in &after {
        let old = before.iter().find(|b| b.uuid == v.uuid).unwrap();
        assert_eq!(
            (&v.label, &v.profile, v.autostart, v.defined),
            (&old.label, &old.profile, old.autostart, old.defined)
        );
    }
    // A subscriber that followed the events knows what is listed.
    let seen = drain(&mut events);
    assert_eq!(known_from(states(before), &seen), states(after), "{seen:?}");
    // The same shrink goes through once the device is free.
    let shrunk = core.execute(ApplyPool { toml: pool(1, 0) }).unwrap();
    assert_eq!(shrunk.removed.len(), 5, "{shrunk:?}");
}

#[test]
fn slots_whose_devices_another_tool_removed_during_a_shrink_are_forgotten_and_the_shrink_goes_on() {
    let sim = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let host = Arc::new(Refuses {
        sim: sim.clone(),
        file: "remove",
        refuse: 1,
        writes: Default::default(),
        meddle: Meddle::RemoveFirst(Default::default()),
    });
    let core = open(&host, dir.path());
    core.execute(ApplyPool { toml: pool(6, 0) }).unwrap();
    let slot = |v: &vgpu_manager::daemon::api::InstanceView, k: u32| {
        v.label.as_deref() == Some(&format!("pool:ev/vdi-2g/{k}"))
    };
    let listed = core.execute(ListInstances).unwrap();
    let doomed: Vec<MdevUuid> = listed
        .iter()
        .filter(|v| (1..6).any(|k| slot(v, k)))
        .map(|v| v.uuid)
        .collect();
    assert_eq!(doomed.len(), 5, "{listed:?}");
    // While the shrink removes its first slot, another tool removes the devices of all five it
    // removes: the shrink's read of the host saw them, and its removals find them gone.
    let Meddle::RemoveFirst(others) = &host.meddle else {
        unreachable!()
    };
    *others.lock().unwrap() = doomed.clone();
    let shrunk = core.execute(ApplyPool { toml: pool(1, 0) }).unwrap();
    assert_eq!(shrunk.removed.len(), 5, "{shrunk:?}");
    // The five are forgotten; slot 0 runs as before.
    let after = core.execute(ListInstances).unwrap();
    assert!(after.iter().all(|v| !doomed.contains(&v.uuid)), "{after:?}");
    let kept: Vec<_> = after.iter().filter(|v| slot(v, 0)).collect();
    assert_eq!(kept.len(), 1, "{after:?}");
    assert_eq!(kept[0].state, InstanceState::Running);
    assert_eq!(
        std::fs::read_dir(dir.path().join("definitions"))
            .unwrap()
            .count(),
        1
    );
    assert!(core.finish_interrupted_applies().is_empty());
}

#[test]
fn an_apply_summary_shows_what_the_pool_status_shows_after_it() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    // Grown, applied again with nothing to do, shrunk: each summary (from the inventory read for
    // the plan when no step changed a PCI device) equals the status read afresh afterwards.
    for (what, toml) in [
        ("grow", pool(4, 1)),
        ("nothing to do", pool(4, 1)),
        ("shrink", pool(1, 0)),
    ] {
        let summary = core.execute(ApplyPool { toml }).unwrap();
        let status = core.execute(GetPoolStatus).unwrap();
        let ev = status.iter().find(|s| s.pool == "ev").expect("pool ev");
        assert_eq!(summary.slots, ev.slots, "{what}: slots");
        assert_eq!(summary.gpus, ev.gpus, "{what}: GPUs");
        assert!(summary.slots.iter().all(|s| s.state == "running"), "{what}");
    }
}
