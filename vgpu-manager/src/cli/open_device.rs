//! `vgpuctl open-device UUID`: asks vgpud for a running instance's VFIO fds (`Instance1.OpenDevice`),
//! as an unprivileged VMM does, so no process but the daemon needs the rights to `/dev/vfio`.
//!
//! Without a command it proves the fds work: device info and config ids through the device fd, a DMA
//! map and unmap through the container or IOAS (exit 1 when a step fails; `--json` prints the
//! report). With `-- COMMAND ARGS…` it runs COMMAND in its place with both fds inherited: `{device-fd}`,
//! `{iommu-fd}` and `{ioas-id}` in ARGS are replaced, and `VGPU_DEVICE_FD`, `VGPU_IOMMU_FD`,
//! `VGPU_IOMMU_BACKEND`, `VGPU_IOAS_ID` and `VGPU_IOMMU_GROUP` are set. QEMU binds the device itself, so it takes the unbound form:
//! `vgpuctl open-device UUID --unbound -- qemu-system-x86_64 … -object
//! iommufd,id=iommufd0,fd={iommu-fd} -device vfio-pci,iommufd=iommufd0,fd={device-fd}`.

use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;

use mdev_types::ids::MdevUuid;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use vgpu_client::{BusAddress, Client};
use vgpu_vfio::{OpenedDevice, OpenedDeviceExt};

use super::CliError;
use super::daemon_cmds::BusArgs;
use super::preflight::{BackendArg, print_report};

/// The options of `vgpuctl open-device`.
#[derive(Debug, Clone, clap::Args)]
pub(super) struct OpenDeviceArgs {
    /// The running instance's UUID.
    uuid: String,
    /// Which VFIO backend the daemon opens it through.
    #[arg(long, value_enum, default_value = "auto")]
    backend: BackendArg,
    /// Size of the DMA buffer of the check, in MiB (it is pinned: mind RLIMIT_MEMLOCK).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=4096))]
    dma_mib: u32,
    /// Receive the device's cdev unbound, with a fresh iommufd, as VMMs that bind it themselves expect
    /// (QEMU's `-object iommufd,fd={iommu-fd} -device vfio-pci,iommufd=…,fd={device-fd}`); iommufd only.
    #[arg(long)]
    unbound: bool,
    /// Print the check's report as JSON (docs/json.md, as `preflight --json`).
    #[arg(long)]
    json: bool,
    /// Run this command with the fds instead of checking them.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// Receives the fds, then checks them (`Ok(false)` when a step failed) or runs the command (returns only
/// when it could not be started).
pub(super) fn run(
    bus: &BusArgs,
    args: &OpenDeviceArgs,
    out: &mut dyn Write,
) -> Result<bool, CliError> {
    let uuid: MdevUuid = args
        .uuid
        .parse()
        .map_err(|e: mdev_types::ids::IdError| CliError::BadArgument(e.to_string()))?;
    let address: BusAddress = bus.bus.parse()?;
    let rt = vgpu_client::runtime()?;
    let mut opened = rt.block_on(async {
        let client = Client::connect_unchecked(&address).await?;
        client
            .open_device(&uuid, args.backend.forced(), !args.unbound)
            .await
    })?;
    drop(rt);
    if args.command.is_empty() {
        let report = opened.check((args.dma_mib as usize) << 20);
        print_report(out, &report, args.json)?;
        return Ok(report.passed);
    }
    Err(exec_with(&opened, &args.command))
}

/// The command line with the placeholders replaced.
fn substitute(command: &[String], device: i32, iommu: i32, ioas: u32) -> Vec<String> {
    command
        .iter()
        .map(|a| {
            a.replace("{device-fd}", &device.to_string())
                .replace("{iommu-fd}", &iommu.to_string())
                .replace("{ioas-id}", &ioas.to_string())
        })
        .collect()
}

/// Replaces this process with `command`, the fds left open across exec. Returns the reason it failed.
fn exec_with(opened: &OpenedDevice, command: &[String]) -> CliError {
    use std::os::fd::AsRawFd;
    for fd in [opened.device_fd(), opened.iommu_fd()] {
        if let Err(e) = fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::empty())) {
            return CliError::Host(format!(
                "cannot keep fd {} open for {}: {e}",
                fd.as_raw_fd(),
                command[0]
            ));
        }
    }
    let (device, iommu) = (opened.device.as_raw_fd(), opened.iommu.as_raw_fd());
    let ioas = opened.ioas_id.unwrap_or(0);
    let argv = substitute(command, device, iommu, ioas);
    let backend = opened.backend.as_str();
    let e = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .env("VGPU_DEVICE_FD", device.to_string())
        .env("VGPU_IOMMU_FD", iommu.to_string())
        .env("VGPU_IOMMU_BACKEND", backend)
        .env("VGPU_IOAS_ID", ioas.to_string())
        .env("VGPU_IOMMU_GROUP", opened.iommu_group.to_string())
        .exec();
    CliError::Host(format!("cannot run {}: {e}", argv[0]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::run_for_test as run;

    #[test]
    fn placeholders_become_the_fd_numbers() {
        let cmd: Vec<String> = [
            "qemu",
            "-object",
            "iommufd,id=i0,fd={iommu-fd}",
            "-device",
            "vfio-pci,iommufd=i0,fd={device-fd}",
            "{ioas-id}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            substitute(&cmd, 7, 9, 3),
            [
                "qemu",
                "-object",
                "iommufd,id=i0,fd=9",
                "-device",
                "vfio-pci,iommufd=i0,fd=7",
                "3"
            ]
        );
    }

    #[test]
    fn bad_uuids_and_absent_daemons_are_one_line_errors() {
        let (code, _, err) = run(&["open-device", "not-a-uuid"]);
        assert_eq!(code, 2);
        assert!(err.contains("not-a-uuid"), "{err}");
        let (code, _, err) = run(&[
            "--bus",
            "unix:path=/nonexistent/vgpu-test.sock",
            "open-device",
            "6a1f0c2e-9b3d-4c1a-8e2f-0d5b7a9c1e01",
        ]);
        assert_eq!(code, 2);
        assert!(err.contains("/nonexistent/vgpu-test.sock"), "{err}");
    }
}
