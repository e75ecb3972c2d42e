//! The kernel events of the core's own changes against those of changes made behind its back: the
//! `add`/`bind` and `unbind`/`remove` events a create's or a destroy's write sends describe what the
//! command already read back, and cost no read of the device; a device made or removed by someone
//! else is still read and shown.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Host, HostError, paths};
use vgpu_manager::daemon::api::{
    CoreError, CreateInstance, DestroyInstance, GetInstance, InstanceSpec, InstanceState,
    InstanceTarget, Ownership,
};
use vgpu_manager::daemon::engine::Core;
use vgpu_sim::SimHost;

use core_common::open;

const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";

/// The simulated kernel, counting the reads of anything below an mdev device's directory.
#[derive(Debug)]
struct Counting {
    sim: Arc<SimHost>,
    device_reads: AtomicUsize,
}

impl Counting {
    fn seen(&self, path: &Path) {
        if path.starts_with(paths::MDEV_DEVICES) {
            self.device_reads.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn take(&self) -> usize {
        self.device_reads.swap(0, Ordering::SeqCst)
    }
}

impl Host for Counting {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        self.seen(path);
        self.sim.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        self.sim.write(path, value)
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        self.seen(path);
        self.sim.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.seen(path);
        self.sim.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.seen(path);
        self.sim.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.seen(path);
        self.sim.exists(path)
    }
    fn describe(&self) -> String {
        self.sim.describe()
    }
}

fn create_on(core: &Core, parent: &str, type_id: &str) -> MdevUuid {
    core.execute(CreateInstance(InstanceSpec {
        target: InstanceTarget::Type(type_id.parse::<MdevTypeId>().unwrap()),
        gpu: Some(parent.into()),
        uuid: None,
        autostart: false,
        label: None,
        attrs: Vec::new(),
    }))
    .unwrap()
    .uuid
}

#[test]
fn the_events_of_the_cores_own_changes_read_nothing_and_foreign_changes_are_read() {
    let sim = Arc::new(SimHost::builtin("samples").unwrap());
    let events = sim.subscribe().unwrap();
    let host = Arc::new(Counting {
        sim: Arc::clone(&sim),
        device_reads: AtomicUsize::new(0),
    });
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    events.try_iter().for_each(drop);

    // The core's own create: its events (add, bind) describe the device it read back.
    let uuid = create_on(&core, "mtty", "mtty-1");
    let own: Vec<_> = events.try_iter().collect();
    assert!(
        own.iter().any(|e| e.action == "add"),
        "the simulated kernel sent no add for the create: {own:?}"
    );
    host.take();
    for ev in &own {
        core.handle_uevent(ev);
    }
    assert_eq!(host.take(), 0, "the create's own events read the device");
    let v = core.execute(GetInstance { uuid }).unwrap();
    assert_eq!(
        (v.state, v.ownership),
        (InstanceState::Running, Ownership::Daemon)
    );

    // The core's own destroy: its events (unbind, remove) describe a device the core knows is gone.
    core.execute(DestroyInstance { uuid }).unwrap();
    let own: Vec<_> = events.try_iter().collect();
    assert!(own.iter().any(|e| e.action == "remove"), "{own:?}");
    host.take();
    for ev in &own {
        core.handle_uevent(ev);
    }
    assert_eq!(host.take(), 0, "the destroy's own events read the device");
    assert!(matches!(
        core.execute(GetInstance { uuid }),
        Err(CoreError::NotFound { .. })
    ));

    // Someone else makes a device: read, and shown as foreign.
    let foreign: MdevUuid = FOREIGN.parse().unwrap();
    let create =
        paths::mdev_type_dir("mtty", &"mtty-1".parse::<MdevTypeId>().unwrap()).join("create");
    sim.write(&create, FOREIGN).unwrap();
    for ev in events.try_iter() {
        core.handle_uevent(&ev);
    }
    assert!(host.take() > 0, "the foreign device's events were not read");
    let v = core.execute(GetInstance { uuid: foreign }).unwrap();
    assert_eq!(
        (v.state, v.ownership),
        (InstanceState::Running, Ownership::Foreign)
    );

    // And removes one the core made, behind its back: read, and gone from the views.
    let mine = create_on(&core, "mtty", "mtty-1");
    events.try_iter().for_each(|ev| {
        core.handle_uevent(&ev);
    });
    sim.write(&paths::mdev_device(&mine).join("remove"), "1")
        .unwrap();
    for ev in events.try_iter() {
        core.handle_uevent(&ev);
    }
    assert!(
        !matches!(
            core.execute(GetInstance { uuid: mine }),
            Ok(v) if v.state == InstanceState::Running
        ),
        "a device removed behind the core's back is still shown running"
    );
}
