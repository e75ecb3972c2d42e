//! 16 concurrent D-Bus clients × 100 operations on shared parents against the real `vgpud`: every call is
//! answered (a reply or a typed error), capacity is never exceeded, and the daemon's view equals the host's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use vgpu_client::{Manager1Proxy, SERVICE};
use vgpu_host::{Host, HostExt, paths};
use vgpu_sim::SimHost;

mod dbus_common;
use dbus_common::Daemon;

const CLIENTS: usize = 16;
const OPS: usize = 100;
/// Shared parents and the type each client uses there (samples host: mbochs-large 4, mdpy 4 in all).
const TARGETS: &[(&str, &str)] = &[
    ("mbochs", "mbochs-large"),
    ("mdpy", "mdpy-vga"),
    ("mdpy", "mdpy-hd"),
];

async fn connect(bus: &str) -> zbus::Connection {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(conn) = zbus::connection::Builder::address(bus).build().await
            && let Ok(dbus) = zbus::fdo::DBusProxy::new(&conn).await
            && dbus.name_has_owner(SERVICE.try_into().unwrap()).await == Ok(true)
        {
            return conn;
        }
        assert!(Instant::now() < deadline, "vgpud did not come up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn available(host: &dyn Host, parent: &str, ty: &str) -> u32 {
    host.read_trimmed(
        &paths::mdev_type_dir(parent, &ty.parse().unwrap()).join("available_instances"),
    )
    .unwrap()
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_clients_never_exceed_capacity_and_every_call_is_answered() {
    let tmp = tempfile::tempdir().unwrap();
    let journal = tmp.path().join("kernel.journal");
    let daemon =
        Daemon::embedded_journaled(tmp.path(), "samples", &journal, &tmp.path().join("state"))
            .await;
    let bus = daemon.bus.clone();
    let _ready = connect(&bus).await;

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let bus = bus.clone();
            tokio::spawn(async move {
                // Each client has its own connection, as separate VDI tools would.
                let conn = connect(&bus).await;
                let p = Manager1Proxy::new(&conn).await.unwrap();
                let mut mine: Vec<String> = Vec::new();
                let (mut ok, mut refused) = (0, 0);
                for i in 0..OPS {
                    let call = async {
                        if i % 3 == 2 && !mine.is_empty() {
                            let u = mine.remove((c + i) % mine.len());
                            p.destroy(&u).await.map(|_| None)
                        } else {
                            let (parent, ty) = TARGETS[(c + i) % TARGETS.len()];
                            p.create("type", ty, parent, "", HashMap::new())
                                .await
                                .map(Some)
                        }
                    };
                    let answer = tokio::time::timeout(Duration::from_secs(30), call)
                        .await
                        .unwrap_or_else(|_| panic!("client {c} call {i} was never answered"));
                    match answer {
                        Ok(Some(path)) => {
                            mine.push(path.as_str().rsplit('/').next().unwrap().replace('_', "-"));
                            ok += 1;
                        }
                        Ok(None) => ok += 1,
                        Err(zbus::Error::MethodError(name, msg, _)) => {
                            let msg = msg.unwrap_or_default();
                            assert!(
                                msg.contains("full"),
                                "client {c} call {i}: unexpected refusal {name}: {msg}"
                            );
                            refused += 1;
                        }
                        Err(e) => panic!("client {c} call {i}: {e}"),
                    }
                }
                (ok, refused)
            })
        })
        .collect();
    let (mut ok, mut refused) = (0, 0);
    for c in clients {
        let (o, r) = c.await.unwrap();
        ok += o;
        refused += r;
    }
    assert_eq!(ok + refused, CLIENTS * OPS, "every call answered");
    assert!(refused > 0, "the test must push the parents to capacity");

    let p = Manager1Proxy::new(&connect(&bus).await).await.unwrap();
    let listed: BTreeSet<String> = p
        .list_instances()
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.uuid)
        .collect();
    let host = SimHost::builtin("samples")
        .unwrap()
        .replayed(&journal)
        .unwrap();
    let on_host: BTreeSet<String> = host
        .list(Path::new(paths::MDEV_DEVICES))
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(listed, on_host, "the daemon's view equals the host");
    // Capacity: what the kernel model reports is consistent with what exists, and never negative.
    let fresh = SimHost::builtin("samples").unwrap();
    for (parent, ty) in TARGETS {
        let used = host
            .list(&paths::mdev_type_dir(parent, &ty.parse().unwrap()).join("devices"))
            .unwrap()
            .len() as u32;
        assert!(
            used <= available(&fresh, parent, ty),
            "{ty}: {used} instances exceed its capacity"
        );
    }
    println!(
        "{ok} answered, {refused} refused as full, {} instances left",
        on_host.len()
    );
}
