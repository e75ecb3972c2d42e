//! The cost of a scrape on a host with 1,000 instances (the target: < 2 ms, and few allocations),
//! printed next to its baseline measured in the same run: `ListInstances` from the engine (a copy of
//! the same 1,000 in-memory views, the cheapest read of that data). Also the cost of the first scrape
//! after a change, which rebuilds the snapshot from the host.
//!
//! Run: `cargo bench -p vgpu-manager --bench metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use vgpu_host::Host;
use vgpu_manager::daemon::api::{CreateInstance, InstanceSpec, InstanceTarget, ListInstances};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::daemon::metrics::{Format, Freshness};
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const N: usize = 1000;

/// Median time, allocations and bytes allocated per call of `f` over `runs` calls.
fn measure<T>(runs: usize, mut f: impl FnMut() -> T) -> (Duration, f64, f64) {
    let mut times = Vec::with_capacity(runs);
    let region = Region::new(GLOBAL);
    for _ in 0..runs {
        let t = Instant::now();
        std::hint::black_box(f());
        times.push(t.elapsed());
    }
    let stats = region.change();
    times.sort();
    (
        times[runs / 2],
        stats.allocations as f64 / runs as f64,
        stats.bytes_allocated as f64 / runs as f64,
    )
}

fn row(name: &str, (t, allocs, bytes): (Duration, f64, f64), base: Duration) {
    println!(
        "{name:<44} {:>9.3} ms {allocs:>10.1} allocs {:>10.1} KiB   {:>5.2}x baseline",
        t.as_secs_f64() * 1e3,
        bytes / 1024.0,
        t.as_secs_f64() / base.as_secs_f64()
    );
}

fn main() {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/bench-host.toml");
    let host = Arc::new(SimHost::load(file.to_str().unwrap()).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = Core::open(
        host as Arc<dyn Host>,
        dir.path(),
        Catalog::builtin().unwrap(),
    )
    .unwrap();
    for i in 0..N {
        core.execute(CreateInstance(InstanceSpec {
            target: InstanceTarget::Type("benchfb-1".parse().unwrap()),
            gpu: Some("benchfb".into()),
            uuid: None,
            autostart: false,
            label: Some(format!("libvirt:desktop-{i}")),
            attrs: Vec::new(),
        }))
        .unwrap();
    }
    let text = core.metrics_text(Format::Prometheus, Freshness::Throttled);
    println!(
        "scrape of a host with {N} instances: {} lines, {} KiB",
        text.lines().count(),
        text.len() / 1024
    );
    let runs = 300;
    let base = measure(runs, || core.execute(ListInstances).unwrap());
    row("baseline: ListInstances (1,000 views)", base, base.0);
    row(
        "scrape, text format 0.0.4",
        measure(runs, || {
            core.metrics_text(Format::Prometheus, Freshness::Throttled)
        }),
        base.0,
    );
    row(
        "scrape, OpenMetrics 1.0",
        measure(runs, || {
            core.metrics_text(Format::OpenMetrics, Freshness::Throttled)
        }),
        base.0,
    );
    // After a change (a uevent recorded): the snapshot is rebuilt from the host first.
    row(
        "first scrape after a change (rebuild)",
        measure(30, || {
            core.metrics().ops().uevent();
            core.metrics_text(Format::Prometheus, Freshness::Current)
        }),
        base.0,
    );
}
