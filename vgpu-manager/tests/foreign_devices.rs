//! Devices vgpud did not create (foreign) and `define` of running devices:
//! * an explicit, authorized Stop or Destroy that names a foreign device adopts it into the ledger,
//!   then removes it; an unprivileged caller still cannot (a real uid 65534 on the embedded bus);
//! * reconcile and pools never touch a foreign device;
//! * `define` of a running device persists it as mdevctl does (mdevctl src/main.rs
//!   `define_command_helper`): its own parent and type, or the ones given, the device left as it is;
//! * a type the parent does not list is defined with a warning, and `start` then fails with the
//!   kernel's error.
//!
//! The D-Bus test needs root (to switch users) and `setpriv` (util-linux): without them it fails, or
//! prints SKIPPED under `VGPU_TESTS_ALLOW_SKIP=1`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;
mod dbus_common;

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use dbus_common::system_bus::{NOBODY, open_tempdir, require_root};
use dbus_common::{Daemon, assert_refused, ok_json, vgpuctl, vgpuctl_as};
use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::{Host, paths};
use vgpu_manager::daemon::api::{
    ApplyPool, CreateInstance, DefineInstance, DestroyInstance, GetInstance, InstanceSpec,
    InstanceState, InstanceTarget, ListInstances, Ownership, Reconcile, StartInstance,
    StopInstance, UndefineInstance,
};
use vgpu_manager::daemon::engine::Core;
use vgpu_sim::SimHost;

use core_common::open;

/// The foreign mdev of the demo host (mdev-types/sims/demo.toml): nvidia-231 on the second T4.
const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";
const T4B: &str = "0000:83:00.0";
const T4A: &str = "0000:01:00.0";

fn spec(type_id: &str, gpu: &str, uuid: Option<&str>) -> InstanceSpec {
    InstanceSpec {
        target: InstanceTarget::Type(type_id.parse::<MdevTypeId>().unwrap()),
        gpu: Some(gpu.to_string()),
        uuid: uuid.map(|u| u.parse().unwrap()),
        autostart: false,
        label: None,
        attrs: Vec::new(),
    }
}

fn ledger_file(state: &Path, uuid: &str) -> std::path::PathBuf {
    state.join("ledger").join(format!("{uuid}.toml"))
}

#[test]
fn an_explicit_stop_adopts_a_foreign_device_then_removes_it() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let uuid: MdevUuid = FOREIGN.parse().unwrap();
    let v = core.execute(GetInstance { uuid }).unwrap();
    assert_eq!(
        (v.ownership, v.state),
        (Ownership::Foreign, InstanceState::Running)
    );
    let after = core.execute(StopInstance { uuid }).unwrap();
    assert!(after.is_none(), "a stopped transient device is gone");
    assert!(!host.exists(&paths::mdev_device(&uuid)));
    assert!(
        !ledger_file(dir.path(), FOREIGN).exists(),
        "the adopted entry goes with the device"
    );
    drop(core);
    let core = open(&host, dir.path());
    assert!(core.execute(GetInstance { uuid }).is_err());
}

#[test]
fn define_of_a_foreign_device_with_another_type_leaves_it_running_then_undefine_and_destroy() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let uuid: MdevUuid = FOREIGN.parse().unwrap();
    // mdevctl's define/uuid-running-diff-type: the definition takes the type given (autostart: the
    // start-up reconcile still leaves the foreign device alone).
    let mut auto = spec("nvidia-232", T4B, Some(FOREIGN));
    auto.autostart = true;
    let v = core.execute(DefineInstance(auto)).unwrap();
    assert_eq!(
        (v.ownership, v.state, v.defined, v.type_id.as_str()),
        (
            Ownership::Foreign,
            InstanceState::Running,
            true,
            "nvidia-231"
        ),
        "the device is left as it is: {v:?}"
    );
    core.execute(Reconcile).unwrap();
    drop(core);
    let core = open(&host, dir.path());
    assert!(
        host.exists(&paths::mdev_device(&uuid)),
        "reconcile and autostart keep it"
    );
    let v = core.execute(GetInstance { uuid }).unwrap();
    assert_eq!(
        (v.ownership, v.type_id.as_str(), v.autostart),
        (Ownership::Foreign, "nvidia-231", true)
    );
    assert!(!ledger_file(dir.path(), FOREIGN).exists(), "never adopted");
    // Undefine removes the definition only; defined again, Destroy removes device and definition.
    let v = core.execute(UndefineInstance { uuid }).unwrap().unwrap();
    assert_eq!((v.ownership, v.defined), (Ownership::Foreign, false));
    assert!(
        host.exists(&paths::mdev_device(&uuid)),
        "undefine leaves it"
    );
    core.execute(DefineInstance(spec("nvidia-232", T4B, Some(FOREIGN))))
        .unwrap();
    let after = core.execute(DestroyInstance { uuid }).unwrap();
    assert!(after.is_none());
    assert!(!host.exists(&paths::mdev_device(&uuid)));
    assert!(
        !dir.path()
            .join(format!("definitions/{FOREIGN}.toml"))
            .exists()
    );
    assert!(!ledger_file(dir.path(), FOREIGN).exists());
}

#[test]
fn reconcile_and_pools_never_touch_a_foreign_device() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let uuid: MdevUuid = FOREIGN.parse().unwrap();
    let pool = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pools/vdi-mixed.toml"),
    )
    .unwrap();
    // The pool's desktops go onto the foreign device's T4; then it shrinks to one, which removes
    // devices there again.
    core.execute(ApplyPool { toml: pool.clone() }).unwrap();
    let on_t4b = |core: &Core| {
        core.execute(ListInstances)
            .unwrap()
            .iter()
            .filter(|v| v.parent == T4B && v.ownership == Ownership::Daemon)
            .count()
    };
    let placed = on_t4b(&core);
    assert!(
        placed > 0,
        "the pool placed desktops beside the foreign device"
    );
    let smaller = pool
        .replace("vdi-2g = 8", "vdi-2g = 1")
        .replace("workstation-4g = 4\n", "");
    core.execute(ApplyPool { toml: smaller }).unwrap();
    assert!(
        on_t4b(&core) < placed,
        "the smaller pool removed devices there"
    );
    core.execute(Reconcile).unwrap();
    drop(core);
    let core = open(&host, dir.path());
    assert!(host.exists(&paths::mdev_device(&uuid)));
    let v = core.execute(GetInstance { uuid }).unwrap();
    assert_eq!(v.ownership, Ownership::Foreign);
    assert!(!ledger_file(dir.path(), FOREIGN).exists(), "never adopted");
}

#[test]
fn define_of_a_running_transient_instance_persists_it_untouched() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    // libvirt's nodedev-create, then nodedev-define with the same UUID, parent and type.
    let made = core
        .execute(CreateInstance(spec("nvidia-231", T4A, None)))
        .unwrap();
    let u = made.uuid.to_string();
    let group = made.iommu_group;
    let v = core
        .execute(DefineInstance(spec("nvidia-231", T4A, Some(&u))))
        .unwrap();
    assert_eq!(
        (v.defined, v.state, v.ownership, v.iommu_group),
        (true, InstanceState::Running, Ownership::Daemon, group)
    );
    // A second define is refused: it is defined now.
    let e = core
        .execute(DefineInstance(spec("nvidia-231", T4A, Some(&u))))
        .unwrap_err();
    assert_eq!(e.kind(), "Exists", "{e}");
    // Stop, then start from the definition.
    core.execute(StopInstance { uuid: made.uuid }).unwrap();
    let s = core.execute(StartInstance { uuid: made.uuid }).unwrap();
    assert_eq!(s.unwrap().state, InstanceState::Running);
    drop(core);
    let core = open(&host, dir.path());
    let all = core.execute(ListInstances).unwrap();
    let v = all.iter().find(|v| v.uuid == made.uuid).unwrap();
    assert!(v.defined && v.state == InstanceState::Running, "{v:?}");
}

#[test]
fn a_type_the_parent_does_not_list_is_defined_and_start_fails_with_the_kernels_error() {
    let host = Arc::new(SimHost::builtin("demo").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let unlisted = "nvidia-999";
    assert!(
        !host.exists(&paths::mdev_type_dir(T4A, &unlisted.parse().unwrap())),
        "the T4 does not list {unlisted}"
    );
    let v = core
        .execute(DefineInstance(spec(unlisted, T4A, None)))
        .unwrap();
    assert_eq!((v.defined, v.state), (true, InstanceState::Stopped));
    let e = core.execute(StartInstance { uuid: v.uuid }).unwrap_err();
    assert_eq!(e.kind(), "Kernel", "{e}");
    assert!(e.to_string().contains(unlisted), "{e}");
    let v = core.execute(GetInstance { uuid: v.uuid }).unwrap();
    assert_eq!(v.state, InstanceState::Stopped, "nothing left running");
    // Create still refuses it: a new device needs a type the parent offers.
    let e = core
        .execute(CreateInstance(spec(unlisted, T4A, None)))
        .unwrap_err();
    assert!(e.to_string().contains("offers no mdev type"), "{e}");
}

/// `mdevctl ARGS` (a symlink to vgpuctl) against `bus`, with no sysfs below the root given.
fn mdevctl(dir: &Path, bus: &str, args: &[&str]) -> Output {
    let link = dir.join("mdevctl");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &link).unwrap();
    }
    Command::new(&link)
        .args(args)
        .env("VGPU_BUS", bus)
        .env("VGPU_SYSFS_ROOT", dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn status(bus_out: &Output) -> serde_json::Value {
    ok_json(bus_out)
}

#[tokio::test(flavor = "multi_thread")]
async fn only_an_authorized_caller_stops_a_foreign_device_and_it_is_adopted_first() {
    if !require_root("only_an_authorized_caller_stops_a_foreign_device_and_it_is_adopted_first") {
        return;
    }
    let tmp = open_tempdir();
    let state = tmp.path().join("state");
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let bus = daemon.bus.clone();
    let f = status(&vgpuctl(&bus, &["status", FOREIGN, "--json"]).await);
    assert_eq!(
        (f["owner"].as_str(), f["state"].as_str()),
        (Some("foreign"), Some("running"))
    );
    for (args, method) in [
        (["stop", FOREIGN], "Stop"),
        (["destroy", FOREIGN], "Destroy"),
    ] {
        let o = vgpuctl_as(Some(NOBODY), &bus, &args).await;
        assert_refused(&o, &[&format!("may not call {method}")]);
    }
    let f = status(&vgpuctl(&bus, &["status", FOREIGN, "--json"]).await);
    assert_eq!(
        (f["owner"].as_str(), f["state"].as_str()),
        (Some("foreign"), Some("running")),
        "an unprivileged caller changed nothing"
    );
    assert!(!ledger_file(&state, FOREIGN).exists());

    // As mdevctl (libvirt's nodedev-destroy): adopted, then stopped, and the log says so.
    let o = mdevctl(tmp.path(), &bus, &["stop", "-u", FOREIGN]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        !vgpuctl(&bus, &["status", FOREIGN, "--json"])
            .await
            .status
            .success(),
        "the foreign device is gone"
    );
    assert!(!ledger_file(&state, FOREIGN).exists(), "its entry too");
    let log = daemon.log();
    assert!(
        log.contains("not created by vgpud adopted into the ledger") && log.contains(FOREIGN),
        "{log}"
    );
    drop(daemon);
}

#[tokio::test(flavor = "multi_thread")]
async fn mdevctl_define_of_running_devices_and_of_unlisted_types() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let a = "51a7c0de-0000-4000-8000-0000000000a1";
    let b = "51a7c0de-0000-4000-8000-0000000000b1";
    let c = "51a7c0de-0000-4000-8000-0000000000c1";
    for u in [a, b] {
        let o = mdevctl(
            tmp.path(),
            &bus,
            &[
                "start",
                "--parent",
                T4A,
                "--type",
                "nvidia-231",
                "--uuid",
                u,
            ],
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    // `define --uuid U` of a running transient device: its parent and type.
    let o = mdevctl(tmp.path(), &bus, &["define", "--uuid", a]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // libvirt's nodedev-define after nodedev-create: parent, type and UUID given.
    let o = mdevctl(
        tmp.path(),
        &bus,
        &[
            "define",
            "--parent",
            T4A,
            "--type",
            "nvidia-231",
            "--uuid",
            b,
            "--auto",
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (u, auto) in [(a, false), (b, true)] {
        let s = status(&vgpuctl(&bus, &["status", u, "--json"]).await);
        assert_eq!(
            (
                s["state"].as_str(),
                s["defined"].as_bool(),
                s["autostart"].as_bool()
            ),
            (Some("running"), Some(true), Some(auto)),
            "{u}: {s}"
        );
    }
    // The foreign device too: defined with its own parent and type, so adopted.
    let o = mdevctl(tmp.path(), &bus, &["define", "--uuid", FOREIGN]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = status(&vgpuctl(&bus, &["status", FOREIGN, "--json"]).await);
    assert_eq!(
        (s["owner"].as_str(), s["defined"].as_bool()),
        (Some("adopted"), Some(true))
    );

    // A type the T4 does not list: defined with a warning on stderr; start fails with the kernel's
    // error.
    let o = mdevctl(
        tmp.path(),
        &bus,
        &[
            "define",
            "--parent",
            T4A,
            "--type",
            "nvidia-999",
            "--uuid",
            c,
        ],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("WARN") && err.contains("does not list") && err.contains("nvidia-999"),
        "{err}"
    );
    let o = mdevctl(tmp.path(), &bus, &["start", "--uuid", c]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nvidia-999"), "{err}");
    let s = status(&vgpuctl(&bus, &["status", c, "--json"]).await);
    assert_eq!(s["state"].as_str(), Some("stopped"), "{s}");
    drop(daemon);
}

/// vgpud killed (SIGKILL) at a random moment of an explicit stop of a foreign device, then started
/// again, over many rounds on a journaled simulated kernel that outlives it: the device is either gone
/// (and nothing of it is left in the ledger) or still there, shown as foreign or adopted and never
/// removed by the start; a repeated stop then removes it. The seed is printed (`VGPU_CRASH_SEED`).
#[tokio::test(flavor = "multi_thread")]
async fn kill_9_during_an_explicit_stop_of_a_foreign_device_leaves_a_state_start_up_reconciles() {
    use vgpu_client::Manager1Proxy;

    let mut rng = dbus_common::crash::seeded(
        "kill_9_during_an_explicit_stop_of_a_foreign_device",
        "the kill moments",
    );
    let tmp = tempfile::tempdir().unwrap();
    let journal = tmp.path().join("journal");
    let state = tmp.path().join("state");
    let mtty: MdevTypeId = "mtty-1".parse().unwrap();
    let (mut gone, mut kept, mut adopted) = (0, 0, 0);
    for round in 0..16u32 {
        // Someone else makes a device while vgpud is down.
        let u = format!("f0f0f0f0-0000-4000-8000-{round:012}");
        {
            let sim = SimHost::builtin("samples")
                .unwrap()
                .with_journal(&journal)
                .unwrap();
            sim.write(&paths::mdev_type_dir("mtty", &mtty).join("create"), &u)
                .unwrap();
        }
        let daemon = Daemon::embedded_journaled(tmp.path(), "samples", &journal, &state).await;
        let conn = dbus_common::client(&daemon.bus).await;
        let m = Manager1Proxy::new(&conn).await.unwrap();
        let pid = daemon.pid();
        let delay = std::time::Duration::from_micros(rng.below(20_000));
        let killer = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        });
        let _ = m.stop(&u).await;
        killer.await.unwrap();
        let _ = daemon.wait();
        drop(conn);

        let daemon = Daemon::embedded_journaled(tmp.path(), "samples", &journal, &state).await;
        let present = {
            let host = SimHost::builtin("samples")
                .unwrap()
                .replayed(&journal)
                .unwrap();
            host.exists(&paths::mdev_device(&u.parse().unwrap()))
        };
        let seen = vgpuctl(&daemon.bus, &["status", &u, "--json"]).await;
        if present {
            kept += 1;
            let s = ok_json(&seen);
            adopted += usize::from(s["owner"] == "adopted");
            assert_eq!(s["state"].as_str(), Some("running"), "round {round}: {s}");
            assert!(
                matches!(s["owner"].as_str(), Some("foreign" | "adopted")),
                "round {round}: {s}"
            );
            let o = vgpuctl(&daemon.bus, &["stop", &u]).await;
            assert!(
                o.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        } else {
            gone += 1;
            assert!(
                !seen.status.success(),
                "round {round}: {u} is gone but listed"
            );
        }
        assert!(
            !vgpuctl(&daemon.bus, &["status", &u, "--json"])
                .await
                .status
                .success(),
            "round {round}: {u} stopped"
        );
        assert!(
            !ledger_file(&state, &u).exists(),
            "round {round}: no entry outlives its device"
        );
        drop(daemon);
    }
    eprintln!(
        "kill -9 during a foreign stop: {gone} rounds removed it before the kill, {kept} kept it ({adopted} adopted)"
    );
}
