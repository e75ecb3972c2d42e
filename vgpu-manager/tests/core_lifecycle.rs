//! The daemon core driven directly through its one command type, on simulated hosts: lifecycle,
//! persistence across restarts, ownership, events and concurrency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Host, HostExt, paths};
use vgpu_manager::daemon::api::{
    Command, CoreError, CreateInstance, DefineInstance, DestroyInstance, Event, GetInstance,
    Handle, InstanceSpec, InstanceState, InstanceTarget, InstanceView, ListInstances, Ownership,
    Reconcile, SetAutostart, StartInstance, StopInstance, UndefineInstance,
};
use vgpu_manager::daemon::engine::Core;
use vgpu_sim::SimHost;

use core_common::open;

const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";

fn req(target: InstanceTarget, gpu: Option<&str>) -> InstanceSpec {
    InstanceSpec {
        target,
        gpu: gpu.map(str::to_string),
        uuid: None,
        autostart: false,
        label: Some("vm-1".into()),
        attrs: Vec::new(),
    }
}

fn ty(s: &str) -> InstanceTarget {
    InstanceTarget::Type(s.parse::<MdevTypeId>().unwrap())
}

fn instance<V: Into<Option<InstanceView>>>(r: Result<V, CoreError>) -> InstanceView {
    r.unwrap().into().expect("expected an instance, got none")
}

/// The command (as debug text) and the error it was refused with.
fn refusal<C: Command>(core: &Core, cmd: C) -> (String, CoreError)
where
    Core: Handle<C>,
{
    let text = format!("{cmd:?}");
    match core.execute(cmd) {
        Ok(_) => panic!("{text} was not refused"),
        Err(e) => (text, e),
    }
}

fn list(core: &Core) -> Vec<InstanceView> {
    core.execute(ListInstances).unwrap()
}

fn available(host: &dyn Host, parent: &str, t: &str) -> u32 {
    host.read_trimmed(
        &paths::mdev_type_dir(parent, &t.parse().unwrap()).join("available_instances"),
    )
    .unwrap()
    .parse()
    .unwrap()
}

#[test]
fn create_define_start_stop_destroy_undefine() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let mut events = core.subscribe();

    // Transient, by profile: the matching code picks mbochs-medium.
    let before = available(host.as_ref(), "mbochs", "mbochs-medium");
    let v = instance(core.execute(CreateInstance(req(
        InstanceTarget::Profile("sample-display-16m".into()),
        None,
    ))));
    assert_eq!(
        (v.parent.as_str(), v.type_id.as_str()),
        ("mbochs", "mbochs-medium")
    );
    assert_eq!(
        (v.state, v.ownership, v.defined),
        (InstanceState::Running, Ownership::Daemon, false)
    );
    assert_eq!(v.profile.as_deref(), Some("sample-display-16m"));
    assert!(v.iommu_group.is_some());
    assert!(host.exists(&paths::mdev_device(&v.uuid)));
    assert_eq!(
        available(host.as_ref(), "mbochs", "mbochs-medium"),
        before - 1
    );
    assert!(matches!(events.try_recv().unwrap(), Event::InstanceAdded(a) if a.uuid == v.uuid));

    // Defined by type, started, stopped, started, destroyed.
    let mut r = req(ty("mdpy-vga"), Some("mdpy"));
    r.autostart = true;
    let d = instance(core.execute(DefineInstance(r)));
    assert_eq!(
        (d.state, d.defined, d.autostart),
        (InstanceState::Stopped, true, true)
    );
    assert!(!host.exists(&paths::mdev_device(&d.uuid)));
    let d = instance(core.execute(StartInstance { uuid: d.uuid }));
    assert_eq!(d.state, InstanceState::Running);
    let e = core.execute(StartInstance { uuid: d.uuid }).unwrap_err();
    assert_eq!(e.kind(), "State", "{e}");
    let d = instance(core.execute(StopInstance { uuid: d.uuid }));
    assert_eq!(d.state, InstanceState::Stopped);
    assert!(!host.exists(&paths::mdev_device(&d.uuid)));
    instance(core.execute(StartInstance { uuid: d.uuid }));
    let d2 = instance(core.execute(SetAutostart {
        uuid: d.uuid,
        autostart: false,
    }));
    assert!(!d2.autostart);

    // Undefine keeps the running device as transient; destroy removes everything.
    let u = instance(core.execute(UndefineInstance { uuid: d.uuid }));
    assert_eq!((u.defined, u.state), (false, InstanceState::Running));
    assert_eq!(
        core.execute(DestroyInstance { uuid: d.uuid }).unwrap(),
        None
    );
    assert!(!host.exists(&paths::mdev_device(&d.uuid)));
    assert!(matches!(
        core.execute(GetInstance { uuid: d.uuid }),
        Err(CoreError::NotFound { .. })
    ));

    assert_eq!(
        core.execute(DestroyInstance { uuid: v.uuid }).unwrap(),
        None
    );
    assert_eq!(available(host.as_ref(), "mbochs", "mbochs-medium"), before);
    assert!(list(&core).is_empty());
}

#[test]
fn definitions_survive_a_restart_and_autostart_comes_back() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let (auto, manual, transient) = {
        let core = open(&host, dir.path());
        let mut r = req(ty("mbochs-small"), Some("mbochs"));
        r.autostart = true;
        let auto = instance(core.execute(DefineInstance(r))).uuid;
        let manual = instance(core.execute(DefineInstance(req(ty("mtty-1"), Some("mtty"))))).uuid;
        let transient =
            instance(core.execute(CreateInstance(req(ty("mtty-2"), Some("mtty"))))).uuid;
        (auto, manual, transient)
    };
    // Host "reboot": a fresh kernel, same state directory.
    let rebooted = Arc::new(SimHost::builtin("samples").unwrap());
    let core = open(&rebooted, dir.path());
    let views = list(&core);
    let by = |u: MdevUuid| views.iter().find(|v| v.uuid == u).cloned();
    assert_eq!(
        by(auto).unwrap().state,
        InstanceState::Running,
        "autostart created on start"
    );
    assert_eq!(by(manual).unwrap().state, InstanceState::Stopped);
    assert!(
        by(transient).is_none(),
        "a transient instance does not survive a reboot"
    );
    assert!(rebooted.exists(&paths::mdev_device(&auto)));

    // Daemon restart on the same (not rebooted) host: nothing changes, nothing leaks.
    drop(core);
    let core = open(&rebooted, dir.path());
    assert_eq!(list(&core).len(), 2);
}

#[test]
fn foreign_devices_are_listed_and_never_touched() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let foreign: MdevUuid = FOREIGN.parse().unwrap();
    let v = list(&core)
        .into_iter()
        .find(|v| v.uuid == foreign)
        .expect("foreign instance listed");
    assert_eq!(v.ownership, Ownership::Foreign);
    // Stop and Destroy that name it take it over first (explicit_stop_adopts_a_foreign_device_first);
    // nothing else changes it.
    for (_, e) in [
        refusal(&core, StartInstance { uuid: foreign }),
        refusal(&core, UndefineInstance { uuid: foreign }),
        refusal(
            &core,
            SetAutostart {
                uuid: foreign,
                autostart: true,
            },
        ),
    ] {
        assert_eq!(e.kind(), "Foreign", "{e}");
        assert!(e.to_string().contains(FOREIGN));
    }
    core.execute(Reconcile).unwrap();
    assert!(
        host.exists(&paths::mdev_device(&foreign)),
        "reconcile must not remove a foreign device"
    );

    // An explicit definition with its UUID and type adopts it; then it is ours to stop.
    let mut r = req(ty("nvidia-231"), Some("0000:83:00.0"));
    r.uuid = Some(foreign);
    let a = instance(core.execute(DefineInstance(r)));
    assert_eq!((a.ownership, a.defined), (Ownership::Adopted, true));
    instance(core.execute(StopInstance { uuid: foreign }));
    assert!(!host.exists(&paths::mdev_device(&foreign)));
}

#[test]
fn bad_requests_get_typed_errors_and_change_nothing() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let before = list(&core);
    let cases: Vec<((String, CoreError), &str, &str)> = vec![
        (
            refusal(
                &core,
                CreateInstance(req(InstanceTarget::Profile("nope".into()), None)),
            ),
            "Invalid",
            "vdi-2g",
        ),
        (
            refusal(
                &core,
                CreateInstance(req(ty("nvidia-231"), Some("0000:3b:00.0"))),
            ),
            "Invalid",
            "0000:3b:00.0",
        ),
        (
            refusal(
                &core,
                CreateInstance(req(ty("nvidia-999"), Some("01:00.0"))),
            ),
            "Invalid",
            "nvidia-999",
        ),
        (
            refusal(&core, CreateInstance(req(ty("nvidia-999"), None))),
            "Invalid",
            "nvidia-999",
        ),
        (
            refusal(
                &core,
                StartInstance {
                    uuid: MdevUuid::new_random(),
                },
            ),
            "NotFound",
            "vgpuctl list",
        ),
        (
            refusal(
                &core,
                CreateInstance(req(
                    InstanceTarget::Profile("compute-8g".into()),
                    Some("0000:00:02.0"),
                )),
            ),
            "Invalid",
            "0000:00:02.0",
        ),
    ];
    for ((cmd, e), kind, needle) in cases {
        assert_eq!(e.kind(), kind, "{cmd:?}: {e}");
        assert!(e.to_string().contains(needle), "{cmd:?}: {e}");
    }
    // Homogeneous rule: T4 #2 already runs nvidia-231, so another type there is full.
    let e = core
        .execute(CreateInstance(req(ty("nvidia-232"), Some("0000:83:00.0"))))
        .unwrap_err();
    assert!(e.to_string().contains("full"), "{e}");
    // Duplicate UUID.
    let mut r = req(ty("nvidia-231"), Some("0000:01:00.0"));
    r.uuid = Some(FOREIGN.parse().unwrap());
    assert_eq!(
        core.execute(CreateInstance(r)).unwrap_err().kind(),
        "Exists"
    );
    assert_eq!(list(&core), before);
}

#[test]
fn concurrent_clients_never_exceed_capacity() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = Arc::new(open(&host, dir.path()));
    let capacity = available(host.as_ref(), "mbochs", "mbochs-large");
    let threads: Vec<_> = (0..16)
        .map(|t| {
            let core = core.clone();
            std::thread::spawn(move || {
                let mut mine = Vec::new();
                let mut answered = 0;
                for i in 0..100 {
                    let r = if i % 3 == 2 && !mine.is_empty() {
                        let u: MdevUuid = mine.remove((t + i) % mine.len());
                        core.execute(DestroyInstance { uuid: u }).map(|_| ())
                    } else {
                        let r =
                            core.execute(CreateInstance(req(ty("mbochs-large"), Some("mbochs"))));
                        if let Ok(v) = &r {
                            mine.push(v.uuid);
                        }
                        r.map(|_| ())
                    };
                    match r {
                        Ok(_) => {}
                        Err(e) => assert!(e.to_string().contains("full"), "unexpected error: {e}"),
                    }
                    answered += 1;
                }
                answered
            })
        })
        .collect();
    let answered: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    assert_eq!(answered, 1600);
    let running: BTreeSet<MdevUuid> = list(&core).iter().map(|v| v.uuid).collect();
    let on_host: BTreeSet<MdevUuid> = host
        .list(Path::new(paths::MDEV_DEVICES))
        .unwrap()
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(running, on_host, "the daemon's view equals the host");
    assert!(on_host.len() as u32 <= capacity);
    assert_eq!(
        available(host.as_ref(), "mbochs", "mbochs-large"),
        capacity - on_host.len() as u32
    );
}

#[test]
fn a_parent_that_registers_late_gets_its_autostart_instances_and_removals_are_noticed() {
    let text = include_str!("../../mdev-types/sims/samples.toml").replace(
        "device = \"mbochs\"\nvirtual_class = \"mbochs\"",
        "device = \"mbochs\"\nvirtual_class = \"mbochs\"\nunloaded = true",
    );
    let host = Arc::new(SimHost::from_toml("late.toml", &text).unwrap());
    let events = host.subscribe().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let mut r = req(ty("mbochs-medium"), Some("mbochs"));
    r.autostart = true;
    let v = instance(core.execute(DefineInstance(r)));
    assert_eq!(v.state, InstanceState::WaitingForParent);

    // modprobe mbochs: the daemon learns of it only through the kernel's uevents.
    host.load_module("mbochs").unwrap();
    for ev in events.try_iter() {
        core.handle_uevent(&ev);
    }
    let v = instance(core.execute(GetInstance { uuid: v.uuid }));
    assert_eq!(v.state, InstanceState::Running);
    assert!(host.exists(&paths::mdev_device(&v.uuid)));

    // Someone removes it behind our back: the view follows the kernel event.
    host.write(&paths::mdev_device(&v.uuid).join("remove"), "1")
        .unwrap();
    for ev in events.try_iter() {
        core.handle_uevent(&ev);
    }
    let v = instance(core.execute(GetInstance { uuid: v.uuid }));
    assert_eq!(v.state, InstanceState::Stopped);
}

/// The real kernel announces a new mdev (`add`, `bind`) before it creates the device's `mdev_type`
/// link and `remove` file. This host shows an mdev's `mdev_type` only after it has been asked about it
/// a few times, the way the link appears a moment after the event.
#[derive(Debug)]
struct LateLinks {
    sim: Arc<SimHost>,
    asked: std::sync::Mutex<u32>,
}

impl LateLinks {
    fn hidden(&self, path: &Path) -> bool {
        if !(path.starts_with(paths::MDEV_DEVICES) && path.ends_with("mdev_type")) {
            return false;
        }
        let mut n = self.asked.lock().unwrap();
        *n = n.saturating_add(1);
        *n <= 3
    }
}

impl Host for LateLinks {
    fn read(&self, path: &Path) -> Result<String, vgpu_host::HostError> {
        self.sim.read(path)
    }
    fn write(&self, path: &Path, value: &str) -> Result<(), vgpu_host::HostError> {
        self.sim.write(path, value)
    }
    fn list(&self, path: &Path) -> Result<Vec<String>, vgpu_host::HostError> {
        self.sim.list(path)
    }
    fn read_link(&self, path: &Path) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        self.sim.read_link(path)
    }
    fn canonicalize(&self, path: &Path) -> Result<std::path::PathBuf, vgpu_host::HostError> {
        if self.hidden(path) {
            return Err(vgpu_host::HostError::new(
                vgpu_host::HostOp::Canonicalize,
                path,
                nix::errno::Errno::ENOENT,
            ));
        }
        self.sim.canonicalize(path)
    }
    fn exists(&self, path: &Path) -> bool {
        !self.hidden(path) && self.sim.exists(path)
    }
    fn describe(&self) -> String {
        self.sim.describe()
    }
}

#[test]
fn a_device_announced_before_its_mdev_type_link_exists_is_still_listed() {
    let sim = Arc::new(SimHost::builtin("samples").unwrap());
    let events = sim.subscribe().unwrap();
    let host = Arc::new(LateLinks {
        sim: Arc::clone(&sim),
        asked: std::sync::Mutex::new(u32::MAX),
    });
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    // Someone makes a device through sysfs; its link shows up only after a few looks.
    *host.asked.lock().unwrap() = 0;
    let uuid: MdevUuid = FOREIGN.parse().unwrap();
    sim.write(
        &paths::mdev_type_dir("mtty", &"mtty-1".parse::<MdevTypeId>().unwrap()).join("create"),
        FOREIGN,
    )
    .unwrap();
    for ev in events.try_iter() {
        core.handle_uevent(&ev);
    }
    let v = instance(core.execute(GetInstance { uuid }));
    assert_eq!(v.ownership, Ownership::Foreign);
    assert_eq!(v.state, InstanceState::Running);
}
