//! vgpud's own request handling against hostile local clients: floods of pipelined calls from a real
//! unprivileged uid (65534) on the embedded bus, with vgpud under `RLIMIT_NOFILE` 1024 (systemd's
//! default soft limit, set with util-linux's `prlimit`). Checked: vgpud never exits, holds no file
//! descriptor per pending call, stays under an RSS bound, answers every flooded call (a reply or a
//! typed refusal naming the limit, never silence), answers a normal client within seconds during
//! the flood, and drops the work of a client that has gone.
//!
//! The attacking clients are this test binary run again as uid 65534 (see [`attacker`]). Needs
//! root (to switch uid) and util-linux's `prlimit`; not run as root, each test fails unless
//! `VGPU_TESTS_ALLOW_SKIP=1` is set (then it prints `SKIPPED: <reason>` and returns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::process::Child;

use dbus_common::Daemon;
use dbus_common::flood::{
    self, Attack, assert_all_answered, assert_bounds, finished, observe, timed_call,
};
use dbus_common::objects::flood_observed;
use dbus_common::system_bus::{open_tempdir, require_root};

/// Not a test of its own: the entry point of the attacking client, which [`flood::spawn`] runs as
/// uid 65534. Without [`flood::ROLE_VAR`] it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker() {
    flood::attacker_main().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_reads_and_refused_changes_cost_no_fds_and_others_stay_answered() {
    if !require_root("floods_of_reads_and_refused_changes_cost_no_fds_and_others_stay_answered") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&daemon.bus).await;
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());

    // 160 calls ahead of their answers: past the embedded bus's 128 waiting, which it refuses at
    // once, while what the attackers have to read stays within their sockets' buffers (busd
    // disconnects a client that does not take its messages within 100 ms).
    let reads = Attack::manager("ListGpus", 10_000).window(160);
    let changes = Attack::destroy(3_000).window(160);
    let mut a = flood::spawn(&daemon.bus, &reads);
    let mut b = flood::spawn(&daemon.bus, &changes);
    let o = observe(&mut daemon, &conn, || finished(&mut a) && finished(&mut b)).await;
    daemon.assert_running("after the flood");
    assert_bounds("ListGpus and Destroy floods", &o, idle_fds, idle_rss);
    assert_all_answered(
        "10,000 ListGpus",
        &flood::tally(a),
        reads.count,
        &[
            "ok",
            "org.vgpumanager.Error.LimitsExceeded",
            "org.freedesktop.DBus.Error.LimitsExceeded",
        ],
    );
    assert_all_answered(
        "3,000 Destroy",
        &flood::tally(b),
        changes.count,
        &[
            "org.vgpumanager.Error.AccessDenied",
            "org.vgpumanager.Error.LimitsExceeded",
            "org.freedesktop.DBus.Error.LimitsExceeded",
        ],
    );
    // Still fully working afterwards.
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_of_a_client_that_has_gone_is_dropped() {
    if !require_root("the_work_of_a_client_that_has_gone_is_dropped") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&daemon.bus).await;
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    // Three clients that each pipeline 10,000 ListGpus and leave at once.
    let floods: Vec<Child> = (0..3)
        .map(|_| flood::spawn(&daemon.bus, &Attack::manager("ListGpus", 10_000).leaving()))
        .collect();
    for f in floods {
        flood::tally(f);
    }
    // They are gone: what they queued must not keep the normal client waiting.
    let mut rounds = 0;
    let o = observe(&mut daemon, &conn, || {
        rounds += 1;
        rounds >= 20
    })
    .await;
    daemon.assert_running("after the clients left");
    assert_bounds("after three flooding clients left", &o, idle_fds, idle_rss);
}

const OBJECT_MANAGER: &str = "org.freedesktop.DBus.ObjectManager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const GPU1: &str = "org.vgpumanager.Gpu1";
const LIMITS_EXCEEDED: &str = "org.vgpumanager.Error.LimitsExceeded";
/// The embedded bus's own refusal of a call past a connection's 128 calls waiting for replies.
const BUS_LIMITS_EXCEEDED: &str = "org.freedesktop.DBus.Error.LimitsExceeded";

/// The object path of vgpud's first GPU.
async fn first_gpu_path(conn: &zbus::Connection) -> String {
    let m = vgpu_client::Manager1Proxy::new(conn).await.unwrap();
    let gpus = m.list_gpus().await.unwrap();
    gpus.first().expect("a GPU").path.to_string()
}

/// Calls `GetManagedObjects` as a normal client until `stop` is set; the slowest answer.
fn time_managed_objects(
    conn: &zbus::Connection,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<std::time::Duration> {
    let conn = conn.clone();
    tokio::spawn(async move {
        let mut slowest = std::time::Duration::ZERO;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            slowest = slowest.max(timed_call(&conn, OBJECT_MANAGER, "GetManagedObjects").await);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        slowest
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_get_managed_objects_is_admitted_and_answered_from_one_reply() {
    if !require_root("a_flood_of_get_managed_objects_is_admitted_and_answered_from_one_reply") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    // Instances too, so that each answer is the size of a small real host's.
    for _ in 0..4 {
        dbus_common::ok(
            &dbus_common::vgpuctl(&daemon.bus, &["create", "--profile", "vdi-1g"]).await,
        );
    }
    let conn = dbus_common::client(&daemon.bus).await;
    timed_call(&conn, OBJECT_MANAGER, "GetManagedObjects").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());

    let flood = Attack::call(
        vgpu_client::MANAGER_PATH,
        OBJECT_MANAGER,
        "GetManagedObjects",
        flood::Args::None,
        10_000,
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timer = time_managed_objects(&conn, stop.clone());
    let (o, tally) = flood_observed(&mut daemon, &conn, &flood).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let slowest = timer.await.unwrap();
    daemon.assert_running("after the flood");
    assert_bounds("10,000 GetManagedObjects", &o, idle_fds, idle_rss);
    println!("a normal client's slowest GetManagedObjects during the flood: {slowest:?}");
    assert!(
        slowest <= flood::ANSWER_BOUND,
        "a normal client's GetManagedObjects took {slowest:?} during the flood"
    );
    assert_all_answered(
        "10,000 GetManagedObjects",
        &tally,
        flood.count,
        &["ok", LIMITS_EXCEEDED, BUS_LIMITS_EXCEEDED],
    );
    timed_call(&conn, OBJECT_MANAGER, "GetManagedObjects").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_pipeline_get_managed_objects_and_leave_cost_nothing_after() {
    if !require_root("clients_that_pipeline_get_managed_objects_and_leave_cost_nothing_after") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&daemon.bus).await;
    timed_call(&conn, OBJECT_MANAGER, "GetManagedObjects").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    let leaving = Attack::call(
        vgpu_client::MANAGER_PATH,
        OBJECT_MANAGER,
        "GetManagedObjects",
        flood::Args::None,
        10_000,
    )
    .leaving();
    let floods: Vec<Child> = (0..3)
        .map(|_| flood::spawn(&daemon.bus, &leaving))
        .collect();
    for f in floods {
        flood::tally(f);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timer = time_managed_objects(&conn, stop.clone());
    let mut rounds = 0;
    let o = observe(&mut daemon, &conn, || {
        rounds += 1;
        rounds >= 20
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let slowest = timer.await.unwrap();
    daemon.assert_running("after the clients left");
    assert_bounds(
        "after three clients pipelined GetManagedObjects and left",
        &o,
        idle_fds,
        idle_rss,
    );
    assert!(
        slowest <= flood::ANSWER_BOUND,
        "a normal client's GetManagedObjects took {slowest:?} after the flooding clients left"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_gpu_scheduling_reads_is_admitted_like_the_methods() {
    if !require_root("a_flood_of_gpu_scheduling_reads_is_admitted_like_the_methods") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&daemon.bus).await;
    let gpu = first_gpu_path(&conn).await;
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    // Gpu1's one read that does host I/O: Scheduling, read back through the vendor backend.
    let reads = Attack::call(
        &gpu,
        PROPERTIES,
        "Get",
        flood::Args::TwoStrs(GPU1.into(), "Scheduling".into()),
        10_000,
    );
    let (o, tally) = flood_observed(&mut daemon, &conn, &reads).await;
    daemon.assert_running("after the flood");
    assert_bounds("10,000 Gpu1 Scheduling reads", &o, idle_fds, idle_rss);
    assert_all_answered(
        "10,000 Gpu1 Scheduling reads",
        &tally,
        reads.count,
        &["ok", LIMITS_EXCEEDED, BUS_LIMITS_EXCEEDED],
    );
    assert!(
        tally.get(LIMITS_EXCEEDED).copied().unwrap_or(0) > 0,
        "10,000 pipelined Scheduling reads, none refused: they are not admitted ({tally:?})"
    );
}

/// The interfaces zbus answers itself on every object (Properties, Introspectable, Peer) are not
/// admitted by vgpud: each call is cheap, answered from the object in memory. Measured here: one
/// flood after another of 10,000 pipelined calls each, vgpud held to the same bounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_the_standard_interfaces_stay_within_the_bounds() {
    if !require_root("floods_of_the_standard_interfaces_stay_within_the_bounds") {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let made = dbus_common::ok_json(
        &dbus_common::vgpuctl(&daemon.bus, &["create", "--profile", "vdi-1g", "--json"]).await,
    );
    let instance = made["path"].as_str().unwrap().to_string();
    let conn = dbus_common::client(&daemon.bus).await;
    let gpu = first_gpu_path(&conn).await;
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    let manager = vgpu_client::MANAGER_PATH;
    let two = |i: &str, p: &str| flood::Args::TwoStrs(i.into(), p.into());
    let one = |i: &str| flood::Args::Str(i.into());
    let floods = [
        (
            "Properties.Get of Instance1.State",
            Attack::call(
                &instance,
                PROPERTIES,
                "Get",
                two("org.vgpumanager.Instance1", "State"),
                10_000,
            ),
            vec!["ok"],
        ),
        (
            "Properties.GetAll of Instance1",
            Attack::call(
                &instance,
                PROPERTIES,
                "GetAll",
                one("org.vgpumanager.Instance1"),
                10_000,
            ),
            vec!["ok"],
        ),
        (
            // Scheduling is read through admission: left out of the answers past the limit, as zbus
            // leaves out a property whose read fails.
            "Properties.GetAll of Gpu1",
            Attack::call(&gpu, PROPERTIES, "GetAll", one(GPU1), 10_000),
            vec!["ok"],
        ),
        (
            "Properties.Set of Manager1.Version (read-only)",
            Attack::call(
                manager,
                PROPERTIES,
                "Set",
                flood::Args::SetStr(
                    "org.vgpumanager.Manager1".into(),
                    "Version".into(),
                    "x".into(),
                ),
                10_000,
            ),
            vec!["org.freedesktop.DBus.Error.PropertyReadOnly"],
        ),
        (
            "Peer.Ping",
            Attack::call(
                manager,
                "org.freedesktop.DBus.Peer",
                "Ping",
                flood::Args::None,
                10_000,
            ),
            vec!["ok"],
        ),
    ];
    for (what, attack, mut allowed) in floods {
        // The bus itself refuses a call past the connection's 128 waiting for replies.
        allowed.push(BUS_LIMITS_EXCEEDED);
        let (o, tally) = flood_observed(&mut daemon, &conn, &attack).await;
        daemon.assert_running(what);
        assert_bounds(what, &o, idle_fds, idle_rss);
        assert_all_answered(what, &tally, attack.count, &allowed);
    }
}

/// vgpud answers `Introspect` through admission from the XML built once per served-objects
/// generation (zbus built each answer anew, about 80 KiB of vgpud's memory per call pending:
/// 10,000 pipelined grew vgpud's RSS by 780 MiB on a bus that lets them all through). This holds
/// vgpud to its bounds with the bus's most pending per connection (dbus-daemon's
/// `max_replies_per_connection`, 128 on the system bus) pipelined, at each of the 64 connections
/// one user may open on the embedded bus (here 4 at once, 5 times over); past the user's 64
/// pending in vgpud, calls are refused typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_within_the_bus_limit_of_pending_calls_stays_within_the_bounds() {
    if !require_root("introspection_within_the_bus_limit_of_pending_calls_stays_within_the_bounds")
    {
        return;
    }
    let tmp = open_tempdir();
    let mut daemon = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&daemon.bus).await;
    timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    let attack = Attack::call(
        vgpu_client::MANAGER_PATH,
        "org.freedesktop.DBus.Introspectable",
        "Introspect",
        flood::Args::None,
        128,
    );
    for round in 0..5 {
        let mut attackers: Vec<Child> =
            (0..4).map(|_| flood::spawn(&daemon.bus, &attack)).collect();
        let o = observe(&mut daemon, &conn, || attackers.iter_mut().all(finished)).await;
        let what = format!("round {round}: 4 clients × 128 pipelined Introspect");
        daemon.assert_running(&what);
        assert_bounds(&what, &o, idle_fds, idle_rss);
        for a in attackers {
            assert_all_answered(
                &what,
                &flood::tally(a),
                attack.count,
                &["ok", BUS_LIMITS_EXCEEDED, LIMITS_EXCEEDED],
            );
        }
    }
}
