//! Discovery on a tree with entries the kernel never makes: a name that is not a UUID under
//! `/sys/bus/mdev/devices` or under a type's `devices` (a stray file, a test tree). mdevctl skips such
//! an entry with a warning (src/environment.rs, "Can't determine uuid for file"); discovery does the
//! same, so one stray name does not stop vgpud from starting.
#![allow(clippy::unwrap_used)]
use std::path::Path;

use vgpu_host::SysfsHost;
use vgpu_host::discover::discover;
use vgpu_sim::SimHost;

/// The demo host with one running mdev, written out as a real tree below `root`.
fn demo_tree(root: &Path) -> (String, std::path::PathBuf) {
    let sim = SimHost::builtin("demo").unwrap();
    sim.materialize(root).unwrap();
    let devices = root.join("sys/bus/mdev/devices");
    let first = std::fs::read_dir(&devices)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .min()
        .expect("the demo host has a running mdev");
    let type_dir = std::fs::canonicalize(devices.join(&first).join("mdev_type")).unwrap();
    (first, type_dir)
}

#[test]
fn non_uuid_entries_are_skipped_and_the_rest_is_read() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, type_dir) = demo_tree(tmp.path());
    let before = discover(&SysfsHost::new(tmp.path()).unwrap()).unwrap();
    std::fs::create_dir(tmp.path().join("sys/bus/mdev/devices/invalid-uuid-value")).unwrap();
    std::fs::create_dir_all(type_dir.join("devices/not-a-uuid")).unwrap();
    let after = discover(&SysfsHost::new(tmp.path()).unwrap()).unwrap();
    assert_eq!(after.mdev_instances, before.mdev_instances);
    assert_eq!(after.mdev_parents, before.mdev_parents);
    assert!(
        after
            .mdev_instances
            .iter()
            .any(|i| i.uuid.to_string() == first),
        "the real device {first} is still listed: {:?}",
        after.mdev_instances
    );
}
