//! The reaper of incoming migration targets and a target being made: on a host whose mdev creates
//! take longer than the reaper's period, the record written before the create must survive it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use vgpu_host::Host;
use vgpu_host::ops::create_mdev;
use vgpu_manager::daemon::api::{CompleteIncoming, PrepareIncoming};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::migration::{Fingerprint, fingerprint};
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

/// The demo host, where every mdev `create` write waits 2.5 s before the device appears (the
/// reaper looks every second).
#[derive(Debug)]
struct SlowCreate(Arc<SimHost>);

impl Host for SlowCreate {
    fn read(&self, path: &Path) -> Result<String, vgpu_host::HostError> {
        self.0.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), vgpu_host::HostError> {
        if path.ends_with("create") {
            std::thread::sleep(Duration::from_millis(2500));
        }
        self.0.write(path, value)
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, vgpu_host::HostError> {
        self.0.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        self.0.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        self.0.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.0.exists(path)
    }
    fn describe(&self) -> String {
        self.0.describe()
    }
}

/// The fingerprint of an NVIDIA instance made on another demo host.
fn source_fingerprint() -> Fingerprint {
    let sim = SimHost::builtin("demo").unwrap();
    let inv = vgpu_host::discover::discover(&sim).unwrap();
    let (parent, ty) = inv
        .mdev_parents
        .iter()
        .find_map(|p| {
            let t = p
                .types
                .iter()
                .find(|t| t.id.as_str().starts_with("nvidia-") && t.available_instances >= 2)?;
            Some((p.name.clone(), t.id.clone()))
        })
        .expect("the demo host has an NVIDIA type with room");
    let src = "9e8d7c6b-5a49-4382-9170-6f5e4d3c2b1a".parse().unwrap();
    create_mdev(&sim, &parent, &ty, &src).unwrap();
    fingerprint(&sim, &src).unwrap()
}

#[test]
fn a_target_whose_create_outlasts_a_reaper_round_is_still_incoming() {
    let sim = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = Core::open(
        Arc::new(SlowCreate(sim)) as Arc<dyn Host>,
        dir.path(),
        Catalog::builtin().unwrap(),
    )
    .unwrap();
    let made = core
        .execute(PrepareIncoming {
            fingerprint: source_fingerprint(),
            gpu: None,
            uuid: None,
            timeout: Duration::from_secs(600),
            numa_node: None,
        })
        .unwrap();
    // A reaper round after the create, too.
    std::thread::sleep(Duration::from_millis(1500));
    core.execute(CompleteIncoming { uuid: made.uuid })
        .expect("the target is still an incoming migration target");
}
