//! D-Bus latency of vgpud while it is scraped: clients create and destroy instances for 30 s without
//! scrapers, then for 30 s while 16 scrapers each `GET /metrics` at 10 Hz (loopback), on a host with
//! 1,000 instances. Prints the Create/Destroy latency of both runs and their ratio (the target: within
//! 10 %), and how the scrapes fared. Timing is printed, never asserted.
//!
//! Run: `cargo bench -p vgpu-manager --bench metrics_load`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use vgpu_client::{BusAddress, Client, NewInstance};

const N: usize = 1000;
const SCRAPERS: usize = 16;
const PHASE: Duration = Duration::from_secs(30);

/// vgpud, killed when dropped.
struct Vgpud(Child);

impl Drop for Vgpud {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Two clients creating and destroying for `PHASE`: every call's latency.
async fn churn(client: &Arc<Client>) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let end = Instant::now() + PHASE;
            let req = NewInstance::of_type("benchfb-1");
            while Instant::now() < end {
                let t = Instant::now();
                let made = client.create(&req).await.unwrap();
                lat.push(t.elapsed());
                let t = Instant::now();
                client.destroy(&made.uuid).await.unwrap();
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all
}

fn scrape(addr: SocketAddr) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    if s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).is_ok() && out.starts_with(b"HTTP/1.1 200 ")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let dir = tempfile::tempdir().unwrap();
    let bus = format!("unix:path={}", dir.path().join("bus.sock").display());
    let host = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/bench-host.toml");
    let log = dir.path().join("vgpud.log");
    let _vgpud = Vgpud(
        Command::new(env!("CARGO_BIN_EXE_vgpud"))
            .args([
                "--listen",
                &bus,
                "--sim",
                host.to_str().unwrap(),
                "--state-dir",
            ])
            .arg(dir.path().join("state"))
            .args(["--metrics-listen", "127.0.0.1:0"])
            .env("VGPU_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let addr: SocketAddr = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(a) = text
            .split("serving metrics at http://")
            .nth(1)
            .and_then(|r| r.split("/metrics").next())
            .and_then(|a| a.parse().ok())
        {
            break a;
        }
        assert!(Instant::now() < deadline, "vgpud did not start:\n{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let client = Arc::new(Client::connect(&BusAddress::Address(bus)).await.unwrap());
    for _ in 0..N {
        client
            .create(&NewInstance::of_type("benchfb-1"))
            .await
            .unwrap();
    }
    println!("{N} instances; each phase {} s", PHASE.as_secs());

    let quiet = churn(&client).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let scrape_times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let scrapers: Vec<_> = (0..SCRAPERS)
        .map(|_| {
            let (stop, ok, failed, times) = (
                stop.clone(),
                ok.clone(),
                failed.clone(),
                scrape_times.clone(),
            );
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if scrape(addr) {
                        ok.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    let took = t.elapsed();
                    times.lock().unwrap().push(took);
                    std::thread::sleep(Duration::from_millis(100).saturating_sub(took));
                }
            })
        })
        .collect();
    let loaded = churn(&client).await;
    stop.store(true, Ordering::Relaxed);
    for s in scrapers {
        s.join().unwrap();
    }
    let mut st = scrape_times.lock().unwrap().clone();
    st.sort();

    println!(
        "{:<36} {:>8} {:>10} {:>10}",
        "Create/Destroy over D-Bus", "calls", "p50 ms", "p99 ms"
    );
    for (name, l) in [
        ("without scrapers", &quiet),
        ("16 scrapers at 10 Hz", &loaded),
    ] {
        println!(
            "{name:<36} {:>8} {:>10.3} {:>10.3}",
            l.len(),
            ms(percentile(l, 0.5)),
            ms(percentile(l, 0.99))
        );
    }
    println!(
        "ratio with/without scrapers: p50 {:.3}, p99 {:.3}",
        percentile(&loaded, 0.5).as_secs_f64() / percentile(&quiet, 0.5).as_secs_f64(),
        percentile(&loaded, 0.99).as_secs_f64() / percentile(&quiet, 0.99).as_secs_f64()
    );
    println!(
        "scrapes: {} answered, {} failed; scrape p50 {:.3} ms, p99 {:.3} ms",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        ms(percentile(&st, 0.5)),
        ms(percentile(&st, 0.99))
    );
}
