//! The pipelining attacker of the hostile suites, and what a test watches while it runs.
//!
//! An attacker is the test binary itself run again as uid 65534 ([`spawn`]): the binary's test named
//! `attacker` calls [`attacker_main`], which reads its [`Attack`] from the environment, sends every
//! call at once on one connection (reading answers on a task of its own, as a pipelining client does,
//! or disconnecting at once), and prints the tally of answers by error name on its last line. An
//! attack may go on with another round on the same connection ([`Attack::then`]); each round prints
//! its tally and how many of its calls waited for their replies at once, as far as the attacker
//! can tell ([`rounds`]).
//! [`observe`] meanwhile calls vgpud as a normal client and samples its descriptors and RSS.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use vgpu_client::{MANAGER_PATH, SERVICE};
use zbus::Connection;
use zbus::message::{Message, Type};

use super::system_bus::NOBODY;
use super::{Daemon, PATIENCE};

/// The environment variable that makes a test binary an attacking client instead of a test suite.
pub const ROLE_VAR: &str = "VGPU_HOSTILE_ROLE";
/// The environment variable that gives the attacker its bus address.
const BUS_VAR: &str = "VGPU_HOSTILE_BUS";

/// Descriptors vgpud may hold beyond its idle count at any moment of a flood (a few per client
/// connection and worker; one per pending call would be thousands).
pub const FD_HEADROOM: usize = 200;
/// RSS vgpud may grow by during a flood.
pub const RSS_HEADROOM_KIB: u64 = 96 * 1024;
/// How long a normal client's call may take during a flood: generous, the machine is shared.
pub const ANSWER_BOUND: Duration = Duration::from_secs(5);

/// The argument list of each call of an attack.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Args {
    /// No argument.
    None,
    /// One string: a UUID numbered after the call (`4b20d080-1b54-4048-85b3-<i>`), so every call
    /// names another instance.
    NumberedUuid,
    /// One string, the same in every call.
    Str(String),
    /// Two strings, the same in every call (`Properties.Get`'s interface and property).
    TwoStrs(String, String),
    /// `Properties.Set`'s arguments: an interface, a property and a string value.
    SetStr(String, String, String),
}

/// What an attacker does: `count` pipelined calls of `interface.member` on `path` at `destination`,
/// then either reads every answer or disconnects at once.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Attack {
    /// The called object.
    pub path: String,
    /// The called interface.
    pub interface: String,
    /// The called method.
    pub member: String,
    /// The arguments of each call.
    pub args: Args,
    /// The bus name called.
    pub destination: String,
    /// How many calls.
    pub count: usize,
    /// Whether the attacker reads its answers (else it disconnects once every call is sent).
    pub read_answers: bool,
    /// How long the attacker waits for its answers ([`PATIENCE`] if not given); those that have not
    /// come by then count as `unanswered`.
    #[serde(default)]
    pub answer_within: Option<Duration>,
    /// Another round on the same connection, once this one's answers are in.
    #[serde(default)]
    pub then: Option<Box<Attack>>,
    /// How many calls the attacker sends ahead of its answers at most (no limit if not given).
    #[serde(default)]
    pub window: Option<usize>,
}

impl Attack {
    /// `count` calls of a method of vgpud's object `path`, reading the answers.
    pub fn call(path: &str, interface: &str, member: &str, args: Args, count: usize) -> Attack {
        Attack {
            path: path.to_string(),
            interface: interface.to_string(),
            member: member.to_string(),
            args,
            destination: SERVICE.to_string(),
            count,
            read_answers: true,
            answer_within: None,
            window: None,
            then: None,
        }
    }

    /// `count` calls of a `org.vgpumanager.Manager1` method without arguments (`ListGpus`, …).
    pub fn manager(member: &str, count: usize) -> Attack {
        Attack::call(
            MANAGER_PATH,
            "org.vgpumanager.Manager1",
            member,
            Args::None,
            count,
        )
    }

    /// `count` calls of `Manager1.Destroy`, each of another UUID.
    pub fn destroy(count: usize) -> Attack {
        Attack::call(
            MANAGER_PATH,
            "org.vgpumanager.Manager1",
            "Destroy",
            Args::NumberedUuid,
            count,
        )
    }

    /// The same attack sent to `destination` instead of vgpud's name.
    pub fn to(mut self, destination: &str) -> Attack {
        self.destination = destination.to_string();
        self
    }

    /// The same attack by a client that disconnects once every call is sent.
    pub fn leaving(mut self) -> Attack {
        self.read_answers = false;
        self
    }

    /// The same attack, waiting `limit` for its answers.
    pub fn answered_within(mut self, limit: Duration) -> Attack {
        self.answer_within = Some(limit);
        self
    }

    /// The same attack by a client that sends at most `window` calls ahead of its answers: still
    /// far more than a bus lets wait, while what the client has to read stays within its socket's
    /// buffer, so that on a loaded machine it keeps up with its answers (busd disconnects a client
    /// that keeps them waiting for 100 ms).
    pub fn window(mut self, window: usize) -> Attack {
        self.window = Some(window);
        self
    }

    /// The same attack, followed on the same connection by `next` once its answers are in.
    pub fn then(mut self, next: Attack) -> Attack {
        self.then = Some(Box::new(next));
        self
    }

    /// Call number `i`.
    fn message(&self, i: usize) -> Message {
        let b = Message::method_call(self.path.as_str(), self.member.as_str())
            .interface(self.interface.as_str())
            .destination(self.destination.as_str());
        match &self.args {
            Args::None => b.build(&()),
            Args::NumberedUuid => b.build(&(format!("4b20d080-1b54-4048-85b3-{i:012x}"),)),
            Args::Str(s) => b.build(&(s.as_str(),)),
            Args::TwoStrs(a, s) => b.build(&(a.as_str(), s.as_str())),
            Args::SetStr(i, p, v) => {
                b.build(&(i.as_str(), p.as_str(), zbus::Variant::from(v.as_str())))
            }
        }
        .unwrap()
    }
}

/// Starts this test binary as uid 65534 running `attack` against `bus`. Its stdout ends with one
/// line: the tally of answers by error name (`ok` for replies), as JSON.
pub fn spawn(bus: &str, attack: &Attack) -> Child {
    spawn_attacker(
        (ROLE_VAR, &serde_json::to_string(attack).unwrap()),
        (BUS_VAR, bus),
    )
}

/// Runs this test binary's test named `attacker` as uid 65534, with the two environment variables
/// that tell it what to do (its role) and where (its bus), its stdout piped.
pub fn spawn_attacker(role: (&str, &str), bus: (&str, &str)) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "attacker", "--nocapture", "--test-threads=1"])
        .env(role.0, role.1)
        .env(bus.0, bus.1)
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the attacking client")
}

/// The tally an attacker printed (of its last round), once it has finished.
pub fn tally(child: Child) -> BTreeMap<String, usize> {
    rounds(child).pop().unwrap().tally
}

/// What an attacker saw in one round.
#[derive(Debug)]
pub struct Round {
    /// The answers by error name (`ok` for replies, `unanswered` for none).
    pub tally: BTreeMap<String, usize>,
    /// The most calls of the round that waited for their replies at once, as far as the attacker
    /// can tell: for each answer, the calls sent up to the one it answers and not refused with the
    /// bus's `LimitsExceeded`, less the answers to such calls that came before it. The bus passed
    /// the call on after it had written those earlier answers, so this is never more than the
    /// calls that waited at that moment.
    pub most_waiting: usize,
}

/// Each round an attacker printed, in order, once it has finished.
pub fn rounds(child: Child) -> Vec<Round> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the attacker failed: {}", out.status);
    let text = String::from_utf8_lossy(&out.stdout);
    // The harness may print `test attacker ... ` on the same line first.
    let mut rounds = Vec::new();
    for line in text.lines() {
        if let Some((_, json)) = line.split_once("TALLY ") {
            rounds.push(Round {
                tally: serde_json::from_str(json).unwrap(),
                most_waiting: 0,
            });
        } else if let Some((_, n)) = line.split_once("WAITING ")
            && let Some(round) = rounds.last_mut()
        {
            round.most_waiting = n.trim().parse().unwrap();
        }
    }
    assert!(!rounds.is_empty(), "no tally from the attacker: {text}");
    rounds
}

/// Whether an attacker has finished.
pub fn finished(c: &mut Child) -> bool {
    c.try_wait().unwrap().is_some()
}

/// The body of the test named `attacker` of a suite that uses [`spawn`]: without [`ROLE_VAR`] it
/// has nothing to do (a normal test run).
pub async fn attacker_main() {
    let Ok(role) = std::env::var(ROLE_VAR) else {
        return;
    };
    let attack: Attack = serde_json::from_str(&role).unwrap();
    let bus = std::env::var(BUS_VAR).unwrap();
    // Room for every answer in the connection's queue: its socket is then read as fast as the bus
    // writes, however far the tally lags (a full queue stops the reads, and the bus drops a client
    // that takes longer than 100 ms to read what it is sent).
    let room = std::num::NonZeroUsize::new(attack.count + 64).unwrap();
    let conn = zbus::connection::Builder::address(&*bus)
        .max_queued(room)
        .build()
        .await
        .expect("the attacker connects");
    assert_eq!(nix::unistd::getuid().as_raw(), NOBODY);
    let mut stream = zbus::MessageStream::from(&conn);
    let mut round = Some(attack);
    while let Some(attack) = round.take() {
        let Some((tally, most_waiting, rest)) = attack_round(&conn, stream, &attack).await else {
            // Gone at once, with every call still pending.
            println!("TALLY {{}}");
            break;
        };
        println!("TALLY {}", serde_json::to_string(&tally).unwrap());
        println!("WAITING {most_waiting}");
        stream = rest;
        round = attack.then.map(|next| *next);
    }
}

/// The error name of the bus's refusal of a call past a connection's calls waiting for replies.
const BUS_LIMITS_EXCEEDED: &str = "org.freedesktop.DBus.Error.LimitsExceeded";

/// One round of `attack` on `conn`, whose messages come out of `stream`: the tally of its answers,
/// the most of its calls that waited at once ([`Round::most_waiting`]), and the stream for the next
/// round; or nothing if the attacker leaves without reading.
async fn attack_round(
    conn: &Connection,
    mut stream: zbus::MessageStream,
    attack: &Attack,
) -> Option<(BTreeMap<String, usize>, usize, zbus::MessageStream)> {
    let count = attack.count;
    let within = attack.answer_within.unwrap_or(PATIENCE);
    // Answers are read by a task of their own while the calls go out, as a pipelining client does
    // (a client that stops reading would only get the bus to drop it). Each call is known by its
    // serial, and numbered in the order it went out.
    let expected = Arc::new(Mutex::new(HashMap::new()));
    let answered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let expected = expected.clone();
        let answered = answered.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut tally: BTreeMap<String, usize> = BTreeMap::new();
            // The number of each call answered, in the order of the answers, and whether the bus
            // refused it for its limit of calls waiting.
            let mut arrivals: Vec<(usize, bool)> = Vec::new();
            let deadline = tokio::time::Instant::now() + within;
            while arrivals.len() < count {
                let next = tokio::time::timeout_at(deadline, stream.next()).await;
                let Ok(Some(Ok(msg))) = next else {
                    break;
                };
                let hdr = msg.header();
                let Some(reply_to) = hdr.reply_serial() else {
                    continue;
                };
                let Some(i) = expected.lock().unwrap().remove(&reply_to) else {
                    continue;
                };
                let key = match msg.message_type() {
                    Type::Error => hdr.error_name().map(|e| e.to_string()).unwrap_or_default(),
                    _ => "ok".to_string(),
                };
                arrivals.push((i, key == BUS_LIMITS_EXCEEDED));
                answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *tally.entry(key).or_default() += 1;
            }
            if arrivals.len() < count {
                tally.insert("unanswered".into(), count - arrivals.len());
            }
            (tally, most_waiting(count, &arrivals), stream)
        })
    };
    let deadline = Instant::now() + within;
    for i in 0..count {
        if let Some(window) = attack.window {
            while i >= answered.load(std::sync::atomic::Ordering::Relaxed) + window
                && Instant::now() < deadline
            {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        let msg = attack.message(i);
        expected
            .lock()
            .unwrap()
            .insert(msg.primary_header().serial_num(), i);
        if let Err(e) = conn.send(&msg).await {
            // The bus dropped this client (busd drops one that takes longer than 100 ms to read
            // what it is sent): the calls not answered are counted `unanswered`.
            eprintln!("the attacker was disconnected after {i} calls: {e}");
            break;
        }
    }
    if !attack.read_answers {
        reader.abort();
        return None;
    }
    Some(reader.await.unwrap())
}

/// [`Round::most_waiting`] of `count` calls answered in the order of `arrivals` (each call's
/// number, and whether the bus refused it for its limit); a call without an answer waits still.
///
/// When the bus passed call `i` on, it had passed every call before it that it did not refuse, and
/// the answers it had written by then were to calls before `i`, and came before `i`'s: so the calls
/// that waited then were at least those passed up to `i` less the answers to calls before `i`
/// that came before `i`'s (counted with a Fenwick tree over the call numbers).
fn most_waiting(count: usize, arrivals: &[(usize, bool)]) -> usize {
    let mut refused = vec![false; count];
    for &(i, r) in arrivals {
        refused[i] = r;
    }
    // passed[i]: the calls up to number i that the bus passed on.
    let passed: Vec<usize> = refused
        .iter()
        .scan(0, |n, r| {
            *n += usize::from(!r);
            Some(*n)
        })
        .collect();
    // tree: the answers so far to calls by number, as a Fenwick tree (1-based).
    let mut tree = vec![0usize; count + 1];
    let answered_before = |tree: &[usize], i: usize| {
        let (mut k, mut sum) = (i, 0);
        while k > 0 {
            sum += tree[k];
            k &= k - 1;
        }
        sum
    };
    let mut answered = 0;
    let mut most = 0;
    for &(i, r) in arrivals {
        if r {
            continue;
        }
        most = most.max(passed[i] - answered_before(&tree, i));
        let mut k = i + 1;
        while k <= count {
            tree[k] += 1;
            k += k & k.wrapping_neg();
        }
        answered += 1;
    }
    most.max(passed.last().copied().unwrap_or(0) - answered)
}

/// One call of a normal client to vgpud's manager object, timed; panics if it fails or takes
/// longer than [`PATIENCE`].
pub async fn timed_call(conn: &Connection, iface: &str, method: &str) -> Duration {
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
pub struct Observed {
    /// The slowest answer to each call of the normal client.
    pub slowest: BTreeMap<&'static str, Duration>,
    /// The most descriptors vgpud held.
    pub max_fds: usize,
    /// vgpud's largest RSS, in KiB.
    pub max_rss_kib: u64,
}

/// Calls Ping, ListInstances and ListGpus as a normal client on `conn` and samples vgpud's fds and
/// RSS until `done` says the attackers finished.
pub async fn observe(
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

/// Panics unless the normal client was answered within [`ANSWER_BOUND`] and vgpud stayed within
/// [`FD_HEADROOM`] descriptors and [`RSS_HEADROOM_KIB`] of its idle figures.
pub fn assert_bounds(what: &str, o: &Observed, idle_fds: usize, idle_rss: u64) {
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

/// Panics unless every flooded call was answered, each with a reply or one of the `allowed` error
/// names (`ok` for a reply): never `Internal`, never silence.
pub fn assert_all_answered(
    what: &str,
    tally: &BTreeMap<String, usize>,
    sent: usize,
    allowed: &[&str],
) {
    println!("{what}: answers {tally:?}");
    assert_eq!(tally.values().sum::<usize>(), sent, "{what}: {tally:?}");
    for k in tally.keys() {
        assert!(
            allowed.contains(&k.as_str()),
            "{what}: answered {k}: {tally:?}"
        );
    }
}
