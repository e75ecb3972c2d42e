//! `materialize` writes a tree that `SysfsHost` reads exactly like the simulated host.

use std::path::Path;

use nix::errno::Errno;

use super::*;
use vgpu_host::SysfsHost;

/// Walks the simulated tree without following links and compares every entry with `real`.
/// Returns how many entries were compared.
fn compare(sim: &SimHost, real: &SysfsHost, dir: &Path) -> usize {
    let names = sim.list(dir).unwrap();
    assert_eq!(real.list(dir).unwrap(), names, "listing {}", dir.display());
    let mut n = 0;
    for name in names {
        let path = dir.join(&name);
        n += 1;
        match sim.read_link(&path) {
            Ok(target) => {
                assert_eq!(real.read_link(&path).unwrap(), target, "{}", path.display());
                assert_eq!(
                    real.canonicalize(&path).ok(),
                    sim.canonicalize(&path).ok(),
                    "{}",
                    path.display()
                );
                continue;
            }
            Err(e) => assert_eq!(e.errno, Errno::EINVAL, "{}", path.display()),
        }
        assert_eq!(
            real.read_link(&path).map_err(|e| e.errno),
            Err(Errno::EINVAL),
            "{}",
            path.display()
        );
        match sim.list(&path) {
            Ok(_) => n += compare(sim, real, &path),
            Err(e) => {
                assert_eq!(e.errno, Errno::ENOTDIR, "{}", path.display());
                match sim.read(&path) {
                    Ok(text) => assert_eq!(real.read(&path).unwrap(), text, "{}", path.display()),
                    // Write-only attribute: exists as a file with mode 0200.
                    Err(e) => {
                        assert_eq!(e.errno, Errno::EACCES);
                        let meta =
                            std::fs::metadata(real.root().join(path.strip_prefix("/").unwrap()))
                                .unwrap();
                        use std::os::unix::fs::PermissionsExt;
                        assert_eq!(
                            meta.permissions().mode() & 0o777,
                            0o200,
                            "{}",
                            path.display()
                        );
                    }
                }
            }
        }
    }
    n
}

#[test]
fn demo_tree_reads_the_same_through_sysfs_host() {
    let h = SimHost::builtin("demo").unwrap();
    let dir = tempfile::tempdir().unwrap();
    h.materialize(dir.path()).unwrap();
    let real = SysfsHost::new(dir.path()).unwrap();
    let n = compare(&h, &real, Path::new("/"));
    assert!(n > 1500, "only {n} entries");
}

#[test]
fn changed_state_materializes_too() {
    let h = SimHost::builtin("samples").unwrap();
    wr(&h, "/sys/bus/pci/devices/0000:01:00.0/sriov_numvfs", "3");
    wr(
        &h,
        "/sys/class/mdev_bus/mdpy/mdev_supported_types/mdpy-hd/create",
        "00000001-0000-4000-8000-000000000001",
    );
    let dir = tempfile::tempdir().unwrap();
    h.materialize(dir.path()).unwrap();
    let real = SysfsHost::new(dir.path()).unwrap();
    compare(&h, &real, Path::new("/"));
    assert_eq!(
        real.read(&p(
            "/sys/bus/mdev/devices/00000001-0000-4000-8000-000000000001/mdev_type/name"
        ))
        .unwrap(),
        "mdpy-hd\n"
    );
    assert!(real.exists(&p("/sys/bus/pci/devices/0000:01:10.4/physfn")));
}
