//! `vgpuctl discover` and `vgpuctl types`.

use std::io::Write;

use mdev_types::fault::DeviceFault;
use mdev_types::ids::PciAddress;
use mdev_types::model::{Assignability, Capability, Gpu, Inventory, MdevParent, MdevType};
use mdev_types::parse::TypeDescription;
use serde::Serialize;
use vgpu_host::discover::discover as discover_host;

use super::{CliError, HostArgs, Table, write_json};

pub(super) fn discover(host: &HostArgs, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let host = host.open()?;
    let inv = discover_host(host.as_ref())?;
    if json {
        return write_json(out, &inv);
    }
    write!(out, "{}", render_inventory(&inv))?;
    Ok(())
}

fn capability_text(c: &Capability) -> String {
    match c {
        Capability::Mdev { types } => format!("mdev ({types} types)"),
        Capability::MdevOnVfs { vfs, types } => format!("mdev on {vfs} VFs ({types} types)"),
        Capability::Sriov { total_vfs, num_vfs } => format!("sr-iov ({num_vfs}/{total_vfs} VFs)"),
        Capability::NvidiaVendorVfio { vfs } => format!("nvidia-vfio ({vfs} VFs)"),
    }
}

fn gpu_row(g: &Gpu) -> Vec<String> {
    let caps: Vec<String> = g.capabilities.iter().map(capability_text).collect();
    let pass = match &g.passthrough {
        Assignability::Yes { iommu_group } => format!("yes (group {iommu_group})"),
        Assignability::No { .. } => "no (see below)".to_string(),
    };
    vec![
        g.id.clone(),
        g.vendor.as_str().to_string(),
        g.model.clone(),
        g.driver.clone().unwrap_or_else(|| "-".into()),
        g.numa_node
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into()),
        if caps.is_empty() {
            "none".into()
        } else {
            caps.join(", ")
        },
        pass,
    ]
}

/// The human report of `vgpuctl discover`.
pub(super) fn render_inventory(inv: &Inventory) -> String {
    let mut s = format!("host: {}\n\n", inv.host);
    if inv.gpus.is_empty() {
        s.push_str("no GPUs found\n");
    } else {
        let mut t = Table::new(&[
            "GPU",
            "VENDOR",
            "MODEL",
            "DRIVER",
            "NUMA",
            "VIRTUALIZATION",
            "PASSTHROUGH",
        ]);
        for g in &inv.gpus {
            t.row(gpu_row(g));
        }
        s.push_str(&t.render());
        let notes: Vec<String> = inv
            .gpus
            .iter()
            .filter_map(|g| match &g.passthrough {
                Assignability::No { reason } => {
                    Some(format!("  {}: not assignable whole: {reason}\n", g.id))
                }
                Assignability::Yes { .. } => None,
            })
            .collect();
        if !notes.is_empty() {
            s.push('\n');
            s.push_str(&notes.concat());
        }
    }
    let others: Vec<&MdevParent> = inv
        .mdev_parents
        .iter()
        // A VF's parent belongs to its GPU (NVIDIA classic vGPU on Ampere and later).
        .filter(|p| inv.gpu_of_parent(&p.name).is_none())
        .collect();
    if !others.is_empty() {
        s.push_str("\nother mdev parents: ");
        s.push_str(
            &others
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
        s.push('\n');
    }
    s.push_str(&render_faults(&inv.faults));
    s.push('\n');
    if inv.mdev_instances.is_empty() {
        s.push_str("no mdev instances\n");
    } else {
        let mut t = Table::new(&["INSTANCE", "PARENT", "TYPE", "IOMMU GROUP", "DRIVER"]);
        for m in &inv.mdev_instances {
            t.row(vec![
                m.uuid.to_string(),
                m.parent.clone(),
                m.type_id.to_string(),
                m.iommu_group
                    .map(|g| g.to_string())
                    .unwrap_or_else(|| "-".into()),
                m.driver.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        s.push_str(&t.render());
    }
    s
}

/// The faulted devices of an inventory: a table (device, kind, path, problem) and each known fix below
/// it; nothing on a healthy host.
pub(super) fn render_faults(faults: &[DeviceFault]) -> String {
    if faults.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&["FAULTED", "KIND", "PATH", "PROBLEM"]);
    for f in faults {
        t.row(vec![
            f.device.clone(),
            f.scope.as_str().to_string(),
            f.path.display().to_string(),
            f.cause.to_string(),
        ]);
    }
    let mut s = format!(
        "\n{} device(s) could not be read and are not managed until they read again:\n",
        faults.len()
    );
    s.push_str(&t.render());
    for f in faults {
        if let Some(fix) = &f.fix {
            s.push_str(&format!("  {}: {fix}\n", f.device));
        }
    }
    s
}

/// A short summary of a type's parsed description.
pub(super) fn details_text(t: &MdevType) -> String {
    match &t.details {
        TypeDescription::Nvidia(d) => format!(
            "{} MiB, {} heads, {}x{}, max {}",
            d.framebuffer_mib,
            d.num_heads,
            d.max_resolution.width,
            d.max_resolution.height,
            d.max_instance
        ),
        TypeDescription::Gvt(d) => format!(
            "{}+{} MiB, {}x{}, weight {}",
            d.low_gm_mib, d.high_gm_mib, d.resolution.width, d.resolution.height, d.weight
        ),
        TypeDescription::SampleVideoMemory { mib } => format!("{mib} MiB video memory"),
        TypeDescription::SampleFramebuffer { resolution } => {
            format!("{}x{} framebuffer", resolution.width, resolution.height)
        }
        TypeDescription::Unknown => t.description.clone().unwrap_or_else(|| "-".into()),
    }
}

#[derive(Serialize)]
struct ParentTypes<'a> {
    parent: &'a str,
    pci: Option<PciAddress>,
    types: &'a [MdevType],
}

/// Resolves `--gpu` to the parent(s) it names, or an error naming the value.
fn select<'a>(inv: &'a Inventory, gpu: Option<&str>) -> Result<Vec<&'a MdevParent>, CliError> {
    let Some(want) = gpu else {
        return Ok(inv.mdev_parents.iter().collect());
    };
    let addr = want.parse::<PciAddress>().ok();
    let looks_like_address = want.contains(':') || want.contains('.');
    if addr.is_none() && looks_like_address {
        return Err(CliError::BadArgument(format!(
            "--gpu {want:?} is not a PCI address: expected DDDD:BB:DD.F or BB:DD.F, e.g. 0000:3b:00.0"
        )));
    }
    let found: Vec<&MdevParent> = inv
        .mdev_parents
        .iter()
        .filter(|p| p.name == want || (addr.is_some() && p.pci == addr))
        .collect();
    if !found.is_empty() {
        return Ok(found);
    }
    let known_gpu = inv
        .gpus
        .iter()
        .find(|g| g.id == want || (addr.is_some() && g.pci == addr));
    if let Some(g) = known_gpu {
        // A GPU whose VFs are its parents lists each VF's types.
        let on_vfs = inv.gpu_parents(g);
        if !on_vfs.is_empty() {
            return Ok(on_vfs);
        }
        // A GPU without mdev types: an empty, truthful answer.
        return Ok(Vec::new());
    }
    Err(CliError::BadArgument(format!(
        "--gpu {want}: no such GPU or mdev parent on {}; `vgpuctl discover` lists them",
        inv.host
    )))
}

pub(super) fn types(
    host: &HostArgs,
    gpu: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let host = host.open()?;
    let inv = discover_host(host.as_ref())?;
    let parents = select(&inv, gpu)?;
    if json {
        let v: Vec<ParentTypes> = parents
            .iter()
            .map(|p| ParentTypes {
                parent: &p.name,
                pci: p.pci,
                types: &p.types,
            })
            .collect();
        return write_json(out, &v);
    }
    if parents.is_empty() {
        writeln!(
            out,
            "no mdev types{}",
            gpu.map(|g| format!(" on {g}")).unwrap_or_default()
        )?;
        return Ok(());
    }
    let mut t = Table::new(&[
        "PARENT",
        "TYPE",
        "NAME",
        "API",
        "AVAILABLE",
        "USED",
        "DETAILS",
    ]);
    for p in parents {
        for ty in &p.types {
            t.row(vec![
                p.name.clone(),
                ty.id.to_string(),
                ty.name.clone().unwrap_or_else(|| "-".into()),
                ty.device_api.clone(),
                ty.available_instances.to_string(),
                ty.instances.len().to_string(),
                details_text(ty),
            ]);
        }
    }
    write!(out, "{}", t.render())?;
    Ok(())
}
