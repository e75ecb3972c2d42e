//! Crash safety: 1,000 random lifecycle operations against the real `vgpud` over its embedded bus, with
//! the daemon killed by SIGKILL at random moments (mid-request included) and restarted. The simulated
//! kernel keeps its state in a journal, so it outlives the daemon as a real kernel would.
//!
//! After every restart and at the end:
//! * no lost definitions: every definition whose `Define` was answered (and not later undone by an
//!   answered `Undefine`/`Destroy`) is listed as defined;
//! * no leaked instances: every device on the host is known to the daemon as its own (the test makes no
//!   device outside the daemon, so a device shown as foreign is one the daemon made and forgot), and the
//!   daemon lists nothing the host does not have;
//! * at the end, destroying everything through the daemon leaves the host and the ledger empty.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use vgpu_client::{InstanceInfo, Manager1Proxy};
use vgpu_host::{Host, paths};
use vgpu_sim::SimHost;

mod dbus_common;
use dbus_common::Daemon;
use dbus_common::crash::{self, Rng};

const OPS: usize = 1000;

struct World {
    dir: PathBuf,
    bus: String,
    journal: PathBuf,
    state: PathBuf,
    starts: usize,
}

impl World {
    /// Starts vgpud (the shared launcher: embedded bus, simulated host `samples` journaled in `journal`).
    async fn spawn(&mut self) -> Daemon {
        self.starts += 1;
        Daemon::embedded_journaled(&self.dir, "samples", &self.journal, &self.state).await
    }

    async fn connect(&self) -> Manager1Proxy<'static> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Ask the bus first: busd drops calls to a name nobody owns yet instead of answering
            // ServiceUnknown, so calling before the daemon owns its name would wait for a timeout.
            let short = Duration::from_secs(2);
            if let Ok(Ok(conn)) = tokio::time::timeout(
                short,
                zbus::connection::Builder::address(self.bus.as_str()).build(),
            )
            .await
                && let Ok(Ok(dbus)) =
                    tokio::time::timeout(short, zbus::fdo::DBusProxy::new(&conn)).await
                && let Ok(Ok(true)) = tokio::time::timeout(
                    short,
                    dbus.name_has_owner(vgpu_client::SERVICE.try_into().unwrap()),
                )
                .await
                && let Ok(Ok(p)) = tokio::time::timeout(short, Manager1Proxy::new(&conn)).await
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "vgpud did not come up; see {}",
                self.dir.display()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The devices on the simulated host (read from the journal while the daemon is idle).
    fn host_devices(&self) -> BTreeSet<String> {
        let host = SimHost::builtin("samples")
            .unwrap()
            .replayed(&self.journal)
            .unwrap();
        host.list(Path::new(paths::MDEV_DEVICES))
            .unwrap()
            .into_iter()
            .collect()
    }
}

/// What the test knows for sure from answered calls.
#[derive(Default)]
struct Knowledge {
    /// Definitions that must exist.
    defined: BTreeSet<String>,
    /// UUIDs whose fate is unknown (the daemon died while handling them).
    uncertain: BTreeSet<String>,
    /// Every UUID the test ever asked about.
    all: BTreeSet<String>,
}

const TYPES: &[(&str, &str)] = &[
    ("mbochs", "mbochs-small"),
    ("mtty", "mtty-1"),
    ("mdpy", "mdpy-vga"),
];

fn pick<'a>(rng: &mut Rng, v: &'a [String]) -> Option<&'a String> {
    (!v.is_empty()).then(|| &v[rng.below(v.len() as u64) as usize])
}

/// Awaits a D-Bus call; a call that gets no answer at all (neither reply nor disconnect) is a bug.
async fn answered<T>(
    what: &str,
    f: impl std::future::Future<Output = zbus::Result<T>>,
) -> zbus::Result<T> {
    match tokio::time::timeout(Duration::from_secs(30), f).await {
        Ok(r) => r,
        Err(_) => panic!("{what}: no answer and no disconnect within 30 s"),
    }
}

/// One random operation. Returns the UUID it concerned and whether it was answered successfully
/// (`Some(true)`), refused (`Some(false)`) or not answered (`None`: the daemon died).
async fn random_op(p: &Manager1Proxy<'_>, rng: &mut Rng, k: &mut Knowledge) -> bool {
    let known: Vec<String> = k.all.iter().cloned().collect();
    let (parent, ty) = TYPES[rng.below(TYPES.len() as u64) as usize];
    let fresh = uuid_from(rng);
    let mut opts = HashMap::new();
    let choice = rng.below(10);
    let (uuid, result, effect): (String, zbus::Result<()>, &str) = match choice {
        0..=2 => {
            let r = answered("create", p.create("type", ty, parent, &fresh, opts))
                .await
                .map(|_| ());
            (fresh, r, "create")
        }
        3..=4 => {
            opts.insert("autostart", zbus::Variant::from(rng.below(2) == 0));
            let r = answered("define", p.define("type", ty, parent, &fresh, opts))
                .await
                .map(|_| ());
            (fresh, r, "define")
        }
        5 => match pick(rng, &known) {
            Some(u) => (u.clone(), answered("start", p.start(u)).await, "start"),
            None => return true,
        },
        6 => match pick(rng, &known) {
            Some(u) => (u.clone(), answered("stop", p.stop(u)).await, "stop"),
            None => return true,
        },
        7..=8 => match pick(rng, &known) {
            Some(u) => (
                u.clone(),
                answered("destroy", p.destroy(u)).await,
                "destroy",
            ),
            None => return true,
        },
        _ => match pick(rng, &known) {
            Some(u) => (
                u.clone(),
                answered("undefine", p.undefine(u)).await,
                "undefine",
            ),
            None => return true,
        },
    };
    k.all.insert(uuid.clone());
    match result {
        Ok(()) => {
            k.uncertain.remove(&uuid);
            match effect {
                "define" => {
                    k.defined.insert(uuid);
                }
                "destroy" | "undefine" => {
                    k.defined.remove(&uuid);
                }
                _ => {}
            }
            true
        }
        Err(zbus::Error::MethodError(name, _, _))
            if name.as_str().starts_with("org.vgpumanager.Error") =>
        {
            true
        }
        Err(_) => {
            // No answer: the daemon was killed during this call. Its outcome is unknown.
            k.uncertain.insert(uuid.clone());
            k.defined.remove(&uuid);
            false
        }
    }
}

fn uuid_from(rng: &mut Rng) -> String {
    let (a, b) = (rng.next(), rng.next());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

async fn check(
    world: &World,
    p: &Manager1Proxy<'_>,
    k: &Knowledge,
    when: &str,
) -> Vec<InstanceInfo> {
    let list = answered("list", p.list_instances()).await.unwrap();
    let by: BTreeMap<&str, &InstanceInfo> = list.iter().map(|i| (i.uuid.as_str(), i)).collect();
    for u in &k.defined {
        let i = by
            .get(u.as_str())
            .unwrap_or_else(|| panic!("{when}: definition {u} was lost"));
        assert!(i.defined, "{when}: {u} is no longer defined");
    }
    for i in &list {
        assert_ne!(
            i.owner, "foreign",
            "{when}: {} leaked: made by the daemon, no longer known as its own",
            i.uuid
        );
    }
    let running: BTreeSet<String> = list
        .iter()
        .filter(|i| i.state == "running")
        .map(|i| i.uuid.clone())
        .collect();
    assert_eq!(
        running,
        world.host_devices(),
        "{when}: the daemon's running instances differ from the host"
    );
    list
}

#[tokio::test(flavor = "multi_thread")]
async fn kill_9_at_random_points_loses_nothing_and_leaks_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rng = crash::seeded("crash test", "the operation sequence");
    let mut world = World {
        dir: tmp.path().to_path_buf(),
        bus: format!("unix:path={}", tmp.path().join("bus.sock").display()),
        journal: tmp.path().join("kernel.journal"),
        state: tmp.path().join("state"),
        starts: 0,
    };
    let mut k = Knowledge::default();
    let started = Instant::now();
    let mut daemon = world.spawn().await;
    let mut proxy = world.connect().await;
    let mut done = 0;
    let mut kills = 0;
    while done < OPS {
        // Arm a kill at a random moment within the next batch of operations.
        let pid = daemon.pid();
        let delay = Duration::from_micros(rng.below(150_000));
        let killer = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        });
        let batch = 1 + rng.below(30) as usize;
        for _ in 0..batch {
            done += 1;
            if !random_op(&proxy, &mut rng, &mut k).await {
                break;
            }
        }
        tokio::time::timeout(Duration::from_secs(5), killer)
            .await
            .expect("killer")
            .unwrap();
        let _killed = daemon.wait();
        kills += 1;
        daemon = world.spawn().await;
        proxy = world.connect().await;
        check(
            &world,
            &proxy,
            &k,
            &format!("after kill {kills} (op {done})"),
        )
        .await;
        if kills % 10 == 0 {
            eprintln!(
                "{kills} kills, {done} operations, {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!(
        "{done} operations, {kills} kills, {} daemon starts",
        world.starts
    );
    assert!(kills >= 20, "too few kills to mean anything: {kills}");

    // Clean up through the daemon: everything of ours can be removed, and then nothing is left.
    let list = check(&world, &proxy, &k, "final").await;
    for i in &list {
        proxy
            .destroy(&i.uuid)
            .await
            .unwrap_or_else(|e| panic!("destroy {}: {e}", i.uuid));
    }
    assert!(proxy.list_instances().await.unwrap().is_empty());
    drop(daemon);
    assert!(world.host_devices().is_empty(), "devices left on the host");
    for sub in ["ledger", "definitions"] {
        let left: Vec<_> = std::fs::read_dir(world.state.join(sub)).unwrap().collect();
        assert!(left.is_empty(), "{sub} not empty: {left:?}");
    }
}
