//! `vgpuctl migration info|fingerprint|check`: the host side of moving a running VM with a vGPU. `info`
//! opens the instance through VFIO as a VMM would and says what it supports of the kernel's migration
//! uAPI v2 (live kernel, root); `fingerprint` prints what must match on the target as JSON; `check`, run
//! on the target host, says whether that host can take it, and every reason when it cannot
//! (exit 1). See docs/migration.md.

use std::io::Write;
use std::path::PathBuf;

use mdev_types::ids::MdevUuid;
use vgpu_host::discover::discover;
use vgpu_vfio::{MigrationSupport, VfioTarget, migration_support};

use super::daemon_cmds::BusArgs;
use super::pool::with_daemon;
use super::preflight::BackendArg;
use super::{CliError, HostArgs, write_json};
use crate::migration::{Fingerprint, Verdict, check, fingerprint, retarget_domain_xml};
use vgpu_client::PrepareOptions;

/// `vgpuctl migration` commands.
#[derive(Debug, Clone, clap::Subcommand)]
pub(super) enum MigrationCommand {
    /// What a running instance supports of VFIO live migration (opens it through VFIO: root, live
    /// kernel; a VM using it makes it busy).
    Info {
        /// The instance's UUID.
        uuid: String,
        /// Which VFIO backend to open it through.
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendArg,
        /// Print JSON (docs/json.md).
        #[arg(long)]
        json: bool,
    },
    /// Print what must match on the target host (type, driver and its version, kernel, vendor
    /// parameters) as JSON, for `vgpuctl migration check --target FILE` there.
    Fingerprint {
        /// The instance's UUID.
        uuid: String,
    },
    /// On the target host, through vgpud: make the target instance for the VM that is to arrive
    /// (refused with every reason when it cannot load the state), held until `complete`, `abort` or
    /// its timeout. Prints its UUID and the <hostdev> for the target domain XML.
    Prepare {
        /// The fingerprint (JSON from `vgpuctl migration fingerprint` on the source); `-` reads stdin.
        #[arg(long, value_name = "FILE")]
        target: PathBuf,
        /// Only this GPU (PCI address or parent name).
        #[arg(long, value_name = "ADDR")]
        gpu: Option<String>,
        /// The target instance's UUID (default: a new random one).
        #[arg(long, value_name = "UUID")]
        uuid: Option<String>,
        /// Release it if no VM took it within this many seconds.
        #[arg(long, value_name = "SECS", default_value_t = 600,
              value_parser = clap::value_parser!(u32).range(1..=86_400))]
        timeout: u32,
        /// Prefer a GPU on this NUMA node (e.g. the node the VM's memory and vCPUs are pinned to on
        /// this host); another GPU that fits is used when none on the node does.
        #[arg(long, value_name = "N")]
        numa_node: Option<u32>,
        /// The source domain's XML (`virsh dumpxml --migratable DOMAIN`; `-` reads stdin): print
        /// the target domain XML for `virsh migrate --xml` (the source mdev's UUID replaced by the
        /// target's) instead of the <hostdev> alone; the summary goes to stderr.
        #[arg(long, value_name = "FILE")]
        domain_xml: Option<PathBuf>,
        /// Print JSON (docs/json.md).
        #[arg(long)]
        json: bool,
    },
    /// Release an incoming target (the migration was given up).
    Abort {
        /// The target instance's UUID.
        uuid: String,
    },
    /// Keep an incoming target as an ordinary instance (the migration succeeded).
    Complete {
        /// The target instance's UUID.
        uuid: String,
    },
    /// On the target host: whether it can take the instance a fingerprint describes; every reason
    /// when not (exit 1).
    Check {
        /// The fingerprint (JSON from `vgpuctl migration fingerprint`); `-` reads stdin.
        #[arg(long, value_name = "FILE")]
        target: PathBuf,
        /// Print JSON (docs/json.md).
        #[arg(long)]
        json: bool,
    },
}

fn parse_uuid(s: &str) -> Result<MdevUuid, CliError> {
    s.parse()
        .map_err(|e| CliError::BadArgument(format!("{s:?} is not an mdev UUID: {e}")))
}

/// Runs a migration command; `Ok(false)` when the answer is "no" (not migratable, does not fit).
pub(super) fn run(
    host: &HostArgs,
    bus: &BusArgs,
    cmd: &MigrationCommand,
    out: &mut dyn Write,
) -> Result<bool, CliError> {
    match cmd {
        MigrationCommand::Prepare {
            target,
            gpu,
            uuid,
            timeout,
            numa_node,
            domain_xml,
            json,
        } => {
            let text = read_fingerprint(target)?;
            // The domain XML is checked before anything is made.
            let source_xml = match domain_xml {
                Some(path) => Some(read_source_xml(path, &text, uuid.as_deref())?),
                None => None,
            };
            with_daemon(bus, |client| async move {
                let reply = client
                    .prepare_incoming_with(
                        &text,
                        &PrepareOptions {
                            gpu: gpu.as_deref(),
                            uuid: uuid.as_deref(),
                            timeout: Some(std::time::Duration::from_secs(u64::from(*timeout))),
                            numa_node: *numa_node,
                        },
                    )
                    .await?;
                let mut v: serde_json::Value = serde_json::from_str(&reply)
                    .map_err(|e| CliError::Host(format!("vgpud's PrepareIncoming reply: {e}")))?;
                let target_xml =
                    match &source_xml {
                        Some((xml, source)) => {
                            let made = v["uuid"].as_str().and_then(|u| u.parse().ok()).ok_or_else(
                                || {
                                    CliError::Host(format!(
                                        "vgpud's PrepareIncoming reply names no UUID: {v}"
                                    ))
                                },
                            )?;
                            Some(
                                retarget_domain_xml(xml, source, &made)
                                    .map_err(|e| CliError::BadArgument(e.to_string()))?,
                            )
                        }
                        None => None,
                    };
                if *json {
                    if let Some(x) = &target_xml {
                        v["domain_xml"] = serde_json::Value::String(x.clone());
                    }
                    return write_json(out, &v);
                }
                if let Some(x) = &target_xml {
                    let mut err = std::io::stderr();
                    print_prepared(&mut err, &v, false)?;
                    write!(out, "{x}")?;
                    return Ok(());
                }
                print_prepared(out, &v, true)?;
                Ok(())
            })?;
            Ok(true)
        }
        MigrationCommand::Abort { uuid } => {
            with_daemon(bus, |client| async move {
                client.abort_incoming(uuid).await?;
                writeln!(out, "released {uuid}")?;
                Ok(())
            })?;
            Ok(true)
        }
        MigrationCommand::Complete { uuid } => {
            with_daemon(bus, |client| async move {
                client.complete_incoming(uuid).await?;
                writeln!(out, "completed {uuid}: an ordinary instance now")?;
                Ok(())
            })?;
            Ok(true)
        }
        MigrationCommand::Info {
            uuid,
            backend,
            json,
        } => {
            let uuid = parse_uuid(uuid)?;
            if host.sim.is_some() || host.sysfs_root.is_some() {
                return Err(CliError::BadArgument(
                    "migration info opens the real VFIO device: it runs only on the live kernel (drop --sim/--sysfs-root)"
                        .into(),
                ));
            }
            let h = host.open()?;
            let support = migration_support(h.as_ref(), &VfioTarget::Mdev(uuid), backend.forced())
                .map_err(|e| CliError::Host(e.to_string()))?;
            print_support(out, &support, *json)?;
            Ok(support.migratable)
        }
        MigrationCommand::Fingerprint { uuid } => {
            let uuid = parse_uuid(uuid)?;
            let h = host.open()?;
            let fp = fingerprint(h.as_ref(), &uuid).map_err(|e| CliError::Host(e.to_string()))?;
            write_json(out, &fp)?;
            Ok(true)
        }
        MigrationCommand::Check { target, json } => {
            let text = read_fingerprint(target)?;
            let fp: Fingerprint = serde_json::from_str(&text).map_err(|e| {
                CliError::BadArgument(format!(
                    "{} is not a fingerprint of `vgpuctl migration fingerprint`: {e}",
                    target.display()
                ))
            })?;
            let h = host.open()?;
            let inv = discover(h.as_ref()).map_err(|e| CliError::Host(e.to_string()))?;
            let v = check(h.as_ref(), &inv, &fp);
            print_verdict(out, &v, *json)?;
            Ok(v.fits)
        }
    }
}

/// Prints `PrepareIncoming`'s reply `v`: the summary line, the `<hostdev>` when `hostdev`, the notes.
fn print_prepared(
    out: &mut dyn Write,
    v: &serde_json::Value,
    hostdev: bool,
) -> Result<(), CliError> {
    let numa = match v["numa_node"].as_u64() {
        Some(n) => format!(", NUMA node {n}"),
        None => String::new(),
    };
    writeln!(
        out,
        "incoming {} ({} on {}{numa}) for source {}, released at {} unless completed",
        v["uuid"].as_str().unwrap_or("?"),
        v["type"].as_str().unwrap_or("?"),
        v["parent"].as_str().unwrap_or("?"),
        v["source"].as_str().unwrap_or("?"),
        v["until"]
    )?;
    if hostdev {
        write!(out, "{}", v["hostdev_xml"].as_str().unwrap_or(""))?;
    }
    for n in v["notes"].as_array().into_iter().flatten() {
        writeln!(out, "note: {}", n.as_str().unwrap_or(""))?;
    }
    Ok(())
}

/// The source domain XML at `path` (`-`: stdin) and the fingerprint's source UUID, checked to be
/// rewritable (it has that mdev, and not the requested target UUID) before anything is made.
fn read_source_xml(
    path: &std::path::Path,
    fingerprint: &str,
    target: Option<&str>,
) -> Result<(String, MdevUuid), CliError> {
    let fp: Fingerprint = serde_json::from_str(fingerprint).map_err(|e| {
        CliError::BadArgument(format!(
            "the fingerprint is not the JSON of `vgpuctl migration fingerprint`: {e}"
        ))
    })?;
    let xml = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())?
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| CliError::BadArgument(format!("cannot read {}: {e}", path.display())))?
    };
    let probe = match target {
        Some(t) => parse_uuid(t)?,
        None => MdevUuid::new_random(),
    };
    retarget_domain_xml(&xml, &fp.uuid, &probe)
        .map_err(|e| CliError::BadArgument(format!("{}: {e}", path.display())))?;
    Ok((xml, fp.uuid))
}

/// The fingerprint file's text (`-`: stdin).
fn read_fingerprint(target: &std::path::Path) -> Result<String, CliError> {
    if target.as_os_str() == "-" {
        Ok(std::io::read_to_string(std::io::stdin())?)
    } else {
        std::fs::read_to_string(target)
            .map_err(|e| CliError::BadArgument(format!("cannot read {}: {e}", target.display())))
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn print_support(out: &mut dyn Write, s: &MigrationSupport, json: bool) -> Result<(), CliError> {
    if json {
        return write_json(out, s);
    }
    writeln!(
        out,
        "{}: {} (opened through {})",
        s.target,
        if s.migratable {
            "can be live-migrated"
        } else {
            "cannot be live-migrated"
        },
        s.backend
    )?;
    if let Some(r) = &s.reason {
        writeln!(out, "  why: {r}")?;
    }
    if let Some(c) = &s.caps {
        writeln!(out, "  stop-copy:      {}", yes(c.stop_copy))?;
        writeln!(out, "  pre-copy:       {}", yes(c.pre_copy))?;
        writeln!(out, "  P2P:            {}", yes(c.p2p))?;
        writeln!(out, "  dirty logging:  {}", yes(c.dirty_logging))?;
        match c.dirty_log_reports {
            Some(true) => writeln!(out, "  dirty log read: yes")?,
            Some(false) => writeln!(out, "  dirty log read: no")?,
            None if c.dirty_logging => writeln!(out, "  dirty log read: not tried")?,
            None => {}
        }
        match c.stop_copy_bytes {
            Some(n) => writeln!(out, "  stop-copy data: {n} bytes")?,
            None => writeln!(out, "  stop-copy data: not reported")?,
        }
    }
    for w in &s.warnings {
        writeln!(out, "  warning: {w}")?;
    }
    if s.migratable {
        writeln!(
            out,
            "  needs: QEMU >= 8.1 (vfio-pci `enable-migration=on`, the default where the device supports it); post-copy is not supported with VFIO devices: use pre-copy (`virsh migrate --live`, no --postcopy)"
        )?;
    }
    Ok(())
}

fn print_verdict(out: &mut dyn Write, v: &Verdict, json: bool) -> Result<(), CliError> {
    if json {
        return write_json(out, v);
    }
    writeln!(
        out,
        "{}: {}",
        v.type_id,
        if v.fits {
            "this host can take it"
        } else {
            "this host cannot take it"
        }
    )?;
    for r in &v.reasons {
        writeln!(out, "  - {r}")?;
    }
    for c in &v.candidates {
        if c.problems.is_empty() {
            writeln!(
                out,
                "  {}: fits ({} more can be created)",
                c.parent, c.available
            )?;
        } else {
            for p in &c.problems {
                writeln!(out, "  {}: {p}", c.parent)?;
            }
        }
    }
    for n in &v.notes {
        writeln!(out, "  note: {n}")?;
    }
    Ok(())
}
