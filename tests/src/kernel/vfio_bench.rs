//! VFIO benchmarks on the real kernel (scripts/bench-vm): preflight latency per sample instance,
//! and DMA map throughput of a 256 MiB region through our code against the raw ioctl sequence on the same
//! container in the same run. Run only when a filter names `bench` (`scripts/bench-vm`); they print
//! `bench:` lines and fail only when an operation fails, never on a ratio.

use vgpu_host::ops::bind_vfio;
use vgpu_vfio::{PreflightOptions, VfioBackend, VfioTarget, preflight};

use super::guest::{Guest, KernelKind};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, test_uuid};
use super::sriov::{Pf, PfGuard};
use super::vfio::{Restore, check_err, expected_backend};

/// The VFIO benchmarks (run only when a filter names `bench`, see [`super::all_benches`]).
pub fn benches() -> Vec<Test<Guest>> {
    vec![
        Test::new("bench_vfio_preflight_latency", bench_preflight_latency),
        Test::new("bench_vfio_dma_map_throughput", bench_dma_map),
    ]
}

/// Measured preflights per sample instance.
const PREFLIGHTS: usize = 20;
/// DMA region of the throughput benchmark (256 MiB).
const DMA_BENCH_SIZE: usize = 256 << 20;
/// Map/unmap rounds per path, after one warm-up round each.
const DMA_ROUNDS: usize = 5;
/// The target: our map throughput at least 0.9x the raw ioctl's.
const DMA_TARGET: f64 = 0.9;

fn percentile(v: &[u64], p: usize) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return 0;
    }
    let rank = (s.len() * p).div_ceil(100).clamp(1, s.len());
    s[rank - 1]
}

/// Preflight latency (without and with the KVM attach check) of one instance of each sample parent.
fn bench_preflight_latency(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    for (n, (parent, ty)) in [
        ("mtty", "mtty-1"),
        ("mdpy", "mdpy-vga"),
        ("mbochs", "mbochs-small"),
    ]
    .into_iter()
    .enumerate()
    {
        let uuid = test_uuid("bench_vfio_preflight", n as u32);
        mdevs.create(parent, ty, uuid)?;
        for kvm in [false, true] {
            let opts = PreflightOptions {
                kvm,
                ..PreflightOptions::default()
            };
            let mut totals = Vec::new();
            let mut by_step: Vec<(String, Vec<u64>)> = Vec::new();
            for i in 0..=PREFLIGHTS {
                let r = preflight(&g.host, &VfioTarget::Mdev(uuid), &opts).map_err(check_err)?;
                ensure(r.passed, || format!("preflight of {parent} failed: {r:?}"))?;
                if i == 0 {
                    continue; // warm-up
                }
                totals.push(r.total_micros);
                for s in &r.steps {
                    match by_step.iter_mut().find(|(n, _)| *n == s.name) {
                        Some((_, v)) => v.push(s.micros),
                        None => by_step.push((s.name.clone(), vec![s.micros])),
                    }
                }
            }
            let steps: Vec<String> = by_step
                .iter()
                .map(|(n, v)| format!("{n} {}", percentile(v, 50)))
                .collect();
            println!(
                "bench: preflight {parent} ({:?}, kvm {kvm}): p50 {:.2} ms, p90 {:.2} ms over {PREFLIGHTS}; step p50 us: {}",
                expected_backend(g),
                percentile(&totals, 50) as f64 / 1e3,
                percentile(&totals, 90) as f64 / 1e3,
                steps.join(", ")
            );
        }
    }
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// Maps and unmaps a 256 MiB vm-memory region for DMA through our `Session` and through the raw
/// `VFIO_IOMMU_MAP_DMA`/`UNMAP_DMA` ioctls on the same container and buffer, interleaved, on an igb VF
/// (a real IOMMU-backed group, so the kernel pins every page and programs the emulated VT-d tables).
fn bench_dma_map(g: &Guest) -> TestResult {
    use std::time::Instant;
    use vgpu_vfio::sys::raw_type1_unmap;
    use vgpu_vfio::{DmaBuffer, Session, inspect};

    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    let vf = guard.enable_vfs(1)?[0];
    let restore = Restore {
        host: &g.host,
        record: Some(bind_vfio(&g.host, &vf).map_err(check_err)?),
    };
    let target = VfioTarget::Pci(vf);
    let state = inspect(&g.host, &target).map_err(check_err)?;
    let buffer = DmaBuffer::new(DMA_BENCH_SIZE).map_err(check_err)?;
    let mut backends = vec![VfioBackend::Type1];
    if g.kernel == KernelKind::Custom {
        backends.push(VfioBackend::Iommufd);
    }
    for backend in backends {
        let mut session = Session::open_backend(backend, None, &target).map_err(check_err)?;
        session.open_device(&state).map_err(check_err)?;
        let mut ours = Vec::new();
        let mut raw = Vec::new();
        for round in 0..=DMA_ROUNDS {
            let t = Instant::now();
            session.map(&buffer).map_err(check_err)?;
            let d = t.elapsed();
            session.unmap(&buffer).map_err(check_err)?;
            if round > 0 {
                ours.push(d);
            }
            let Some(container) = session.container() else {
                continue;
            };
            let t = Instant::now();
            buffer
                .raw_type1_map(container)
                .map_err(|e| TestError::Check(format!("raw {e}")))?;
            let d = t.elapsed();
            let n = raw_type1_unmap(container, buffer.iova(), DMA_BENCH_SIZE as u64)
                .map_err(|e| TestError::Check(format!("raw VFIO_IOMMU_UNMAP_DMA: {e}")))?;
            ensure_eq("bytes unmapped by the raw ioctl", n, DMA_BENCH_SIZE as u64)?;
            if round > 0 {
                raw.push(d);
            }
        }
        let gib_s = |d: &std::time::Duration| {
            (DMA_BENCH_SIZE as f64 / (1u64 << 30) as f64) / d.as_secs_f64().max(1e-9)
        };
        let median = |v: &mut Vec<std::time::Duration>| {
            v.sort_unstable();
            v[v.len() / 2]
        };
        let ours_p50 = median(&mut ours);
        if raw.is_empty() {
            println!(
                "bench: dma map 256 MiB ({backend}): ours p50 {:.1} ms = {:.2} GiB/s (no raw baseline for this backend)",
                ours_p50.as_secs_f64() * 1e3,
                gib_s(&ours_p50)
            );
        } else {
            let raw_p50 = median(&mut raw);
            let r = gib_s(&ours_p50) / gib_s(&raw_p50);
            println!(
                "bench: dma map 256 MiB ({backend}): ours p50 {:.1} ms = {:.2} GiB/s, raw ioctl p50 {:.1} ms = {:.2} GiB/s, ours/raw throughput {r:.3} (target >= {DMA_TARGET}: {})",
                ours_p50.as_secs_f64() * 1e3,
                gib_s(&ours_p50),
                raw_p50.as_secs_f64() * 1e3,
                gib_s(&raw_p50),
                if r >= DMA_TARGET { "met" } else { "NOT met" }
            );
        }
        session.close();
    }
    drop(buffer);
    restore.finish()?;
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}
