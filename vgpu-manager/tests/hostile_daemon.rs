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

use std::path::Path;
use std::process::Child;

use dbus_common::Daemon;
use dbus_common::flood::{
    self, Attack, assert_all_answered, assert_bounds, finished, observe, timed_call,
};
use dbus_common::system_bus::{open_tempdir, require_root};

/// vgpud on its embedded bus under `RLIMIT_NOFILE` [`dbus_common::HOSTILE_NOFILE`].
async fn limited_daemon(dir: &Path) -> Daemon {
    let d = Daemon::embedded(dir, &dir.join("state")).await;
    d.limit_fds();
    d
}

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
    let mut daemon = limited_daemon(tmp.path()).await;
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
    let mut daemon = limited_daemon(tmp.path()).await;
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
