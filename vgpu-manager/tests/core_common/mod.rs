//! Shared by the tests that drive the daemon core directly: opening a core on a simulated host, a
//! host whose writes of one sysfs file take their time, and a migration source's fingerprint.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use vgpu_host::ops::create_mdev;
use vgpu_host::{Host, HostError};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::migration::{Fingerprint, fingerprint};
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

/// A core over `host` (the simulated kernel, or a host wrapped around it) with its state in `dir` and
/// the built-in profiles.
pub fn open<H: Host + 'static>(host: &Arc<H>, dir: &Path) -> Core {
    Core::open(
        host.clone() as Arc<dyn Host>,
        dir,
        Catalog::builtin().unwrap(),
    )
    .unwrap()
}

/// A simulated host on which every write of a file named `file` (`create`, `remove`) waits `before`
/// it reaches the simulated kernel and `after` once it did (the kernel's uevent is out by then):
/// time for a daemon thread to look at the device in between.
#[derive(Debug)]
pub struct SlowWrites {
    /// The kernel behind it.
    pub sim: Arc<SimHost>,
    /// The file name whose writes are slow.
    pub file: &'static str,
    /// The wait before such a write.
    pub before: Duration,
    /// The wait after it.
    pub after: Duration,
}

impl Host for SlowWrites {
    fn read(&self, path: &Path) -> Result<String, HostError> {
        self.sim.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
        let slow = path.ends_with(self.file);
        if slow {
            std::thread::sleep(self.before);
        }
        let r = self.sim.write(path, value);
        if slow {
            std::thread::sleep(self.after);
        }
        r
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
        self.sim.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.sim.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
        self.sim.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.sim.exists(path)
    }
    fn describe(&self) -> String {
        self.sim.describe()
    }
}

/// The fingerprint of an NVIDIA instance made on a demo host of its own (a migration source).
pub fn source_fingerprint() -> Fingerprint {
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
