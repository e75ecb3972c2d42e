//! Commands on one instance racing each other, through the core directly on a simulated host, many
//! threads at once: every answer is the typed error the final state explains (NotFound for an
//! instance another command removed, a state error for one in the wrong state), a Stop never calls
//! our own instance foreign, and of concurrent Destroys exactly one succeeds. The last test runs
//! the Create/Destroy race over D-Bus against the real `vgpud`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;
mod dbus_common;

use std::collections::BTreeMap;
use std::sync::{Arc, Barrier};

use mdev_types::ids::{MdevTypeId, MdevUuid};
use vgpu_host::Host;
use vgpu_manager::daemon::api::{
    CoreError, CreateInstance, DefineInstance, DestroyInstance, InstanceSpec, InstanceTarget,
    StartInstance, StopInstance,
};
use vgpu_sim::SimHost;

use core_common::open;

/// Rounds per test; each round races fresh threads.
const ROUNDS: usize = 60;
/// Threads racing in each round.
const THREADS: usize = 8;

fn spec(uuid: MdevUuid) -> InstanceSpec {
    InstanceSpec {
        target: InstanceTarget::Type("mdpy-vga".parse::<MdevTypeId>().unwrap()),
        gpu: Some("mdpy".into()),
        uuid: Some(uuid),
        autostart: false,
        label: None,
        attrs: Vec::new(),
    }
}

/// `Ok` or the error's kind.
fn kind<T>(r: &Result<T, CoreError>) -> &'static str {
    match r {
        Ok(_) => "Ok",
        Err(e) => e.kind(),
    }
}

/// Runs `f(i)` on `n` threads released together and collects the answers.
fn race<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let start = Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (start, f) = (&start, &f);
                s.spawn(move || {
                    start.wait();
                    f(i)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn tally(kinds: impl IntoIterator<Item = &'static str>) -> BTreeMap<&'static str, usize> {
    let mut t = BTreeMap::new();
    for k in kinds {
        *t.entry(k).or_default() += 1;
    }
    t
}

#[test]
fn of_concurrent_destroys_of_one_instance_exactly_one_succeeds() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    for round in 0..ROUNDS {
        let uuid = MdevUuid::new_random();
        // Alternate a transient instance and a defined, running one.
        if round % 2 == 0 {
            core.execute(CreateInstance(spec(uuid))).unwrap();
        } else {
            core.execute(DefineInstance(spec(uuid))).unwrap();
            core.execute(StartInstance { uuid }).unwrap();
        }
        let answers = race(THREADS, |_| kind(&core.execute(DestroyInstance { uuid })));
        let t = tally(answers);
        assert_eq!(
            t.get("Ok"),
            Some(&1),
            "round {round}: exactly one Destroy succeeds: {t:?}"
        );
        assert!(
            t.keys().all(|k| matches!(*k, "Ok" | "NotFound")),
            "round {round}: the others find nothing: {t:?}"
        );
        assert!(!host.exists(&vgpu_host::paths::mdev_device(&uuid)));
    }
}

#[test]
fn create_against_destroy_of_one_uuid_answers_only_what_happened() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let uuid = MdevUuid::new_random();
    let mut all = Vec::new();
    for round in 0..ROUNDS * 3 {
        // Half the threads create the UUID, half destroy it.
        let answers = race(THREADS, |i| {
            if i % 2 == 0 {
                ("Create", kind(&core.execute(CreateInstance(spec(uuid)))))
            } else {
                ("Destroy", kind(&core.execute(DestroyInstance { uuid })))
            }
        });
        for (cmd, k) in &answers {
            let fine = match *cmd {
                // Made it, or the UUID was taken (by another Create, or not yet destroyed).
                "Create" => matches!(*k, "Ok" | "Exists"),
                // Removed it, or there was nothing (yet, or any more).
                _ => matches!(*k, "Ok" | "NotFound"),
            };
            assert!(fine, "round {round}: {cmd} answered {k}: {answers:?}");
        }
        all.extend(answers);
        let _ = core.execute(DestroyInstance { uuid });
    }
    let t = tally(all.iter().map(|(_, k)| *k));
    assert!(t.get("Ok").copied().unwrap_or(0) > ROUNDS, "{t:?}");
}

#[test]
fn stop_never_calls_our_own_instance_foreign() {
    let host = Arc::new(SimHost::builtin("samples").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let uuid = MdevUuid::new_random();
    let mut seen = Vec::new();
    for round in 0..ROUNDS * 3 {
        // Creates, Stops and Destroys of one UUID: the instance is only ever ours.
        let answers = race(THREADS, |i| match i % 3 {
            0 => ("Create", kind(&core.execute(CreateInstance(spec(uuid))))),
            1 => ("Stop", kind(&core.execute(StopInstance { uuid }))),
            _ => ("Destroy", kind(&core.execute(DestroyInstance { uuid }))),
        });
        for (cmd, k) in &answers {
            let fine = match *cmd {
                "Create" => matches!(*k, "Ok" | "Exists"),
                // Stopped it, it was not running, or it was gone.
                "Stop" => matches!(*k, "Ok" | "State" | "NotFound"),
                _ => matches!(*k, "Ok" | "NotFound"),
            };
            assert!(fine, "round {round}: {cmd} answered {k}: {answers:?}");
        }
        seen.extend(answers);
        let _ = core.execute(DestroyInstance { uuid });
    }
    let stops = tally(seen.iter().filter(|(c, _)| *c == "Stop").map(|(_, k)| *k));
    assert!(
        stops.contains_key("Ok"),
        "some Stop must have found it running: {stops:?}"
    );
}

/// The same race over D-Bus against the real `vgpud`: two clients on their own connections, one
/// creating a UUID and one destroying it, never get `Internal` or a state error for what happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_against_destroy_over_dbus_answers_typed_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = dbus_common::Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let creator = dbus_common::client(&daemon.bus).await;
    let destroyer = dbus_common::client(&daemon.bus).await;
    let uuid = MdevUuid::new_random().to_string();
    let name = |r: &Result<(), zbus::Error>| match r {
        Ok(()) => "Ok".to_string(),
        Err(zbus::Error::MethodError(n, _, _)) => n.to_string(),
        Err(e) => format!("{e}"),
    };
    let mut answers: BTreeMap<(String, String), usize> = BTreeMap::new();
    for _ in 0..150 {
        let c = vgpu_client::Manager1Proxy::new(&creator).await.unwrap();
        let d = vgpu_client::Manager1Proxy::new(&destroyer).await.unwrap();
        // The destroyer keeps destroying until the create is answered, to hit every window of it.
        let created = std::sync::atomic::AtomicBool::new(false);
        let (made, gone) = tokio::join!(
            async {
                let r = c
                    .create(
                        "type",
                        "nvidia-231",
                        "",
                        &uuid,
                        std::collections::HashMap::new(),
                    )
                    .await
                    .map(|_| ());
                created.store(true, std::sync::atomic::Ordering::SeqCst);
                r
            },
            async {
                let mut answers = Vec::new();
                while !created.load(std::sync::atomic::Ordering::SeqCst) {
                    answers.push(name(&d.destroy(&uuid).await));
                }
                answers
            }
        );
        *answers.entry(("Create".into(), name(&made))).or_default() += 1;
        for g in gone {
            *answers.entry(("Destroy".into(), g)).or_default() += 1;
        }
        let _ = d.destroy(&uuid).await;
    }
    println!("{answers:?}");
    for ((cmd, answer), n) in &answers {
        let fine = match cmd.as_str() {
            "Create" => matches!(answer.as_str(), "Ok" | "org.vgpumanager.Error.Exists"),
            _ => matches!(answer.as_str(), "Ok" | "org.vgpumanager.Error.NotFound"),
        };
        assert!(fine, "{cmd} answered {answer} {n} times: {answers:?}");
    }
}
