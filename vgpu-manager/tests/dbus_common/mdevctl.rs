//! A fake root in the shape mdevctl's own tests build (mdevctl src/tests/mod.rs `TestEnvironment`:
//! `sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/{available_instances,device_api,name,
//! description}`, `sys/bus/mdev/devices/<uuid>` → the device below its parent with an `mdev_type` link,
//! `etc/mdevctl.d/<parent>/<uuid>` definitions, call-out directories under `usr/lib/mdevctl/scripts.d`
//! and `etc/mdevctl.d/scripts.d`), plus what a real kernel has beside it and vgpud reads: a PCI device
//! entry for a parent named by a PCI address, and a kernel behind the write-only `create`/`remove`
//! attributes ([`FakeKernel`]).
//!
//! Also starts vgpud on such a root ([`Daemon::on_sysfs_root`]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsStr;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::Daemon;
use super::fuse_attr::FuseAttr;

impl Daemon {
    /// Starts `vgpud --listen unix:path=<dir>/bus.sock --sysfs-root <root> --state-dir <dir>/state
    /// --pools-dir <dir>/pools.d` and waits until it owns its name; its log when it exits first (a
    /// tree vgpud refuses is a result here, not a test failure).
    pub async fn on_sysfs_root(dir: &Path, root: &Path) -> Result<Daemon, String> {
        let bus = format!("unix:path={}", dir.join("bus.sock").display());
        let pools = dir.join("pools.d");
        fs::create_dir_all(&pools).unwrap();
        let (state, listen) = (dir.join("state"), OsStr::new(&bus));
        let args = [
            OsStr::new("--listen"),
            listen,
            OsStr::new("--sysfs-root"),
            root.as_os_str(),
            OsStr::new("--state-dir"),
            state.as_os_str(),
            OsStr::new("--pools-dir"),
            pools.as_os_str(),
        ];
        Daemon::try_start(&args, &bus, dir).await
    }
}

/// A fake root directory holding sysfs, `/etc/mdevctl.d` and the call-out directories.
pub struct FakeRoot {
    /// The root (what `--sysfs-root` gets).
    pub root: PathBuf,
}

/// Whether `name` is a PCI address (`DDDD:BB:DD.F`), so a real kernel would list it under
/// `/sys/bus/pci/devices`.
fn is_pci_address(name: &str) -> bool {
    let b = name.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

impl FakeRoot {
    /// Creates the empty directories mdevctl's tests create.
    pub fn new(root: &Path) -> FakeRoot {
        let r = FakeRoot {
            root: root.to_path_buf(),
        };
        for d in [
            "sys/bus/mdev/devices",
            "sys/class/mdev_bus",
            "sys/bus/pci/devices",
            "sys/devices/pci0000:00",
            "etc/mdevctl.d/scripts.d/callouts",
            "etc/mdevctl.d/scripts.d/notifiers",
            "usr/lib/mdevctl/scripts.d/callouts",
            "usr/lib/mdevctl/scripts.d/notifiers",
        ] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        r
    }

    /// `/etc/mdevctl.d`.
    pub fn config_base(&self) -> PathBuf {
        self.root.join("etc/mdevctl.d")
    }

    /// The sysfs directory of parent `name` (the target of `/sys/class/mdev_bus/<name>`).
    pub fn parent_dir(&self, name: &str) -> PathBuf {
        if is_pci_address(name) {
            self.root.join("sys/devices/pci0000:00").join(name)
        } else {
            self.root.join("sys/devices/virtual/mdev_parent").join(name)
        }
    }

    /// The directory of type `ty` of parent `parent`.
    pub fn type_dir(&self, parent: &str, ty: &str) -> PathBuf {
        self.parent_dir(parent)
            .join("mdev_supported_types")
            .join(ty)
    }

    fn ensure_parent(&self, name: &str) -> PathBuf {
        let dir = self.parent_dir(name);
        if dir.exists() {
            return dir;
        }
        fs::create_dir_all(&dir).unwrap();
        if is_pci_address(name) {
            // A display controller of no particular vendor: vgpud treats it as a GPU with an mdev parent.
            fs::write(dir.join("class"), "0x030000\n").unwrap();
            fs::write(dir.join("vendor"), "0x1234\n").unwrap();
            fs::write(dir.join("device"), "0x1111\n").unwrap();
            link(&dir, &self.root.join("sys/bus/pci/devices").join(name)).unwrap();
        }
        link(&dir, &self.root.join("sys/class/mdev_bus").join(name)).unwrap();
        dir
    }

    /// mdevctl's `populate_parent_device`: parent `parent` supports `ty` with `instances` available, the
    /// given `device_api` and `name`, and a description file when `description` is given.
    pub fn parent(
        &self,
        parent: &str,
        ty: &str,
        instances: u32,
        device_api: &str,
        name: &str,
        description: Option<&str>,
    ) {
        self.ensure_parent(parent);
        let t = self.type_dir(parent, ty);
        fs::create_dir_all(t.join("devices")).unwrap();
        fs::write(t.join("available_instances"), instances.to_string()).unwrap();
        fs::write(t.join("device_api"), device_api).unwrap();
        fs::write(t.join("name"), name).unwrap();
        if let Some(d) = description {
            fs::write(t.join("description"), d).unwrap();
        }
        // Write-only in the kernel; present so a write reaches the fake kernel.
        fs::write(t.join("create"), "").unwrap();
    }

    /// mdevctl's `populate_active_device`: a running mdev `uuid` of `ty` on `parent` (whose type is
    /// (re)written as [`FakeRoot::parent`] with one instance, no device API and no name, as mdevctl's does).
    pub fn active(&self, uuid: &str, parent: &str, ty: &str) {
        self.parent(parent, ty, 1, "", "", None);
        materialize(&self.root, parent, ty, uuid, &[]);
    }

    /// mdevctl's `populate_defined_device`: `source` copied to `/etc/mdevctl.d/<parent>/<uuid>`.
    pub fn defined(&self, uuid: &str, parent: &str, source: &Path) {
        let dir = self.config_base().join(parent);
        fs::create_dir_all(&dir).unwrap();
        fs::copy(source, dir.join(uuid))
            .unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
    }

    /// An executable call-out script `name` with body `script`, in the current call-out directory
    /// (`/usr/lib/mdevctl/scripts.d/callouts`) or, with `old_dir`, in `/etc/mdevctl.d/scripts.d/callouts`.
    pub fn callout(&self, name: &str, script: &str, old_dir: bool) {
        let dir = if old_dir {
            "etc/mdevctl.d/scripts.d/callouts"
        } else {
            "usr/lib/mdevctl/scripts.d/callouts"
        };
        let path = self.root.join(dir).join(name);
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

impl FakeRoot {
    /// An executable notifier script `name` in `/usr/lib/mdevctl/scripts.d/notifiers` that appends its
    /// arguments, one call a line, to `notified.log` at the root ([`FakeRoot::notified`]).
    pub fn notifier(&self, name: &str) {
        let path = self
            .root
            .join("usr/lib/mdevctl/scripts.d/notifiers")
            .join(name);
        let script =
            "#!/bin/sh\necho \"$*\" >> \"$(dirname \"$0\")/../../../../../notified.log\"\n";
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The calls the notifiers of [`FakeRoot::notifier`] saw, one argument line each.
    pub fn notified(&self) -> Vec<String> {
        fs::read_to_string(self.root.join("notified.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// A relative symbolic link at `at` to `target` (both inside the root), as sysfs makes them.
fn link(target: &Path, at: &Path) -> std::io::Result<()> {
    let from = at.parent().expect("link has a directory");
    let common = target
        .components()
        .zip(from.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut rel = PathBuf::new();
    for _ in from.components().skip(common) {
        rel.push("..");
    }
    for c in target.components().skip(common) {
        rel.push(c);
    }
    symlink(rel, at)
}

/// Makes the sysfs entries of a running mdev, as the kernel's mdev core does on `create`, with the
/// vendor driver's writable attributes `attrs` (empty files: what is written to one stays in it).
fn materialize(root: &Path, parent: &str, ty: &str, uuid: &str, attrs: &[String]) {
    let fake = FakeRoot {
        root: root.to_path_buf(),
    };
    let dev = fake.parent_dir(parent).join(uuid);
    fs::create_dir_all(&dev).unwrap();
    let _ = link(&fake.type_dir(parent, ty), &dev.join("mdev_type"));
    fs::write(dev.join("remove"), "").unwrap();
    for a in attrs {
        fs::write(dev.join(a), "").unwrap();
    }
    let _ = link(&dev, &root.join("sys/bus/mdev/devices").join(uuid));
    let _ = fs::create_dir_all(fake.type_dir(parent, ty).join("devices"));
    let _ = link(&dev, &fake.type_dir(parent, ty).join("devices").join(uuid));
}

/// One write to a kernel attribute of the fake root: `create` of a type or `remove` of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelWrite {
    /// Text written to `<parent>/mdev_supported_types/<type>/create`.
    Create {
        /// The parent's name.
        parent: String,
        /// The type id.
        ty: String,
        /// What was written, byte for byte.
        text: String,
    },
    /// Text written to `/sys/bus/mdev/devices/<uuid>/remove`.
    Remove {
        /// The device.
        uuid: String,
        /// What was written.
        text: String,
    },
}

/// The fake root's kernel: every `create` and `remove` attribute is served through FUSE
/// ([`super::fuse_attr`]), so a UUID written to `create` makes the device, and `1` written to `remove`
/// removes it, before the write returns, as the kernel's mdev core does (drivers/vfio/mdev/mdev_sysfs.c
/// `create_store`, `remove_store`). Every write is recorded. Needs root and /dev/fuse.
pub struct FakeKernel {
    writes: Arc<Mutex<Vec<KernelWrite>>>,
    mounts: Arc<Mutex<Vec<FuseAttr>>>,
}

impl FakeKernel {
    /// Serves the `create` attribute of every type and the `remove` attribute of every device below
    /// `root`.
    pub fn start(root: &Path) -> FakeKernel {
        FakeKernel::start_with(root, &[])
    }

    /// [`FakeKernel::start`], where every device `create` makes has the writable attributes
    /// `device_attrs` (as a vendor driver's mdevs have theirs, e.g. vfio_ap's `assign_adapter`).
    pub fn start_with(root: &Path, device_attrs: &[String]) -> FakeKernel {
        let device_attrs: Arc<Vec<String>> = Arc::new(device_attrs.to_vec());
        let k = FakeKernel {
            writes: Arc::default(),
            mounts: Arc::default(),
        };
        let parents = fs::read_dir(root.join("sys/class/mdev_bus")).unwrap();
        for p in parents.flatten() {
            let parent = p.file_name().to_string_lossy().into_owned();
            let Ok(types) = fs::read_dir(p.path().join("mdev_supported_types")) else {
                continue;
            };
            for t in types.flatten() {
                let ty = t.file_name().to_string_lossy().into_owned();
                serve_create(root, &parent, &ty, &k.writes, &k.mounts, &device_attrs);
            }
        }
        for d in fs::read_dir(root.join("sys/bus/mdev/devices"))
            .unwrap()
            .flatten()
        {
            let uuid = d.file_name().to_string_lossy().into_owned();
            if d.path().join("remove").exists() {
                serve_remove(root, &uuid, &k.writes, &k.mounts);
            }
        }
        k
    }

    /// Unmounts every attribute and returns the writes seen.
    pub fn finish(self) -> Vec<KernelWrite> {
        self.writes.lock().unwrap().clone()
    }
}

impl Drop for FakeKernel {
    /// Unmounts every attribute (the callbacks hold the list too, so it is emptied here, not dropped).
    fn drop(&mut self) {
        let mounts = std::mem::take(&mut *self.mounts.lock().unwrap());
        drop(mounts);
    }
}

type Mounts = Arc<Mutex<Vec<FuseAttr>>>;
type Writes = Arc<Mutex<Vec<KernelWrite>>>;

fn serve_create(
    root: &Path,
    parent: &str,
    ty: &str,
    writes: &Writes,
    mounts: &Mounts,
    attrs: &Arc<Vec<String>>,
) {
    let fake = FakeRoot {
        root: root.to_path_buf(),
    };
    let path = fake.type_dir(parent, ty).join("create");
    let (root, parent, ty) = (root.to_path_buf(), parent.to_string(), ty.to_string());
    let (w, m, attrs) = (writes.clone(), mounts.clone(), attrs.clone());
    let attr = FuseAttr::mount(
        &path,
        Box::new(move |text: &str| {
            w.lock().unwrap().push(KernelWrite::Create {
                parent: parent.clone(),
                ty: ty.clone(),
                text: text.to_string(),
            });
            let uuid = text.trim();
            let devices = root.join("sys/bus/mdev/devices");
            if devices.join(uuid).exists() {
                return Err(17); // EEXIST, as mdev_device_create answers
            }
            let fake = FakeRoot { root: root.clone() };
            let avail = fs::read_to_string(fake.type_dir(&parent, &ty).join("available_instances"))
                .unwrap_or_default();
            if avail.trim() == "0" {
                return Err(87); // EUSERS: the mdev core's answer for a full type
            }
            materialize(&root, &parent, &ty, uuid, &attrs);
            serve_remove(&root, uuid, &w, &m);
            Ok(())
        }),
    );
    mounts.lock().unwrap().push(attr);
}

fn serve_remove(root: &Path, uuid: &str, writes: &Writes, mounts: &Mounts) {
    let path = root.join("sys/bus/mdev/devices").join(uuid).join("remove");
    let (root, uuid) = (root.to_path_buf(), uuid.to_string());
    let w = writes.clone();
    let attr = FuseAttr::mount(
        &fs::canonicalize(&path).unwrap(),
        Box::new(move |text: &str| {
            w.lock().unwrap().push(KernelWrite::Remove {
                uuid: uuid.clone(),
                text: text.to_string(),
            });
            if text.trim() != "1" {
                return Err(22); // EINVAL
            }
            let link = root.join("sys/bus/mdev/devices").join(&uuid);
            let Ok(dev) = fs::canonicalize(&link) else {
                return Err(2);
            };
            super::fuse_attr::unmount(&dev.join("remove"));
            if let Ok(ty) = fs::canonicalize(dev.join("mdev_type")) {
                let _ = fs::remove_file(ty.join("devices").join(&uuid));
            }
            let _ = fs::remove_file(&link);
            let _ = fs::remove_dir_all(&dev);
            Ok(())
        }),
    );
    mounts.lock().unwrap().push(attr);
}
