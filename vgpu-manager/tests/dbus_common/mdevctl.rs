//! A fake root in the shape mdevctl's own tests build (mdevctl src/tests/mod.rs `TestEnvironment`:
//! `sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/{available_instances,device_api,name,
//! description}`, `sys/bus/mdev/devices/<uuid>` → the device below its parent with an `mdev_type` link,
//! `etc/mdevctl.d/<parent>/<uuid>` definitions, call-out directories under `usr/lib/mdevctl/scripts.d`
//! and `etc/mdevctl.d/scripts.d`), plus what a real kernel has beside it and vgpud reads: a PCI device
//! entry for a parent named by a PCI address, and the write-only `create`/`remove` attributes, whose
//! writes [`kernel_writes`] reads back.
//!
//! Also starts vgpud on such a root ([`Daemon::on_sysfs_root`]).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::Daemon;

impl Daemon {
    /// Starts `vgpud --listen unix:path=<dir>/bus.sock --sysfs-root <root> --state-dir <dir>/state
    /// --pools-dir <dir>/pools.d` and waits until it owns its name; its log when it exits first (a
    /// tree vgpud refuses is a result here, not a test failure).
    pub async fn on_sysfs_root(dir: &Path, root: &Path) -> Result<Daemon, String> {
        let bus = format!("unix:path={}", dir.join("bus.sock").display());
        let pools = dir.join("pools.d");
        fs::create_dir_all(&pools).unwrap();
        let log = dir.join("vgpud.log");
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .args(["--listen", &bus, "--sysfs-root"])
            .arg(root)
            .arg("--state-dir")
            .arg(dir.join("state"))
            .arg("--pools-dir")
            .arg(&pools)
            .env("VGPU_LOG", "info")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start vgpud");
        let mut d = Daemon {
            child: Some(child),
            bus: bus.clone(),
            log,
        };
        let address: vgpu_client::BusAddress = bus.parse().unwrap();
        let deadline = std::time::Instant::now() + super::PATIENCE;
        loop {
            if let Some(status) = d.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("vgpud exited ({status}): {}", d.log().trim()));
            }
            let short = Duration::from_secs(2);
            if let Ok(Ok(conn)) = tokio::time::timeout(short, vgpu_client::connect(&address)).await
                && let Ok(Ok(dbus)) =
                    tokio::time::timeout(short, zbus::fdo::DBusProxy::new(&conn)).await
                && let Ok(Ok(true)) = tokio::time::timeout(
                    short,
                    dbus.name_has_owner(vgpu_client::SERVICE.try_into().unwrap()),
                )
                .await
            {
                return Ok(d);
            }
            assert!(
                std::time::Instant::now() < deadline,
                "vgpud not ready: {}",
                d.log()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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
        materialize(&self.root, parent, ty, uuid);
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

/// Makes the sysfs entries of a running mdev, as the kernel's mdev core does on `create`.
fn materialize(root: &Path, parent: &str, ty: &str, uuid: &str) {
    let fake = FakeRoot {
        root: root.to_path_buf(),
    };
    let dev = fake.parent_dir(parent).join(uuid);
    fs::create_dir_all(&dev).unwrap();
    let _ = link(&fake.type_dir(parent, ty), &dev.join("mdev_type"));
    fs::write(dev.join("remove"), "").unwrap();
    let _ = link(&dev, &root.join("sys/bus/mdev/devices").join(uuid));
    let _ = fs::create_dir_all(fake.type_dir(parent, ty).join("devices"));
    let _ = link(&dev, &fake.type_dir(parent, ty).join("devices").join(uuid));
}

/// One write to a kernel attribute of the fake root: `create` of a type (parent, type, text) or `remove` of a device.
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

/// What was written to the fake root's `create` and `remove` attributes. Nothing acts on those writes
/// while a command runs: the tree has no kernel behind it, and one that made devices a moment after the
/// write (a watcher) would race with vgpud, which reads a device back as soon as its write returns, as a
/// real kernel lets it. So a device asked for never appears, the same way every run.
pub fn kernel_writes(root: &Path) -> Vec<KernelWrite> {
    let mut seen = Vec::new();
    poll(root, &mut seen);
    seen
}

fn poll(root: &Path, seen: &mut Vec<KernelWrite>) {
    let Ok(parents) = fs::read_dir(root.join("sys/class/mdev_bus")) else {
        return;
    };
    for p in parents.flatten() {
        let parent = p.file_name().to_string_lossy().into_owned();
        let Ok(types) = fs::read_dir(p.path().join("mdev_supported_types")) else {
            continue;
        };
        for t in types.flatten() {
            let create = t.path().join("create");
            let text = fs::read_to_string(&create).unwrap_or_default();
            if text.is_empty() {
                continue;
            }
            let ty = t.file_name().to_string_lossy().into_owned();
            seen.push(KernelWrite::Create {
                parent: parent.clone(),
                ty,
                text,
            });
        }
    }
    let Ok(devices) = fs::read_dir(root.join("sys/bus/mdev/devices")) else {
        return;
    };
    for d in devices.flatten() {
        let remove = d.path().join("remove");
        let text = fs::read_to_string(&remove).unwrap_or_default();
        if text.is_empty() {
            continue;
        }
        let uuid = d.file_name().to_string_lossy().into_owned();
        seen.push(KernelWrite::Remove { uuid, text });
    }
}
