//! Benchmarks on the real kernel (issue 4, "Benchmarks"): not tests. They run only when a filter
//! names them (`scripts/vm-test --kernel custom -- bench`, or `scripts/bench-vm`), print their numbers
//! and ratios measured side by side in one guest run, and fail only when an operation fails.
//!
//! `bench_daemon_create_destroy`: create→ready→destroy of one mbochs-small through vgpud over D-Bus
//! (`Manager1.Create` by type with an explicit GPU — its reply comes after the device exists — then
//! `Manager1.Destroy`) against a raw loop writing the same sysfs files through `Host::write` (`create`,
//! then the device's `remove`), interleaved, target p50 ratio ≤ 1.3×. It runs twice: with vgpud's state
//! directory on tmpfs, and on the 9p share (host-backed, so the daemon's fsyncs reach a disk the way
//! they would with /var/lib on a real host), and measures a bare D-Bus round trip
//! (`org.freedesktop.DBus.Peer.Ping`) to show the bus's share of the difference.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mdev_types::host::{Host, paths};

use super::guest::Guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, available, create_path, test_uuid};
use super::vgpud::{TargetKind, Vgpud, Workdir};

/// The benchmarks, selected only by a filter containing `bench` (see the kernel-tests binary).
pub fn benches() -> Vec<Test<Guest>> {
    vec![Test::new("bench_daemon_create_destroy", create_destroy)]
}

/// Measured iterations per loop.
const ITERATIONS: u32 = 50;
/// Iterations run first and not counted (page cache, the daemon's first allocations).
const WARMUP: u32 = 5;
/// The target for the p50 ratio D-Bus / raw.
const TARGET_RATIO: f64 = 1.3;
const PARENT: &str = "mbochs";
const TYPE: &str = "mbochs-small";

/// Durations of one loop, per step.
#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    remove: Vec<Duration>,
    total: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, create: Duration, remove: Duration) {
        self.create.push(create);
        self.remove.push(remove);
        self.total.push(create + remove);
    }
}

/// The `p`th percentile (nearest rank) of `v`.
fn percentile(v: &[Duration], p: u32) -> Duration {
    let mut s = v.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = (s.len() * p as usize).div_ceil(100).clamp(1, s.len());
    s[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

/// The file system type `path` is on, from /proc/mounts (longest matching mount point).
fn fs_type(path: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mnt, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt).then(|| (mnt.len(), fs.to_string()))
        })
        .max()
        .map(|(_, fs)| fs)
        .unwrap_or_else(|| "unknown".into())
}

/// One measured run: the daemon with its state dir below `state_base`, against the raw loop.
fn run(g: &Guest, label: &str, state_base: &Path, seq: &mut u32) -> Result<f64, TestError> {
    let work = Workdir::new("bench")?;
    let state = Workdir::new_in(state_base, "bench-state")?;
    let d = Vgpud::spawn(work.path(), state.path())?;
    let mut mdevs = Mdevs::new(&g.host);
    let create = create_path(PARENT, TYPE)?;
    let (mut dbus, mut raw) = (Samples::default(), Samples::default());
    let mut ping = Vec::new();
    for i in 0..WARMUP + ITERATIONS {
        let counted = i >= WARMUP;
        // Alternate which loop goes first, so drift (caches, the host's load) hits both alike.
        for first_daemon in [i % 2 == 0, i % 2 != 0] {
            let u = test_uuid("bench_daemon_create_destroy", *seq);
            *seq += 1;
            let remove = paths::mdev_device(&u).join("remove");
            let (c, r) = if first_daemon {
                let t = Instant::now();
                d.create(TargetKind::Type, TYPE, PARENT, Some(&u))?;
                let c = t.elapsed();
                mdevs.adopt(u);
                ensure(g.host.exists(&remove), || {
                    format!("{u} missing after Create returned")
                })?;
                let t = Instant::now();
                d.destroy(&u)?;
                (c, t.elapsed())
            } else {
                let t = Instant::now();
                g.host.write(&create, &u.to_string())?;
                let c = t.elapsed();
                mdevs.adopt(u);
                ensure(g.host.exists(&remove), || {
                    format!("{u} missing after the create write returned")
                })?;
                let t = Instant::now();
                g.host.write(&remove, "1")?;
                (c, t.elapsed())
            };
            mdevs.forget(&u);
            ensure(!g.host.exists(&remove), || {
                format!("{u} still present after removal returned")
            })?;
            if counted {
                if first_daemon { &mut dbus } else { &mut raw }.push(c, r);
            }
        }
        let t = Instant::now();
        d.ping()?;
        if counted {
            ping.push(t.elapsed());
        }
    }
    d.stop()?;
    let (pd, pr) = (percentile(&dbus.total, 50), percentile(&raw.total, 50));
    let q = ratio(pd, pr);
    println!(
        "bench: state dir on {} ({}): {ITERATIONS} iterations after {WARMUP} warm-up",
        fs_type(state.path()),
        label
    );
    println!(
        "bench:   D-Bus  create+destroy p50 {} p90 {}  (Create p50 {}, Destroy p50 {})",
        ms(pd),
        ms(percentile(&dbus.total, 90)),
        ms(percentile(&dbus.create, 50)),
        ms(percentile(&dbus.remove, 50))
    );
    println!(
        "bench:   sysfs  create+remove  p50 {} p90 {}  (create p50 {}, remove p50 {})",
        ms(pr),
        ms(percentile(&raw.total, 90)),
        ms(percentile(&raw.create, 50)),
        ms(percentile(&raw.remove, 50))
    );
    println!(
        "bench:   Peer.Ping p50 {} (two round trips: {} of the D-Bus loop)",
        ms(percentile(&ping, 50)),
        ms(percentile(&ping, 50) * 2)
    );
    println!(
        "bench:   ratio D-Bus/sysfs p50 {q:.2}x (target <= {TARGET_RATIO}x{})",
        if q <= TARGET_RATIO {
            ""
        } else {
            ": ABOVE TARGET"
        }
    );
    Ok(q)
}

/// Where the 9p share is: the directory of the running test binary (scripts/vm-test's guest-run).
fn share_dir() -> Result<PathBuf, TestError> {
    let exe = std::env::current_exe()
        .map_err(|e| TestError::Check(format!("cannot find the running test binary: {e}")))?;
    exe.parent()
        .map(Path::to_path_buf)
        .ok_or_else(|| TestError::Check(format!("{} has no directory", exe.display())))
}

fn create_destroy(g: &Guest) -> TestResult {
    let avail = available(&g.host, PARENT, TYPE)?;
    ensure(avail > 0, || format!("{TYPE} has no room"))?;
    let mut seq = 0;
    let tmp = run(g, "tmpfs, as in memory", &std::env::temp_dir(), &mut seq)?;
    let share = run(
        g,
        "the 9p share, fsync reaches the host's disk",
        &share_dir()?,
        &mut seq,
    )?;
    println!(
        "bench: create->ready->destroy D-Bus/sysfs p50 ratio: {tmp:.2}x (state on tmpfs), {share:.2}x (state on 9p)"
    );
    ensure_eq(
        format_args!("{TYPE} available_instances after the benchmark"),
        available(&g.host, PARENT, TYPE)?,
        avail,
    )?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<Duration> = (1..=10).map(Duration::from_millis).collect();
        assert_eq!(percentile(&v, 50), Duration::from_millis(5));
        assert_eq!(percentile(&v, 90), Duration::from_millis(9));
        assert_eq!(percentile(&v, 100), Duration::from_millis(10));
        assert_eq!(percentile(&[], 50), Duration::ZERO);
    }
}
