//! Provisioning benchmarks on the real kernel (scripts/bench-vm), each figure printed beside its floor
//! and beside Debian's mdevctl 1.2.0 doing the same work in the same boot. Like [`super::bench`], they
//! print and fail only when an operation fails; no ratio is asserted.
//!
//! `bench_cli_per_op`: one process per operation, as libvirt and scripts call them: `vgpuctl create`,
//! `destroy`, `start`, `stop`, `list`, `--version`; the same through our mdevctl front end (`vgpuctl`
//! run as `mdevctl`); the real `mdevctl start`/`stop`/`list`/`--version`; a dynamic `true`; and the
//! parts of the floor, each measured in the run: the binary's start-up (`vgpuctl --version`), a fresh
//! bus connection (authentication and `Hello`), one round trip (`Peer.Ping` of vgpud) and the raw sysfs
//! write. Floor of an operation = start-up + connection + one round trip + its sysfs write.
//!
//! `bench_pool_apply`: `Manager1.Apply` of a pool growing from 1 to 49 slots of `sample-display-4m`
//! (mbochs-small), the same apply again (nothing to do), and the shrink back to 1, from one persistent
//! client, against the raw create and remove loops of the same 48 devices run in the same round, with
//! the number of signals vgpud sent for each. Its ratios are the median of the rounds' own ratios.
//!
//! Every process runs from the guest's tmpfs (copies), so that no run pages its binary in over 9p. The
//! host's dynamic binaries (`mdevctl`, `true`) run through the host's dynamic loader with the host's
//! library directories, as an exec of them on the host loads the same objects.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;
use vgpu_host::{Host, paths};

use super::bench::{ms, percentile, ratio};
use super::bus_daemon::BusDaemon;
use super::guest::Guest;
use super::libvirt::sysroot::share_path;
use super::qemu_attach::HOSTROOT;
use super::runner::{Outcome, Test, TestError, TestResult, ensure};
use super::samples::{Mdevs, available, create_path, test_uuid};
use super::vgpud::{Vgpud, Workdir};

/// The benchmarks of this module (selected by a filter containing `bench`).
pub fn benches() -> Vec<Test<Guest>> {
    vec![
        Test::new("bench_cli_per_op", cli_per_op),
        Test::new("bench_pool_apply", pool_apply),
    ]
}

const PARENT: &str = "mbochs";
const TYPE: &str = "mbochs-small";
/// The shipped profile served by [`TYPE`].
const PROFILE: &str = "sample-display-4m";
/// Measured iterations of the per-operation loop, after [`WARMUP`].
const ITERATIONS: u32 = 24;
const WARMUP: u32 = 3;
/// The pool's rounds (raw loops, grow, nothing to do, shrink). Each round's apply is set against
/// the raw loop of the same round, moments apart, and the median of those ratios is reported: the
/// guest's speed drifts by a third between boots and within one.
const ROUNDS: u32 = 7;
/// Slots the pool grows by in each round.
const GROW: u32 = 48;
/// The targets, printed beside the ratios.
const TARGET_FLOOR: f64 = 1.2;
const TARGET_STARTUP: f64 = 1.2;
const TARGET_POOL: f64 = 1.5;

/// The CPU time process `pid` has used (user + system, /proc/PID/stat fields 14 and 15, in USER_HZ
/// ticks: 100 per second on x86, include/asm-generic/param.h); zero when it cannot be read.
fn cpu_time(pid: Option<u32>) -> Duration {
    let Some(text) = pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
    else {
        return Duration::ZERO;
    };
    // The command name (field 2) may hold spaces: count fields after its closing parenthesis.
    let ticks: u64 = text
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// The host's dynamic loader and library path, inside [`HOSTROOT`] (Debian 12, merged /usr).
const LOADER: &str = "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2";
const LIB_DIRS: &str = "/usr/lib/x86_64-linux-gnu:/lib/x86_64-linux-gnu";

/// One program the benchmark runs.
pub(super) struct Program {
    /// argv[0]..: the command line before the operation's own arguments.
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

impl Program {
    /// A static binary at `path`.
    pub(super) fn direct(path: &Path) -> Program {
        Program {
            argv: vec![path.display().to_string()],
            env: Vec::new(),
        }
    }

    /// A dynamic binary of the host (its path outside [`HOSTROOT`] as given), started by the host's
    /// loader.
    pub(super) fn host_dynamic(path: &Path) -> Program {
        let lib_path = LIB_DIRS
            .split(':')
            .map(|d| format!("{HOSTROOT}{d}"))
            .collect::<Vec<_>>()
            .join(":");
        Program {
            argv: vec![
                format!("{HOSTROOT}{LOADER}"),
                "--library-path".into(),
                lib_path,
                path.display().to_string(),
            ],
            env: Vec::new(),
        }
    }

    pub(super) fn with_env(mut self, k: &str, v: &str) -> Program {
        self.env.push((k.into(), v.into()));
        self
    }

    /// The program's command line and environment, for the caller's own arguments and pipes.
    pub(super) fn command(&self) -> Command {
        let mut cmd = Command::new(&self.argv[0]);
        cmd.args(&self.argv[1..])
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// The program with `args`, run by `wrapper` (its own arguments `wrapper_args` first, then this
    /// program's command line): a `perf stat --` around it, with this program's environment.
    pub(super) fn wrapped(
        &self,
        wrapper: &Program,
        wrapper_args: &[&str],
        args: &[&str],
    ) -> Command {
        let mut cmd = wrapper.command();
        cmd.args(wrapper_args).args(&self.argv).args(args);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Runs the program with `args`, timing fork, exec and wait; fails unless it exits 0.
    pub(super) fn run(&self, args: &[&str]) -> Result<Duration, TestError> {
        let mut cmd = self.command();
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let t = Instant::now();
        let out = cmd.output().map_err(|e| {
            TestError::Check(format!("cannot run {} {args:?}: {e}", self.argv.join(" ")))
        })?;
        let took = t.elapsed();
        ensure(out.status.success(), || {
            format!(
                "{} {args:?} failed ({}): {}{}",
                self.argv.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        Ok(took)
    }
}

/// Copies the shipped binary `name` (next to kernel-tests) into `dir`.
pub(super) fn shipped_copy(name: &str, dir: &Path) -> Result<PathBuf, TestError> {
    let exe = std::env::current_exe()
        .map_err(|e| TestError::Check(format!("cannot find the running test binary: {e}")))?;
    let shipped = exe.with_file_name(name);
    let copy = dir.join(name);
    std::fs::copy(&shipped, &copy).map_err(|e| {
        TestError::Check(format!(
            "cannot copy {} (scripts/vm-test ships it next to kernel-tests): {e}",
            shipped.display()
        ))
    })?;
    Ok(copy)
}

/// vgpud on `bus` with its state in `state` and its private socket in `work`, once the socket is
/// there; and the socket's path.
pub(super) fn with_private_socket(
    work: &Workdir,
    state: &Workdir,
    bus: &BusDaemon,
) -> Result<(Vgpud, String), TestError> {
    let private = work.path().join("private");
    let private_s = private.display().to_string();
    let d = Vgpud::spawn_on_bus_with(
        work.path(),
        state.path(),
        bus.address(),
        &["--private-socket", &private_s],
    )?;
    d.wait_until("the private socket", Duration::from_secs(30), |_| {
        Ok(private.exists())
    })?;
    Ok((d, private_s))
}

/// mdevctl refuses to run without its script directories (its package makes them); the guest's root
/// has none. Empty, they hold no call-out for mdevctl or our front end.
pub(super) fn mdevctl_script_dirs() -> Result<(), TestError> {
    for d in [
        "/etc/mdevctl.d/scripts.d/callouts",
        "/etc/mdevctl.d/scripts.d/notifiers",
    ] {
        std::fs::create_dir_all(d)
            .map_err(|e| TestError::Check(format!("cannot create {d}: {e}")))?;
    }
    Ok(())
}

/// Debian's mdevctl 1.2.0 binary, extracted from the share's package into `dir` (tmpfs), by the
/// host's `dpkg-deb` chrooted into [`HOSTROOT`] (the guest's /tmp is bind-mounted there).
pub(super) fn real_mdevctl(dir: &Path) -> Result<PathBuf, TestError> {
    let deb = share_path()?.join("mdevctl.deb");
    let out = Command::new("chroot")
        .arg(HOSTROOT)
        .arg("/usr/bin/dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(dir)
        .output()
        .map_err(|e| TestError::Check(format!("cannot run dpkg-deb: {e}")))?;
    ensure(out.status.success(), || {
        format!(
            "dpkg-deb -x {} failed: {}",
            deb.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let bin = dir.join("usr/bin/mdevctl");
    ensure(bin.is_file(), || {
        format!("{} has no usr/bin/mdevctl", deb.display())
    })?;
    Ok(bin)
}

/// Samples of one operation, by who did it.
#[derive(Default)]
struct Op {
    /// vgpuctl on the bus.
    ours: Vec<Duration>,
    /// The mdevctl front end on the bus.
    front_end: Vec<Duration>,
    /// vgpuctl through vgpud's private socket.
    ours_private: Vec<Duration>,
    /// The mdevctl front end through vgpud's private socket.
    front_end_private: Vec<Duration>,
    mdevctl: Vec<Duration>,
    raw: Vec<Duration>,
}

/// What one row of the table compares.
struct Row<'a> {
    name: &'a str,
    op: &'a Op,
    /// The floor's parts other than the sysfs write: start-up, a fresh bus connection, one round
    /// trip on the bus.
    base_floor: Duration,
    /// The same through the private socket: start-up, a fresh connection there, one round trip
    /// there.
    private_floor: Duration,
}

/// The private socket's line of a row: vgpuctl and the front end through it, against both floors
/// and mdevctl.
fn print_private_row(r: &Row<'_>) {
    let p = |v: &[Duration]| (!v.is_empty()).then(|| percentile(v, 50));
    let raw = p(&r.op.raw).unwrap_or_default();
    let (bus_floor, own_floor) = (r.base_floor + raw, r.private_floor + raw);
    let mut line = format!("bench:   {:<9}", "");
    let mark = |q: f64, limit: f64| if q <= limit { "" } else { " ABOVE" };
    if let Some(o) = p(&r.op.ours_private) {
        let q = ratio(o, bus_floor);
        line += &format!(
            " private socket: vgpuctl {:>9} ({q:.2}x floor{}, {:.2}x the private socket's own floor {})",
            ms(o),
            mark(q, TARGET_FLOOR),
            ratio(o, own_floor),
            ms(own_floor)
        );
        if let Some(m) = p(&r.op.mdevctl) {
            let q = ratio(o, m);
            line += &format!(" (vgpuctl/mdevctl {q:.2}x{})", mark(q, 1.0));
        }
    }
    if let Some(f) = p(&r.op.front_end_private) {
        let q = ratio(f, bus_floor);
        line += &format!(
            "  front end {:>9} ({q:.2}x floor{}",
            ms(f),
            mark(q, TARGET_FLOOR)
        );
        if let Some(m) = p(&r.op.mdevctl) {
            let q = ratio(f, m);
            line += &format!(", front end/mdevctl {q:.2}x{}", mark(q, 1.0));
        }
        line += ")";
    }
    println!("{line}");
}

fn print_row(r: &Row<'_>) {
    let p = |v: &[Duration]| (!v.is_empty()).then(|| percentile(v, 50));
    let ours = p(&r.op.ours);
    let floor = r.base_floor + p(&r.op.raw).unwrap_or_default();
    let mut line = format!("bench:   {:<9}", r.name);
    if let Some(o) = ours {
        let q = ratio(o, floor);
        line += &format!(
            " vgpuctl {:>9}  floor {:>9} ({q:.2}x{})",
            ms(o),
            ms(floor),
            if q <= TARGET_FLOOR { "" } else { " ABOVE" }
        );
    }
    if let Some(f) = p(&r.op.front_end) {
        line += &format!("  front end {:>9} ({:.2}x floor)", ms(f), ratio(f, floor));
    }
    if let Some(m) = p(&r.op.mdevctl) {
        line += &format!("  mdevctl {:>9}", ms(m));
        if let Some(o) = ours {
            let q = ratio(o, m);
            line += &format!(
                " (vgpuctl/mdevctl {q:.2}x{})",
                if q <= 1.0 { "" } else { " ABOVE" }
            );
        }
        if let Some(f) = p(&r.op.front_end) {
            line += &format!(" (front end/mdevctl {:.2}x)", ratio(f, m));
        }
    }
    if let Some(raw) = p(&r.op.raw) {
        line += &format!("  sysfs {}", ms(raw));
    }
    println!("{line}");
}

/// A fresh connection to vgpud's private socket at `path` (authentication, no `Hello`), timed, then
/// dropped.
fn fresh_private_connection(
    rt: &tokio::runtime::Runtime,
    path: &Path,
) -> Result<Duration, TestError> {
    let t = Instant::now();
    let conn = rt
        .block_on(vgpu_client::private::connect_private(path))
        .map_err(|e| TestError::Check(format!("cannot connect to {}: {e}", path.display())))?;
    let took = t.elapsed();
    drop(conn);
    Ok(took)
}

/// One `Peer.Ping` of vgpud over `conn`, timed.
fn ping_on(rt: &tokio::runtime::Runtime, conn: &zbus::Connection) -> Result<Duration, TestError> {
    let t = Instant::now();
    rt.block_on(async {
        let peer = zbus::fdo::PeerProxy::builder(conn)
            .destination(vgpu_client::SERVICE)
            .path(vgpu_client::MANAGER_PATH)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await?;
        peer.ping().await
    })
    .map_err(|e| TestError::Check(format!("Ping on the private socket failed: {e}")))?;
    Ok(t.elapsed())
}

/// The five timed operations of one program (`vgpuctl` or the front end), each checked against the
/// kernel: create, destroy, start, stop, list.
struct Five {
    create: Duration,
    destroy: Duration,
    start: Duration,
    stop: Duration,
    list: Duration,
}

/// A fresh connection to `bus` (authentication and `Hello`), timed, then dropped.
fn fresh_connection(rt: &tokio::runtime::Runtime, bus: &str) -> Result<Duration, TestError> {
    let t = Instant::now();
    let conn = rt
        .block_on(async { zbus::connection::Builder::address(bus).build().await })
        .map_err(|e| TestError::Check(format!("cannot connect to {bus}: {e}")))?;
    let took = t.elapsed();
    drop(conn);
    Ok(took)
}

/// What the per-operation loop drives: the host, its devices, and the UUIDs it hands out.
struct Lab<'a> {
    g: &'a Guest,
    mdevs: Mdevs<'a>,
    seq: u32,
}

impl Lab<'_> {
    fn next_uuid(&mut self) -> MdevUuid {
        self.seq += 1;
        test_uuid("bench_cli_per_op", self.seq)
    }

    fn there(&mut self, u: MdevUuid) -> Result<(), TestError> {
        self.mdevs.adopt(u);
        ensure(self.g.host.exists(&paths::mdev_device(&u)), || {
            format!("{u} missing after its creation returned")
        })
    }

    fn gone(&mut self, u: &MdevUuid) -> Result<(), TestError> {
        self.mdevs.forget(u);
        ensure(!self.g.host.exists(&paths::mdev_device(u)), || {
            format!("{u} still present after its removal returned")
        })
    }

    /// `vgpuctl create`, `destroy`, `define` + `start`, `stop` + `undefine`, `list` through `p`.
    fn vgpuctl_ops(&mut self, p: &Program) -> Result<Five, TestError> {
        let ty_args = ["--type", TYPE, "--gpu", PARENT];
        let u = self.next_uuid();
        let us = u.to_string();
        let mut args = vec!["create"];
        args.extend(ty_args);
        args.extend(["--uuid", &us]);
        let create = p.run(&args)?;
        self.there(u)?;
        let destroy = p.run(&["destroy", &us])?;
        self.gone(&u)?;
        let u = self.next_uuid();
        let us = u.to_string();
        let mut args = vec!["define"];
        args.extend(ty_args);
        args.extend(["--uuid", &us]);
        p.run(&args)?;
        let start = p.run(&["start", &us])?;
        self.there(u)?;
        let stop = p.run(&["stop", &us])?;
        self.gone(&u)?;
        p.run(&["undefine", &us])?;
        let list = p.run(&["list"])?;
        Ok(Five {
            create,
            destroy,
            start,
            stop,
            list,
        })
    }

    /// `mdevctl start -p -t`, `stop`, `define` + `start`, `stop` + `undefine`, `list` through `p`
    /// (Debian's mdevctl or our front end).
    fn mdevctl_ops(&mut self, p: &Program) -> Result<Five, TestError> {
        let u = self.next_uuid();
        let us = u.to_string();
        let create = p.run(&["start", "-u", &us, "-p", PARENT, "-t", TYPE])?;
        self.there(u)?;
        let destroy = p.run(&["stop", "-u", &us])?;
        self.gone(&u)?;
        let u = self.next_uuid();
        let us = u.to_string();
        p.run(&["define", "-u", &us, "-p", PARENT, "-t", TYPE])?;
        let start = p.run(&["start", "-u", &us])?;
        self.there(u)?;
        let stop = p.run(&["stop", "-u", &us])?;
        self.gone(&u)?;
        p.run(&["undefine", "-u", &us])?;
        let list = p.run(&["list"])?;
        Ok(Five {
            create,
            destroy,
            start,
            stop,
            list,
        })
    }
}

/// The five operations' sample vectors of one program.
fn keep_five(ops: [&mut Op; 5], pick: fn(&mut Op) -> &mut Vec<Duration>, f: &Five) {
    let [c, d, s, t, l] = ops;
    pick(c).push(f.create);
    pick(d).push(f.destroy);
    pick(s).push(f.start);
    pick(t).push(f.stop);
    pick(l).push(f.list);
}

fn cli_per_op(g: &Guest) -> TestResult {
    let avail = available(&g.host, PARENT, TYPE)?;
    ensure(avail > 0, || format!("{TYPE} has no room"))?;
    let work = Workdir::new("bench-cli")?;
    let state = Workdir::new("bench-cli-state")?;
    let bus = BusDaemon::start(work.path())?;
    let (d, private_s) = with_private_socket(&work, &state, &bus)?;
    let private = PathBuf::from(&private_s);
    // On the bus: the private socket turned off. Through it: named, whatever the bus.
    let vgpuctl = Program::direct(&shipped_copy("vgpuctl", work.path())?)
        .with_env("VGPU_BUS", d.bus())
        .with_env("VGPU_PRIVATE_SOCKET", "");
    let vgpuctl_private = Program::direct(&work.path().join("vgpuctl"))
        .with_env("VGPU_BUS", d.bus())
        .with_env("VGPU_PRIVATE_SOCKET", &private_s);
    // The front end: vgpuctl under the name mdevctl, finding the bus in VGPU_BUS.
    let fe_dir = work.path().join("front-end");
    std::fs::create_dir_all(&fe_dir).map_err(|e| TestError::Check(e.to_string()))?;
    let fe_bin = fe_dir.join("mdevctl");
    std::os::unix::fs::symlink(work.path().join("vgpuctl"), &fe_bin)
        .map_err(|e| TestError::Check(format!("cannot link {}: {e}", fe_bin.display())))?;
    let front_end = Program::direct(&fe_bin)
        .with_env("VGPU_BUS", d.bus())
        .with_env("VGPU_PRIVATE_SOCKET", "");
    let front_end_private = Program::direct(&fe_bin)
        .with_env("VGPU_BUS", d.bus())
        .with_env("VGPU_PRIVATE_SOCKET", &private_s);
    let mdevctl = Program::host_dynamic(&real_mdevctl(&work.path().join("mdevctl-deb"))?);
    mdevctl_script_dirs()?;
    let dyn_true = Program::host_dynamic(Path::new(&format!("{HOSTROOT}/usr/bin/true")));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| TestError::Check(format!("cannot start a tokio runtime: {e}")))?;
    // One persistent connection to the private socket, for its round trip.
    let private_conn = rt
        .block_on(vgpu_client::private::connect_private(&private))
        .map_err(|e| TestError::Check(format!("cannot connect to {private_s}: {e}")))?;

    let mut lab = Lab {
        g,
        mdevs: Mdevs::new(&g.host),
        seq: 0,
    };
    let create_file = create_path(PARENT, TYPE)?;
    let (mut create, mut destroy, mut start, mut stop, mut list, mut version) = (
        Op::default(),
        Op::default(),
        Op::default(),
        Op::default(),
        Op::default(),
        Op::default(),
    );
    let (mut true_s, mut connect, mut ping) = (Vec::new(), Vec::new(), Vec::new());
    let (mut connect_private, mut ping_private) = (Vec::new(), Vec::new());
    let (mut daemon_cpu, mut bus_cpu) = (Duration::ZERO, Duration::ZERO);
    let (mut daemon_cpu_private, mut bus_cpu_private) = (Duration::ZERO, Duration::ZERO);
    const WAYS: u32 = 6;
    for i in 0..WARMUP + ITERATIONS {
        let counted = i >= WARMUP;
        let keep = |v: &mut Vec<Duration>, d: Duration| {
            if counted {
                v.push(d)
            }
        };
        // Rotate who goes first, so that drift hits every one alike.
        for k in 0..WAYS {
            let ops = [&mut create, &mut destroy, &mut start, &mut stop, &mut list];
            match (i + k) % WAYS {
                0 => {
                    let u = lab.next_uuid();
                    let t = Instant::now();
                    g.host.write(&create_file, &u.to_string())?;
                    let made = t.elapsed();
                    lab.there(u)?;
                    let remove = paths::mdev_device(&u).join("remove");
                    let t = Instant::now();
                    g.host.write(&remove, "1")?;
                    let removed = t.elapsed();
                    lab.gone(&u)?;
                    keep(&mut create.raw, made);
                    keep(&mut destroy.raw, removed);
                }
                1 => {
                    let cpu = (cpu_time(d.pid()), cpu_time(Some(bus.pid())));
                    let f = lab.vgpuctl_ops(&vgpuctl)?;
                    if counted {
                        daemon_cpu += cpu_time(d.pid()).saturating_sub(cpu.0);
                        bus_cpu += cpu_time(Some(bus.pid())).saturating_sub(cpu.1);
                        keep_five(ops, |o| &mut o.ours, &f);
                    }
                    keep(&mut version.ours, vgpuctl.run(&["--version"])?);
                }
                2 => {
                    let f = lab.mdevctl_ops(&mdevctl)?;
                    if counted {
                        keep_five(ops, |o| &mut o.mdevctl, &f);
                    }
                    keep(&mut version.mdevctl, mdevctl.run(&["--version"])?);
                    keep(&mut true_s, dyn_true.run(&[])?);
                }
                3 => {
                    let f = lab.mdevctl_ops(&front_end)?;
                    if counted {
                        keep_five(ops, |o| &mut o.front_end, &f);
                    }
                    keep(&mut connect, fresh_connection(&rt, d.bus())?);
                    let t = Instant::now();
                    d.ping()?;
                    keep(&mut ping, t.elapsed());
                }
                4 => {
                    let cpu = (cpu_time(d.pid()), cpu_time(Some(bus.pid())));
                    let f = lab.vgpuctl_ops(&vgpuctl_private)?;
                    if counted {
                        daemon_cpu_private += cpu_time(d.pid()).saturating_sub(cpu.0);
                        bus_cpu_private += cpu_time(Some(bus.pid())).saturating_sub(cpu.1);
                        keep_five(ops, |o| &mut o.ours_private, &f);
                    }
                }
                _ => {
                    let f = lab.mdevctl_ops(&front_end_private)?;
                    if counted {
                        keep_five(ops, |o| &mut o.front_end_private, &f);
                    }
                    keep(
                        &mut connect_private,
                        fresh_private_connection(&rt, &private)?,
                    );
                    keep(&mut ping_private, ping_on(&rt, &private_conn)?);
                }
            }
        }
    }
    drop(private_conn);
    // A definition's start writes the same sysfs file as a create.
    start.raw = create.raw.clone();
    stop.raw = destroy.raw.clone();
    let log = d.log_text();
    d.stop()?;
    ensure(log.contains("on private#"), || {
        format!("vgpud logged no call through its private socket:\n{log}")
    })?;
    let startup = percentile(&version.ours, 50);
    let (conn, rtt) = (percentile(&connect, 50), percentile(&ping, 50));
    let (pconn, prtt) = (
        percentile(&connect_private, 50),
        percentile(&ping_private, 50),
    );
    let base = startup + conn + rtt;
    let private_base = startup + pconn + prtt;
    println!(
        "bench: one process per operation, vgpud on dbus-daemon with its private socket, {TYPE} on {PARENT}: {ITERATIONS} iterations after {WARMUP} warm-up, p50"
    );
    println!(
        "bench:   floor parts: vgpuctl start-up (--version) {}, fresh bus connection {}, one round trip (Peer.Ping) {}; private socket: fresh connection {}, one round trip {}",
        ms(startup),
        ms(conn),
        ms(rtt),
        ms(pconn),
        ms(prtt)
    );
    for (name, op) in [
        ("create", &create),
        ("destroy", &destroy),
        ("start", &start),
        ("stop", &stop),
        ("list", &list),
    ] {
        let row = Row {
            name,
            op,
            base_floor: base,
            private_floor: private_base,
        };
        print_row(&row);
        print_private_row(&row);
    }
    println!(
        "bench:   CPU per vgpuctl create+destroy+define+start+stop+undefine+list (mean, {} ms ticks): on the bus vgpud {}, dbus-daemon {}; through the private socket vgpud {}, dbus-daemon {}",
        10,
        ms(daemon_cpu / ITERATIONS),
        ms(bus_cpu / ITERATIONS),
        ms(daemon_cpu_private / ITERATIONS),
        ms(bus_cpu_private / ITERATIONS)
    );
    let t = percentile(&true_s, 50);
    let q = ratio(startup, t);
    println!(
        "bench:   --version vgpuctl {} vs dynamic true {}: {q:.2}x (target <= {TARGET_STARTUP}x{}); mdevctl --version {}",
        ms(startup),
        ms(t),
        if q <= TARGET_STARTUP { "" } else { ": ABOVE" },
        ms(percentile(&version.mdevctl, 50))
    );
    println!(
        "bench:   targets: vgpuctl and the front end <= {TARGET_FLOOR}x floor (start-up + bus connection + bus round trip + sysfs) and <= mdevctl"
    );
    lab.mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// The median of `ratios` (the lower middle one of an even count; 0 for none).
fn median(ratios: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = ratios.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len().saturating_sub(1) / 2).copied().unwrap_or(0.0)
}

/// Counts the signals vgpud sends, on a connection of its own that matches them all.
struct SignalCounter {
    rt: tokio::runtime::Runtime,
    stream: zbus::MessageStream,
    _conn: zbus::Connection,
}

impl SignalCounter {
    fn new(bus: &str) -> Result<SignalCounter, TestError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TestError::Check(format!("cannot start a tokio runtime: {e}")))?;
        let (conn, stream) = rt
            .block_on(async {
                let conn = zbus::connection::Builder::address(bus).build().await?;
                let rule = zbus::MatchRule::builder()
                    .msg_type(zbus::message::Type::Signal)
                    .sender(vgpu_client::SERVICE)
                    .build()?;
                let stream = zbus::MessageStream::for_match_rule(
                    rule,
                    &conn,
                    std::num::NonZeroUsize::new(100_000),
                )
                .await?;
                Ok::<_, zbus::Error>((conn, stream))
            })
            .map_err(|e| TestError::Check(format!("cannot subscribe to vgpud's signals: {e}")))?;
        Ok(SignalCounter {
            rt,
            stream,
            _conn: conn,
        })
    }

    /// The signals received since the last call, by member name, waiting `settle` for late ones.
    fn take(&mut self, settle: Duration) -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        let stream = &mut self.stream;
        self.rt.block_on(async {
            loop {
                let next = std::future::poll_fn(|cx| {
                    futures_core::Stream::poll_next(std::pin::Pin::new(&mut *stream), cx)
                });
                match tokio::time::timeout(settle, next).await {
                    Ok(Some(Ok(m))) => {
                        let name = m
                            .header()
                            .member()
                            .map(|m| m.to_string())
                            .unwrap_or_default();
                        *counts.entry(name).or_insert(0) += 1;
                    }
                    Ok(Some(Err(_))) => {}
                    _ => break,
                }
            }
        });
        counts
    }
}

/// A persistent client of vgpud on its bus, as the pool benchmarks apply and remove pools with it.
pub(super) struct PoolClient(vgpu_client::blocking::Client);

impl PoolClient {
    /// Connects to `d` on its bus.
    pub(super) fn connect(d: &Vgpud) -> Result<PoolClient, TestError> {
        let bus: vgpu_client::BusAddress = d
            .bus()
            .parse()
            .map_err(|e| TestError::Check(format!("{e}")))?;
        vgpu_client::blocking::Client::connect(&bus)
            .map(PoolClient)
            .map_err(|e| TestError::Check(format!("cannot connect to vgpud: {e}")))
    }

    /// `Manager1.Apply` of the pool `toml`, its `PoolProgress` signals taken as they come.
    pub(super) fn apply(&self, toml: &str) -> Result<vgpu_client::PoolSummary, TestError> {
        let c = &self.0;
        c.block_on(
            c.async_client()
                .apply_pool::<vgpu_client::ClientError>(toml, |_| Ok(())),
        )
        .map_err(|e| TestError::Check(format!("Apply of {toml:?}: {e}")))
    }

    /// `Manager1.RemovePool` of the pool `name`.
    pub(super) fn remove(&self, name: &str) -> Result<(), TestError> {
        let c = &self.0;
        c.block_on(c.async_client().remove_pool(name))
            .map(drop)
            .map_err(|e| TestError::Check(format!("RemovePool {name}: {e}")))
    }
}

/// A pool named `bench` of `slots` slots of the benchmarks' profile on their parent.
pub(super) fn pool_toml(slots: u32) -> String {
    format!(
        "name = \"bench\"\nautostart = true\n\n[profiles]\n{PROFILE} = {slots}\n\n[select]\ngpus = [\"{PARENT}\"]\n"
    )
}

fn pool_apply(g: &Guest) -> TestResult {
    let avail = available(&g.host, PARENT, TYPE)?;
    ensure(avail > GROW, || {
        format!(
            "{TYPE} has room for {avail}, the benchmark needs {}",
            GROW + 1
        )
    })?;
    let work = Workdir::new("bench-pool")?;
    let state = Workdir::new("bench-pool-state")?;
    let bus = BusDaemon::start(work.path())?;
    let d = Vgpud::spawn_on_bus(work.path(), state.path(), bus.address())?;
    let client = PoolClient::connect(&d)?;
    let mut signals = SignalCounter::new(d.bus())?;
    let apply = |slots: u32| -> Result<(Duration, vgpu_client::PoolSummary), TestError> {
        let toml = pool_toml(slots);
        let t = Instant::now();
        let s = client.apply(&toml)?;
        Ok((t.elapsed(), s))
    };
    let mut mdevs = Mdevs::new(&g.host);
    let create_file = create_path(PARENT, TYPE)?;
    let mut last_slots = apply(1)?.1.slots;
    signals.take(Duration::from_millis(200));
    let (mut grow, mut noop, mut shrink) = (Vec::new(), Vec::new(), Vec::new());
    // CPU time of vgpud and of dbus-daemon in each phase, summed over the rounds.
    let mut cpu = [(Duration::ZERO, Duration::ZERO); 3];
    let cpu_now = || (cpu_time(d.pid()), cpu_time(Some(bus.pid())));
    let mut add_cpu = |i: usize, before: (Duration, Duration)| {
        let now = cpu_now();
        cpu[i].0 += now.0.saturating_sub(before.0);
        cpu[i].1 += now.1.saturating_sub(before.1);
    };
    let (mut raw_create, mut raw_remove, mut ping, mut discover) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut discover_full = Vec::new();
    let mut sig_grow = Default::default();
    let mut sig_noop = Default::default();
    let mut sig_shrink = Default::default();
    let mut seq = 0;
    for round in 0..ROUNDS {
        // The raw loops: GROW creates, then GROW removes.
        let uuids: Vec<MdevUuid> = (0..GROW)
            .map(|_| {
                seq += 1;
                test_uuid("bench_pool_apply", seq)
            })
            .collect();
        let t = Instant::now();
        for u in &uuids {
            g.host.write(&create_file, &u.to_string())?;
            mdevs.adopt(*u);
        }
        raw_create.push(t.elapsed());
        let t = Instant::now();
        for u in &uuids {
            g.host.write(&paths::mdev_device(u).join("remove"), "1")?;
            mdevs.forget(u);
        }
        raw_remove.push(t.elapsed());
        // vgpud saw those devices come and go (foreign ones): let it finish with them first.
        signals.take(Duration::from_millis(500));
        let before = cpu_now();
        let (took, s) = apply(GROW + 1)?;
        add_cpu(0, before);
        ensure(s.created.len() == GROW as usize, || {
            format!(
                "round {round}: the grow created {} slots, not {GROW}",
                s.created.len()
            )
        })?;
        grow.push(took);
        sig_grow = signals.take(Duration::from_millis(300));
        // One discovery of the host as the next apply finds it (the grown pool's devices included).
        let t = Instant::now();
        d.list_gpus()?;
        discover_full.push(t.elapsed());
        let before = cpu_now();
        let (took, s) = apply(GROW + 1)?;
        add_cpu(1, before);
        ensure(!s.changed, || {
            format!("round {round}: the second apply changed the host")
        })?;
        noop.push(took);
        sig_noop = signals.take(Duration::from_millis(300));
        let before = cpu_now();
        let (took, s) = apply(1)?;
        add_cpu(2, before);
        ensure(s.removed.len() == GROW as usize, || {
            format!(
                "round {round}: the shrink removed {} slots, not {GROW}",
                s.removed.len()
            )
        })?;
        shrink.push(took);
        last_slots = s.slots;
        sig_shrink = signals.take(Duration::from_millis(300));
        for _ in 0..3 {
            let t = Instant::now();
            d.ping()?;
            ping.push(t.elapsed());
            let t = Instant::now();
            d.list_gpus()?;
            discover.push(t.elapsed());
        }
    }
    let p = |v: &[Duration]| percentile(v, 50);
    let rtt = p(&ping);
    println!(
        "bench: pool apply through vgpud on dbus-daemon, {PROFILE} ({TYPE}) on {PARENT}, one persistent client: {ROUNDS} rounds, p50"
    );
    println!(
        "bench:   one round trip (Peer.Ping) {}, one discovery (ListGpus) {} with one slot, {} with {}",
        ms(rtt),
        ms(p(&discover)),
        ms(p(&discover_full)),
        GROW + 1
    );
    let report = |what: &str, took: Duration, floor: Duration, target: &str, q: f64, ok: bool| {
        println!(
            "bench:   {what:<28} {:>10}  floor {:>10}  {q:.2}x (target {target}{})",
            ms(took),
            ms(floor),
            if ok { "" } else { ": ABOVE" }
        );
    };
    // Each round's apply against the same round's raw loop plus one round trip.
    let per_round = |applies: &[Duration], raws: &[Duration]| {
        median(applies.iter().zip(raws).map(|(a, r)| ratio(*a, *r + rtt)))
    };
    let floor = p(&raw_create) + rtt;
    let q = per_round(&grow, &raw_create);
    report(
        &format!("grow by {GROW} (1 -> {})", GROW + 1),
        p(&grow),
        floor,
        "<= 1.5x raw create loop + 1 round trip, median of the rounds' ratios",
        q,
        q <= TARGET_POOL,
    );
    let floor = rtt * 3 + p(&discover_full);
    let q = ratio(p(&noop), floor);
    report(
        "again, nothing to do",
        p(&noop),
        floor,
        "<= 3 round trips + one discovery",
        q,
        q <= 1.0,
    );
    let floor = p(&raw_remove) + rtt;
    let q = per_round(&shrink, &raw_remove);
    report(
        &format!("shrink by {GROW} ({} -> 1)", GROW + 1),
        p(&shrink),
        floor,
        "<= 1.5x raw remove loop + 1 round trip, median of the rounds' ratios",
        q,
        q <= TARGET_POOL,
    );
    println!(
        "bench:   raw loops of {GROW}: create {}, remove {}",
        ms(p(&raw_create)),
        ms(p(&raw_remove))
    );
    for (what, (daemon, bus)) in ["grow", "nothing to do", "shrink"].iter().zip(cpu) {
        println!(
            "bench:   CPU used ({what}, per round): vgpud {}, dbus-daemon {}",
            ms(daemon / ROUNDS),
            ms(bus / ROUNDS)
        );
    }
    for (what, counts) in [
        ("grow", &sig_grow),
        ("nothing to do", &sig_noop),
        ("shrink", &sig_shrink),
    ] {
        let total: usize = counts.values().sum();
        let each: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        println!(
            "bench:   signals vgpud sent ({what}, last round): {total}: {}",
            each.join(", ")
        );
    }
    d.stop()?;
    // The slot left keeps its device after vgpud stops; its definition goes with the state directory.
    for row in &last_slots {
        if let Ok(u) = row.uuid.parse::<MdevUuid>()
            && g.host.exists(&paths::mdev_device(&u))
        {
            mdevs.adopt(u);
        }
    }
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_of_ratios_is_the_middle_one() {
        assert_eq!(median([1.4, 1.9, 1.2].into_iter()), 1.4);
        // An even count takes the lower middle one.
        assert_eq!(median([1.6, 1.1, 1.3, 2.0].into_iter()), 1.3);
        assert_eq!(median(std::iter::empty()), 0.0);
    }
}
