//! vgpud's private socket (`--private-socket`): the real vgpud and the real `vgpuctl`.
//!
//! * Every daemon command works through it with no bus at all (`vgpuctl --bus` names a socket
//!   nobody listens on), its changes are still announced on the bus, and vgpud logs the caller as
//!   the private socket's peer.
//! * The `mdevctl` front end's start/list/stop go through it too, attributes included.
//! * The socket is mode 0600; another user's `vgpuctl` does not try it and takes the bus, and a
//!   raw connection of another user is closed by vgpud before any handshake (needs root, to switch
//!   to uid 65534; not run as root, each such test fails unless `VGPU_TESTS_ALLOW_SKIP=1`).
//! * A stale socket left by a dead vgpud is replaced; a live one, or a file that is not a socket,
//!   stops vgpud with an error naming the path.
//! * A client whose private socket is gone falls back to the bus.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use dbus_common::system_bus::{NOBODY, require_root};
use dbus_common::{Daemon, PATIENCE, Sig, Signals, client, ok, ok_json, stderr, vgpuctl_with};

const UUID: &str = "7b0e8a52-5f55-4c4b-8f3a-2a3c1d9e0b11";
/// The demo host's first T4 and one of its types.
const T4: &str = "0000:01:00.0";
const TYPE: &str = "nvidia-231";

/// vgpud on an embedded bus in `dir`, with its private socket at `dir/private`, once the socket is
/// there.
async fn daemon_with_private(dir: &Path) -> (Daemon, PathBuf) {
    let private = dir.join("private");
    let p = private.to_str().unwrap().to_string();
    let d = Daemon::embedded_with(dir, &dir.join("state"), &["--private-socket", &p]).await;
    let deadline = Instant::now() + PATIENCE;
    while !private.exists() {
        assert!(Instant::now() < deadline, "no private socket:\n{}", d.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (d, private)
}

/// Runs `vgpuctl ARGS --bus BUS` with `VGPU_PRIVATE_SOCKET=private`, as `user` if given.
async fn vgpuctl_private(user: Option<u32>, private: &Path, bus: &str, args: &[&str]) -> Output {
    vgpuctl_with(
        user,
        bus,
        args,
        &[("VGPU_PRIVATE_SOCKET", private.as_os_str())],
    )
    .await
}

/// Waits until `d` logs `needle`, then until it exits, which must be a failure; its log.
async fn fails_with(d: Daemon, needle: &str) -> String {
    let deadline = Instant::now() + PATIENCE;
    while !d.log().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "vgpud never said {needle:?}:\n{}",
            d.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let log = d.log();
    let exit = d.wait();
    assert!(!exit.success(), "vgpud exits non-zero: {exit}\n{log}");
    log
}

/// A bus address nobody listens on: a call that succeeds did not take the bus.
fn no_bus(dir: &Path) -> String {
    format!("unix:path={}", dir.join("nobody-listens.sock").display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_commands_work_through_the_private_socket_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (d, private) = daemon_with_private(dir.path()).await;
    let bus_client = client(&d.bus).await;
    let mut signals = Signals::watch(&bus_client).await;
    let nobus = no_bus(dir.path());
    let run = |args: Vec<&'static str>| {
        let (private, nobus) = (private.clone(), nobus.clone());
        async move { vgpuctl_private(None, &private, &nobus, &args).await }
    };

    let created = ok(&run(vec!["create", "--type", TYPE, "--gpu", T4, "--uuid", UUID]).await);
    assert!(created.contains(UUID), "{created}");
    // Announced on the bus, where subscribers are, although the call came another way.
    signals
        .expect(Sig::Added(
            vgpu_client::instance_path(UUID).to_string(),
            UUID.into(),
        ))
        .await;
    let list = ok_json(&run(vec!["list", "--json"]).await);
    let ours: Vec<_> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["uuid"] == UUID)
        .collect();
    assert_eq!(ours.len(), 1, "{list}");
    assert_eq!(ours[0]["state"], "running", "{list}");
    let status = ok(&run(vec!["status"]).await);
    assert!(
        status.contains("private socket"),
        "status names the way it came: {status}"
    );
    assert!(ok(&run(vec!["destroy", UUID]).await).contains("destroyed"));

    // Defined, started, refused typed: errors come back the same way.
    let defined = ok_json(
        &run(vec![
            "define", "--type", TYPE, "--gpu", T4, "--uuid", UUID, "--json",
        ])
        .await,
    );
    assert_eq!(defined["defined"], true, "{defined}");
    ok(&run(vec!["start", UUID]).await);
    let again = run(vec!["start", UUID]).await;
    assert!(!again.status.success(), "a second start is refused");
    ok(&run(vec!["stop", UUID]).await);
    ok(&run(vec!["destroy", UUID]).await);
    let missing = run(vec!["destroy", UUID]).await;
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains(UUID), "{}", stderr(&missing));

    let log = d.log();
    assert!(
        log.contains("on private#"),
        "vgpud logs the private socket's peer as the caller:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mdevctl_front_end_goes_through_the_private_socket_with_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let (d, private) = daemon_with_private(dir.path()).await;
    // The front end is vgpuctl run as `mdevctl`.
    let mdevctl = dir.path().join("mdevctl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &mdevctl).unwrap();
    let nobus = no_bus(dir.path());
    let run = |args: Vec<&str>| {
        let mut cmd = std::process::Command::new(&mdevctl);
        cmd.args(&args)
            .env("VGPU_BUS", &nobus)
            .env("VGPU_PRIVATE_SOCKET", &private)
            // No sysfs below this root: the front end reads nothing of the machine's own.
            .env("VGPU_SYSFS_ROOT", dir.path());
        cmd.output().expect("run mdevctl front end")
    };
    let parent = format!("--parent={T4}");
    let ty = format!("--type={TYPE}");
    let uuid = format!("--uuid={UUID}");
    let define = run(vec!["define", &uuid, &parent, &ty]);
    assert!(define.status.success(), "{}", stderr(&define));
    let modify = run(vec!["modify", &uuid, "--addattr=x", "--value=1"]);
    assert!(modify.status.success(), "{}", stderr(&modify));
    let listed = run(vec!["list", "-d", "--dumpjson"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains(UUID) && text.contains("\"x\"") && text.contains("\"1\""),
        "the definition and its attribute, read through the private socket:\n{text}\n{}",
        d.log()
    );
    // The simulated driver has no attribute x: take it off again before starting.
    let modify = run(vec!["modify", &uuid, "--delattr"]);
    assert!(modify.status.success(), "{}", stderr(&modify));
    let start = run(vec!["start", &uuid]);
    assert!(start.status.success(), "{}", stderr(&start));
    let active = run(vec!["list", "--dumpjson"]);
    assert!(active.status.success(), "{}", stderr(&active));
    assert!(
        String::from_utf8_lossy(&active.stdout).contains(UUID),
        "{}",
        String::from_utf8_lossy(&active.stdout)
    );
    let stop = run(vec!["stop", &uuid]);
    assert!(stop.status.success(), "{}", stderr(&stop));
    let undefine = run(vec!["undefine", &uuid]);
    assert!(undefine.status.success(), "{}", stderr(&undefine));
}

/// Names the private socket [`raw_peer`] connects to.
const RAW_PEER_VAR: &str = "VGPU_TEST_RAW_PEER";

/// Not a test of its own: run again as uid 65534 by [`the_socket_is_for_root_and_vgpuds_user_only`]
/// with [`RAW_PEER_VAR`] set, it connects to the private socket, starts a D-Bus handshake and
/// prints how many bytes came back before vgpud closed. Without the variable it has nothing to do.
#[test]
fn raw_peer() {
    use std::io::{Read, Write};
    let Some(path) = std::env::var_os(RAW_PEER_VAR) else {
        return;
    };
    let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    // The handshake may already fail at the write: vgpud closes at once.
    let _ = s.write_all(b"\0AUTH EXTERNAL 3635353334\r\n");
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    println!("RAW-PEER connected, answered {} bytes", buf.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_socket_is_for_root_and_vgpuds_user_only() {
    if !require_root("the_socket_is_for_root_and_vgpuds_user_only") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (d, private) = daemon_with_private(dir.path()).await;
    let mode = std::fs::metadata(&private).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the private socket's mode");

    // Another user's vgpuctl does not try it: it takes the bus (which, here, nobody serves).
    let nobus = no_bus(dir.path());
    let other = vgpuctl_private(Some(NOBODY), &private, &nobus, &["list"]).await;
    assert!(!other.status.success());
    assert!(
        stderr(&other).contains("nobody-listens.sock"),
        "the error names the bus it fell back to: {}",
        stderr(&other)
    );
    // On the real bus it is answered as any unprivileged client.
    let listed = vgpuctl_private(Some(NOBODY), &private, &d.bus, &["list"]).await;
    assert!(listed.status.success(), "{}", stderr(&listed));

    // Even with the mode opened up, vgpud closes another user's connection before any handshake.
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o666)).unwrap();
    let raw = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "raw_peer", "--nocapture", "--test-threads=1"])
        .env(RAW_PEER_VAR, &private)
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .expect("run the raw peer as nobody");
    let said = String::from_utf8_lossy(&raw.stdout);
    assert!(raw.status.success(), "{said}{}", stderr(&raw));
    assert!(
        said.contains("RAW-PEER connected, answered 0 bytes"),
        "vgpud answers nothing and closes: {said}"
    );
    let log = d.log();
    assert!(
        log.contains("refused a connection") && log.contains("uid=65534"),
        "{log}"
    );
    // Root still gets through.
    let root = vgpuctl_private(None, &private, &nobus, &["list"]).await;
    assert!(root.status.success(), "{}", stderr(&root));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_socket_is_replaced_and_anything_else_in_the_way_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private");
    // A socket nobody listens on any more, as a vgpud killed with SIGKILL leaves it.
    drop(std::os::unix::net::UnixListener::bind(&private).unwrap());
    let (d, _) = daemon_with_private(dir.path()).await;
    let nobus = no_bus(dir.path());
    ok(&vgpuctl_private(None, &private, &nobus, &["list"]).await);

    // The live socket is not taken over by a second vgpud.
    let log = refused_start(
        &dir.path().join("other"),
        &private,
        "another process is listening",
    )
    .await;
    assert!(log.contains("another process is listening"), "{log}");
    ok(&vgpuctl_private(None, &private, &nobus, &["list"]).await);
    drop(d);

    // A plain file in the way.
    let third = dir.path().join("third");
    std::fs::create_dir(&third).unwrap();
    let file = third.join("private");
    std::fs::write(&file, "not a socket").unwrap();
    let log = refused_start(&third, &file, "is not a socket").await;
    assert!(
        log.contains("is not a socket") && log.contains(file.to_str().unwrap()),
        "{log}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket");
}

/// Starts a vgpud with its bus and state in `dir` (created if missing) and `--private-socket
/// private`, which is to stop at start-up saying `needle`; returns its log.
async fn refused_start(dir: &Path, private: &Path, needle: &str) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let bus = format!("unix:path={}", dir.join("bus.sock").display());
    let state = dir.join("state");
    let args: Vec<&std::ffi::OsStr> = [
        "--listen",
        &bus,
        "--sim",
        "demo",
        "--state-dir",
        state.to_str().unwrap(),
        "--private-socket",
        private.to_str().unwrap(),
    ]
    .into_iter()
    .map(std::ffi::OsStr::new)
    .collect();
    match Daemon::try_start(&args, &bus, dir).await {
        Ok(d) => fails_with(d, needle).await,
        Err(log) => log,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_private_socket_is_gone_takes_the_bus() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::embedded(dir.path(), &dir.path().join("state")).await;
    let missing = dir.path().join("no-such-socket");
    let listed = vgpuctl_private(None, &missing, &d.bus, &["list", "--json"]).await;
    ok_json(&listed);
    // A socket file that nobody serves (vgpud gone) is passed over too.
    let stale = dir.path().join("stale");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let listed = vgpuctl_private(None, &stale, &d.bus, &["list", "--json"]).await;
    ok_json(&listed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_sent_there_never_stay_in_vgpud_and_closed_connections_are_let_go() {
    let dir = tempfile::tempdir().unwrap();
    let (d, private) = daemon_with_private(dir.path()).await;
    let nobus = no_bus(dir.path());
    // One connection served and closed first, so that what vgpud allocates once is counted in.
    ok(&vgpuctl_private(None, &private, &nobus, &["list"]).await);
    let settled = |want: usize| {
        let d = &d;
        async move {
            let deadline = Instant::now() + PATIENCE;
            loop {
                let now = d.fd_count();
                if now == want {
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "vgpud holds {now} descriptors, {want} before:\n{}",
                    d.log()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = d.fd_count();

    for _ in 0..10 {
        let conn = vgpu_client::private::connect_private(&private)
            .await
            .unwrap();
        // A call carrying eight descriptors of /dev/null: the descriptors are dropped on receipt,
        // so the message no longer holds what it announces and vgpud closes the connection.
        let fds: Vec<zbus::OwnedFd> = (0..8)
            .map(|_| {
                let f = std::fs::File::open("/dev/null").unwrap();
                std::os::fd::OwnedFd::from(f).into()
            })
            .collect();
        let refused = conn
            .call_method(
                Some(vgpu_client::SERVICE),
                vgpu_client::MANAGER_PATH,
                Some("org.vgpumanager.Manager1"),
                "Stop",
                &(UUID, fds),
            )
            .await;
        assert!(refused.is_err(), "a call with descriptors is refused");
        drop(conn);
        // The next client is served as ever.
        let conn = vgpu_client::private::connect_private(&private)
            .await
            .unwrap();
        let list = vgpu_client::Manager1Proxy::new(&conn)
            .await
            .unwrap()
            .list_instances()
            .await
            .unwrap();
        assert!(!list.is_empty());
        drop(conn);
    }
    // Every connection closed: vgpud is back to what it held.
    settled(before).await;
}

/// A reply on the private socket waits for the objects but not for the bus's signals: the instance
/// a create names is on the bus as the reply arrives, one a destroy removed is gone from it, and
/// subscribers on the bus still get every signal of both, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_private_reply_finds_the_objects_in_place_and_the_signals_still_follow() {
    let dir = tempfile::tempdir().unwrap();
    let (d, private) = daemon_with_private(dir.path()).await;
    let bus_client = client(&d.bus).await;
    let mut signals = Signals::watch(&bus_client).await;
    let conn = vgpu_client::private::connect_private(&private)
        .await
        .unwrap();
    let calls =
        vgpu_client::Client::with_connection(conn, &vgpu_client::BusAddress::Private(private))
            .await
            .unwrap();
    let uuids = [
        "7b0e8a52-5f55-4c4b-8f3a-2a3c1d9e0b21",
        "7b0e8a52-5f55-4c4b-8f3a-2a3c1d9e0b22",
        "7b0e8a52-5f55-4c4b-8f3a-2a3c1d9e0b23",
    ];
    for uuid in uuids {
        let req = vgpu_client::NewInstance {
            gpu: Some(T4.into()),
            uuid: Some(uuid.into()),
            ..vgpu_client::NewInstance::of_type(TYPE)
        };
        let made = calls.create_uuid(&req).await.unwrap();
        assert_eq!(made.to_string(), uuid);
        // Straight after the reply, on the bus: the object is there.
        let instance = vgpu_client::Instance1Proxy::builder(&bus_client)
            .path(vgpu_client::instance_path(uuid))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .unwrap();
        assert_eq!(instance.state().await.unwrap(), "running");
        calls.destroy(uuid).await.unwrap();
        assert!(
            instance.state().await.is_err(),
            "{uuid} is still on the bus after its destroy was answered"
        );
    }
    for uuid in uuids {
        let path = vgpu_client::instance_path(uuid).to_string();
        signals.expect(Sig::Added(path.clone(), uuid.into())).await;
        signals.expect(Sig::Removed(path, uuid.into())).await;
    }
}
