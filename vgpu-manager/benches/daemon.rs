//! Daemon benchmarks. Each prints a measurement next to its baseline taken in the same run, and
//! the ratio; this machine is noisy, so only side-by-side ratios mean anything.
//!
//! 1. Cold start and reconcile with 1,000 definitions on a simulated host (target < 100 ms to ready):
//!    `Core::open` when the devices exist (daemon restart) and when they must all be created (host
//!    reboot), next to a plain read of the same 1,000 definition files.
//! 2. `ListInstances` with 1,000 instances over D-Bus: p50/p99 against `org.freedesktop.DBus.Peer.Ping`
//!    on the same bus (target p99 < 2 ms and ≤ 2× Ping). Beside it, the floor on the same bus: a bare
//!    zbus server answering with the same rows, and with the same number of bytes as one `ay`
//!    (`daemon/floor.rs`).
//! 3. Resident memory of an idle `vgpud` holding 1,000 instances (target < 15 MB).
//!
//! Run: `cargo bench -p vgpu-manager --bench daemon`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vgpu_client::Manager1Proxy;
use vgpu_host::Host;
use vgpu_manager::daemon::api::{DefineInstance, InstanceSpec, InstanceTarget};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

const N: usize = 1000;

#[path = "daemon/floor.rs"]
mod floor;

fn bench_host_file() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/bench-host.toml")
}

fn bench_host() -> Arc<SimHost> {
    Arc::new(SimHost::load(bench_host_file().to_str().unwrap()).unwrap())
}

fn open(host: &Arc<SimHost>, dir: &Path) -> Core {
    Core::open(
        host.clone() as Arc<dyn Host>,
        dir,
        Catalog::builtin().unwrap(),
    )
    .unwrap()
}

/// Writes `N` autostart definitions through the daemon itself.
fn define_all(dir: &Path) {
    let host = bench_host();
    let core = open(&host, dir);
    for i in 0..N {
        core.execute(DefineInstance(InstanceSpec {
            target: InstanceTarget::Type("benchfb-1".parse().unwrap()),
            gpu: Some("benchfb".into()),
            uuid: None,
            autostart: true,
            label: Some(format!("desktop-{i}")),
            attrs: Vec::new(),
        }))
        .unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Returns the simulated host after the reboot, with its 1,000 devices.
fn cold_start(dir: &Path) -> Arc<SimHost> {
    println!("== cold start + reconcile, {N} autostart definitions, simulated host");
    // Baseline: just reading every definition file.
    let read_files = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let mut bytes = 0;
                for e in std::fs::read_dir(dir.join("definitions")).unwrap() {
                    bytes += std::fs::read(e.unwrap().path()).unwrap().len();
                }
                assert!(bytes > 0);
                t.elapsed()
            })
            .collect(),
    );
    // Host reboot: every device must be created (ledger entry first, fsynced).
    let host = bench_host();
    let t = Instant::now();
    let core = open(&host, dir);
    let reboot = t.elapsed();
    drop(core);
    // Daemon restart: devices exist, reconcile finds nothing to do.
    let restart = median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                let core = open(&host, dir);
                let d = t.elapsed();
                drop(core);
                d
            })
            .collect(),
    );
    println!(
        "  read {N} definition files (baseline)      {:>9.2} ms",
        ms(read_files)
    );
    println!(
        "  daemon restart to ready (devices exist)  {:>9.2} ms  = {:.1}x the file read, {:.2}x the 100 ms target",
        ms(restart),
        ms(restart) / ms(read_files),
        ms(restart) / 100.0
    );
    println!(
        "  host reboot to ready (creates {N})      {:>9.2} ms  = {:.2}x the 100 ms target (all ledger entries in one batch file)",
        ms(reboot),
        ms(reboot) / 100.0
    );
    host
}

struct Vgpud(Child);

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `VmRSS`, `RssAnon` and `RssFile` of a process, in KiB.
fn rss_kib(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssFile:"))
}

async fn over_dbus(dir: &Path, tmp: &Path) {
    println!("== vgpud over its embedded bus with {N} instances, simulated host");
    let sock = tmp.join("bus.sock");
    let bus = format!("unix:path={}", sock.display());
    let child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .args([
            "--listen",
            &bus,
            "--sim",
            bench_host_file().to_str().unwrap(),
            "--state-dir",
        ])
        .arg(dir)
        .env("VGPU_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Vgpud(child);
    measure(&daemon, &sock, &bus, true).await;
}

/// The `Environment=` settings of the shipped systemd unit, which the deployed daemon runs with.
fn unit_environment() -> Vec<(String, String)> {
    let unit = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/vgpud.service");
    std::fs::read_to_string(unit)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The daemon as deployed: a separate bus daemon (`dbus-daemon`, like the system bus), the
/// environment of the shipped systemd unit, and the kernel's sysfs read through `SysfsHost` (here a
/// real directory tree written from the simulated host, with the same 1,000 devices), so neither the
/// embedded bus nor the simulated kernel counts in its memory.
async fn as_deployed(host: &SimHost, dir: &Path, tmp: &Path) {
    println!(
        "== vgpud as deployed with {N} instances: separate dbus-daemon, the unit's environment, sysfs tree on disk"
    );
    let sysfs = tmp.join("sysfs");
    host.materialize(&sysfs).unwrap();
    let sock = tmp.join("dbus.sock");
    let bus = format!("unix:path={}", sock.display());
    let config = tmp.join("bus.conf");
    std::fs::write(
        &config,
        format!(
            "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN\" \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n<busconfig><type>session</type><listen>{bus}</listen><auth>EXTERNAL</auth><policy context=\"default\"><allow send_destination=\"*\" eavesdrop=\"true\"/><allow eavesdrop=\"true\"/><allow own=\"*\"/></policy></busconfig>\n"
        ),
    )
    .unwrap();
    let Ok(bus_daemon) = Command::new("dbus-daemon")
        .arg(format!("--config-file={}", config.display()))
        .arg("--nofork")
        .stdout(Stdio::null())
        .spawn()
    else {
        println!("  skipped: dbus-daemon is not installed (Debian package dbus-daemon)");
        return;
    };
    let _bus_daemon = Vgpud(bus_daemon);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !sock.exists() {
        assert!(Instant::now() < deadline, "dbus-daemon did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let child = Command::new(env!("CARGO_BIN_EXE_vgpud"))
        .args(["--bus", &bus, "--sysfs-root"])
        .arg(&sysfs)
        .arg("--state-dir")
        .arg(dir)
        .envs(unit_environment())
        .env("VGPU_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let daemon = Vgpud(child);
    measure(&daemon, &sock, &bus, true).await;
}

/// Waits for the daemon to list `N` instances, then measures ListInstances against Ping (when
/// `latency`) and the daemon's idle resident memory.
async fn measure(daemon: &Vgpud, sock: &Path, bus: &str, latency: bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let (conn, proxy) = loop {
        // The embedded bus drops calls to a name nobody owns yet (instead of an error): ask first.
        if sock.exists()
            && let Ok(conn) = zbus::connection::Builder::address(bus).build().await
            && let Ok(dbus) = zbus::fdo::DBusProxy::new(&conn).await
            && dbus
                .name_has_owner(vgpu_client::SERVICE.try_into().unwrap())
                .await
                == Ok(true)
            && let Ok(p) = Manager1Proxy::new(&conn).await
            && let Ok(list) = p.list_instances().await
            && list.len() == N
        {
            break (conn.clone(), p);
        }
        assert!(
            Instant::now() < deadline,
            "vgpud did not come up with {N} instances"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    if latency {
        list_vs_ping(&conn, &proxy, bus).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss, anon, file) = rss_kib(daemon.0.id());
    println!(
        "  idle vgpud RSS with {N} instances: {:.1} MiB = {:.2}x the 15 MB target (heap and stacks {:.1} MiB, mapped binary and libraries {:.1} MiB)",
        rss as f64 / 1024.0,
        rss as f64 * 1024.0 / 15e6,
        anon as f64 / 1024.0,
        file as f64 / 1024.0
    );
}

async fn list_vs_ping(conn: &zbus::Connection, proxy: &Manager1Proxy<'_>, bus: &str) {
    let peer = zbus::fdo::PeerProxy::builder(conn)
        .destination(vgpu_client::SERVICE)
        .path(vgpu_client::MANAGER_PATH)
        .build()
        .await
        .unwrap();
    let (mut list_t, mut ping_t) = (Vec::new(), Vec::new());
    for _ in 0..300 {
        let t = Instant::now();
        let l = proxy.list_instances().await.unwrap();
        list_t.push(t.elapsed());
        assert_eq!(l.len(), N);
        let t = Instant::now();
        peer.ping().await.unwrap();
        ping_t.push(t.elapsed());
    }
    // Where the time goes: the same call until its reply is in (no decoding), then decoding that
    // reply into owned structs, as the typed proxy above does.
    let (mut wire_t, mut decode_t, mut size) = (Vec::new(), Vec::new(), 0);
    for _ in 0..300 {
        let t = Instant::now();
        let reply = conn
            .call_method(
                Some(vgpu_client::SERVICE),
                vgpu_client::MANAGER_PATH,
                Some(vgpu_client::MANAGER_INTERFACE),
                "ListInstances",
                &(),
            )
            .await
            .unwrap();
        wire_t.push(t.elapsed());
        size = reply.data().len();
        let t = Instant::now();
        let list: Vec<vgpu_client::InstanceInfo> = reply.body().deserialize().unwrap();
        decode_t.push(t.elapsed());
        assert_eq!(list.len(), N);
    }
    for v in [&mut list_t, &mut ping_t, &mut wire_t, &mut decode_t] {
        v.sort();
    }
    let (l50, l99) = (percentile(&list_t, 0.5), percentile(&list_t, 0.99));
    let (p50, p99) = (percentile(&ping_t, 0.5), percentile(&ping_t, 0.99));
    println!(
        "  Peer.Ping          p50 {:>7.3} ms  p99 {:>7.3} ms",
        ms(p50),
        ms(p99)
    );
    println!(
        "  ListInstances({N}) p50 {:>7.3} ms  p99 {:>7.3} ms  = p99 {:.2}x Ping (target ≤ 2x, < 2 ms)",
        ms(l50),
        ms(l99),
        ms(l99) / ms(p99)
    );
    println!(
        "    of which: reply in ({size} bytes) p50 {:.3} ms, decoding it p50 {:.3} ms",
        ms(percentile(&wire_t, 0.5)),
        ms(percentile(&decode_t, 0.5)),
    );
    floor::compare(conn, bus).await;
}

fn main() {
    if floor::serve_if_asked() {
        return;
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing special: run either way.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let t = Instant::now();
    define_all(&dir);
    println!(
        "(prepared {N} definitions in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let host = cold_start(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(over_dbus(&dir, tmp.path()));
    rt.block_on(as_deployed(&host, &dir, tmp.path()));
}
