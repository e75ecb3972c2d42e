//! OpenStack Nova's own libvirt driver manages an mdev on a host where vgpud runs: Nova 34.0.0's
//! installed code (the test virtualenv `.cache/nova-venv` of scripts/nova-venv) runs in the sysroot
//! against the [`Stack`]'s libvirtd (`qemu:///system`), whose node-device driver runs our `mdevctl`
//! front end, which asks vgpud, which writes the kernel's mtty sample parent. Nothing of Nova is
//! copied: [`SCRIPT`] (`nova_host.py`) builds a `nova.virt.libvirt.driver.LibvirtDriver` as
//! nova-compute does (nova/cmd/compute.py: `monkey_patch.patch(backend='threading')`, then
//! `nova.config.parse_args`), with a nova.conf of `[devices] enabled_mdev_types = mtty-1` and
//! `[mdev_mtty-1] device_addresses = mtty_mtty`, runs `init_host`, and calls, in order:
//!
//! 1. `Host.list_mdev_capable_devices` (libvirt's `listDevices("mdev_types")`),
//!    `LibvirtDriver._get_mdev_capable_devices` (each parent's node-device XML parsed by Nova's
//!    `LibvirtConfigNodeDevice`; mtty_mtty is a virtual parent, read from its top-level
//!    `mdev_types` capability: driver.py, `_get_mdev_capabilities_for_dev`),
//!    `_get_supported_mdev_resource_classes` and `_get_gpu_inventories` (what nova-compute reports to
//!    placement), `Host.list_mediated_devices`;
//! 2. `LibvirtDriver._create_new_mediated_device("mtty_mtty", uuid)`, which in Nova 34.0.0 goes only
//!    through libvirt (driver.py, `_create_mdev`: `Host.device_create` = `nodeDeviceCreateXML`, then
//!    `Host.device_define` = `nodeDeviceDefineXML`, then `Host.device_set_autostart`; no
//!    `nova.privsep` code touches mdevs), then `Host.list_mediated_devices`, `_get_mediated_devices`,
//!    `_get_existing_mdevs_not_assigned`, `_get_gpu_inventories` and `Host.device_lookup_by_name`;
//! 3. the device stopped with libvirt's `virNodeDevice.destroy()` on the object Nova's Host looked up
//!    (libvirt then lists it inactive, and `Host.list_mediated_devices`, libvirt's
//!    `listDevices("mdev")`, still names it: that call does not tell defined from active), then
//!    `LibvirtDriver._start_inactive_mediated_devices` (what `init_host` runs to start defined,
//!    inactive mdevs: `Host.list_all_devices`, `Host.device_start`);
//! 4. deletion with `virNodeDevice.destroy()` and `undefine()`: Nova 34.0.0 has no call that stops or
//!    deletes an mdev (no node-device destroy or undefine anywhere in nova/virt/libvirt), so this
//!    step is libvirt's API on the device Nova's Host looked up.
//!
//! After each step the script prints Nova's return values as one JSON line and waits; the test checks
//! them against sysfs (`/sys/bus/mdev/devices/<uuid>`, its type and IOMMU group), vgpud's
//! `ListInstances`, vgpud's definition file and `virsh`, then lets it go on. The JSON must carry the
//! node-device names libvirt makes (`mdev_<uuid with _>_mtty`), so a script that never reached
//! libvirt cannot pass. Python is the virtualenv's (CPython 3.11) with Debian's python3-libvirt
//! module (built for Debian's CPython 3.11, same ABI) on `PYTHONPATH`: the two files of the module
//! only, linked into the scratch directory, so no other Debian package shadows the virtualenv's.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use serde_json::{Value, json};

use super::super::guest::Guest;
use super::super::runner::{Outcome, TestError, TestResult, ensure, ensure_eq};
use super::super::samples::{Mdevs, SAMPLE_TYPES, available, test_uuid};
use super::super::vgpud::find;
use super::nodedev::{mdev_node, nodedev_list};
use super::stack::{Stack, tail};
use super::sysroot::{Libvirt, kernel_lacks_overlay};

/// The helper that runs Nova's code (written into the scratch directory for each run).
pub const SCRIPT: &str = include_str!("nova_host.py");
/// The mdev parent and type Nova is configured with.
const PARENT: &str = "mtty";
const NODE_PARENT: &str = "mtty_mtty";
const TYPE: &str = "mtty-1";
/// The compute node's host name in the script's UTS namespace.
const HOSTNAME: &str = "nova-compute-guest";
/// The first phase imports Nova, builds its driver and runs `init_host` (libvirt probes QEMU's
/// capabilities) under TCG: a few seconds on the host, minutes in the guest.
const FIRST_PHASE_WITHIN: Duration = Duration::from_secs(600);
const PHASE_WITHIN: Duration = Duration::from_secs(180);
/// Debian's python3-libvirt, as its package installs it.
const DIST_PACKAGES: &str = "/usr/lib/python3/dist-packages";
const LIBVIRT_MODULE: &[&str] = &["libvirt.py", "libvirtmod.cpython-311-x86_64-linux-gnu.so"];

/// The repository the test binary was built from; the guest sees the host's root, so the path is
/// the same inside the sysroot.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The virtualenv's Python, as the chrooted programs see it.
fn venv_python() -> PathBuf {
    repo().join(".cache/nova-venv/bin/python")
}

/// The running script: its stdin (one line lets it go on), its stdout lines, its stderr log.
struct Nova {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    log: PathBuf,
}

impl Nova {
    fn start(s: &Stack, u: &MdevUuid) -> Result<Nova, TestError> {
        let python = venv_python();
        // bin/python links to the interpreter by an absolute path, which resolves in the sysroot
        // only: look for the virtualenv's own file.
        let cfg = repo().join(".cache/nova-venv/pyvenv.cfg");
        ensure(s.root.path(&cfg.display().to_string()).is_file(), || {
            format!(
                "{} is missing: the test runs Nova from the test virtualenv (scripts/nova-venv; .ci/run makes it)",
                cfg.display()
            )
        })?;
        let pylib = s.work.path().join("libvirt-python");
        std::fs::create_dir_all(&pylib)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", pylib.display())))?;
        for f in LIBVIRT_MODULE {
            let target = Path::new(DIST_PACKAGES).join(f);
            ensure(s.root.path(&target.display().to_string()).exists(), || {
                format!(
                    "{} is missing: Nova's libvirt driver needs python3-libvirt (.ci/run installs it)",
                    target.display()
                )
            })?;
            std::os::unix::fs::symlink(&target, pylib.join(f))
                .map_err(|e| TestError::Check(format!("cannot link {}: {e}", target.display())))?;
        }
        let script = s.file("nova_host.py", SCRIPT)?;
        let log = s.work.path().join("nova.log");
        let err = std::fs::File::create(&log)
            .map_err(|e| TestError::Check(format!("cannot create {}: {e}", log.display())))?;
        let work = s.work.path().display().to_string();
        let uuid = u.to_string();
        // Nova's `[DEFAULT] host` defaults to the host name (nova/conf/netconf.py), which must be a
        // valid one (oslo.config's HostDomain type refuses the guest's "(none)" at import): the
        // script runs in a UTS namespace of its own with a host name, as a compute node has one.
        let py = python.display().to_string();
        let mut child = s
            .root
            // Full paths: the guest's busybox chroot prefers its own applets to a bare name.
            .command("/usr/bin/unshare")
            .args([
                "--uts",
                "--",
                "/bin/sh",
                "-c",
                &format!("/bin/hostname {HOSTNAME} && exec \"$0\" \"$@\""),
                py.as_str(),
                script.as_str(),
                "--uri",
                "qemu:///system",
                "--parent",
                NODE_PARENT,
                "--type",
                TYPE,
                "--uuid",
                &uuid,
                "--work",
                &work,
            ])
            .env("PYTHONPATH", &pylib)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .map_err(|e| TestError::Check(format!("cannot start {}: {e}", python.display())))?;
        let stdin = child.stdin.take();
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| TestError::Check("no stdout of the Nova script".into()))?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Nova {
            child,
            stdin,
            lines,
            log,
        })
    }

    /// The script's next phase, which must be `phase`; a failure with its error and log otherwise.
    fn phase(&mut self, s: &Stack, phase: &str, within: Duration) -> Result<Value, TestError> {
        let t = Instant::now();
        let line = match self.lines.recv_timeout(within) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                return Err(self.failure(s, &format!("no {phase:?} phase within {within:?}")));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                return Err(self.failure(
                    s,
                    &format!("the Nova script ended ({status}) before the {phase:?} phase"),
                ));
            }
        };
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            self.failure(s, &format!("the Nova script printed no JSON ({e}): {line}"))
        })?;
        if v["phase"] != phase {
            let what = if v["phase"] == "error" {
                format!(
                    "Nova failed in {}: {}\n{}",
                    v["step"].as_str().unwrap_or("?"),
                    v["error"].as_str().unwrap_or("?"),
                    v["traceback"].as_str().unwrap_or("")
                )
            } else {
                format!("expected the {phase:?} phase, the Nova script printed {line}")
            };
            return Err(self.failure(s, &what));
        }
        let mut shown = v.clone();
        if let Some(o) = shown.as_object_mut() {
            o.remove("nova_conf");
        }
        println!("nova: {phase} after {:?}: {shown}", t.elapsed());
        Ok(v)
    }

    /// Lets the script go on to its next phase.
    fn next(&mut self, s: &Stack) -> Result<(), TestError> {
        let written = match self.stdin.as_mut() {
            Some(i) => i.write_all(b"\n").and_then(|_| i.flush()),
            None => Ok(()),
        };
        written.map_err(|e| self.failure(s, &format!("cannot write to the Nova script: {e}")))
    }

    fn failure(&self, s: &Stack, what: &str) -> TestError {
        s.failure(&format!(
            "{what}\n  last lines of Nova's log ({}):\n{}",
            self.log.display(),
            tail(&self.log, 40)
        ))
    }

    /// Waits for the script to exit 0 after its last phase.
    fn finish(mut self, s: &Stack) -> Result<(), TestError> {
        drop(self.stdin.take());
        let t = Instant::now();
        loop {
            match self.child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    return Err(self.failure(s, &format!("the Nova script exited {st}")));
                }
                Ok(None) if t.elapsed() < PHASE_WITHIN => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => return Err(self.failure(s, "the Nova script did not exit")),
            }
        }
    }
}

impl Drop for Nova {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// What sysfs, vgpud, its definition file and libvirt (virsh) say of `u`.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    /// `/sys/bus/mdev/devices/<uuid>` exists, with this type.
    sysfs: Option<String>,
    /// (type, state, defined, autostart) in vgpud's ListInstances.
    vgpud: Option<(String, String, bool, bool)>,
    /// (type, start) of `/etc/mdevctl.d/mtty/<uuid>`.
    file: Option<(String, String)>,
    /// (active, defined) in `virsh nodedev-list --cap mdev` and `--inactive`.
    libvirt: (bool, bool),
}

impl Seen {
    /// A defined, autostarted mdev of [`TYPE`] that runs: what Nova's create and its restart leave.
    fn running_autostart() -> Seen {
        Seen {
            sysfs: Some(TYPE.into()),
            vgpud: Some((TYPE.into(), "running".into(), true, true)),
            file: Some((TYPE.into(), "auto".into())),
            libvirt: (true, false),
        }
    }
}

fn seen(s: &Stack, u: &MdevUuid) -> Result<Seen, TestError> {
    let dev = Path::new("/sys/bus/mdev/devices").join(u.to_string());
    let sysfs = if dev.exists() {
        Some(link_name(&dev.join("mdev_type"))?)
    } else {
        None
    };
    let list = s.vgpud()?.list_instances()?;
    let vgpud =
        find(&list, u).map(|i| (i.type_id.clone(), i.state.clone(), i.defined, i.autostart));
    let path = s.root.path(&format!("/etc/mdevctl.d/{PARENT}/{u}"));
    let file = match std::fs::read_to_string(&path) {
        Ok(text) => {
            let v: Value = serde_json::from_str(&text).map_err(|e| {
                TestError::Check(format!("{} is not JSON ({e}): {text}", path.display()))
            })?;
            Some((
                v["mdev_type"].as_str().unwrap_or("?").to_string(),
                v["start"].as_str().unwrap_or("?").to_string(),
            ))
        }
        Err(_) => None,
    };
    let node = mdev_node(u);
    let libvirt = (
        nodedev_list(s, &["--cap", "mdev"])?.contains(&node),
        nodedev_list(s, &["--cap", "mdev", "--inactive"])?.contains(&node),
    );
    Ok(Seen {
        sysfs,
        vgpud,
        file,
        libvirt,
    })
}

fn ensure_seen(s: &Stack, u: &MdevUuid, step: &str, want: Seen) -> Result<(), TestError> {
    // libvirt learns of a change from udev and from /etc/mdevctl.d; give it what nodedev.rs gives it.
    let mut got = seen(s, u)?;
    let t = Instant::now();
    while got != want && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
        got = seen(s, u)?;
    }
    if got == want {
        Ok(())
    } else {
        Err(s.failure(&format!(
            "after Nova's {step}: {u} is {got:?}, expected {want:?}"
        )))
    }
}

/// The last component of symlink `p`'s target.
fn link_name(p: &Path) -> Result<String, TestError> {
    let target = std::fs::read_link(p)
        .map_err(|e| TestError::Check(format!("cannot read link {}: {e}", p.display())))?;
    Ok(target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default())
}

/// What Nova's `_get_mdev_capabilities_for_dev` must return for the mtty parent, from sysfs now.
fn mtty_capabilities(g: &Guest) -> Result<Value, TestError> {
    let mut types = serde_json::Map::new();
    for t in SAMPLE_TYPES.iter().filter(|t| t.parent == PARENT) {
        types.insert(
            t.id.to_string(),
            json!({
                "availableInstances": available(&g.host, PARENT, t.id)?,
                "name": t.name,
                "deviceAPI": "vfio-pci",
            }),
        );
    }
    Ok(json!({"dev_id": NODE_PARENT, "vendor_id": null, "types": types}))
}

/// Nova's inventory of the mtty parent for `total` mdevs of its type.
fn inventory(total: u32) -> Value {
    json!({NODE_PARENT: {
        "total": total, "min_unit": 1, "max_unit": total, "step_size": 1, "reserved": 0,
        "allocation_ratio": 1.0,
    }})
}

fn entry<'v>(list: &'v Value, dev_id: &str) -> Option<&'v Value> {
    list.as_array()?.iter().find(|d| d["dev_id"] == dev_id)
}

/// Nova's libvirt driver lists the mdev parents and types, makes an mdev of `[devices]
/// enabled_mdev_types`, lists it, starts it again after it was stopped, and it is deleted through the
/// device Nova's Host looked up: every step through libvirtd `v`, our mdevctl front end and vgpud.
pub fn manages_mdev(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let s = Stack::up("nova", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("nova", 0);
    mdevs.adopt(u);
    let node = mdev_node(&u);
    let us = u.to_string();

    let capable_before = mtty_capabilities(g)?;
    let free = available(&g.host, PARENT, TYPE)?;
    let parents = nodedev_list(&s, &["--cap", "mdev_types"])?;
    let t = Instant::now();
    let mut nova = Nova::start(&s, &u)?;

    // 1 and 2: listed, then made by Nova.
    let c = nova.phase(&s, "created", FIRST_PHASE_WITHIN)?;
    println!(
        "nova: first phase (import, LibvirtDriver, init_host, create) took {:?}",
        t.elapsed()
    );
    ensure_eq("Nova's version", &c["nova_version"], &json!("34.0.0"))?;
    let mut listed: Vec<String> = serde_json::from_value(c["mdev_capable_devices"].clone())
        .map_err(|e| TestError::Check(format!("mdev_capable_devices: {e}: {c}")))?;
    listed.sort();
    let mut want_parents = parents.clone();
    want_parents.sort();
    ensure_eq(
        "Host.list_mdev_capable_devices against virsh nodedev-list --cap mdev_types",
        &listed,
        &want_parents,
    )?;
    ensure_eq(
        "LibvirtDriver._get_mdev_capable_devices: mtty_mtty",
        entry(&c["capable_before"], NODE_PARENT),
        Some(&capable_before),
    )?;
    ensure_eq(
        "supported_vgpu_types",
        &c["supported_vgpu_types"],
        &json!([TYPE]),
    )?;
    ensure_eq("virtual_mdevs", &c["virtual_mdevs"], &json!([NODE_PARENT]))?;
    ensure_eq(
        "_get_supported_mdev_resource_classes",
        &c["resource_classes"],
        &json!(["VGPU"]),
    )?;
    ensure_eq(
        "_get_gpu_inventories before",
        &c["inventories_before"],
        &inventory(free),
    )?;
    ensure_eq("mdevs before", &c["mediated_before"], &json!([]))?;
    ensure_eq(
        "_create_new_mediated_device's UUID",
        &c["created_uuid"],
        &json!(us),
    )?;
    ensure_eq(
        "Host.list_mediated_devices after the create",
        &c["mediated_after"],
        &json!([node]),
    )?;
    let dev = Path::new("/sys/bus/mdev/devices").join(&us);
    ensure(dev.exists(), || {
        format!("Nova made {us}, but {} does not exist", dev.display())
    })?;
    let group: i64 = link_name(&dev.join("iommu_group"))?
        .parse()
        .map_err(|e| TestError::Check(format!("{us}'s iommu_group: {e}")))?;
    ensure_eq(
        "_get_mediated_devices after the create",
        &c["mediated_info"],
        &json!([{"dev_id": node, "uuid": us, "parent": NODE_PARENT, "type": TYPE,
                 "iommu_group": group}]),
    )?;
    ensure_eq(
        "_get_existing_mdevs_not_assigned",
        &c["not_assigned"],
        &json!([us]),
    )?;
    // One mdev made, one instance fewer available: the same total.
    ensure_eq(
        "available_instances after the create",
        available(&g.host, PARENT, TYPE)?,
        free - 1,
    )?;
    ensure_eq(
        "_get_gpu_inventories after the create",
        &c["inventories_after"],
        &inventory(free),
    )?;
    ensure_eq(
        "the node device Nova looked up",
        &c["node"],
        &json!({"name": node, "parent": NODE_PARENT, "active": true, "persistent": true,
                "autostart": true}),
    )?;
    ensure_seen(
        &s,
        &u,
        "_create_new_mediated_device",
        Seen::running_autostart(),
    )?;

    // 3: stopped, then started again by Nova's init_host step.
    nova.next(&s)?;
    let st = nova.phase(&s, "stopped", PHASE_WITHIN)?;
    ensure_eq(
        "inactive mdevs after destroy",
        &st["inactive"],
        &json!([node]),
    )?;
    ensure_eq("active mdevs after destroy", &st["active"], &json!([]))?;
    // libvirt's listDevices("mdev"), Nova's Host.list_mediated_devices, names defined, inactive
    // mdevs too (measured on 9.0 and 11.3).
    ensure_eq(
        "Host.list_mediated_devices after destroy",
        &st["mediated"],
        &json!([node]),
    )?;
    ensure_seen(
        &s,
        &u,
        "virNodeDevice.destroy",
        Seen {
            sysfs: None,
            vgpud: Some((TYPE.into(), "stopped".into(), true, true)),
            file: Some((TYPE.into(), "auto".into())),
            libvirt: (false, true),
        },
    )?;
    nova.next(&s)?;
    let r = nova.phase(&s, "restarted", PHASE_WITHIN)?;
    ensure_eq(
        "Host.list_mediated_devices after _start_inactive_mediated_devices",
        &r["mediated"],
        &json!([node]),
    )?;
    ensure_eq("active mdevs after the start", &r["active"], &json!([node]))?;
    ensure_eq("inactive mdevs after the start", &r["inactive"], &json!([]))?;
    let info = &r["mediated_info"];
    ensure(
        info.as_array().is_some_and(|a| a.len() == 1)
            && info[0]["uuid"] == us
            && info[0]["type"] == TYPE
            && info[0]["parent"] == NODE_PARENT,
        || format!("_get_mediated_devices after the start: {info}"),
    )?;
    ensure_seen(
        &s,
        &u,
        "_start_inactive_mediated_devices",
        Seen::running_autostart(),
    )?;

    // 4: deleted.
    nova.next(&s)?;
    let d = nova.phase(&s, "deleted", PHASE_WITHIN)?;
    ensure_eq("every mdev libvirt lists", &d["all_mdevs"], &json!([]))?;
    ensure_eq("Host.list_mediated_devices", &d["mediated"], &json!([]))?;
    ensure_eq("_get_mediated_devices", &d["mediated_info"], &json!([]))?;
    ensure_eq(
        "_get_mdev_capable_devices after the delete: mtty_mtty",
        entry(&d["capable"], NODE_PARENT),
        Some(&capable_before),
    )?;
    ensure_eq(
        "_get_gpu_inventories after the delete",
        &d["inventories"],
        &inventory(free),
    )?;
    ensure_seen(
        &s,
        &u,
        "delete",
        Seen {
            sysfs: None,
            vgpud: None,
            file: None,
            libvirt: (false, false),
        },
    )?;
    nova.finish(&s)?;
    println!("nova: whole run took {:?}", t.elapsed());
    mdevs.forget(&u);
    Ok(Outcome::Passed)
}
