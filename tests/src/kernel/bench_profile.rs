//! Where vgpud spends its CPU on the real kernel: `bench_vgpud_profile` samples vgpud with `perf
//! record` (the host's perf, run through the host's loader) while one-process-per-operation `vgpuctl
//! create`/`destroy` pairs run, and again while a pool apply with nothing to do repeats, and prints the
//! hottest symbols of each (`perf report --sort dso,symbol`). Where the host has no perf it fails
//! saying so. Like the other benchmarks, it fails only when an operation fails.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::bench_cli::{PoolClient, Program, pool_toml, shipped_copy};
use super::bus_daemon::BusDaemon;
use super::guest::Guest;
use super::qemu_attach::HOSTROOT;
use super::runner::{Outcome, Test, TestError, TestResult, ensure};
use super::samples::{Mdevs, available, test_uuid};
use super::vgpud::{Vgpud, Workdir};

/// The benchmarks of this module.
pub fn benches() -> Vec<Test<Guest>> {
    vec![Test::new("bench_vgpud_profile", vgpud_profile)]
}

const PARENT: &str = "mbochs";
const TYPE: &str = "mbochs-small";
const PAIRS: u32 = 24;
const NOOP_APPLIES: u32 = 6;
const POOL_SLOTS: u32 = 33;
/// Symbols printed per workload.
const TOP: usize = 40;

pub(super) fn perf() -> Result<Program, TestError> {
    let perf = format!("{HOSTROOT}/usr/bin/perf");
    ensure(Path::new(&perf).exists(), || {
        "the host has no /usr/bin/perf (Debian's linux-perf)".to_string()
    })?;
    Ok(Program::host_dynamic(Path::new(&perf)))
}

/// `perf record` of `pid` into `out`, running until stopped by [`stop_perf`].
fn record(perf: &Program, pid: u32, out: &Path) -> Result<Child, TestError> {
    // DWARF unwinding from .eh_frame (the shipped binaries keep it; they have no frame pointers).
    let args = ["record", "-q", "-F", "499", "--call-graph", "dwarf,8192"];
    attach_perf(perf, &args, pid, out, Duration::from_millis(1500))
}

/// `perf ARGS -p PID -o OUT` started in the background, given `attach` to attach to the process
/// before the caller starts what it measures; stopped by [`stop_perf`].
pub(super) fn attach_perf(
    perf: &Program,
    args: &[&str],
    pid: u32,
    out: &Path,
    attach: Duration,
) -> Result<Child, TestError> {
    let mut cmd = perf.command();
    cmd.args(args)
        .args(["-p", &pid.to_string(), "-o"])
        .arg(out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .map_err(|e| TestError::Check(format!("cannot start perf {}: {e}", args.join(" "))))?;
    std::thread::sleep(attach);
    Ok(child)
}

/// Stops a `perf record` or `perf stat` started in the background, once it has written its output.
pub(super) fn stop_perf(child: Child) -> Result<(), TestError> {
    let pid = Pid::from_raw(child.id() as i32);
    kill(pid, Signal::SIGINT).map_err(|e| TestError::Check(format!("cannot stop perf: {e}")))?;
    let out = child
        .wait_with_output()
        .map_err(|e| TestError::Check(format!("cannot wait for perf: {e}")))?;
    // perf ends by raising the signal that stopped it again, once its output is written.
    use std::os::unix::process::ExitStatusExt;
    ensure(
        out.status.success() || out.status.signal() == Some(2),
        || {
            format!(
                "perf failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        },
    )
}

/// Prints the hottest symbols of `data`: by their own samples, then by the samples of everything
/// they called (vgpud's own functions only).
fn report(perf: &Program, data: &Path, what: &str) -> Result<(), TestError> {
    let flat = perf_report(
        perf,
        data,
        &["--no-children", "--sort", "dso,symbol", "-g", "none"],
    )?;
    println!("bench: vgpud profile, {what} (self):");
    print_top(&flat, TOP);
    let inclusive = perf_report(
        perf,
        data,
        &[
            "--children",
            "--sort",
            "symbol",
            "--dsos",
            "vgpud",
            "-g",
            "none",
        ],
    )?;
    println!("bench: vgpud profile, {what} (with callees):");
    print_top(&inclusive, 2 * TOP);
    Ok(())
}

fn print_top(text: &str, n: usize) {
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .take(n)
    {
        println!("bench:   {}", line.trim_end());
    }
}

fn perf_report(perf: &Program, data: &Path, args: &[&str]) -> Result<String, TestError> {
    let out = perf
        .command()
        // No inline frames and no source lines: both run addr2line on the shipped binaries, which
        // carry no debug info (vm-test strips it), and perf report then dies of SIGPIPE.
        .args(["report", "--stdio", "--no-inline", "--percent-limit", "0.3"])
        .args(args)
        .arg("-i")
        .arg(data)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestError::Check(format!("cannot run perf report: {e}")))?;
    ensure(out.status.success(), || {
        format!(
            "perf report failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn vgpud_profile(g: &Guest) -> TestResult {
    let perf = perf()?;
    let avail = available(&g.host, PARENT, TYPE)?;
    ensure(avail > POOL_SLOTS, || {
        format!("{TYPE} has room for {avail}")
    })?;
    let work = Workdir::new("bench-profile")?;
    let state = Workdir::new("bench-profile-state")?;
    let bus = BusDaemon::start(work.path())?;
    let d = Vgpud::spawn_on_bus(work.path(), state.path(), bus.address())?;
    let pid = d
        .pid()
        .ok_or_else(|| TestError::Check("vgpud has no pid".into()))?;
    let vgpuctl =
        Program::direct(&shipped_copy("vgpuctl", work.path())?).with_env("VGPU_BUS", d.bus());
    let mut mdevs = Mdevs::new(&g.host);

    let data = work.path().join("create.perf");
    let rec = record(&perf, pid, &data)?;
    for i in 0..PAIRS {
        let u = test_uuid("bench_vgpud_profile", i + 1);
        let us = u.to_string();
        vgpuctl.run(&["create", "--type", TYPE, "--gpu", PARENT, "--uuid", &us])?;
        mdevs.adopt(u);
        vgpuctl.run(&["destroy", &us])?;
        mdevs.forget(&u);
    }
    stop_perf(rec)?;
    report(
        &perf,
        &data,
        &format!("{PAIRS} vgpuctl create+destroy pairs"),
    )?;

    let client = PoolClient::connect(&d)?;
    let apply = |slots: u32| client.apply(&pool_toml(slots));
    apply(POOL_SLOTS)?;
    let data = work.path().join("noop.perf");
    let rec = record(&perf, pid, &data)?;
    for _ in 0..NOOP_APPLIES {
        let s = apply(POOL_SLOTS)?;
        ensure(!s.changed, || {
            "the repeated apply changed the host".to_string()
        })?;
    }
    stop_perf(rec)?;
    report(
        &perf,
        &data,
        &format!("{NOOP_APPLIES} applies of {POOL_SLOTS} slots with nothing to do"),
    )?;
    let data = work.path().join("grow.perf");
    apply(1)?;
    let rec = record(&perf, pid, &data)?;
    apply(POOL_SLOTS)?;
    apply(1)?;
    stop_perf(rec)?;
    report(
        &perf,
        &data,
        &format!("a pool grow by {} and its shrink", POOL_SLOTS - 1),
    )?;
    apply(0).ok();
    drop(client);
    d.stop()?;
    Ok(Outcome::Passed)
}
