//! Daemon benchmarks (issue 4). Each prints a measurement next to its baseline taken in the same run, and
//! the ratio; this machine is noisy, so only side-by-side ratios mean anything.
//!
//! 1. Cold start and reconcile with 1,000 definitions on a simulated host (target < 100 ms to ready):
//!    `Core::open` when the devices exist (daemon restart) and when they must all be created (host
//!    reboot), next to a plain read of the same 1,000 definition files.
//! 2. `ListInstances` with 1,000 instances over D-Bus: p50/p99 against `org.freedesktop.DBus.Peer.Ping`
//!    on the same bus (target p99 < 2 ms and ≤ 2× Ping).
//! 3. Resident memory of an idle `vgpud` holding 1,000 instances (target < 15 MB).
//!
//! Run: `cargo bench -p vgpu-manager --bench daemon`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mdev_types::host::Host;
use mdev_types::host::sim::SimHost;
use vgpu_manager::client::Manager1Proxy;
use vgpu_manager::daemon::api::{Command as CoreCommand, CreateRequest, Target};
use vgpu_manager::daemon::core::Core;
use vgpu_manager::profile::Catalog;

const N: usize = 1000;

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
        core.execute(CoreCommand::Define(CreateRequest {
            target: Target::Type("benchfb-1".parse().unwrap()),
            gpu: Some("benchfb".into()),
            uuid: None,
            autostart: true,
            label: Some(format!("desktop-{i}")),
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

fn cold_start(dir: &Path) {
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
}

struct Vgpud(Child);

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

async fn over_dbus(dir: &Path, tmp: &Path) {
    println!("== vgpud over its embedded bus with {N} instances");
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
    let deadline = Instant::now() + Duration::from_secs(60);
    let (conn, proxy) = loop {
        // The embedded bus drops calls to a name nobody owns yet (instead of an error): ask first.
        if sock.exists()
            && let Ok(conn) = zbus::connection::Builder::address(bus.as_str())
                .build()
                .await
            && let Ok(dbus) = zbus::fdo::DBusProxy::new(&conn).await
            && dbus
                .name_has_owner(vgpu_manager::client::SERVICE.try_into().unwrap())
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
    let peer = zbus::fdo::PeerProxy::builder(&conn)
        .destination(vgpu_manager::client::SERVICE)
        .path(vgpu_manager::client::MANAGER_PATH)
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
    list_t.sort();
    ping_t.sort();
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
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = rss_kib(daemon.0.id());
    println!(
        "  idle vgpud RSS with {N} instances: {:.1} MiB = {:.2}x the 15 MB target",
        rss as f64 / 1024.0,
        rss as f64 * 1024.0 / 15e6
    );
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing special: run either way.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let t = Instant::now();
    define_all(&dir);
    println!(
        "(prepared {N} definitions in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    cold_start(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(over_dbus(&dir, tmp.path()));
}
