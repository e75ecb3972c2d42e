//! Benchmark: host boot to ready, as users feel it: from the parent driver loading (`modprobe mtty`) to
//! every autostart vGPU listed active by `virsh nodedev-list --cap mdev` — with vgpu-manager installed
//! (vgpud starts its autostart definitions when the parent appears; mdevctl's udev rule, run by the
//! sysroot's udevd, calls our `mdevctl start-parent-mdevs` too), and with the real mdevctl 1.2.0 in
//! charge (its udev rule `60-mdevctl.rules` runs `/usr/sbin/mdevctl start-parent-mdevs`; vgpud
//! stopped, `/usr/sbin/mdevctl` and `/usr/bin/mdevctl` pointed at the real one). Same guest, same
//! libvirtd, same devices, three rounds each, printed side by side with the ratio. Fails only when
//! an operation fails, never on a time.
//!
//! The mtty sample takes at most 24 single-port devices (samples/vfio-mdev/mtty.c `MAX_MTTYS`), so the
//! benchmark brings back 24, not the 32 of a larger host.

use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;

use super::super::daemon_events::module_tool;
use super::super::guest::Guest;
use super::super::runner::{Outcome, TestError, TestResult};
use super::super::samples::{Mdevs, test_uuid};
use super::super::vgpud::TargetKind;
use super::nodedev::{mdev_node, nodedev_list};
use super::stack::Stack;
use super::sysroot::{Libvirt, REAL_MDEVCTL, kernel_lacks_overlay};

/// Autostart devices brought back per round (mtty's whole capacity).
const DEVICES: u32 = 24;
/// Rounds per side.
const ROUNDS: u32 = 3;
/// The bound on one round (a failure, not a measurement).
const READY_WITHIN: Duration = Duration::from_secs(300);

/// The benchmarks.
pub fn benches() -> Vec<super::super::runner::Test<Guest>> {
    vec![super::super::runner::Test::new(
        "bench_libvirt_boot_to_ready",
        boot_to_ready,
    )]
}

/// Unloads mtty (its devices go with it), loads it again and times until libvirt lists all of `uuids`
/// active.
fn one_round(s: &Stack, uuids: &[MdevUuid]) -> Result<Duration, TestError> {
    module_tool("rmmod", &["mtty"])?;
    s.wait_until("libvirt drops mtty's devices", READY_WITHIN, |s| {
        Ok(!nodedev_list(s, &["--cap", "mdev"])?
            .iter()
            .any(|n| n.ends_with("_mtty")))
    })?;
    let nodes: Vec<String> = uuids.iter().map(mdev_node).collect();
    let t = Instant::now();
    module_tool("modprobe", &["mtty"])?;
    s.wait_until(
        "libvirt lists every autostart device active",
        READY_WITHIN,
        |s| {
            let listed = nodedev_list(s, &["--cap", "mdev"])?;
            Ok(nodes.iter().all(|n| listed.contains(n)))
        },
    )?;
    Ok(t.elapsed())
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn boot_to_ready(g: &Guest) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let mut s = Stack::up("libvirt-boot-bench", Libvirt::V9_0)?;
    let mut mdevs = Mdevs::new(&g.host);
    let uuids: Vec<MdevUuid> = (0..DEVICES)
        .map(|n| test_uuid("libvirt-boot-bench", n))
        .collect();
    for u in &uuids {
        mdevs.adopt(*u);
    }

    // vgpu-manager: autostart definitions in vgpud.
    for u in &uuids {
        s.vgpud()?
            .define(TargetKind::Type, "mtty-1", "mtty", u, true)?;
    }
    let mut ours = Vec::new();
    for _ in 0..ROUNDS {
        ours.push(one_round(&s, &uuids)?);
    }
    for u in &uuids {
        s.vgpud()?.destroy(u)?;
    }
    s.stop_vgpud()?;

    // The real mdevctl: its links back, the same devices defined with --auto.
    for link in ["/usr/sbin/mdevctl", "/usr/bin/mdevctl"] {
        s.root.symlink(std::path::Path::new(REAL_MDEVCTL), link)?;
    }
    for u in &uuids {
        s.root.run(
            REAL_MDEVCTL,
            &[
                "define",
                "-u",
                &u.to_string(),
                "-p",
                "mtty",
                "-t",
                "mtty-1",
                "--auto",
            ],
        )?;
    }
    let mut real = Vec::new();
    for _ in 0..ROUNDS {
        real.push(one_round(&s, &uuids)?);
    }
    for u in &uuids {
        let u = u.to_string();
        s.root.run(REAL_MDEVCTL, &["stop", "-u", &u])?;
        s.root.run(REAL_MDEVCTL, &["undefine", "-u", &u])?;
    }
    for u in &uuids {
        mdevs.forget(u);
    }

    let (o, r) = (median(ours.clone()), median(real.clone()));
    println!(
        "bench libvirt boot to ready ({DEVICES} autostart mtty devices, modprobe to all listed by virsh, median of {ROUNDS}): vgpu-manager {o:?} {ours:?}, real mdevctl's udev rule {r:?} {real:?}, ratio vgpu-manager/mdevctl {:.2}",
        o.as_secs_f64() / r.as_secs_f64()
    );
    Ok(Outcome::Passed)
}
