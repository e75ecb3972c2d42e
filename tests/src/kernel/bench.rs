//! Benchmarks on the real kernel (scripts/bench-vm): not tests. They run only when a filter
//! names them (`scripts/vm-test --kernel custom -- bench`, or `scripts/bench-vm`), print their numbers
//! and ratios measured side by side in one guest run, and fail only when an operation fails.
//!
//! `bench_daemon_create_destroy`: create→ready→destroy of one mbochs-small through vgpud over D-Bus
//! (`Manager1.Create` by type with an explicit GPU — its reply comes after the device exists — then
//! `Manager1.Destroy`) against a raw loop writing the same sysfs files through `Host::write` (`create`,
//! then the device's `remove`; on the live host that is one open(2) and one write(2)), interleaved,
//! target p50 ratio ≤ 1.3×. It runs twice, with vgpud's state directory on tmpfs: back to back, and
//! with a pause after every operation, so that what the daemon does in the background after a kernel
//! event is over before the next operation. (The guest has no writable host-backed filesystem since the
//! 9p share became the host's read-only root; the cost of the state directory's fsyncs is printed on
//! its own instead.) A third run puts the daemon on a separate `dbus-daemon`, the bus it is deployed on;
//! a fourth keeps it there but makes the calls, and the round trip they are set against, through
//! vgpud's private socket, the way a root client that only makes calls connects (no bus routes the
//! call, its reply or the change's signals ahead of the reply).
//! To show where the time goes, each run also prints a bare D-Bus round trip
//! (`org.freedesktop.DBus.Peer.Ping`), `ListGpus` (one full discovery), the state directory's file
//! protocol timed on its own, and which kernel events made the daemon reconcile.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use vgpu_host::{Host, paths};

use super::bench_cli::with_private_socket;
use super::bench_phases::{CallSpan, Marks, phases};
use super::bus_daemon::BusDaemon;
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
/// The target for the p50 ratio D-Bus / raw of a create+destroy pair.
const TARGET_RATIO: f64 = 1.3;
/// The target for one call from a persistent client against its floor: the raw sysfs operation plus
/// one bus round trip.
const TARGET_CALL: f64 = 1.2;
/// The pause of the third run (see [`Setup::pause`]).
const PAUSE: Duration = Duration::from_millis(300);
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
pub(super) fn percentile(v: &[Duration], p: u32) -> Duration {
    let mut s = v.to_vec();
    s.sort_unstable();
    if s.is_empty() {
        return Duration::ZERO;
    }
    let rank = (s.len() * p as usize).div_ceil(100).clamp(1, s.len());
    s[rank - 1]
}

pub(super) fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

pub(super) fn ratio(a: Duration, b: Duration) -> f64 {
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

/// How one run is set up.
struct Setup<'a> {
    /// Printed with the results.
    label: &'a str,
    /// The state directory goes below this.
    state_base: &'a Path,
    /// A pause after every operation (both loops), so that work the daemon does in the background
    /// after answering (kernel-event reconciles, GPU object refreshes) is over before the next one.
    pause: Duration,
    /// The daemon on a separate `dbus-daemon`, as deployed, instead of its embedded bus.
    dbus_daemon: bool,
    /// The calls (and the round trip they are set against) through vgpud's private socket, as a
    /// root client that makes calls alone connects, instead of the bus. Only with `dbus_daemon`.
    private_socket: bool,
}

/// What a run measured.
struct Results {
    ratio: f64,
}

/// One measured run: the daemon with its state dir below `setup.state_base`, against the raw loop.
fn run(g: &Guest, setup: &Setup<'_>, seq: &mut u32) -> Result<Results, TestError> {
    let work = Workdir::new("bench")?;
    let state = Workdir::new_in(setup.state_base, "bench-state")?;
    let bus = setup
        .dbus_daemon
        .then(|| BusDaemon::start(work.path()))
        .transpose()?;
    let d = match &bus {
        Some(b) if setup.private_socket => {
            let (mut d, private) = with_private_socket(&work, &state, b)?;
            d.call_through_private_socket(Path::new(&private))?;
            d
        }
        Some(b) => Vgpud::spawn_on_bus(work.path(), state.path(), b.address())?,
        None => Vgpud::spawn(work.path(), state.path())?,
    };
    let mut mdevs = Mdevs::new(&g.host);
    let create = create_path(PARENT, TYPE)?;
    let (mut dbus, mut raw) = (Samples::default(), Samples::default());
    let (mut ping, mut list_gpus) = (Vec::new(), Vec::new());
    let (mut creates, mut destroys) = (Vec::new(), Vec::new());
    let log_before = d.log_text();
    for i in 0..WARMUP + ITERATIONS {
        let counted = i >= WARMUP;
        // Alternate which loop goes first, so drift (caches, the host's load) hits both alike.
        for first_daemon in [i % 2 == 0, i % 2 != 0] {
            let u = test_uuid("bench_daemon_create_destroy", *seq);
            *seq += 1;
            let remove = paths::mdev_device(&u).join("remove");
            let (c, r) = if first_daemon {
                let (t, wall) = (Instant::now(), SystemTime::now());
                d.create(TargetKind::Type, TYPE, PARENT, Some(&u))?;
                let c = t.elapsed();
                creates.push(CallSpan {
                    uuid: u,
                    start: wall,
                    end: SystemTime::now(),
                });
                mdevs.adopt(u);
                ensure(g.host.exists(&remove), || {
                    format!("{u} missing after Create returned")
                })?;
                std::thread::sleep(setup.pause);
                let (t, wall) = (Instant::now(), SystemTime::now());
                d.destroy(&u)?;
                let r = t.elapsed();
                destroys.push(CallSpan {
                    uuid: u,
                    start: wall,
                    end: SystemTime::now(),
                });
                (c, r)
            } else {
                let t = Instant::now();
                g.host.write(&create, &u.to_string())?;
                let c = t.elapsed();
                mdevs.adopt(u);
                ensure(g.host.exists(&remove), || {
                    format!("{u} missing after the create write returned")
                })?;
                std::thread::sleep(setup.pause);
                let t = Instant::now();
                g.host.write(&remove, "1")?;
                (c, t.elapsed())
            };
            mdevs.forget(&u);
            ensure(!g.host.exists(&remove), || {
                format!("{u} still present after removal returned")
            })?;
            std::thread::sleep(setup.pause);
            if counted {
                if first_daemon { &mut dbus } else { &mut raw }.push(c, r);
            }
        }
        let t = Instant::now();
        d.ping()?;
        let p = t.elapsed();
        let t = Instant::now();
        d.list_gpus()?;
        let l = t.elapsed();
        if counted {
            ping.push(p);
            list_gpus.push(l);
        }
        std::thread::sleep(setup.pause);
    }
    // The daemon logs one line per reconcile a kernel event started (vgpu-manager's core/mod.rs).
    let log = d.log_text();
    let phases_of = |calls: &[CallSpan], marks| {
        phases(
            &log,
            calls.get(WARMUP as usize..).unwrap_or_default(),
            marks,
        )
    };
    let create_phases = phases_of(&creates, &Marks::CREATE);
    let destroy_phases = phases_of(&destroys, &Marks::DESTROY);
    let triggers = reconcile_triggers(log.get(log_before.len()..).unwrap_or_default());
    let reconciles: usize = triggers.iter().map(|(_, n)| n).sum();
    let warned = warnings(log.get(log_before.len()..).unwrap_or_default());
    d.stop()?;
    let store = store_cost(state.path())?;
    let (pd, pr) = (percentile(&dbus.total, 50), percentile(&raw.total, 50));
    let q = ratio(pd, pr);
    println!(
        "bench: {}, state dir on {} ({}), pause {:?} after each operation: {ITERATIONS} iterations after {WARMUP} warm-up",
        match (setup.dbus_daemon, setup.private_socket) {
            (true, true) => "dbus-daemon bus, calls and round trips through the private socket",
            (true, false) => "dbus-daemon bus",
            (false, _) => "embedded bus",
        },
        fs_type(state.path()),
        setup.label,
        setup.pause
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
        "bench:   Peer.Ping p50 {} (x2 = {} of bus round trips per create+destroy); ListGpus p50 {} (one discover)",
        ms(percentile(&ping, 50)),
        ms(percentile(&ping, 50) * 2),
        ms(percentile(&list_gpus, 50)),
    );
    println!(
        "bench:   one-round-trip floor (sysfs + 2 x Ping) / sysfs = {:.2}x: a D-Bus call can come no closer to raw sysfs here",
        ratio(pr + percentile(&ping, 50) * 2, pr)
    );
    let rtt = percentile(&ping, 50);
    for (what, ours, raw) in [
        (
            "Create",
            percentile(&dbus.create, 50),
            percentile(&raw.create, 50),
        ),
        (
            "Destroy",
            percentile(&dbus.remove, 50),
            percentile(&raw.remove, 50),
        ),
    ] {
        let q = ratio(ours, raw + rtt);
        println!(
            "bench:   {what:<7} {} vs floor (sysfs {} + one round trip) {}: {q:.2}x (target <= {TARGET_CALL}x{})",
            ms(ours),
            ms(raw),
            ms(raw + rtt),
            if q <= TARGET_CALL { "" } else { ": ABOVE" }
        );
    }
    println!("{}", create_phases.summary("Create"));
    println!("{}", destroy_phases.summary("Destroy"));
    println!(
        "bench:   state-dir file protocol alone (write+fsync+rename+fsync dir, unlink+fsync dir) p50 {}",
        ms(store)
    );
    println!(
        "bench:   kernel-event reconciles in the daemon: {reconciles} for {} devices made and removed (both loops), started by:",
        2 * (WARMUP + ITERATIONS)
    );
    for (what, n) in triggers.iter().take(6) {
        println!("bench:     {n:>4}  {what}");
    }
    for (what, n) in warned.iter().take(6) {
        println!("bench:   daemon log, {n} times: {what}");
    }
    println!(
        "bench:   ratio D-Bus/sysfs p50 {q:.2}x (target <= {TARGET_RATIO}x{})",
        if q <= TARGET_RATIO {
            ""
        } else {
            ": ABOVE TARGET"
        }
    );
    Ok(Results { ratio: q })
}

/// `word` with every `/`-separated part that is a UUID or a number replaced by `<uuid>` or `<n>`, so
/// that log lines about different devices group together.
fn normalize(word: &str) -> String {
    word.split('/')
        .map(|c| {
            if c.parse::<mdev_types::ids::MdevUuid>().is_ok() {
                "<uuid>"
            } else if !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit()) {
                "<n>"
            } else {
                c
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The kernel events that started the daemon's reconciles in `log` (its "reconcile after a kernel
/// event" lines, vgpu-manager's daemon/engine/mod.rs), counted by action and devpath with numbers and
/// UUIDs replaced, most frequent first.
fn reconcile_triggers(log: &str) -> Vec<(String, usize)> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for line in log
        .lines()
        .filter(|l| l.contains("reconcile after a kernel event scope="))
    {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(key))
                .unwrap_or("?")
                .to_string()
        };
        let devpath = normalize(&field("devpath="));
        let key = format!("{} {} {devpath}", field("scope="), field("action="));
        *counts.entry(key).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// The daemon's warnings and errors in `log`, each distinct one (UUIDs and numbers replaced) once with
/// its count.
fn warnings(log: &str) -> Vec<(String, usize)> {
    let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
    for line in log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
    {
        // Drop the timestamp; keep the level, the target and the message with its fields.
        let text = line
            .split_once(' ')
            .map_or(line, |(_, rest)| rest.trim_start());
        let normal: Vec<String> = text.split_whitespace().map(normalize).collect();
        *counts.entry(normal.join(" ")).or_default() += 1;
    }
    let mut v: Vec<(String, usize)> = counts.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// p50 of the state directory's file protocol for one create+destroy (vgpu-manager's
/// daemon/store/fsio.rs: ledger entry written to a temp file, fsync, rename, fsync of the directory;
/// later unlink and fsync of the directory), measured on its own in `dir`.
fn store_cost(dir: &Path) -> Result<Duration, TestError> {
    use std::io::Write;
    let io = |what: &str, e: std::io::Error| {
        TestError::Check(format!("{what} in {}: {e}", dir.display()))
    };
    let sync_dir = || {
        std::fs::File::open(dir)
            .and_then(|f| f.sync_all())
            .map_err(|e| io("fsync dir", e))
    };
    let mut v = Vec::new();
    for i in 0..20 {
        let (tmp, fin) = (
            dir.join(format!(".tmp-{i}")),
            dir.join(format!("entry-{i}")),
        );
        let t = Instant::now();
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(&[b'x'; 300]).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("fsync", e))?;
        std::fs::rename(&tmp, &fin).map_err(|e| io("rename", e))?;
        sync_dir()?;
        std::fs::remove_file(&fin).map_err(|e| io("unlink", e))?;
        sync_dir()?;
        v.push(t.elapsed());
    }
    Ok(percentile(&v, 50))
}

fn create_destroy(g: &Guest) -> TestResult {
    let avail = available(&g.host, PARENT, TYPE)?;
    ensure(avail > 0, || format!("{TYPE} has no room"))?;
    let mut seq = 0;
    let tmp = std::env::temp_dir();
    let deployed = Setup {
        label: "in memory, as deployed",
        state_base: &tmp,
        pause: Duration::ZERO,
        dbus_daemon: true,
        private_socket: false,
    };
    // The deployed daemon, its calls made through its private socket.
    let private = Setup {
        private_socket: true,
        ..deployed
    };
    let runs = [
        Setup {
            label: "in memory",
            state_base: &tmp,
            pause: Duration::ZERO,
            dbus_daemon: false,
            private_socket: false,
        },
        Setup {
            label: "in memory, background work let finish",
            state_base: &tmp,
            pause: PAUSE,
            dbus_daemon: false,
            private_socket: false,
        },
        deployed,
        private,
    ];
    let mut ratios = Vec::new();
    for setup in &runs {
        ratios.push(run(g, setup, &mut seq)?.ratio);
    }
    println!(
        "bench: create->ready->destroy D-Bus/sysfs p50 ratio: {:.2}x (state on tmpfs), {:.2}x (tmpfs, {PAUSE:?} pauses), {:.2}x (on dbus-daemon), {:.2}x (private socket)",
        ratios[0], ratios[1], ratios[2], ratios[3]
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

    #[test]
    fn reconcile_triggers_are_grouped() {
        let log = "\
2026-11-29T14:00:00.000001Z  INFO vgpu_manager::daemon::engine: reconcile after a kernel event scope=Refresh action=add devpath=/devices/virtual/vfio/7
2026-11-29T14:00:00.000002Z  INFO vgpu_manager::daemon::engine: instance created uuid=x
2026-11-29T14:00:00.000003Z  INFO vgpu_manager::daemon::engine: reconcile after a kernel event scope=Refresh action=remove devpath=/devices/virtual/vfio/12
2026-11-29T14:00:00.000004Z  INFO vgpu_manager::daemon::engine: reconcile after a kernel event scope=Refresh action=add devpath=/devices/virtual/vfio/8
2026-11-29T14:00:00.000005Z  INFO vgpu_manager::daemon::engine: reconcile after a kernel event scope=Refresh action=bind devpath=/devices/virtual/mbochs/mbochs/6d0c5a4e-7b1f-4c1e-9a55-766770757465
2026-11-29T14:00:00.000006Z  WARN vgpu_manager::daemon::engine: reconcile after a kernel event failed error=gone devpath=/devices/virtual/vfio/9
";
        assert_eq!(
            reconcile_triggers(log),
            vec![
                ("Refresh add /devices/virtual/vfio/<n>".to_string(), 2),
                (
                    "Refresh bind /devices/virtual/mbochs/mbochs/<uuid>".to_string(),
                    1
                ),
                ("Refresh remove /devices/virtual/vfio/<n>".to_string(), 1),
            ]
        );
        assert_eq!(
            warnings(log),
            vec![(
                "WARN vgpu_manager::daemon::engine: reconcile after a kernel event failed error=gone devpath=/devices/virtual/vfio/<n>"
                    .to_string(),
                1
            )]
        );
    }
}
