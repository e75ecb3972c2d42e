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

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dbus_common::system_bus::{NOBODY, open_tempdir, require_root};
use dbus_common::{Daemon, PATIENCE};
use vgpu_client::{MANAGER_PATH, SERVICE};
use zbus::Connection;
use zbus::message::{Message, Type};

/// The environment variable that makes this binary an attacking client instead of a test suite.
const ROLE_VAR: &str = "VGPU_HOSTILE_ROLE";
/// Descriptors vgpud may hold beyond its idle count at any moment of a flood (a few per client
/// connection and worker; one per pending call would be thousands).
const FD_HEADROOM: usize = 200;
/// RSS vgpud may grow by during a flood.
const RSS_HEADROOM_KIB: u64 = 96 * 1024;
/// How long a normal client's call may take during a flood: generous, the machine is shared.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// vgpud on its embedded bus under `RLIMIT_NOFILE` [`dbus_common::HOSTILE_NOFILE`].
async fn limited_daemon(dir: &Path) -> Daemon {
    let d = Daemon::embedded(dir, &dir.join("state")).await;
    d.limit_fds();
    d
}

/// What an attacker does: `count` pipelined calls of `method` (`ListGpus`, `Destroy`), then either reads every answer or disconnects at once.
#[derive(Debug, Clone, Copy)]
struct Attack {
    method: &'static str,
    count: usize,
    read_answers: bool,
}

/// Starts this binary as uid 65534 running `attack` against `bus`. Its stdout ends with one line:
/// the tally of answers by error name (`ok` for replies), as JSON.
fn spawn_attacker(bus: &str, attack: Attack) -> Child {
    let role = format!("{}:{}:{}", attack.method, attack.count, attack.read_answers);
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "attacker", "--nocapture", "--test-threads=1"])
        .env(ROLE_VAR, role)
        .env("VGPU_HOSTILE_BUS", bus)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the attacking client")
}

/// The tally an attacker printed.
fn attacker_tally(child: Child) -> BTreeMap<String, usize> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the attacker failed: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    // The harness may print `test attacker ... ` on the same line first.
    let json = text
        .lines()
        .rev()
        .find_map(|l| l.split_once("TALLY ").map(|(_, j)| j))
        .unwrap_or_else(|| panic!("no tally from the attacker: {text}"));
    serde_json::from_str(json).unwrap()
}

/// The method call message of `attack` number `i`.
fn attack_message(attack: &Attack, i: usize) -> Message {
    let dest = SERVICE;
    match attack.method {
        "Destroy" => Message::method_call(MANAGER_PATH, "Destroy")
            .interface("org.vgpumanager.Manager1")
            .destination(dest)
            .build(&(format!("4b20d080-1b54-4048-85b3-{i:012x}"),))
            .unwrap(),
        m => Message::method_call(MANAGER_PATH, m)
            .interface("org.vgpumanager.Manager1")
            .destination(dest)
            .build(&())
            .unwrap(),
    }
}

/// Not a test of its own: the entry point of the attacking client, which [`spawn_attacker`] runs as
/// uid 65534. Without [`ROLE_VAR`] it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let mut parts = role.split(':');
    let method: &'static str = Box::leak(parts.next().unwrap().to_string().into_boxed_str());
    let count: usize = parts.next().unwrap().parse().unwrap();
    let read_answers = parts.next() == Some("true");
    let attack = Attack {
        method,
        count,
        read_answers,
    };
    let bus = std::env::var("VGPU_HOSTILE_BUS").unwrap();
    let conn = zbus::connection::Builder::address(&*bus)
        .build()
        .await
        .expect("the attacker connects");
    assert_eq!(nix::unistd::getuid().as_raw(), NOBODY);
    // Answers are read by a task of their own while the calls go out, as a pipelining client does
    // (a client that stops reading would only get the bus to drop it).
    let expected = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashSet::new()));
    let mut stream = zbus::MessageStream::from(&conn);
    let reader = {
        let expected = expected.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut tally: BTreeMap<String, usize> = BTreeMap::new();
            let mut answered = 0;
            let deadline = tokio::time::Instant::now() + PATIENCE;
            while answered < count {
                let next = tokio::time::timeout_at(deadline, stream.next()).await;
                let Ok(Some(Ok(msg))) = next else {
                    break;
                };
                let hdr = msg.header();
                let Some(reply_to) = hdr.reply_serial() else {
                    continue;
                };
                if !expected.lock().unwrap().remove(&reply_to) {
                    continue;
                }
                let key = match msg.message_type() {
                    Type::Error => hdr.error_name().map(|e| e.to_string()).unwrap_or_default(),
                    _ => "ok".to_string(),
                };
                *tally.entry(key).or_default() += 1;
                answered += 1;
            }
            if answered < count {
                tally.insert("unanswered".into(), count - answered);
            }
            tally
        })
    };
    for i in 0..attack.count {
        let msg = attack_message(&attack, i);
        expected
            .lock()
            .unwrap()
            .insert(msg.primary_header().serial_num());
        conn.send(&msg).await.expect("send a call");
    }
    let tally = if attack.read_answers {
        reader.await.unwrap()
    } else {
        // Gone at once, with every call still pending.
        reader.abort();
        BTreeMap::new()
    };
    println!("TALLY {}", serde_json::to_string(&tally).unwrap());
}

/// One call of a normal client, timed; panics if it fails or takes longer than [`PATIENCE`].
async fn timed_call(conn: &Connection, iface: &str, method: &str) -> Duration {
    let t = Instant::now();
    let r = tokio::time::timeout(
        PATIENCE,
        conn.call_method(Some(SERVICE), MANAGER_PATH, Some(iface), method, &()),
    )
    .await
    .unwrap_or_else(|_| panic!("{method} was not answered within {PATIENCE:?}"));
    r.unwrap_or_else(|e| panic!("{method}: {e}"));
    t.elapsed()
}

/// What the normal client and the sampler saw during a flood.
#[derive(Debug, Default)]
struct Observed {
    slowest: BTreeMap<&'static str, Duration>,
    max_fds: usize,
    max_rss_kib: u64,
}

/// Calls Ping, ListInstances and ListGpus as a normal (root) client and samples vgpud's fds and RSS
/// until `done` says the attackers finished.
async fn observe(
    daemon: &mut Daemon,
    conn: &Connection,
    mut done: impl FnMut() -> bool,
) -> Observed {
    let mut o = Observed::default();
    let calls: [(&'static str, &str, &str); 3] = [
        ("Ping", "org.freedesktop.DBus.Peer", "Ping"),
        ("ListInstances", "org.vgpumanager.Manager1", "ListInstances"),
        ("ListGpus", "org.vgpumanager.Manager1", "ListGpus"),
    ];
    loop {
        for (name, iface, method) in calls {
            daemon.assert_running("during the flood");
            let took = timed_call(conn, iface, method).await;
            let slowest = o.slowest.entry(name).or_default();
            *slowest = (*slowest).max(took);
            o.max_fds = o.max_fds.max(daemon.fd_count());
            o.max_rss_kib = o.max_rss_kib.max(daemon.rss_kib());
        }
        if done() {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn finished(c: &mut Child) -> bool {
    c.try_wait().unwrap().is_some()
}

fn assert_bounds(what: &str, o: &Observed, idle_fds: usize, idle_rss: u64) {
    println!("{what}: {o:?} (idle: {idle_fds} fds, {idle_rss} KiB)");
    for (call, took) in &o.slowest {
        assert!(
            *took <= ANSWER_BOUND,
            "{what}: a normal client's {call} took {took:?} (bound {ANSWER_BOUND:?})"
        );
    }
    assert!(
        o.max_fds <= idle_fds + FD_HEADROOM,
        "{what}: vgpud held {} fds (idle {idle_fds}): a descriptor per pending call?",
        o.max_fds
    );
    assert!(
        o.max_rss_kib <= idle_rss + RSS_HEADROOM_KIB,
        "{what}: vgpud's RSS grew to {} KiB (idle {idle_rss} KiB)",
        o.max_rss_kib
    );
}

/// Every flooded call was answered, each with a reply or a typed refusal (never `Internal`, never
/// silence).
fn assert_all_answered(what: &str, tally: &BTreeMap<String, usize>, sent: usize, allowed: &[&str]) {
    println!("{what}: answers {tally:?}");
    assert_eq!(tally.values().sum::<usize>(), sent, "{what}: {tally:?}");
    for k in tally.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: answered {k}: {tally:?}"
        );
    }
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

    let reads = Attack {
        method: "ListGpus",
        count: 10_000,
        read_answers: true,
    };
    let changes = Attack {
        method: "Destroy",
        count: 3_000,
        read_answers: true,
    };
    let mut a = spawn_attacker(&daemon.bus, reads);
    let mut b = spawn_attacker(&daemon.bus, changes);
    let o = observe(&mut daemon, &conn, || finished(&mut a) && finished(&mut b)).await;
    daemon.assert_running("after the flood");
    assert_bounds("ListGpus and Destroy floods", &o, idle_fds, idle_rss);
    assert_all_answered(
        "10,000 ListGpus",
        &attacker_tally(a),
        reads.count,
        &["ok", "org.vgpumanager.Error.LimitsExceeded"],
    );
    assert_all_answered(
        "3,000 Destroy",
        &attacker_tally(b),
        changes.count,
        &[
            "org.vgpumanager.Error.AccessDenied",
            "org.vgpumanager.Error.LimitsExceeded",
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
        .map(|_| {
            spawn_attacker(
                &daemon.bus,
                Attack {
                    method: "ListGpus",
                    count: 10_000,
                    read_answers: false,
                },
            )
        })
        .collect();
    for f in floods {
        attacker_tally(f);
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
