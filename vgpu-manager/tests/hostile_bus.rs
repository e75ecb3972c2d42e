//! Hostile local clients against the embedded bus (`vgpud --sim demo --listen …`), vgpud started with
//! `RLIMIT_NOFILE` 1024 (soft and hard, systemd's default soft limit), the attackers a real
//! unprivileged uid (65534, through `setpriv`):
//! * a hijack of vgpud's name (or polkit's) and `BecomeMonitor` are refused (`AccessDenied`), and
//!   vgpud keeps its name;
//! * a call to a name nobody owns is answered `ServiceUnknown` at once;
//! * 600 connections that never authenticate: a normal client is answered during and after, the bus
//!   closes every one of them (refused past the per-user cap, or at the handshake timeout);
//! * many users together stop at the bus's total cap, and root is still answered;
//! * out of descriptors (`EMFILE`), the bus accepts again once they are back;
//! * file descriptors an unprivileged user sends never enter vgpud's table;
//! * 8 connections announcing a 120 MiB body and sending 4 KiB, and 60 announcing 1000 KiB (under
//!   the message limit), leave vgpud's RSS under a bound;
//! * 10,000 pipelined `Peer.Ping` and `Introspectable.Introspect` (which zbus answers itself) from
//!   each of several connections: every call answered (a reply or the bus's `LimitsExceeded`), at
//!   most 128 of a connection's calls waiting at once, vgpud's own connection never dropped;
//! * 10,000 pipelined calls to a peer that never answers: refused past 128 with `LimitsExceeded`,
//!   the 128 answered `NoReply` after the reply timeout, and the connection may call again;
//! * connections that authenticate and never send `Hello` are closed after 10 s and free their
//!   slots;
//! * vgpud never exits.
//!
//! Needs root (to switch users), `setpriv` (util-linux), `dbus-send` (dbus-bin) and `/usr/bin/python3`
//! (the attackers' raw sockets). Not run as root, each test fails, unless `VGPU_TESTS_ALLOW_SKIP=1`:
//! then it prints `SKIPPED: <reason>` and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use dbus_common::flood::{self, Args, Attack, assert_all_answered, assert_bounds, observe};
use dbus_common::sysbus::socket_of;
use dbus_common::system_bus::{NOBODY, open_tempdir, require_root};
use dbus_common::{Daemon, PATIENCE, ok, stderr, vgpuctl, vgpuctl_as};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use vgpu_client::MANAGER_PATH;

/// How much vgpud's RSS may grow while 8 connections each announce a 120 MiB body: each holds at
/// most the bytes it really sent (4 KiB) and a 64 KiB read buffer, so a few MiB; 32 MiB leaves room
/// for the allocator and the noise of a running daemon.
const RSS_GROWTH_BOUND_KIB: u64 = 32 * 1024;

/// Connects `N` sockets to the bus at `PATH` and never authenticates (or, given a fourth argument
/// `auth`, authenticates each, SASL EXTERNAL as its own uid, and never sends a message). Prints
/// `connected OK FAILED`, waits for a line on stdin, then waits up to `WAIT` seconds for the bus to
/// close each socket and prints `closed COUNT`, then waits for stdin to close.
const IDLE: &str = r#"
import os, socket, sys, time
path, n, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
auth = sys.argv[4:] == ["auth"]
uid = str(os.getuid()).encode().hex().encode()
socks, failed = [], 0
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2)
    try:
        s.connect(path)
        if auth:
            s.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\n")
            if not s.recv(4096).startswith(b"OK"):
                raise OSError("not authenticated")
            s.sendall(b"BEGIN\r\n")
        socks.append(s)
    except OSError:
        failed += 1
        s.close()
print("connected", len(socks), failed, flush=True)
sys.stdin.readline()
for s in socks:
    s.setblocking(False)
closed = set()
deadline = time.time() + wait
while time.time() < deadline and len(closed) < len(socks):
    for i, s in enumerate(socks):
        if i in closed:
            continue
        try:
            if s.recv(4096) == b"":
                closed.add(i)
        except BlockingIOError:
            pass
        except OSError:
            closed.add(i)
    time.sleep(0.2)
print("closed", len(closed), flush=True)
sys.stdin.readline()
"#;

/// Authenticates `N` connections to the bus at `PATH` (SASL EXTERNAL as its own uid), then on each
/// sends the primary header of a message announcing a body of `SIZE` bytes, and 4 KiB of it. Prints `sent
/// COUNT`, then waits for stdin to close.
const HUGE: &str = r#"
import os, socket, struct, sys
path, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
uid = str(os.getuid()).encode().hex().encode()
socks, sent = [], 0
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
        s.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\n")
        line = b""
        while not line.endswith(b"\r\n"):
            chunk = s.recv(1)
            if not chunk:
                break
            line += chunk
        if not line.startswith(b"OK"):
            continue
        s.sendall(b"BEGIN\r\n")
        s.sendall(struct.pack("<cBBBIII", b"l", 1, 0, 1, size, i + 1, 0))
        s.sendall(b"\0" * 4096)
        socks.append(s)
        sent += 1
    except OSError:
        pass
print("sent", sent, flush=True)
sys.stdin.readline()
"#;

/// Authenticates `N` connections to the bus at `PATH`, then on each sends the primary header of a
/// message announcing a 64 KiB body, and one byte of it every 0.1 s for `SECONDS`, each write with
/// 250 file descriptors (of `/dev/null`) along. Prints `closed CLOSED CONNECTED` (how many the bus
/// closed, of how many it took), then waits for stdin to close.
const FDS: &str = r#"
import array, os, socket, struct, sys, time
path, n, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
uid = str(os.getuid()).encode().hex().encode()
nulls = array.array("i", [os.open("/dev/null", os.O_RDONLY) for _ in range(250)])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    try:
        s.connect(path)
        s.sendall(b"\0AUTH EXTERNAL " + uid + b"\r\n")
        s.recv(4096)
        s.sendall(b"NEGOTIATE_UNIX_FD\r\n")
        s.recv(4096)
        s.sendall(b"BEGIN\r\n")
        socks.append(s)
    except OSError:
        pass
# Each message announces a 64 KiB body, which then trickles in a byte at a time, with descriptors.
first = {i: struct.pack("<cBBBIII", b"l", 1, 0, 1, 65536, 1, 0) for i in range(len(socks))}
closed = set()
deadline = time.time() + seconds
while time.time() < deadline:
    for i, s in enumerate(socks):
        if i in closed:
            continue
        try:
            s.sendmsg([first.pop(i, b"\0")], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, nulls)])
        except OSError:
            closed.add(i)
    time.sleep(0.1)
print("closed", len(closed), len(socks), flush=True)
sys.stdin.readline()
"#;

/// Panics unless vgpud is still running (not exited, not a zombie), with its log.
fn assert_alive(d: &Daemon) {
    let state = std::fs::read_to_string(format!("/proc/{}/stat", d.pid()))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string))
        });
    assert!(
        matches!(state.as_deref(), Some(s) if s != "Z" && s != "X"),
        "vgpud exited (state {state:?}):\n{}",
        d.log()
    );
    assert!(
        !d.log().contains("the embedded bus stopped"),
        "the embedded bus stopped:\n{}",
        d.log()
    );
}

/// A python attacker running `script` with `args` as `uid`.
struct Attacker {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Attacker {
    fn start(uid: u32, script: &str, args: &[String]) -> Attacker {
        let mut child = Command::new("setpriv")
            .arg(format!("--reuid={uid}"))
            .arg(format!("--regid={uid}"))
            .arg("--clear-groups")
            .args(["/usr/bin/python3", "-c", script])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("setpriv (util-linux) and /usr/bin/python3 must be installed");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Attacker {
            child,
            stdin,
            lines,
        }
    }

    /// The next line the attacker prints, split into words.
    async fn report(&mut self) -> Vec<String> {
        let line = tokio::time::timeout(PATIENCE, self.lines.next_line())
            .await
            .expect("the attacker hung")
            .expect("read the attacker")
            .expect("the attacker ended early");
        line.split_whitespace().map(str::to_string).collect()
    }

    async fn go_on(&mut self) {
        self.stdin.write_all(b"go\n").await.unwrap();
        self.stdin.flush().await.unwrap();
    }

    /// Kills the attacker, which closes its connections.
    async fn stop(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(PATIENCE, self.child.wait()).await;
    }
}

/// A normal client's call answers, within generous seconds.
async fn assert_answered(bus: &str, uid: Option<u32>, when: &str) {
    let t = Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(20), vgpuctl_as(uid, bus, &["status"]))
        .await
        .unwrap_or_else(|_| panic!("{when}: `vgpuctl status` got no answer in 20 s"));
    ok(&out);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "{when}: `vgpuctl status` took {:?}",
        t.elapsed()
    );
}

/// `dbus-send --print-reply` as `uid` with `args`, bounded.
async fn dbus_send_as(uid: u32, bus: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={uid}"))
        .arg("--clear-groups")
        .arg("dbus-send")
        .arg(format!("--bus={bus}"))
        .args(["--print-reply", "--reply-timeout=15000"])
        .args(args);
    tokio::time::timeout(PATIENCE, cmd.output())
        .await
        .expect("dbus-send hung")
        .expect("dbus-send (Debian package `dbus-bin`) must be installed")
}

/// The unique name that owns vgpud's name.
async fn owner(bus: &str) -> String {
    let out = vgpuctl(bus, &["status"]).await;
    ok(&out);
    let out = Command::new("dbus-send")
        .arg(format!("--bus={bus}"))
        .args([
            "--print-reply",
            "--dest=org.freedesktop.DBus",
            "/org/freedesktop/DBus",
            "org.freedesktop.DBus.GetNameOwner",
            "string:org.vgpumanager.Manager1",
        ])
        .output()
        .await
        .unwrap();
    let reply = ok(&out);
    reply
        .lines()
        .find(|l| l.trim_start().starts_with("string"))
        .unwrap_or_else(|| panic!("GetNameOwner: {reply}"))
        .trim()
        .to_string()
}

#[tokio::test]
async fn an_unprivileged_user_cannot_take_vgpuds_name() {
    if !require_root("an_unprivileged_user_cannot_take_vgpuds_name") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let before = owner(&d.bus).await;
    // Flags 2 | 1: replace the owner, and let others replace us.
    for flags in ["uint32:2", "uint32:3", "uint32:4"] {
        let out = dbus_send_as(
            NOBODY,
            &d.bus,
            &[
                "--dest=org.freedesktop.DBus",
                "/org/freedesktop/DBus",
                "org.freedesktop.DBus.RequestName",
                "string:org.vgpumanager.Manager1",
                flags,
            ],
        )
        .await;
        assert!(
            !out.status.success()
                && stderr(&out).contains("org.freedesktop.DBus.Error.AccessDenied"),
            "RequestName({flags}) as uid {NOBODY} should be refused with AccessDenied: {} {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
    // Nor polkit's name, which vgpud asks about callers where it has an owner, nor a monitor that
    // would see other users' calls.
    for call in [
        &[
            "org.freedesktop.DBus.RequestName",
            "string:org.freedesktop.PolicyKit1",
            "uint32:4",
        ][..],
        &[
            "org.freedesktop.DBus.Monitoring.BecomeMonitor",
            "array:string:type=method_call",
            "uint32:0",
        ][..],
    ] {
        let mut args = vec!["--dest=org.freedesktop.DBus", "/org/freedesktop/DBus"];
        args.extend_from_slice(call);
        let out = dbus_send_as(NOBODY, &d.bus, &args).await;
        assert!(
            !out.status.success()
                && stderr(&out).contains("org.freedesktop.DBus.Error.AccessDenied"),
            "{} as uid {NOBODY} should be refused with AccessDenied: {} {}",
            call[0],
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
    assert_eq!(owner(&d.bus).await, before, "vgpud must keep its name");
    assert!(
        !d.log().contains("lost"),
        "vgpud lost its name:\n{}",
        d.log()
    );
    assert_answered(&d.bus, Some(NOBODY), "after the hijack").await;
    assert_alive(&d);
}

#[tokio::test]
async fn a_call_to_a_name_nobody_owns_is_answered_service_unknown() {
    if !require_root("a_call_to_a_name_nobody_owns_is_answered_service_unknown") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let t = Instant::now();
    let out = dbus_send_as(
        NOBODY,
        &d.bus,
        &[
            "--dest=org.example.NobodyOwnsThis",
            "/",
            "org.example.Nothing.Call",
        ],
    )
    .await;
    assert!(
        stderr(&out).contains("org.freedesktop.DBus.Error.ServiceUnknown"),
        "a call to an unowned name should fail with ServiceUnknown: {}",
        stderr(&out)
    );
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "ServiceUnknown took {:?}: the bus let the call wait",
        t.elapsed()
    );
    assert_alive(&d);
}

#[tokio::test]
async fn six_hundred_idle_connections_do_not_stop_the_bus() {
    if !require_root("six_hundred_idle_connections_do_not_stop_the_bus") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let args = [socket_of(&d.bus), "600".into(), "40".into()];
    let mut a = Attacker::start(NOBODY, IDLE, &args);
    let got = a.report().await;
    assert_eq!(got[0], "connected", "{got:?}");
    let connected = got[1].clone();
    assert_answered(&d.bus, None, "during 600 idle connections").await;
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
        .unwrap()
        .count();
    eprintln!("vgpud holds {fds} descriptors during 600 idle connections ({got:?})");
    // Each is closed: past the per-user cap at once, the others at the handshake timeout (10 s).
    a.go_on().await;
    let closed = a.report().await;
    assert_eq!(
        closed,
        ["closed", connected.as_str()],
        "the bus should close every connection that never authenticates ({got:?}):\n{}",
        d.log()
    );
    a.stop().await;
    assert_answered(&d.bus, None, "after the idle connections").await;
    assert_answered(&d.bus, Some(NOBODY), "for the attacker's user afterwards").await;
    assert_alive(&d);
}

#[tokio::test]
async fn many_users_stop_at_the_total_cap_and_root_is_answered() {
    if !require_root("many_users_stop_at_the_total_cap_and_root_is_answered") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    // 16 users × 60 connections: more than the bus's cap at 1024 descriptors (704), fewer than the
    // per-user cap each.
    let mut attackers = Vec::new();
    for i in 0..16 {
        let args = [socket_of(&d.bus), "60".into(), "40".into()];
        attackers.push(Attacker::start(NOBODY - i, IDLE, &args));
    }
    for a in &mut attackers {
        let got = a.report().await;
        assert_eq!(got[0], "connected", "{got:?}");
    }
    assert_answered(&d.bus, None, "during 960 idle connections of 16 users").await;
    for a in attackers {
        a.stop().await;
    }
    assert_answered(&d.bus, Some(NOBODY), "after the connections of 16 users").await;
    assert_alive(&d);
}

#[tokio::test]
async fn bodies_announced_but_never_sent_cost_no_memory() {
    if !require_root("bodies_announced_but_never_sent_cost_no_memory") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let before = d.rss_kib();
    let mut a = Attacker::start(
        NOBODY,
        HUGE,
        &[socket_of(&d.bus), "8".into(), (120u32 << 20).to_string()],
    );
    let got = a.report().await;
    assert_eq!(got[0], "sent", "{got:?}");
    // Time for the bus to read what came (and, before the limit, to allocate what was announced).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = d.rss_kib();
    eprintln!("vgpud's RSS: {before} KiB before, {during} KiB with 8 huge announced bodies");
    assert_answered(&d.bus, None, "during 8 huge announced bodies").await;
    assert!(
        during < before + RSS_GROWTH_BOUND_KIB,
        "vgpud's RSS grew from {before} KiB to {during} KiB for 8 × 4 KiB sent of 120 MiB announced \
         (bound: {RSS_GROWTH_BOUND_KIB} KiB)"
    );
    a.stop().await;
    assert_answered(&d.bus, Some(NOBODY), "after the huge bodies").await;
    assert_alive(&d);
}

#[tokio::test]
async fn the_bus_accepts_again_after_running_out_of_descriptors() {
    if !require_root("the_bus_accepts_again_after_running_out_of_descriptors") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    // Squeeze vgpud to 64 descriptors: root's 64 connections (root is held to the per-user cap
    // only) then run it out, and accept(2) fails with EMFILE.
    let out = Command::new("prlimit")
        .arg(format!("--pid={}", d.pid()))
        .arg("--nofile=64:64")
        .output()
        .await
        .expect("prlimit (util-linux) must be installed");
    ok(&out);
    let mut a = Attacker::start(0, IDLE, &[socket_of(&d.bus), "64".into(), "40".into()]);
    let got = a.report().await;
    assert_eq!(got[0], "connected", "{got:?}");
    let deadline = Instant::now() + PATIENCE;
    while !d.log().contains("Too many open files") {
        assert!(
            Instant::now() < deadline,
            "vgpud never ran out of descriptors:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    a.stop().await;
    assert_answered(&d.bus, None, "after running out of descriptors").await;
    assert_answered(&d.bus, Some(NOBODY), "after running out of descriptors").await;
    assert_alive(&d);
}

#[tokio::test]
async fn file_descriptors_sent_by_an_unprivileged_user_never_reach_vgpud() {
    if !require_root("file_descriptors_sent_by_an_unprivileged_user_never_reach_vgpud") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let mut a = Attacker::start(NOBODY, FDS, &[socket_of(&d.bus), "60".into(), "3".into()]);
    // While the attacker sends, vgpud's own table stays small.
    let mut most = 0;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid()))
            .map(|r| r.count())
            .unwrap_or(0);
        most = most.max(fds);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let got = a.report().await;
    eprintln!("vgpud held at most {most} descriptors; the attacker reports {got:?}");
    assert_eq!(
        got[1], got[2],
        "the bus should close every connection that sends descriptors: {got:?}"
    );
    assert!(
        most < 200,
        "vgpud held {most} descriptors while 60 connections sent 250 each"
    );
    a.stop().await;
    assert_answered(&d.bus, None, "after the descriptor flood").await;
    assert_answered(&d.bus, Some(NOBODY), "after the descriptor flood").await;
    assert_alive(&d);
}

#[tokio::test]
async fn bodies_under_the_size_limit_cost_what_was_sent_not_what_was_announced() {
    if !require_root("bodies_under_the_size_limit_cost_what_was_sent_not_what_was_announced") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let before = d.rss_kib();
    // 60 connections (under the per-user cap), each announcing 1000 KiB (under the message limit):
    // allocated by the announced length, that is 60 MiB.
    let mut a = Attacker::start(
        NOBODY,
        HUGE,
        &[socket_of(&d.bus), "60".into(), (1000 * 1024).to_string()],
    );
    let got = a.report().await;
    assert_eq!(got, ["sent", "60"], "{got:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = d.rss_kib();
    eprintln!("vgpud's RSS: {before} KiB before, {during} KiB with 60 announced 1000 KiB bodies");
    assert_answered(&d.bus, None, "during 60 announced bodies").await;
    assert!(
        during < before + RSS_GROWTH_BOUND_KIB,
        "vgpud's RSS grew from {before} KiB to {during} KiB for 60 × 4 KiB sent of 1000 KiB announced \
         (bound: {RSS_GROWTH_BOUND_KIB} KiB)"
    );
    a.stop().await;
    assert_alive(&d);
}

/// A peer that hands out descriptors, as vgpud does with `Instance1.OpenDevice`.
struct Handout;

#[zbus::interface(name = "org.vgpumanager.Test.Handout")]
impl Handout {
    /// A descriptor of /dev/null, announced first by a signal without one: the peer writes the two
    /// messages back to back, so the bus may read them in one go (the kernel glues a write without
    /// descriptors to the next one that has some, net/unix/af_unix.c `unix_stream_read_generic`).
    async fn open(
        &self,
        #[zbus(signal_emitter)] emitter: zbus::object_server::SignalEmitter<'_>,
    ) -> zbus::fdo::Result<zbus::OwnedFd> {
        Self::opening(&emitter).await?;
        let f = std::fs::File::open("/dev/null")
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))?;
        Ok(std::os::fd::OwnedFd::from(f).into())
    }

    /// Sent before each reply of `Open`.
    #[zbus(signal)]
    async fn opening(emitter: &zbus::object_server::SignalEmitter<'_>) -> zbus::Result<()>;
}

#[tokio::test]
async fn descriptors_from_a_privileged_peer_reach_root_and_unprivileged_callers() {
    if !require_root("descriptors_from_a_privileged_peer_reach_root_and_unprivileged_callers") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    let bus = d.bus.clone();
    // A root peer serving descriptors (what vgpud's OpenDevice replies carry), sending signals too.
    let server = dbus_common::client(&bus).await;
    server
        .object_server()
        .at("/org/vgpumanager/Test", Handout)
        .await
        .unwrap();
    let name = server.unique_name().unwrap().to_string();
    // Many calls from root, pipelined, each reply with one descriptor after a signal without any.
    let caller = dbus_common::client(&bus).await;
    let proxy = zbus::Proxy::new(
        &caller,
        name.as_str(),
        "/org/vgpumanager/Test",
        "org.vgpumanager.Test.Handout",
    )
    .await
    .unwrap();
    let calls = (0..64).map(|_| proxy.call::<_, _, zbus::OwnedFd>("Open", &()));
    for got in futures_util::future::join_all(calls).await {
        let fd = got.expect("a reply carrying a descriptor arrives");
        let meta = std::fs::File::from(std::os::fd::OwnedFd::from(fd))
            .metadata()
            .unwrap();
        assert!(!meta.is_file(), "/dev/null is a character device");
    }
    // An unprivileged caller receives one too (an unprivileged VMM takes its device this way).
    let out = dbus_send_as(
        NOBODY,
        &bus,
        &[
            &format!("--dest={name}"),
            "/org/vgpumanager/Test",
            "org.vgpumanager.Test.Handout.Open",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "uid {NOBODY} got no descriptor: {}",
        stderr(&out)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("file descriptor"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_alive(&d);
}

/// Not a test of its own: the entry point of the attacking client, which [`flood::spawn`] runs as
/// uid 65534. Without [`flood::ROLE_VAR`] it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attacker() {
    flood::attacker_main().await;
    dbus_common::sysbus::attacker_main();
}

/// The environment variable that makes this binary a [`silent_peer`], on the bus it names.
const SILENT_VAR: &str = "VGPU_SILENT_PEER_BUS";

/// The bus's limit of a connection's calls waiting for replies (dbus-daemon's
/// `max_replies_per_connection` on the system bus).
const MAX_PENDING_REPLIES: usize = 128;

/// How long the bus waits for a reply before it answers `NoReply` itself: the daemon under test is
/// started with `--bus-reply-timeout 40` (the default, 120 s, is the same code with a longer wait).
/// Twice the second round's 20 s, in which the bus refuses the calls past the limit (about 10 s at its
/// pace of one a millisecond) and the 128 that wait must not be answered yet.
const REPLY_TIMEOUT: Duration = Duration::from_secs(40);

/// How many calls the pipelining attackers keep ahead of their answers: more than the bus lets
/// wait, few enough that the answers they have yet to read fit in their sockets' buffers (busd
/// disconnects a client that does not take its messages within 100 ms, which a loaded test machine
/// would otherwise make of them).
const WINDOW: usize = 160;

/// The bus's refusal of a call past a connection's calls waiting for replies.
const BUS_LIMITS_EXCEEDED: &str = "org.freedesktop.DBus.Error.LimitsExceeded";

/// Not a test of its own: a peer that owns a unique name only and never answers a call (its zbus
/// connection serves no object, so every call it reads is dropped), run as uid 65534 by
/// [`SilentPeer::start`]. Prints `NAME <unique name>`, then waits for stdin to close. Without
/// [`SILENT_VAR`] it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_peer() {
    let Ok(bus) = std::env::var(SILENT_VAR) else {
        return;
    };
    let conn = zbus::connection::Builder::address(&*bus)
        .build()
        .await
        .expect("the silent peer connects");
    assert_eq!(nix::unistd::getuid().as_raw(), NOBODY);
    println!("NAME {}", conn.unique_name().unwrap());
    let _ = tokio::task::spawn_blocking(|| {
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new())
    })
    .await;
    drop(conn);
}

/// A [`silent_peer`] running as uid 65534.
struct SilentPeer {
    _child: Child,
    name: String,
}

impl SilentPeer {
    async fn start(bus: &str) -> SilentPeer {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "silent_peer", "--nocapture", "--test-threads=1"])
            .env(SILENT_VAR, bus)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start the silent peer");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let name = loop {
            let line = tokio::time::timeout(PATIENCE, lines.next_line())
                .await
                .expect("the silent peer hung")
                .unwrap()
                .expect("the silent peer ended early");
            if let Some((_, name)) = line.split_once("NAME ") {
                break name.trim().to_string();
            }
        };
        SilentPeer {
            _child: child,
            name,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn floods_of_calls_zbus_answers_itself_stop_at_the_pending_reply_limit() {
    if !require_root("floods_of_calls_zbus_answers_itself_stop_at_the_pending_reply_limit") {
        return;
    }
    let dir = open_tempdir();
    let mut d = Daemon::embedded_hostile(dir.path()).await;
    let conn = dbus_common::client(&d.bus).await;
    for method in ["ListGpus", "ListInstances"] {
        flood::timed_call(&conn, "org.vgpumanager.Manager1", method).await;
    }
    let before = owner(&d.bus).await;
    let (idle_fds, idle_rss) = (d.fd_count(), d.rss_kib());
    // zbus answers these itself, outside vgpud's admission: only the bus's limit holds them.
    let ping = Attack::call(
        MANAGER_PATH,
        "org.freedesktop.DBus.Peer",
        "Ping",
        Args::None,
        10_000,
    )
    .window(WINDOW);
    // Introspected where vgpud has no object (zbus answers `UnknownObject` itself): the answers to
    // `/` are 41 KiB each, more than a test attacker on a loaded machine reads within the 100 ms
    // busd gives it, which would get it disconnected (with those, vgpud's RSS grew to 2.1 GB
    // without the limit and to about 70 MiB with it, measured by hand).
    let introspect = Attack::call(
        "/org/vgpumanager/Gpu",
        "org.freedesktop.DBus.Introspectable",
        "Introspect",
        Args::None,
        10_000,
    )
    .window(WINDOW);
    // One after the other: on a loaded machine, two attackers at once may not read their answers
    // within the 100 ms busd gives them.
    for attack in [&ping, &introspect] {
        let mut child = flood::spawn(&d.bus, attack);
        let o = observe(&mut d, &conn, || flood::finished(&mut child)).await;
        d.assert_running("after the flood");
        let what = format!("10,000 {}", attack.member);
        assert_bounds(&what, &o, idle_fds, idle_rss);
        let round = flood::rounds(child).pop().unwrap();
        assert_all_answered(
            &what,
            &round.tally,
            attack.count,
            &[
                "ok",
                BUS_LIMITS_EXCEEDED,
                "org.freedesktop.DBus.Error.UnknownObject",
            ],
        );
        eprintln!(
            "{what}: at most {} calls waited at once",
            round.most_waiting
        );
        assert!(
            round.most_waiting <= MAX_PENDING_REPLIES,
            "{what}: {} calls waited for their replies at once (limit {MAX_PENDING_REPLIES})",
            round.most_waiting
        );
        // The attacker sends far faster than vgpud answers, so 128 calls wait at some point and
        // the bus refuses what comes then (without the limit it refuses none).
        assert!(
            round.tally.get(BUS_LIMITS_EXCEEDED).is_some_and(|n| *n > 0),
            "{what}: the bus refused none of the calls: {:?}",
            round.tally
        );
    }
    assert_eq!(owner(&d.bus).await, before, "vgpud must keep its name");
    assert!(
        !d.log().contains("lost"),
        "vgpud lost its name:\n{}",
        d.log()
    );
    assert_answered(&d.bus, Some(NOBODY), "after the flood").await;
    assert_alive(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_peer_that_never_answers_stop_at_the_limit_until_the_reply_timeout() {
    if !require_root("calls_to_a_peer_that_never_answers_stop_at_the_limit_until_the_reply_timeout")
    {
        return;
    }
    let dir = open_tempdir();
    let timeout = REPLY_TIMEOUT.as_secs().to_string();
    let mut d = Daemon::embedded_hostile_with(dir.path(), &["--bus-reply-timeout", &timeout]).await;
    let conn = dbus_common::client(&d.bus).await;
    let (idle_fds, idle_rss) = (d.fd_count(), d.rss_kib());
    let silent = SilentPeer::start(&d.bus).await;
    let call = || {
        Attack::call("/", "org.example.Silent", "Wait", Args::None, 10_000)
            .to(&silent.name)
            .window(WINDOW)
    };
    // The bus answers the 128 that wait `NoReply` at the reply timeout; then the same connection
    // may call again, and again 128 calls wait (unanswered within the second round's 20 s).
    let attack = call()
        .answered_within(REPLY_TIMEOUT + Duration::from_secs(40))
        .then(call().answered_within(Duration::from_secs(20)));
    let t = Instant::now();
    let mut a = flood::spawn(&d.bus, &attack);
    let o = observe(&mut d, &conn, || flood::finished(&mut a)).await;
    eprintln!("the attacker finished after {:?}", t.elapsed());
    assert_bounds("calls to a silent peer", &o, idle_fds, idle_rss);
    let rounds = flood::rounds(a);
    let refused = 10_000 - MAX_PENDING_REPLIES;
    let first = std::collections::BTreeMap::from([
        (BUS_LIMITS_EXCEEDED.to_string(), refused),
        (
            "org.freedesktop.DBus.Error.NoReply".to_string(),
            MAX_PENDING_REPLIES,
        ),
    ]);
    assert_eq!(rounds[0].tally, first, "the first round");
    assert!(rounds[0].most_waiting <= MAX_PENDING_REPLIES, "{rounds:?}");
    let again = std::collections::BTreeMap::from([
        (BUS_LIMITS_EXCEEDED.to_string(), refused),
        ("unanswered".to_string(), MAX_PENDING_REPLIES),
    ]);
    assert_eq!(rounds[1].tally, again, "after the reply timeout");
    assert_answered(&d.bus, Some(NOBODY), "after the calls to a silent peer").await;
    assert_alive(&d);
}

#[tokio::test]
async fn connections_that_never_send_hello_are_closed_and_free_their_slots() {
    if !require_root("connections_that_never_send_hello_are_closed_and_free_their_slots") {
        return;
    }
    let dir = open_tempdir();
    let d = Daemon::embedded_hostile(dir.path()).await;
    // As many as the user may hold, each authenticated, none saying Hello.
    let args = [socket_of(&d.bus), "64".into(), "40".into(), "auth".into()];
    let mut a = Attacker::start(NOBODY, IDLE, &args);
    let got = a.report().await;
    assert_eq!(got, ["connected", "64", "0"], "{got:?}");
    let t = Instant::now();
    a.go_on().await;
    let closed = a.report().await;
    eprintln!("the bus closed them after {:?}: {closed:?}", t.elapsed());
    assert_eq!(
        closed,
        ["closed", "64"],
        "the bus should close every connection that does not send Hello within 10 s:\n{}",
        d.log()
    );
    // Closed, they hold no slot: the same user connects again while the attacker still runs.
    assert_answered(&d.bus, Some(NOBODY), "after the silent connections").await;
    a.stop().await;
    assert_alive(&d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_from_every_connection_a_user_may_open_stays_bounded() {
    if !require_root("introspection_from_every_connection_a_user_may_open_stays_bounded") {
        return;
    }
    use dbus_common::sysbus::{self, Raw};
    let tmp = open_tempdir();
    let mut d = Daemon::embedded_hostile(tmp.path()).await;
    let conn = dbus_common::client(&d.bus).await;
    flood::timed_call(&conn, "org.vgpumanager.Manager1", "ListGpus").await;
    let (idle_fds, idle_rss) = (d.fd_count(), d.rss_kib());
    // Introspect of `/` renders the whole tree. 64 connections of one user (the bus's most per
    // user), 128 pipelined calls each (each connection's most waiting): the bus's limit per user
    // and vgpud's admission (64 calls of one user pending, answered from the XML built once) keep
    // them from holding 64 × 128 answers in vgpud at once.
    let (connections, count) = (64, 128);
    let calls = Raw::Calls {
        connections,
        path: "/".into(),
        interface: "org.freedesktop.DBus.Introspectable".into(),
        member: "Introspect".into(),
        destination: vgpu_client::SERVICE.into(),
        arg: None,
        count,
        fds: 0,
    };
    let mut a = sysbus::spawn(&socket_of(&d.bus), &calls);
    let o = observe(&mut d, &conn, || flood::finished(&mut a)).await;
    d.assert_running("after the introspection flood");
    assert_bounds(
        "Introspect of / on 64 connections of one user",
        &o,
        idle_fds,
        idle_rss,
    );
    let tally = flood::tally(a);
    assert_all_answered(
        "Introspect of / on 64 connections of one user",
        &tally,
        connections * count,
        &[
            "ok",
            "org.freedesktop.DBus.Error.LimitsExceeded",
            "org.vgpumanager.Error.LimitsExceeded",
        ],
    );
    assert!(
        tally
            .get("org.freedesktop.DBus.Error.LimitsExceeded")
            .is_some_and(|n| *n > 0),
        "past the user's 256 calls waiting the bus refuses: {tally:?}"
    );
}
