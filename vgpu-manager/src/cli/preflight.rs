//! `vgpuctl preflight UUID|ADDR`: open the device through VFIO the way a VMM would (type1 or iommufd,
//! chosen automatically), read its info, map and unmap a DMA buffer, and check a KVM guest could take it.
//! Needs root and the live kernel; a failed step exits 1 with the report printed.

use std::io::Write;

use vgpu_vfio::{
    PreflightOptions, PreflightReport, StepOutcome, VfioBackend, VfioTarget, preflight,
};

use super::{CliError, HostArgs, write_json};

/// `--backend` values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(super) enum BackendArg {
    /// Choose: iommufd where /dev/iommu and the device's vfio cdev exist, else type1.
    Auto,
    /// The legacy container/group API.
    Type1,
    /// iommufd + the vfio device cdev.
    Iommufd,
}

impl BackendArg {
    /// The forced backend, or `None` for the automatic choice.
    pub(super) fn forced(self) -> Option<VfioBackend> {
        match self {
            BackendArg::Auto => None,
            BackendArg::Type1 => Some(VfioBackend::Type1),
            BackendArg::Iommufd => Some(VfioBackend::Iommufd),
        }
    }
}

/// The options of `vgpuctl preflight`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct PreflightArgs {
    /// An mdev UUID, or the PCI address of a VF or GPU bound to vfio-pci.
    target: String,
    /// Which VFIO backend to use.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// Skip the KVM attach check.
    #[arg(long)]
    no_kvm: bool,
    /// Size of the DMA buffer in MiB.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4096))]
    dma_mib: u32,
    /// Print JSON (docs/json.md).
    #[arg(long)]
    json: bool,
}

/// Exit code of a preflight whose report has a failed step.
pub(super) const EXIT_FAILED: i32 = 1;

/// Runs the preflight; `Ok(false)` when a step failed (the report is printed either way).
pub(super) fn run(
    host: &HostArgs,
    args: &PreflightArgs,
    out: &mut dyn Write,
) -> Result<bool, CliError> {
    let target: VfioTarget = args
        .target
        .parse()
        .map_err(|e: vgpu_vfio::BadTarget| CliError::BadArgument(e.to_string()))?;
    if host.sim.is_some() || host.sysfs_root.is_some() {
        return Err(CliError::BadArgument(
            "preflight opens real VFIO devices: it runs only on the live kernel (drop --sim/--sysfs-root)"
                .into(),
        ));
    }
    let opts = PreflightOptions {
        backend: args.backend.forced(),
        dma_size: (args.dma_mib as usize) << 20,
        kvm: !args.no_kvm,
    };
    let host = host.open()?;
    let report =
        preflight(host.as_ref(), &target, &opts).map_err(|e| CliError::Host(e.to_string()))?;
    print_report(out, &report, args.json)?;
    Ok(report.passed)
}

/// Prints a preflight report: JSON, or a header line and one line per step.
pub(super) fn print_report(
    out: &mut dyn Write,
    report: &PreflightReport,
    json: bool,
) -> Result<(), CliError> {
    if json {
        return write_json(out, report);
    }
    writeln!(
        out,
        "{}: {} (IOMMU group {}, {}; {})",
        report.target,
        if report.passed { "PASSED" } else { "FAILED" },
        report.iommu_group,
        report.backend,
        report.backend_reason
    )?;
    for s in &report.steps {
        let (word, text) = match &s.outcome {
            StepOutcome::Passed(t) => ("ok", t),
            StepOutcome::Failed(t) => ("FAILED", t),
            StepOutcome::Skipped(t) => ("skipped", t),
        };
        writeln!(
            out,
            "  {:<12} {:<7} {:>8.3} ms  {text}",
            s.name,
            word,
            s.micros as f64 / 1000.0
        )?;
    }
    writeln!(out, "  total {:.3} ms", report.total_micros as f64 / 1000.0)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::run_for_test as run;

    #[test]
    fn refuses_simulated_hosts_and_bad_targets() {
        let (code, _, err) = run(&["--sim", "demo", "preflight", "01:00.0"]);
        assert_eq!(code, 2);
        assert!(err.contains("live kernel"), "{err}");
        let (code, _, err) = run(&["preflight", "gpu0"]);
        assert_eq!(code, 2);
        assert!(
            err.contains("\"gpu0\"") && err.contains("PCI address"),
            "{err}"
        );
    }
}
