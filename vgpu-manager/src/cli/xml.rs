//! `vgpuctl xml UUID [--domain | --qemu]`: what to give a guest to use an instance — the libvirt
//! `<hostdev>` element, a complete example VDI domain around it (with vgpu-manager metadata, so the
//! libvirt hook can recreate the vGPU on demand), or QEMU's `-device` arguments. The instance is looked up
//! in vgpud, so a typo fails here rather than at guest start.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mdev_types::ids::MdevUuid;
use qemu_glue::{DomainSpec, Hostdev, MdevDisplay, VgpuRequest, VgpuTarget};

use super::CliError;
use super::daemon_cmds::BusArgs;
use crate::client::{BusAddress, InstanceInfo};
use crate::hook::daemon::{DbusDaemon, VgpuDaemon};

/// `vgpuctl xml` options.
#[derive(Debug, Args)]
pub struct XmlArgs {
    /// The instance UUID (`vgpuctl list`). Pool names are not supported yet.
    target: String,
    /// Print a complete example domain instead of the <hostdev> element.
    #[arg(long, conflicts_with = "qemu")]
    domain: bool,
    /// Print QEMU `-device` arguments instead of libvirt XML.
    #[arg(long)]
    qemu: bool,
    /// Show the vGPU's display in the guest's graphics (display='on'); needs a vGPU type with a display.
    #[arg(long)]
    display: bool,
    /// With --display: also a ramfb boot display, so firmware and boot loader are visible.
    #[arg(long, requires = "display")]
    ramfb: bool,
    /// With --domain: the domain name (default: vdi-<first 8 characters of the UUID>).
    #[arg(long, value_name = "NAME", requires = "domain")]
    name: Option<String>,
    /// With --domain: memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 4096, requires = "domain")]
    memory: u64,
    /// With --domain: virtual CPUs.
    #[arg(long, value_name = "N", default_value_t = 2, requires = "domain")]
    vcpus: u32,
    /// With --domain: a qcow2 disk image.
    #[arg(long, value_name = "FILE", requires = "domain")]
    disk: Option<PathBuf>,
}

/// Runs `vgpuctl xml` against vgpud on `bus`.
pub fn run(args: &XmlArgs, bus: &BusArgs, out: &mut dyn Write) -> Result<(), CliError> {
    // Refuse a non-UUID before touching the bus: the message does not depend on the daemon.
    let uuid = parse_target(&args.target)?;
    let bus: BusAddress = bus.bus.parse()?;
    let mut daemon = DbusDaemon::connect(&bus)?;
    run_with(args, uuid, &mut daemon, out)
}

fn parse_target(target: &str) -> Result<MdevUuid, CliError> {
    target.parse().map_err(|_| {
        CliError::BadArgument(format!(
            "'{target}' is not an instance UUID: give one from `vgpuctl list` (XML for a whole pool is not supported yet)"
        ))
    })
}

/// Renders for instance `uuid` as found through `daemon`.
fn run_with(
    args: &XmlArgs,
    uuid: MdevUuid,
    daemon: &mut dyn VgpuDaemon,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let info = daemon.get_instance(&uuid.to_string())?.ok_or_else(|| {
        CliError::BadArgument(format!(
            "no instance {uuid}: `vgpuctl list` shows the instances"
        ))
    })?;
    let hostdev = Hostdev::Mdev {
        uuid,
        display: MdevDisplay {
            display: args.display,
            ramfb: args.ramfb,
        },
    };
    if args.qemu {
        writeln!(out, "{}", hostdev.qemu_args().join(" "))?;
        return Ok(());
    }
    if !args.domain {
        write!(out, "{}", hostdev.libvirt_xml(0))?;
        return Ok(());
    }
    let mut spec = DomainSpec::desktop(
        args.name
            .as_deref()
            .unwrap_or(&format!("vdi-{}", &uuid.to_string()[..8])),
        vec![hostdev],
    );
    spec.memory_mib = args.memory;
    spec.vcpus = args.vcpus;
    spec.disk = args.disk.clone();
    spec.vgpus.push(request(&info, uuid)?);
    let xml = spec
        .to_xml()
        .map_err(|e| CliError::BadArgument(e.to_string()))?;
    write!(out, "{xml}")?;
    Ok(())
}

/// The metadata that lets the hook recreate this instance: its profile if it was made from one (any GPU
/// that fits will do), else its exact type on its GPU.
fn request(info: &InstanceInfo, uuid: MdevUuid) -> Result<VgpuRequest, CliError> {
    Ok(match info.profile() {
        Some(p) => VgpuRequest {
            uuid,
            target: VgpuTarget::Profile(p.to_string()),
            gpu: None,
        },
        None => VgpuRequest {
            uuid,
            target: VgpuTarget::Type(info.type_id.parse().map_err(|_| {
                CliError::BadArgument(format!(
                    "instance {uuid} reports type '{}', which is not an mdev type id",
                    info.type_id
                ))
            })?),
            gpu: Some(info.gpu.clone()),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hook::fake::{FakeDaemon, instance};
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: XmlArgs,
    }

    const U: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";

    fn render(args: &[&str], f: &mut FakeDaemon) -> Result<String, CliError> {
        let t = T::try_parse_from(std::iter::once("xml").chain(args.iter().copied()))
            .map_err(|e| CliError::BadArgument(e.to_string()))?;
        let uuid = parse_target(&t.a.target)?;
        let mut out = Vec::new();
        run_with(&t.a, uuid, f, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    #[test]
    fn hostdev_domain_and_qemu_forms() {
        let mut i = instance(U, "nvidia-223", "running", false, "daemon");
        i.profile = "vdi-2g".into();
        let mut f = FakeDaemon::new().with(i);
        let x = render(&[U], &mut f).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            x.starts_with("<hostdev mode='subsystem' type='mdev'") && x.contains(U),
            "{x}"
        );
        let x = render(
            &[U, "--domain", "--display", "--ramfb", "--name", "desk"],
            &mut f,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(
            x.contains("<name>desk</name>") && x.contains("profile='vdi-2g'"),
            "{x}"
        );
        assert!(x.contains("display='on' ramfb='on'"), "{x}");
        let q = render(&[U, "--qemu", "--display"], &mut f).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            q,
            format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{U},display=on\n")
        );
    }

    #[test]
    fn an_instance_without_profile_pins_type_and_gpu() {
        let mut f = FakeDaemon::new().with(instance(U, "nvidia-231", "stopped", true, "daemon"));
        let x = render(&[U, "--domain"], &mut f).unwrap_or_else(|e| panic!("{e}"));
        assert!(x.contains("type='nvidia-231' gpu='0000:01:00.0'"), "{x}");
        assert!(x.contains(&format!("<name>vdi-{}</name>", &U[..8])), "{x}");
    }

    #[test]
    fn unknown_uuid_and_pool_names_are_refused_clearly() {
        let mut f = FakeDaemon::new();
        let e = render(&[U], &mut f).unwrap_err().to_string();
        assert!(
            e.contains("no instance") && e.contains("vgpuctl list"),
            "{e}"
        );
        let e = render(&["vdi-pool"], &mut f).unwrap_err().to_string();
        assert!(
            e.contains("'vdi-pool' is not an instance UUID") && e.contains("pool"),
            "{e}"
        );
        let e = render(&[U, "--ramfb"], &mut f).unwrap_err().to_string();
        assert!(e.contains("--display"), "{e}");
    }
}
