//! What one operation costs in counts rather than time: `bench_vgpud_counts` runs each operation N
//! times under `perf stat` (the host's perf, through the host's loader) and prints, per operation, the
//! system calls (`raw_syscalls:sys_enter`), context switches (each one a thread handing work to
//! another or waiting), page faults and CPU time of vgpud, and of the client process where there is
//! one, beside Debian's mdevctl 1.2.0 doing the same work. Times on an emulated machine drift by ±10%
//! between boots; counts do not, so a change that removes work shows in them from one run. They do
//! move when the machine running the guest is busy (a compile beside it adds about a tenth: more
//! wake-ups, fewer events taken together), so compare runs of an otherwise idle machine.
//!
//! A pool is counted per slot: grown by N slots with one `Manager1.Apply` and shrunk back with
//! another, for vgpud and for the dbus-daemon that carries each slot's signals.
//!
//! The floor is counted too: the same sysfs writes made by the benchmark's own process.
//!
//! vgpud's counts include what an operation makes it do after answering (the GPU object's refresh,
//! the kernel's uevents): each batch is followed by a pause before perf stops. Like the other
//! benchmarks it fails only when an operation fails, or when the host has no perf.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use vgpu_host::{Host, paths};

use super::bench_cli::{
    PoolClient, Program, mdevctl_script_dirs, pool_toml, real_mdevctl, shipped_copy,
    with_private_socket,
};
use super::bench_profile::{attach_perf, perf, stop_perf};
use super::bus_daemon::BusDaemon;
use super::guest::Guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure};
use super::samples::{Mdevs, available, create_path, test_uuid};
use super::vgpud::{TargetKind, Workdir};

/// The benchmarks of this module.
pub fn benches() -> Vec<Test<Guest>> {
    vec![Test::new("bench_vgpud_counts", vgpud_counts)]
}

const PARENT: &str = "mbochs";
const TYPE: &str = "mbochs-small";
/// Operations per batch.
const N: u32 = 16;
/// How long perf is given to attach, and vgpud to finish what a batch left it.
const ATTACH: Duration = Duration::from_millis(1000);
const AFTERMATH: Duration = Duration::from_millis(400);
/// The events counted, as perf names them.
const EVENTS: &str = "raw_syscalls:sys_enter,context-switches,page-faults,task-clock";

/// What perf counted over a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counts {
    syscalls: f64,
    switches: f64,
    /// Page faults: each page of a binary or of memory touched for the first time (a process run
    /// once per operation pays them all again).
    faults: f64,
    /// CPU time in milliseconds.
    cpu_ms: f64,
}

impl Counts {
    fn per(self, n: u32) -> Counts {
        let n = f64::from(n);
        Counts {
            syscalls: self.syscalls / n,
            switches: self.switches / n,
            faults: self.faults / n,
            cpu_ms: self.cpu_ms / n,
        }
    }

    fn add(self, o: Counts) -> Counts {
        Counts {
            syscalls: self.syscalls + o.syscalls,
            switches: self.switches + o.switches,
            faults: self.faults + o.faults,
            cpu_ms: self.cpu_ms + o.cpu_ms,
        }
    }

    fn show(self) -> String {
        format!(
            "{:>6.1} syscalls {:>5.1} switches {:>6.1} faults {:>6.2} ms CPU",
            self.syscalls, self.switches, self.faults, self.cpu_ms
        )
    }
}

/// Parses `perf stat -x,` output: `value,unit,event,...` lines; every event must have been counted.
fn parse_stat(text: &str) -> Result<Counts, String> {
    let mut c = Counts::default();
    let mut seen = 0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split(',').collect();
        let (Some(value), Some(event)) = (f.first(), f.get(2)) else {
            continue;
        };
        let v: f64 = value
            .parse()
            .map_err(|_| format!("perf did not count {event}: {line}"))?;
        match *event {
            "raw_syscalls:sys_enter" => c.syscalls = v,
            "context-switches" => c.switches = v,
            "page-faults" => c.faults = v,
            "task-clock" => c.cpu_ms = v,
            _ => continue,
        }
        seen += 1;
    }
    if seen == 4 {
        Ok(c)
    } else {
        Err(format!(
            "perf stat printed {seen} of the 4 events {EVENTS}:\n{text}"
        ))
    }
}

fn read_stat(out: &Path) -> Result<Counts, TestError> {
    let text = std::fs::read_to_string(out)
        .map_err(|e| TestError::Check(format!("cannot read {}: {e}", out.display())))?;
    parse_stat(&text).map_err(TestError::Check)
}

/// perf stat attached to `pid` while `batch` runs (and [`AFTERMATH`] after it).
fn stat_pid(
    perf: &Program,
    pid: u32,
    out: &Path,
    batch: impl FnOnce() -> Result<(), TestError>,
) -> Result<Counts, TestError> {
    let [c] = stat_pids(perf, [(pid, out)], batch)?;
    Ok(c)
}

/// perf stat attached to each of `pids` at once (each writing its own output) while `batch` runs
/// (and [`AFTERMATH`] after it): with vgpud and the bus daemon, what an operation costs the daemon
/// and the bus that carries its signals.
fn stat_pids<const K: usize>(
    perf: &Program,
    pids: [(u32, &Path); K],
    batch: impl FnOnce() -> Result<(), TestError>,
) -> Result<[Counts; K], TestError> {
    let args = ["stat", "-x", ",", "-e", EVENTS];
    let mut children = Vec::with_capacity(K);
    for (pid, out) in pids {
        children.push(attach_perf(perf, &args, pid, out, Duration::ZERO)?);
    }
    std::thread::sleep(ATTACH);
    let ran = batch();
    std::thread::sleep(AFTERMATH);
    for child in children {
        stop_perf(child)?;
    }
    ran?;
    let mut counts = [Counts::default(); K];
    for (c, (_, out)) in counts.iter_mut().zip(pids) {
        *c = read_stat(out)?;
    }
    Ok(counts)
}

/// `program args` run under `perf stat`: what the client process itself did.
fn stat_command(
    perf: &Program,
    program: &Program,
    args: &[&str],
    out: &Path,
) -> Result<Counts, TestError> {
    let out_s = out.display().to_string();
    let o = program
        .wrapped(
            perf,
            &["stat", "-x", ",", "-e", EVENTS, "-o", &out_s, "--"],
            args,
        )
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestError::Check(format!("cannot run perf stat: {e}")))?;
    ensure(o.status.success(), || {
        format!(
            "{args:?} under perf stat failed ({}): {}{}",
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })?;
    read_stat(out)
}

/// A pool grown by [`N`] slots with one `Manager1.Apply`, then shrunk back with another: what each
/// slot costs vgpud and dbus-daemon (the slot's signals pass through it), each apply's own work (one
/// discovery, its plan and its records) shared among the slots.
fn pool_counts(
    perf: &Program,
    d: &super::vgpud::Vgpud,
    pids: (u32, u32),
    dir: &Path,
) -> Result<(), TestError> {
    let client = PoolClient::connect(d)?;
    let (out, bus_out) = (dir.join("stat-vgpud.txt"), dir.join("stat-bus.txt"));
    let pids = [(pids.0, out.as_path()), (pids.1, bus_out.as_path())];
    let apply = |slots: u32| -> Result<(), TestError> {
        let s = client.apply(&pool_toml(slots))?;
        ensure(s.slots.len() == slots as usize, || {
            format!("the apply of {slots} slots left {} slots", s.slots.len())
        })
    };
    apply(1)?;
    let grow = stat_pids(perf, pids, || apply(N + 1));
    let shrink = grow.and_then(|g| Ok((g, stat_pids(perf, pids, || apply(1))?)));
    // The pool goes whatever was measured: the devices are vgpud's to remove.
    let removed = client.remove("bench");
    let ([grow_d, grow_b], [shrink_d, shrink_b]) = shrink?;
    removed?;
    row(
        &format!("pool grow by {N}, per slot"),
        Some(grow_d.per(N)),
        None,
    );
    bus_row(grow_b.per(N));
    row(
        &format!("pool shrink by {N}, per slot"),
        Some(shrink_d.per(N)),
        None,
    );
    bus_row(shrink_b.per(N));
    Ok(())
}

/// The bus daemon's line under an operation's row.
fn bus_row(c: Counts) {
    println!("bench:   {:<34}  dbus-daemon {}", "", c.show());
}

/// One printed row: an operation, what vgpud did for it and what its client process did.
fn row(what: &str, vgpud: Option<Counts>, client: Option<Counts>) {
    let part = |who: &str, c: Option<Counts>| {
        c.map(|c| format!("  {who} {}", c.show()))
            .unwrap_or_default()
    };
    let total = match (vgpud, client) {
        (Some(a), Some(b)) => format!("  together {:>6.1} syscalls", a.add(b).syscalls),
        _ => String::new(),
    };
    println!(
        "bench:   {what:<34}{}{}{total}",
        part("vgpud", vgpud),
        part("client", client)
    );
}

fn vgpud_counts(g: &Guest) -> TestResult {
    let perf = perf()?;
    let avail = available(&g.host, PARENT, TYPE)?;
    // The pool rows need one slot more than a batch.
    ensure(avail > N, || format!("{TYPE} has room for {avail}"))?;
    let work = Workdir::new("bench-counts")?;
    let state = Workdir::new("bench-counts-state")?;
    let bus = BusDaemon::start(work.path())?;
    let (d, private_s) = with_private_socket(&work, &state, &bus)?;
    let pid = d
        .pid()
        .ok_or_else(|| TestError::Check("vgpud has no pid".into()))?;
    let vgpuctl = Program::direct(&shipped_copy("vgpuctl", work.path())?)
        .with_env("VGPU_BUS", d.bus())
        .with_env("VGPU_PRIVATE_SOCKET", &private_s);
    mdevctl_script_dirs()?;
    let mdevctl = Program::host_dynamic(&real_mdevctl(&work.path().join("mdevctl-deb"))?);
    let mut mdevs = Mdevs::new(&g.host);
    let out = work.path().join("stat.txt");
    let uuids: Vec<_> = (1..=N)
        .map(|i| test_uuid("bench_vgpud_counts", i))
        .collect();

    // Warm up: the first calls allocate, open and cache what later ones reuse.
    for u in uuids.iter().take(3) {
        d.create(TargetKind::Type, TYPE, PARENT, Some(u))?;
        mdevs.adopt(*u);
        d.destroy(u)?;
        mdevs.forget(u);
    }
    println!(
        "bench: counts per operation (perf stat: {N} operations per batch, vgpud on dbus-daemon; counts do not drift with the machine's speed)"
    );
    let ping = stat_pid(&perf, pid, &out, || {
        (0..N).try_for_each(|_| d.ping().map_err(TestError::from))
    })?;
    row("Peer.Ping (persistent client)", Some(ping.per(N)), None);
    let create = stat_pid(&perf, pid, &out, || {
        uuids.iter().try_for_each(|u| {
            d.create(TargetKind::Type, TYPE, PARENT, Some(u))?;
            mdevs.adopt(*u);
            Ok(())
        })
    })?;
    row(
        "Manager1.Create (persistent client)",
        Some(create.per(N)),
        None,
    );
    let destroy = stat_pid(&perf, pid, &out, || {
        uuids.iter().try_for_each(|u| {
            d.destroy(u)?;
            mdevs.forget(u);
            Ok(())
        })
    })?;
    row("Manager1.Destroy", Some(destroy.per(N)), None);
    let discover = stat_pid(&perf, pid, &out, || {
        (0..N).try_for_each(|_| d.list_gpus().map(drop).map_err(TestError::from))
    })?;
    row(
        "Manager1.ListGpus (one discovery)",
        Some(discover.per(N)),
        None,
    );
    pool_counts(&perf, &d, (pid, bus.pid()), work.path())?;

    // One process per operation, through the private socket: vgpud's share and the client's.
    let client_out = work.path().join("client.txt");
    for (what, op) in [("create", 0), ("destroy", 1)] {
        let mut client = Counts::default();
        let daemon = stat_pid(&perf, pid, &out, || {
            for u in &uuids {
                let us = u.to_string();
                let args: Vec<&str> = if op == 0 {
                    vec!["create", "--type", TYPE, "--gpu", PARENT, "--uuid", &us]
                } else {
                    vec!["destroy", &us]
                };
                client = client.add(stat_command(&perf, &vgpuctl, &args, &client_out)?);
                if op == 0 {
                    mdevs.adopt(*u);
                } else {
                    mdevs.forget(u);
                }
            }
            Ok(())
        })?;
        row(
            &format!("vgpuctl {what} (private socket)"),
            Some(daemon.per(N)),
            Some(client.per(N)),
        );
    }
    for (what, op) in [("start -u -p -t", 0), ("stop -u", 1)] {
        let mut client = Counts::default();
        for u in &uuids {
            let us = u.to_string();
            let args: Vec<&str> = if op == 0 {
                vec!["start", "-u", &us, "-p", PARENT, "-t", TYPE]
            } else {
                vec!["stop", "-u", &us]
            };
            client = client.add(stat_command(&perf, &mdevctl, &args, &client_out)?);
            if op == 0 {
                mdevs.adopt(*u);
            } else {
                mdevs.forget(u);
            }
        }
        row(&format!("mdevctl {what}"), None, Some(client.per(N)));
    }
    // The floor: the same sysfs writes made by this process (the benchmark's own threads are idle
    // meanwhile), each followed by the check that the device came or went.
    let create = create_path(PARENT, TYPE)?;
    let raw = stat_pid(&perf, std::process::id(), &out, || {
        for u in &uuids {
            g.host.write(&create, &u.to_string())?;
            mdevs.adopt(*u);
            ensure(g.host.exists(&paths::mdev_device(u)), || {
                format!("{u} missing after the create write returned")
            })?;
            g.host.write(&paths::mdev_device(u).join("remove"), "1")?;
            mdevs.forget(u);
        }
        Ok(())
    })?;
    row(
        "sysfs create + remove (this process)",
        None,
        Some(raw.per(N)),
    );
    d.stop()?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_stat_csv_is_read() {
        let text = "# started on Mon Dec  7 01:57:19 2026\n\n3004,,raw_syscalls:sys_enter,659300505,100.00,4.556,K/sec\n836,,context-switches,659300505,100.00,1.268,K/sec\n235,,page-faults,659300505,100.00,0.356,K/sec\n659.30,msec,task-clock,659300505,100.00,0.472,CPUs utilized\n";
        assert_eq!(
            parse_stat(text),
            Ok(Counts {
                syscalls: 3004.0,
                switches: 836.0,
                faults: 235.0,
                cpu_ms: 659.30
            })
        );
        let missing = "<not supported>,,raw_syscalls:sys_enter,0,100.00,,\n836,,context-switches,1,100.00,,\n";
        assert!(parse_stat(missing).unwrap_err().contains("did not count"));
        assert!(
            parse_stat("836,,context-switches,1,100.00,,\n")
                .unwrap_err()
                .contains("1 of the 4")
        );
    }
}
