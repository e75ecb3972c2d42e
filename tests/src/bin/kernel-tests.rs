//! The real-kernel test suite's entry point, run inside the vm-test guest by scripts/vm-test.
//!
//! `kernel-tests [--list] [FILTER...]`: runs every test whose name contains one of the filters (all
//! without filters) and exits non-zero when any failed. Benchmarks (`bench_*`) join only when a filter
//! contains `bench`, so a normal run never starts them. Outside the guest it only lists tests: the
//! suite creates mdevs, enables VFs and rebinds drivers, which must never happen on a real host.

use std::process::ExitCode;

use vgpu_host::SysfsHost;
use vgpu_tests::kernel::guest::Guest;
use vgpu_tests::kernel::{all_benches, all_tests, runner};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut tests = all_tests();
    if args.iter().any(|a| a == "--list") {
        for t in &tests {
            println!("{}", t.name);
        }
        for b in all_benches() {
            println!(
                "{} (benchmark: only with a filter containing \"bench\")",
                b.name
            );
        }
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a.contains("bench")) {
        tests.extend(all_benches());
    }
    if let Some(bad) = args.iter().find(|a| a.starts_with('-')) {
        eprintln!("kernel-tests: unknown option {bad}; usage: kernel-tests [--list] [FILTER...]");
        return ExitCode::from(2);
    }
    let cmdline = match std::fs::read_to_string("/proc/cmdline") {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kernel-tests: cannot read /proc/cmdline: {e}");
            return ExitCode::from(2);
        }
    };
    let guest = match Guest::from_cmdline(&cmdline, SysfsHost::live()) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("kernel-tests: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "kernel-tests: kernel {:?}, topology {:?}, {} tests",
        guest.kernel,
        guest.topology,
        tests.len()
    );
    let report = runner::run(&tests, &guest, &args, &guest.boots, &mut std::io::stdout());
    if report.failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
