//! `vgpuctl xml UUID|POOL [--domain | --qemu]`: what to give a guest to use an instance — the libvirt
//! `<hostdev>` element, a complete example VDI domain around it (with vgpu-manager metadata, so the
//! libvirt hook can recreate the vGPU on demand), or QEMU's `-device` arguments. The instance is looked up
//! in vgpud, so a typo fails here rather than at guest start.
//!
//! Given the name of a pool vgpud has applied (Manager1 `PoolStatus`), the same for every slot that has
//! an instance, each preceded by a comment naming the slot; with `--domain` one domain per slot, named
//! `POOL-PROFILE-INDEX` (the slot's label with the characters libvirt refuses in a name replaced).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use mdev_types::ids::{MdevUuid, PciAddress};
use qemu_glue::{DomainSpec, Hostdev, MdevDisplay, PciHostdev, VfBinding, VgpuRequest, VgpuTarget};
use vgpu_client::blocking::{self, ManagerCalls};
use vgpu_client::{BusAddress, InstanceInfo, PoolStatus, SlotRow};

use super::CliError;
use super::daemon_cmds::BusArgs;

/// `vgpuctl xml` options.
#[derive(Debug, Args)]
pub struct XmlArgs {
    /// An instance UUID (`vgpuctl list`) or a pool slot's UUID, or the name of an applied pool
    /// (`vgpuctl pool status`) for every slot of it.
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
    /// With --domain and a UUID: the domain name (default: vdi-<first 8 characters of the UUID>).
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
    let bus: BusAddress = bus.bus.parse()?;
    match args.target.parse::<MdevUuid>() {
        Ok(uuid) => {
            let mut daemon = blocking::Client::connect_unchecked(&bus)?;
            // A pool slot held by a VF is no instance: find it among the applied pools' slots.
            if daemon.find_instance(&uuid.to_string())?.is_none() {
                let pools = daemon.pool_status()?;
                let vf_slot = pools.iter().find_map(|p| {
                    p.slots
                        .iter()
                        .find(|s| s.uuid == args.target && s.vf.is_some())
                        .map(|s| (p.pool.as_str(), s))
                });
                if let Some((pool, slot)) = vf_slot {
                    let domain = args
                        .name
                        .clone()
                        .unwrap_or_else(|| format!("{pool}-{}-{}", slot.profile, slot.index));
                    return render_slot(args, pool, slot, &domain, out);
                }
            }
            run_with(args, uuid, &mut daemon, out)
        }
        Err(_) => {
            // Refused before the bus is touched: a pool has many domains, one name cannot fit them.
            if args.name.is_some() {
                return Err(name_with_pool(&args.target));
            }
            let pools = blocking::Client::connect_unchecked(&bus)?.pool_status()?;
            render_pool(args, &pools, out)
        }
    }
}

fn name_with_pool(pool: &str) -> CliError {
    CliError::BadArgument(format!(
        "--name names one domain, but '{pool}' is a pool: its domains are named after their slots (POOL-PROFILE-INDEX)"
    ))
}

/// Renders every slot with an instance of pool `args.target`, found in `pools`.
fn render_pool(args: &XmlArgs, pools: &[PoolStatus], out: &mut dyn Write) -> Result<(), CliError> {
    let name = &args.target;
    if args.name.is_some() {
        return Err(name_with_pool(name));
    }
    let Some(pool) = pools.iter().find(|p| &p.pool == name) else {
        let applied: Vec<&str> = pools.iter().map(|p| p.pool.as_str()).collect();
        // "not an instance UUID" first: the argument may as well have been a mistyped UUID.
        return Err(CliError::BadArgument(format!(
            "'{name}' is not an instance UUID nor an applied pool (applied pools: {}): give a UUID from `vgpuctl list` or a pool from `vgpuctl pool status`",
            if applied.is_empty() {
                "none".to_string()
            } else {
                applied.join(", ")
            }
        )));
    };
    // A slot without an instance has nothing to attach (its row has no GPU).
    let slots: Vec<&SlotRow> = pool.slots.iter().filter(|s| s.gpu.is_some()).collect();
    if slots.is_empty() {
        return Err(CliError::BadArgument(format!(
            "pool '{name}' has no slot with an instance: `vgpuctl pool apply` its file again"
        )));
    }
    for slot in slots {
        let domain = format!("{name}-{}-{}", slot.profile, slot.index);
        render_slot(args, name, slot, &domain, out)?;
    }
    Ok(())
}

/// Renders one slot of pool `name` (an mdev by UUID, or a VF as its PCI function); `domain` names the
/// example domain of `--domain`.
fn render_slot(
    args: &XmlArgs,
    name: &str,
    slot: &SlotRow,
    domain: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let display = MdevDisplay {
        display: args.display,
        ramfb: args.ramfb,
    };
    let uuid: MdevUuid = slot.uuid.parse().map_err(|_| {
        CliError::BadArgument(format!(
            "vgpud reports slot {}/{} of pool '{name}' with UUID '{}', which is not a UUID",
            slot.profile, slot.index, slot.uuid
        ))
    })?;
    // A VF slot is given to the guest as its PCI function; vgpud bound it (or the NVIDIA driver
    // owns it), so libvirt must leave the binding alone.
    let vf = match &slot.vf {
        Some(a) => Some(a.parse::<PciAddress>().map_err(|_| {
            CliError::BadArgument(format!(
                "vgpud reports slot {}/{} of pool '{name}' on VF '{a}', which is not a PCI address",
                slot.profile, slot.index
            ))
        })?),
        None => None,
    };
    let hostdev = match vf {
        Some(a) => Hostdev::Pci(PciHostdev::new(a, VfBinding::BoundByVgpuManager)),
        None => Hostdev::Mdev { uuid, display },
    };
    let what = match vf {
        Some(a) => format!(
            "slot {name}/{}/{} ({uuid}, VF {a})",
            slot.profile, slot.index
        ),
        None => format!("slot {name}/{}/{} ({uuid})", slot.profile, slot.index),
    };
    if args.qemu {
        writeln!(out, "# {what}\n{}", hostdev.qemu_args().join(" "))?;
        return Ok(());
    }
    if !args.domain {
        write!(out, "<!-- {what} -->\n{}", hostdev.libvirt_xml(0))?;
        return Ok(());
    }
    // An mdev slot was made from its profile, so any GPU that fits it will do (as for a UUID made
    // from a profile, see `request`). A VF slot is kept by the pool itself: no request for the
    // hook.
    let request = vf.is_none().then(|| VgpuRequest {
        uuid,
        target: VgpuTarget::Profile(slot.profile.clone()),
        gpu: None,
    });
    let xml = domain_xml(args, domain, hostdev, request)?;
    write!(out, "<!-- {what} -->\n{xml}")?;
    Ok(())
}

/// The example domain `name` around `hostdev`, with `request` as its metadata.
fn domain_xml(
    args: &XmlArgs,
    name: &str,
    hostdev: Hostdev,
    request: Option<VgpuRequest>,
) -> Result<String, CliError> {
    let mut spec = DomainSpec::desktop(name, vec![hostdev]);
    spec.memory_mib = args.memory;
    spec.vcpus = args.vcpus;
    spec.disk = args.disk.clone();
    spec.vgpus.extend(request);
    spec.to_xml()
        .map_err(|e| CliError::BadArgument(e.to_string()))
}

/// Renders for instance `uuid` as found through `daemon`.
fn run_with(
    args: &XmlArgs,
    uuid: MdevUuid,
    daemon: &mut dyn ManagerCalls,
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
    let name = match &args.name {
        Some(n) => n.clone(),
        None => format!("vdi-{}", &uuid.to_string()[..8]),
    };
    let xml = domain_xml(args, &name, hostdev, Some(request(&info, uuid)?))?;
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

    fn parse(args: &[&str]) -> Result<T, CliError> {
        T::try_parse_from(std::iter::once("xml").chain(args.iter().copied()))
            .map_err(|e| CliError::BadArgument(e.to_string()))
    }

    fn render(args: &[&str], f: &mut FakeDaemon) -> Result<String, CliError> {
        let t = parse(args)?;
        let mut out = Vec::new();
        match t.a.target.parse::<MdevUuid>() {
            Ok(uuid) => run_with(&t.a, uuid, f, &mut out)?,
            Err(_) => render_pool(&t.a, &[], &mut out)?,
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn render_pools(args: &[&str], pools: &[PoolStatus]) -> Result<String, CliError> {
        let t = parse(args)?;
        let mut out = Vec::new();
        render_pool(&t.a, pools, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    const S0: &str = "e1c3d5b5-851c-52a3-be68-1c6a6edad9d6";
    const S1: &str = "0f9b8c3a-5a1e-5d2b-9c4e-3f2a1b0c9d8e";
    const S2: &str = "7a6b5c4d-3e2f-5a1b-8c9d-0e1f2a3b4c5d";

    fn slot(profile: &str, index: u32, uuid: &str, gpu: Option<&str>) -> SlotRow {
        SlotRow {
            vf: None,
            pci_id: None,
            parent: None,
            type_name: None,
            fault: None,
            iommu_group: None,
            profile: profile.into(),
            index,
            uuid: uuid.into(),
            gpu: gpu.map(Into::into),
            numa_node: None,
            type_id: gpu.map(|_| "nvidia-223".into()),
            state: if gpu.is_some() { "running" } else { "missing" }.into(),
        }
    }

    fn pool(name: &str, slots: Vec<SlotRow>) -> PoolStatus {
        PoolStatus {
            pool: name.into(),
            description: String::new(),
            policy: "consolidate".into(),
            autostart: true,
            applied_at: 0,
            wanted: Default::default(),
            in_sync: slots.iter().all(|s| s.gpu.is_some()),
            slots,
            gpus: Vec::new(),
        }
    }

    fn demo_pools() -> Vec<PoolStatus> {
        vec![
            pool("other", vec![]),
            pool(
                "desks",
                vec![
                    slot("vdi-2g", 0, S0, Some("0000:01:00.0")),
                    slot("vdi-2g", 1, S1, None),
                    slot("workstation-4g", 0, S2, Some("0000:83:00.0")),
                ],
            ),
        ]
    }

    #[test]
    fn a_pool_gives_one_hostdev_per_slot_with_an_instance() {
        let x = render_pools(&["desks"], &demo_pools()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x.matches("<hostdev ").count(), 2, "{x}");
        assert!(
            x.contains(&format!("<!-- slot desks/vdi-2g/0 ({S0}) -->\n<hostdev "))
                && x.contains(&format!("<address uuid='{S0}'/>"))
                && x.contains(&format!("<address uuid='{S2}'/>")),
            "{x}"
        );
        // The slot without an instance has nothing to attach.
        assert!(!x.contains(S1), "{x}");
        let q = render_pools(&["desks", "--qemu"], &demo_pools()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            q,
            format!(
                "# slot desks/vdi-2g/0 ({S0})\n-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{S0}\n\
                 # slot desks/workstation-4g/0 ({S2})\n-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{S2}\n"
            )
        );
    }

    #[test]
    fn a_pool_gives_one_domain_per_slot_named_after_it() {
        let x = render_pools(
            &["desks", "--domain", "--display", "--memory", "2048"],
            &demo_pools(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(x.matches("<domain ").count(), 2, "{x}");
        assert!(x.contains("<name>desks-vdi-2g-0</name>"), "{x}");
        assert!(x.contains("<name>desks-workstation-4g-0</name>"), "{x}");
        assert!(x.contains("profile='workstation-4g'"), "{x}");
        assert_eq!(
            x.matches("<memory unit='MiB'>2048</memory>").count(),
            2,
            "{x}"
        );
        assert_eq!(x.matches("display='on' ramfb='off'").count(), 2, "{x}");
        // Each domain carries its own slot only.
        let second = &x[x.rfind("<domain ").unwrap_or(0)..];
        assert!(second.contains(S2) && !second.contains(S0), "{second}");
    }

    #[test]
    fn unknown_or_empty_pools_are_refused_clearly() {
        let e = render_pools(&["desk"], &demo_pools())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'desk' is not an instance UUID nor an applied pool")
                && e.contains("applied pools: other, desks")
                && !e.contains('\n'),
            "{e}"
        );
        let e = render_pools(&["other"], &demo_pools())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pool 'other' has no slot with an instance"),
            "{e}"
        );
        let e = render_pools(&["desks", "--domain", "--name", "x"], &demo_pools())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--name") && e.contains("POOL-PROFILE-INDEX"),
            "{e}"
        );
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
    fn unknown_uuids_and_pools_are_refused_clearly() {
        let mut f = FakeDaemon::new();
        let e = render(&[U], &mut f).unwrap_err().to_string();
        assert!(
            e.contains("no instance") && e.contains("vgpuctl list"),
            "{e}"
        );
        let e = render(&["vdi-pool"], &mut f).unwrap_err().to_string();
        assert!(
            e.contains("'vdi-pool' is not an instance UUID nor an applied pool")
                && e.contains("applied pools: none"),
            "{e}"
        );
        let e = render(&[U, "--ramfb"], &mut f).unwrap_err().to_string();
        assert!(e.contains("--display"), "{e}");
    }
}
