//! The real-kernel test suite: our host layer against a real Linux kernel inside the QEMU guest that
//! scripts/vm-test boots (emulated Intel IOMMU, igb and nvme SR-IOV PFs, the kernel's sample mdev
//! drivers mtty/mdpy/mbochs).
//!
//! * [`runner`] — the tiny named-test runner (the guest has no libtest).
//! * [`guest`] — which kernel and topology are running; sysfs helpers.
//! * [`harness`] — the guest's own modules and device nodes (/dev/kvm, /dev/vfio, /dev/iommu).
//! * [`samples`] — facts about the sample mdev drivers; a guard that removes created mdevs.
//! * [`mdev`], [`sriov`], [`iommu`] — raw sysfs tests, each errno case with its kernel source.
//! * [`lifecycle`] — the same refusals as typed `vgpu_host::ops` errors, as host-independent scenarios.
//! * [`discovery`] — `vgpu_host::discover` against what sysfs says.
//! * [`vgpud`], [`daemon`], [`daemon_events`] — the real `vgpud` on the guest's sysfs, driven over D-Bus.
//! * [`faults`] — a parent unloaded and VFs vanishing behind the running `vgpud`: the others keep
//!   working, and the parent is managed again once it is back.
//! * [`metrics`] — `vgpuctl metrics` after vgpud and sysfs made devices: `promtool check metrics` and
//!   the values against sysfs.
//! * [`qemu_attach`] — the host's QEMU (chrooted into its 9p-shared root) attaching an mdev and a VF
//!   with `qemu-glue`'s arguments.
//! * [`migration`] — `vgpuctl migration info|fingerprint|check` (VFIO migration uAPI v2) on mtty and mdpy.
//! * [`migration_qemu`] — a live migration of an mtty mdev between two QEMUs, the target made by
//!   `vgpuctl migration prepare`.
//! * [`vfio`] — VFIO preflight, backends, viability and binding on the real kernel; [`vfio_bench`] its
//!   benchmarks.
//! * [`dra`] — the Kubernetes DRA kubelet plugin: published slices, a prepare making a real mdev.
//! * [`bench_cli`] — provisioning benchmarks: one process per operation against mdevctl, pool apply.
//!   `bench_counts`: system calls, context switches and CPU per operation, from `perf stat`;
//!   `bench_phases`: where one daemon call's time goes, from vgpud's log.
//! * [`bench`](mod@bench) — benchmarks ([`all_benches`]), run only when a filter names them;
//!   [`bus_daemon`] a real dbus-daemon for them.
//!
//! Later suites (VFIO) add modules here and list their tests in [`all_tests`].

pub mod bench;
pub mod bench_cli;
mod bench_counts;
mod bench_phases;
pub mod bench_profile;
pub mod bus_daemon;
pub mod daemon;
pub mod daemon_events;
pub mod discovery;
pub mod dra;
pub mod faults;
pub mod guest;
pub mod handoff;
pub mod harness;
pub mod iommu;
pub mod libvirt;
pub mod lifecycle;
pub mod mdev;
pub mod metrics;
pub mod migration;
pub mod migration_qemu;
pub mod qemu_attach;
pub mod runner;
pub mod samples;
pub mod sriov;
pub mod vfio;
pub mod vfio_bench;
pub mod vgpud;

use guest::Guest;
use runner::Test;

/// Every real-kernel test, in run order.
pub fn all_tests() -> Vec<Test<Guest>> {
    let mut tests = Vec::new();
    tests.extend(harness::tests());
    tests.extend(mdev::tests());
    tests.extend(sriov::tests());
    tests.extend(iommu::tests());
    tests.extend(lifecycle::tests());
    tests.extend(discovery::tests());
    tests.extend(vfio::tests());
    tests.extend(handoff::tests());
    tests.extend(migration::tests());
    tests.extend(migration_qemu::tests());
    tests.extend(daemon::tests());
    tests.extend(faults::tests());
    tests.extend(metrics::tests());
    tests.extend(qemu_attach::tests());
    tests.extend(libvirt::tests());
    tests.extend(dra::tests());
    tests
}

/// Every benchmark. Not part of a normal run: the kernel-tests binary adds them only when a filter
/// contains `bench` (they print measurements and fail only when an operation fails).
pub fn all_benches() -> Vec<Test<Guest>> {
    let mut benches = bench::benches();
    benches.extend(bench_cli::benches());
    benches.extend(bench_profile::benches());
    benches.extend(bench_counts::benches());
    benches.extend(vfio_bench::benches());
    benches.extend(libvirt::boot_bench::benches());
    benches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_are_unique() {
        let mut names: Vec<&str> = all_tests()
            .iter()
            .chain(all_benches().iter())
            .map(|t| t.name)
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n, "duplicate test names");
        assert!(n > 20, "the suite has only {n} tests");
        // A normal run (no filter) must never select a benchmark, and `-- bench` only benchmarks.
        assert!(all_tests().iter().all(|t| !t.name.contains("bench")));
        assert!(all_benches().iter().all(|t| t.name.starts_with("bench_")));
    }
}
