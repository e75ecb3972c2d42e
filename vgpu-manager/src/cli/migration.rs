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

use super::preflight::BackendArg;
use super::{CliError, HostArgs, write_json};
use crate::migration::{Fingerprint, Verdict, check, fingerprint};

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
    cmd: &MigrationCommand,
    out: &mut dyn Write,
) -> Result<bool, CliError> {
    match cmd {
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
            let text = if target.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                std::fs::read_to_string(target).map_err(|e| {
                    CliError::BadArgument(format!("cannot read {}: {e}", target.display()))
                })?
            };
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
        match c.stop_copy_bytes {
            Some(n) => writeln!(out, "  stop-copy data: {n} bytes")?,
            None => writeln!(out, "  stop-copy data: not reported")?,
        }
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
