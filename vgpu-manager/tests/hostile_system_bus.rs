//! Hostile local clients against vgpud on a real `dbus-daemon` configured as Debian's system bus
//! (dbus's default system policy, the shipped `data/org.vgpumanager.Manager1.conf`, the system bus's
//! resource limits and user; `dbus_common::system_bus::real_system_bus`), vgpud under
//! `RLIMIT_NOFILE` 1024 (systemd's default soft limit), every attacker a real unprivileged uid
//! (65534). Each test checks that vgpud never exits, that a normal (root) client stays answered
//! within [`flood::ANSWER_BOUND`], and that vgpud's descriptors and RSS stay within the shared bounds:
//! * (a) 10,000 pipelined `ListGpus` and 3,000 `Destroy`: the policy refuses every Destroy at the
//!   bus (`AccessDenied`), every ListGpus is answered or refused typed;
//! * (b) 10,000 pipelined `GetManagedObjects`;
//! * (c) the work of clients that leave at once is dropped;
//! * (d) hundreds of idle connections, unauthenticated or not, and bodies announced but never sent:
//!   dbus-daemon's own limits hold them off and vgpud does not notice;
//! * (e) calls carrying file descriptors (16 each, max_message_unix_fds): the policy refuses them
//!   at the bus (`AccessDenied`); on a bus without the policy vgpud refuses each before any work
//!   (`org.vgpumanager.Error.Invalid`) and, with the shipped unit's `LimitNOFILE`, holds at most what
//!   the bus's pending-reply limit lets in (at 1024 descriptors zbus's read-ahead alone would exhaust
//!   the table: that case is the policy's to prevent);
//! * (f) past `max_replies_per_connection` pending calls the bus refuses typed
//!   (`org.freedesktop.DBus.Error.LimitsExceeded`), and nothing hangs;
//! * many connections of one user (the bus allows 256) get no more of vgpud than one.
//!
//! The attackers are this test binary run again as uid 65534 (the test named `attacker`). Needs root
//! (to switch uid), the Debian packages `dbus` (dbus-daemon; dbus-system-bus-common: system.conf and
//! user messagebus) and util-linux
//! (`prlimit`); not run as root, each test fails unless `VGPU_TESTS_ALLOW_SKIP=1` is set (then it prints
//! `SKIPPED: <reason>` and returns).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use dbus_common::flood::{
    self, Args, Attack, assert_all_answered, assert_bounds, finished, observe, timed_call,
};
use dbus_common::sysbus::{self, Raw, socket_of};
use dbus_common::system_bus::{
    DbusDaemon, NOBODY, PERMISSIVE, SYSTEM_LIMITS, open_tempdir, real_system_bus, repo,
    require_root, start_dbus_daemon_with,
};
use dbus_common::{Daemon, ok_json, vgpuctl_as};
use vgpu_client::{MANAGER_PATH, SERVICE};
use zbus::Connection;

/// The bus's refusal past one of its limits (`max_replies_per_connection`, a full queue).
const BUS_LIMITS: &str = "org.freedesktop.DBus.Error.LimitsExceeded";
/// The bus's refusal by policy.
const BUS_DENIED: &str = "org.freedesktop.DBus.Error.AccessDenied";
/// vgpud's refusal past its own per-client limit.
const VGPUD_LIMITS: &str = "org.vgpumanager.Error.LimitsExceeded";

/// Not a test of its own: the entry point of the attacking clients ([`flood::spawn`],
/// [`sysbus::spawn`]), run as uid 65534. Without their role variables it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker() {
    flood::attacker_main().await;
    sysbus::attacker_main();
}

/// vgpud on a bus, its normal client, and its idle figures. Dropped in this order: vgpud first.
struct Setup {
    daemon: Daemon,
    conn: Connection,
    bus: DbusDaemon,
    idle_fds: usize,
    idle_rss: u64,
    _dir: tempfile::TempDir,
}

impl Setup {
    /// vgpud under `RLIMIT_NOFILE` 1024 on the bus `start` makes in a fresh directory.
    async fn on(start: impl FnOnce(&Path) -> DbusDaemon) -> Setup {
        Setup::on_with(start, None).await
    }

    /// [`Setup::on`] with `nofile` descriptors instead of 1024.
    async fn on_with(start: impl FnOnce(&Path) -> DbusDaemon, nofile: Option<u64>) -> Setup {
        let dir = open_tempdir();
        let bus = start(dir.path());
        let daemon = Daemon::on_bus(&bus.address, dir.path(), &dir.path().join("state"), &[]).await;
        match nofile {
            None => daemon.limit_fds(),
            Some(n) => sysbus::set_nofile(daemon.pid(), n),
        }
        let conn = dbus_common::client(&bus.address).await;
        timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
        let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
        Setup {
            daemon,
            conn,
            bus,
            idle_fds,
            idle_rss,
            _dir: dir,
        }
    }

    /// On a bus configured as Debian's system bus.
    async fn system_bus() -> Setup {
        Setup::on(real_system_bus).await
    }

    /// Observes vgpud until every attacker has finished, then checks the shared bounds.
    async fn watch(&mut self, what: &str, attackers: &mut [Child]) -> flood::Observed {
        let o = observe(&mut self.daemon, &self.conn, || {
            attackers.iter_mut().all(finished)
        })
        .await;
        self.daemon.assert_running(what);
        assert_bounds(what, &o, self.idle_fds, self.idle_rss);
        o
    }

    /// A new root client and a new client of the attacker's uid are answered (nothing the attack
    /// left behind keeps the bus or vgpud from serving newcomers).
    async fn newcomers_answered(&mut self, what: &str) {
        let fresh = dbus_common::client(&self.bus.address).await;
        timed_call(&fresh, "org.vgpumanager.Manager1", "ListGpus").await;
        let list = ok_json(&vgpuctl_as(Some(NOBODY), &self.bus.address, &["list", "--json"]).await);
        assert!(list.is_array(), "{what}: {list}");
        self.daemon.assert_running(what);
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        // A failed check shows what vgpud logged (its log lives in the directory being removed).
        if std::thread::panicking() {
            eprintln!("vgpud's log:\n{}", self.daemon.log());
        }
    }
}

/// The pool text the `Plan` floods send (a real pool file, which vgpud plans on a worker thread).
fn pool_text() -> String {
    std::fs::read_to_string(repo().join("data/pools.d/vdi-floor.toml")).unwrap()
}

fn count(t: &BTreeMap<String, usize>, key: &str) -> usize {
    t.get(key).copied().unwrap_or(0)
}

#[test]
fn the_test_bus_has_the_limits_of_debians_system_bus() {
    // Debian's system.conf lists the built-in limits, each in a comment of its own, and sets none.
    let conf = std::fs::read_to_string("/usr/share/dbus-1/system.conf").expect(
        "/usr/share/dbus-1/system.conf (Debian package dbus-system-bus-common) must be installed",
    );
    let mut listed = BTreeMap::new();
    for line in conf.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("<!-- <limit name=\"") {
            let (name, rest) = rest.split_once("\">").unwrap();
            let value = rest.split_once('<').unwrap().0.parse::<u64>().unwrap();
            listed.insert(name.to_string(), value);
        } else {
            assert!(
                !line.starts_with("<limit"),
                "Debian's system.conf now sets a limit: {line}"
            );
        }
    }
    let ours: BTreeMap<String, u64> = SYSTEM_LIMITS
        .iter()
        .map(|(n, v)| (n.to_string(), *v))
        .collect();
    assert_eq!(ours, listed, "SYSTEM_LIMITS against Debian's system.conf");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_reads_and_refused_changes() {
    if !require_root("floods_of_reads_and_refused_changes") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let reads = Attack::manager("ListGpus", 10_000);
    let changes = Attack::destroy(3_000);
    let mut attackers = [
        flood::spawn(&s.bus.address, &reads),
        flood::spawn(&s.bus.address, &changes),
    ];
    s.watch("ListGpus and Destroy floods", &mut attackers).await;
    let [a, b] = attackers;
    assert_all_answered(
        "10,000 ListGpus",
        &flood::tally(a),
        reads.count,
        &["ok", BUS_LIMITS, VGPUD_LIMITS],
    );
    // The policy lets only root and group vgpu-admin send Destroy: none reaches vgpud.
    assert_all_answered(
        "3,000 Destroy",
        &flood::tally(b),
        changes.count,
        &[BUS_DENIED],
    );
    s.newcomers_answered("after the floods").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_get_managed_objects() {
    if !require_root("a_flood_of_get_managed_objects") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let objects = Attack::call(
        MANAGER_PATH,
        "org.freedesktop.DBus.ObjectManager",
        "GetManagedObjects",
        Args::None,
        10_000,
    );
    let mut attackers = [flood::spawn(&s.bus.address, &objects)];
    s.watch("10,000 GetManagedObjects", &mut attackers).await;
    let [a] = attackers;
    assert_all_answered(
        "10,000 GetManagedObjects",
        &flood::tally(a),
        objects.count,
        &["ok", BUS_LIMITS, VGPUD_LIMITS],
    );
    s.newcomers_answered("after the flood").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_work_of_clients_that_leave_is_dropped() {
    if !require_root("the_work_of_clients_that_leave_is_dropped") {
        return;
    }
    let mut s = Setup::system_bus().await;
    // Reads answered at once, and plans that need a worker thread, from clients that leave at once.
    let mut floods: Vec<Child> = (0..3)
        .map(|_| {
            flood::spawn(
                &s.bus.address,
                &Attack::manager("ListGpus", 10_000).leaving(),
            )
        })
        .collect();
    let plans = Attack::call(
        MANAGER_PATH,
        "org.vgpumanager.Manager1",
        "Plan",
        Args::Str(pool_text()),
        3_000,
    )
    .leaving();
    floods.push(flood::spawn(&s.bus.address, &plans));
    for f in floods {
        flood::tally(f);
    }
    // They are gone: what they queued must not keep the normal client waiting.
    let mut rounds = 0;
    let o = observe(&mut s.daemon, &s.conn, || {
        rounds += 1;
        rounds >= 20
    })
    .await;
    s.daemon.assert_running("after the clients left");
    assert_bounds(
        "after four flooding clients left",
        &o,
        s.idle_fds,
        s.idle_rss,
    );
    s.newcomers_answered("after the clients left").await;
}

/// How long a new client of root may take to connect and be answered while an unprivileged user
/// holds the bus's unauthenticated connections: dbus-daemon serves the connections waiting to be
/// accepted in turns of max_incomplete_connections (64) per auth_timeout (5 s), so a newcomer may wait
/// for several turns (see docs/security.md, "On the system bus").
const NEWCOMER_BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_stop_at_the_bus() {
    if !require_root("idle_connections_stop_at_the_bus") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let socket = socket_of(&s.bus.address);
    let bus_fds = sysbus::FdSampler::start(s.bus.pid());
    // 600 connections that never authenticate (the bus keeps at most max_incomplete_connections,
    // 64, and closes each after auth_timeout, 5 s), and 300 that do and say Hello (the bus takes at
    // most max_connections_per_user, 256, of one uid).
    let unauthenticated = Raw::Idle {
        connections: 600,
        authenticate: false,
        hold: 8,
    };
    let authenticated = Raw::Idle {
        connections: 300,
        authenticate: true,
        hold: 8,
    };
    let mut attackers = [
        sysbus::spawn(&socket, &authenticated),
        sysbus::spawn(&socket, &unauthenticated),
    ];
    // A newcomer while they are held: connects, says Hello and calls vgpud.
    let bus = s.bus.address.clone();
    let newcomer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let t = std::time::Instant::now();
        let conn = tokio::time::timeout(NEWCOMER_BOUND, dbus_common::client(&bus))
            .await
            .expect("a new root client could not connect during the idle connections");
        timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
        t.elapsed()
    });
    let o = s.watch("900 idle connections", &mut attackers).await;
    let [a, b] = attackers;
    let (a, b) = (flood::tally(a), flood::tally(b));
    let newcomer = newcomer.await.unwrap();
    let bus_most = bus_fds.most();
    println!(
        "authenticated: {a:?}; unauthenticated: {b:?}; the bus held at most {bus_most} descriptors; \
         a new client took {newcomer:?}"
    );
    let per_user = bus_limit("max_connections_per_user");
    let incomplete = bus_limit("max_incomplete_connections");
    assert!(
        count(&a, "held") <= per_user,
        "the bus should hold at most {per_user} connections of one uid: {a:?}"
    );
    assert!(
        count(&b, "closed") > 0,
        "the bus should close connections that never authenticate after auth_timeout: {b:?}"
    );
    // The bus itself holds no more than its limits allow (and a few of its own).
    assert!(
        bus_most <= per_user + incomplete + 64,
        "dbus-daemon held {bus_most} descriptors: {a:?} {b:?}"
    );
    // vgpud never sees a connection to the bus: no descriptor of its own for any of them.
    assert!(
        o.max_fds <= s.idle_fds + 8,
        "vgpud held {} descriptors during 900 idle connections (idle {})",
        o.max_fds,
        s.idle_fds
    );
    s.newcomers_answered("after the idle connections").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_announced_but_never_sent_stop_at_the_bus() {
    if !require_root("bodies_announced_but_never_sent_stop_at_the_bus") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let socket = socket_of(&s.bus.address);
    // 8 announcing 120 MiB (past max_message_size, 32 MiB: the bus closes them at the header) and
    // 60 announcing 30 MiB (under it: the bus waits for the rest, in its own memory).
    let over = Raw::Announce {
        connections: 8,
        announced: 120 << 20,
        hold: 4,
    };
    let under = Raw::Announce {
        connections: 60,
        announced: 30 << 20,
        hold: 4,
    };
    let mut attackers = [
        sysbus::spawn(&socket, &over),
        sysbus::spawn(&socket, &under),
    ];
    let o = s.watch("68 announced bodies", &mut attackers).await;
    let [a, b] = attackers;
    let (a, b) = (flood::tally(a), flood::tally(b));
    println!("past the size limit: {a:?}; under it: {b:?}");
    assert_eq!(
        count(&a, "held"),
        0,
        "the bus should close a connection announcing a message past max_message_size: {a:?}"
    );
    // A message still incomplete goes to nobody: vgpud's RSS is untouched.
    assert!(
        o.max_rss_kib <= s.idle_rss + 8 * 1024,
        "vgpud's RSS grew from {} KiB to {} KiB while bodies were announced to the bus",
        s.idle_rss,
        o.max_rss_kib
    );
    s.newcomers_answered("after the announced bodies").await;
}

/// The shipped unit's `LimitNOFILE=` (data/vgpud.service).
fn unit_nofile() -> u64 {
    let unit = std::fs::read_to_string(repo().join("data/vgpud.service")).unwrap();
    unit.lines()
        .find_map(|l| l.strip_prefix("LimitNOFILE="))
        .expect("data/vgpud.service sets LimitNOFILE=")
        .trim()
        .parse()
        .unwrap()
}

/// A limit of the test bus (`SYSTEM_LIMITS`).
fn bus_limit(name: &str) -> usize {
    SYSTEM_LIMITS.iter().find(|(n, _)| *n == name).unwrap().1 as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_policy_keeps_calls_carrying_descriptors_from_vgpud() {
    if !require_root("the_policy_keeps_calls_carrying_descriptors_from_vgpud") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let socket = socket_of(&s.bus.address);
    let pool = pool_text();
    let attacks = [
        Raw::manager_fds("ListGpus", None, 3_000, 16),
        Raw::manager_fds("Plan", Some(&pool), 3_000, 16),
    ];
    let mut attackers: Vec<Child> = attacks.iter().map(|a| sysbus::spawn(&socket, a)).collect();
    let o = s
        .watch("calls carrying 16 descriptors each", &mut attackers)
        .await;
    for (attack, a) in attacks.iter().zip(attackers) {
        let Raw::Calls { member, count, .. } = attack else {
            unreachable!()
        };
        assert_all_answered(
            &format!("{count} {member} with 16 descriptors each"),
            &flood::tally(a),
            *count,
            &[BUS_DENIED],
        );
    }
    assert!(
        o.max_fds <= s.idle_fds + 8,
        "vgpud held {} descriptors (idle {}): calls carrying descriptors reached it",
        o.max_fds,
        s.idle_fds
    );
    s.newcomers_answered("after the descriptor flood").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_the_bus_lets_descriptors_through_vgpud_holds_few_and_keeps_its_connection() {
    if !require_root(
        "where_the_bus_lets_descriptors_through_vgpud_holds_few_and_keeps_its_connection",
    ) {
        return;
    }
    // A bus with the system bus's limits but no policy at all: calls carrying descriptors reach
    // vgpud (what an administrator's own policy might allow).
    let limits: String = SYSTEM_LIMITS
        .iter()
        .map(|(name, value)| format!("  <limit name=\"{name}\">{value}</limit>\n"))
        .collect();
    // At 1024 descriptors zbus's read-ahead alone (64 messages of 16) exhausts vgpud's table, which
    // is why the policy refuses such calls; without it, vgpud runs with the shipped unit's budget.
    let nofile = unit_nofile();
    let mut s = Setup::on_with(
        |dir| start_dbus_daemon_with(dir, PERMISSIVE, None, &limits),
        Some(nofile),
    )
    .await;
    let socket = socket_of(&s.bus.address);
    let pool = pool_text();
    let attacks = [
        Raw::manager_fds("ListGpus", None, 3_000, 16),
        Raw::manager_fds("Plan", Some(&pool), 3_000, 16),
        Raw::manager_fds("Plan", Some(&pool), 3_000, 16),
    ];
    let sampler = sysbus::FdSampler::start(s.daemon.pid());
    let mut attackers: Vec<Child> = attacks.iter().map(|a| sysbus::spawn(&socket, a)).collect();
    // The bus refuses every call to vgpud, the normal client's too, while more than
    // max_outgoing_unix_fds (64) wait for vgpud to read them: such a refusal is typed and prompt.
    let mut refused = 0;
    let mut answered = 0;
    while !attackers.iter_mut().all(finished) {
        s.daemon.assert_running("during the descriptor flood");
        let ping = tokio::time::timeout(
            flood::ANSWER_BOUND,
            s.conn.call_method(
                Some(vgpu_client::SERVICE),
                MANAGER_PATH,
                Some("org.freedesktop.DBus.Peer"),
                "Ping",
                &(),
            ),
        )
        .await
        .expect("a normal client's Ping was not answered in time");
        match ping {
            Ok(_) => answered += 1,
            // zbus reports a standard error of the bus as its own kind: matched by name.
            Err(e) if e.to_string().starts_with(BUS_LIMITS) => refused += 1,
            Err(e) => panic!("a normal client's Ping during the descriptor flood: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    s.daemon.assert_running("after the descriptor flood");
    println!("the normal client's Ping: {answered} answered, {refused} refused by the bus");
    let most = sampler.most();
    println!(
        "vgpud held at most {most} descriptors (idle {})",
        s.idle_fds
    );
    for (attack, a) in attacks.iter().zip(attackers) {
        let Raw::Calls { member, count, .. } = attack else {
            unreachable!()
        };
        assert_all_answered(
            &format!("{count} {member} with 16 descriptors each, no policy"),
            &flood::tally(a),
            *count,
            // Refused by vgpud before any work, or by the bus past its limits; never served.
            &["org.vgpumanager.Error.Invalid", BUS_LIMITS],
        );
    }
    // Each attacking connection has at most max_replies_per_connection calls pending, each with at
    // most max_message_unix_fds descriptors: the most vgpud can be made to hold at once.
    let bound = s.idle_fds
        + attacks.len()
            * bus_limit("max_replies_per_connection")
            * bus_limit("max_message_unix_fds");
    assert!(
        most <= bound && (most as u64) < nofile,
        "vgpud held {most} descriptors (idle {}, bound {bound}, limit {nofile}) while calls carrying \
         16 each arrived",
        s.idle_fds
    );
    s.newcomers_answered("after the descriptor flood").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_connections_of_one_user_do_not_multiply_its_share() {
    if !require_root("many_connections_of_one_user_do_not_multiply_its_share") {
        return;
    }
    let mut s = Setup::system_bus().await;
    let socket = socket_of(&s.bus.address);
    // The bus lets one uid have max_connections_per_user (256) connections, and vgpud's
    // per-client limits (calls pending, calls on the workers) apply to each connection: 128
    // connections of one user, each with 2 plans (which run on worker threads), all pending at once.
    let (connections, count) = (128, 2);
    let plans = Raw::manager_fds("Plan", Some(&pool_text()), count, 0).on_connections(connections);
    let mut attackers = [sysbus::spawn(&socket, &plans)];
    s.watch("Plan on 128 connections of one user", &mut attackers)
        .await;
    let [a] = attackers;
    assert_all_answered(
        "Plan on 128 connections of one user",
        &flood::tally(a),
        connections * count,
        &["ok", BUS_LIMITS, VGPUD_LIMITS],
    );
    s.newcomers_answered("after 128 connections of one user")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_replies_past_the_bus_limit_are_refused_typed() {
    use nix::sys::signal::{Signal, kill};
    if !require_root("pending_replies_past_the_bus_limit_are_refused_typed") {
        return;
    }
    let mut s = Setup::system_bus().await;
    // vgpud stopped: every call the bus forwards stays pending, so the attacker's 129th pending call
    // meets max_replies_per_connection (128).
    kill(s.daemon.pid(), Signal::SIGSTOP).unwrap();
    let reads = Attack::manager("ListGpus", 1_000);
    let mut a = flood::spawn(&s.bus.address, &reads);
    tokio::time::sleep(Duration::from_secs(3)).await;
    kill(s.daemon.pid(), Signal::SIGCONT).unwrap();
    let o = observe(&mut s.daemon, &s.conn, || finished(&mut a)).await;
    s.daemon.assert_running("after the stall");
    assert_bounds(
        "1,000 ListGpus on a stalled vgpud",
        &o,
        s.idle_fds,
        s.idle_rss,
    );
    let tally = flood::tally(a);
    assert_all_answered(
        "1,000 ListGpus on a stalled vgpud",
        &tally,
        reads.count,
        &["ok", BUS_LIMITS, VGPUD_LIMITS],
    );
    assert!(
        count(&tally, BUS_LIMITS) >= reads.count - 128,
        "past 128 pending calls the bus should refuse with LimitsExceeded: {tally:?}"
    );
    s.newcomers_answered("after the stall").await;
}

/// vgpud answers `Introspect` itself through admission, from the XML built for the called path
/// while no served object changed: one user's 64 connections × 128 pipelined calls get at most 64
/// pending in vgpud together, the rest refused typed. Before (zbus answering, rendering the whole
/// object tree below the called path for each call, bounded only by the bus's 128 pending calls per
/// connection): vgpud's RSS reached 589 MiB and a normal client's `Ping` waited 4.5 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_from_many_connections_of_one_user() {
    if !require_root("introspection_from_many_connections_of_one_user") {
        return;
    }
    let mut s = Setup::system_bus().await;
    // 64 connections of one user (a user may open 256 on the system bus), 128 pipelined calls each
    // (the bus's most pending per connection).
    let (connections, each) = (64, 128);
    let calls = Raw::Calls {
        connections,
        path: MANAGER_PATH.into(),
        interface: "org.freedesktop.DBus.Introspectable".into(),
        member: "Introspect".into(),
        destination: SERVICE.into(),
        arg: None,
        count: each,
        fds: 0,
    };
    let mut attackers = [sysbus::spawn(&socket_of(&s.bus.address), &calls)];
    s.watch("Introspect on 64 connections of one user", &mut attackers)
        .await;
    let [a] = attackers;
    let tally = flood::tally(a);
    assert_all_answered(
        "Introspect on 64 connections of one user",
        &tally,
        connections * each,
        &["ok", BUS_LIMITS, VGPUD_LIMITS],
    );
    assert!(
        count(&tally, VGPUD_LIMITS) > 0,
        "past the user's 64 calls pending vgpud refuses Introspect as any other read: {tally:?}"
    );
    s.newcomers_answered("after the introspection flood").await;
}
