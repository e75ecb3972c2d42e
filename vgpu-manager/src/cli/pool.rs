//! `vgpuctl pool plan FILE`: what applying a pool would create, remove and keep on the selected host
//! (`--sim`, `--sysfs-root` or the live kernel). Nothing changes. Offline, VF slots a daemon holds are
//! unknown, so only mdev slots count as existing.
//!
//! `vgpuctl pool apply FILE` and `vgpuctl pool status` go through vgpud (`--bus`): apply sends the
//! file's text to Manager1 `Apply`, shows its `PoolProgress` signals (a bar on a terminal, one line per
//! step otherwise, nothing with `--json`), then a summary. `vgpuctl pool remove NAME` has vgpud give
//! back every slot of a pool and forget it (Manager1 `RemovePool`).

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use vgpu_client::{BusAddress, Client, PoolGpu, PoolProgress, PoolStatus, PoolSummary, SlotRow};
use vgpu_host::discover::discover as discover_host;

use super::daemon_cmds::BusArgs;
use super::profiles::catalog;
use super::{CliError, HostArgs, Table, write_json};
use crate::pool::{PoolPlan, PoolStep, load_file, plan_pool};

/// `vgpuctl pool …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum PoolCommand {
    /// Dry run: what applying the pool in FILE would create, remove and keep (nothing changes).
    Plan {
        /// The pool file (TOML).
        file: PathBuf,
        /// Also load the profiles in this directory (overriding shipped ones with the same name).
        #[arg(long, value_name = "DIR")]
        profiles_dir: Option<PathBuf>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Make the host match the pool in FILE through vgpud: progress, then a summary. Applying twice
    /// changes nothing; a pool that does not fit is refused with the shortfall, before any change.
    Apply {
        /// The pool file (TOML); vgpud checks it against its own profiles.
        file: PathBuf,
        /// Print the summary as JSON (and no progress).
        #[arg(long)]
        json: bool,
    },
    /// Give back every slot of pool NAME through vgpud (mdev instances destroyed, VFs released) and
    /// forget the pool; a pool vgpud does not know changes nothing.
    Remove {
        /// The pool's name.
        name: String,
        /// Print what was removed as JSON.
        #[arg(long)]
        json: bool,
    },
    /// The pools vgpud has applied and the state of their slots.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

pub(super) fn run(
    cmd: &PoolCommand,
    host: &HostArgs,
    bus: &BusArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match cmd {
        PoolCommand::Plan {
            file,
            profiles_dir,
            json,
        } => plan(host, file, profiles_dir.as_deref(), *json, out),
        PoolCommand::Apply { file, json } => {
            let text = std::fs::read_to_string(file).map_err(|e| {
                CliError::BadArgument(format!("{}: cannot read pool file: {e}", file.display()))
            })?;
            with_daemon(bus, |client| async move {
                let summary = apply(&client, &text, *json, out).await?;
                if *json {
                    write_json(out, &summary)
                } else {
                    write!(out, "{}", render_summary(&summary))?;
                    Ok(())
                }
            })
        }
        PoolCommand::Remove { name, json } => with_daemon(bus, |client| async move {
            let r = client.remove_pool(name).await?;
            if *json {
                write_json(out, &r)
            } else if r.applied || !r.removed.is_empty() {
                writeln!(
                    out,
                    "pool {} removed: {} slot(s) given back{}",
                    r.pool,
                    r.removed.len(),
                    if r.removed.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", r.removed.join(", "))
                    }
                )?;
                Ok(())
            } else {
                writeln!(out, "vgpud has no pool {}: nothing to remove", r.pool)?;
                Ok(())
            }
        }),
        PoolCommand::Status { json } => with_daemon(bus, |client| async move {
            let status: Vec<PoolStatus> = client.pool_status().await?;
            if *json {
                write_json(out, &status)
            } else {
                write!(out, "{}", render_status(&status))?;
                Ok(())
            }
        }),
    }
}

/// Runs `f` with a client of vgpud on `bus` in a one-thread runtime.
pub(super) fn with_daemon<'a, F, Fut>(bus: &BusArgs, f: F) -> Result<(), CliError>
where
    F: FnOnce(Client) -> Fut,
    Fut: std::future::Future<Output = Result<(), CliError>> + 'a,
{
    let bus: BusAddress = bus.bus.parse()?;
    let rt = vgpu_client::runtime()?;
    rt.block_on(async { f(Client::connect_unchecked(&bus).await?).await })
}

/// One progress line (or bar) for step `done` of `total`.
fn progress_line(done: u32, total: u32, step: &str, bar: bool) -> String {
    if !bar {
        return format!("[{done}/{total}] {step}\n");
    }
    const WIDTH: u32 = 30;
    let filled = (done.min(total) * WIDTH)
        .checked_div(total)
        .unwrap_or(WIDTH);
    // Padded to a fixed width so a shorter step overwrites all of a longer one.
    let mut step: String = step.chars().take(60).collect();
    let shown = step.chars().count();
    step.push_str(&" ".repeat(60 - shown));
    format!(
        "\r[{}{}] {done}/{total} {step}",
        "#".repeat(filled as usize),
        ".".repeat((WIDTH - filled) as usize)
    )
}

/// Calls `Apply` with `text`, showing the `PoolProgress` signals as they come (unless `quiet`).
async fn apply(
    client: &Client,
    text: &str,
    quiet: bool,
    out: &mut dyn Write,
) -> Result<PoolSummary, CliError> {
    let bar = !quiet && std::io::stdout().is_terminal();
    let mut shown = false;
    let summary = client
        .apply_pool(text, |p: PoolProgress<'_>| {
            if quiet {
                return Ok::<(), CliError>(());
            }
            write!(out, "{}", progress_line(p.done, p.total, p.step, bar))?;
            out.flush()?;
            shown = true;
            Ok(())
        })
        .await;
    if bar && shown {
        writeln!(out)?;
    }
    summary
}

fn opt(s: Option<&str>) -> String {
    s.unwrap_or("-").to_string()
}

fn gpu_rows(gpus: &[PoolGpu]) -> Table {
    let mut t = Table::new(&["GPU", "MODEL", "NUMA", "SLOTS", "PROFILES"]);
    for g in gpus {
        let n: u32 = g.profiles.values().sum();
        let profiles: Vec<String> = g
            .profiles
            .iter()
            .map(|(p, n)| format!("{n} × {p}"))
            .collect();
        t.row(vec![
            g.gpu.clone(),
            g.model.clone(),
            numa(g.numa_node),
            n.to_string(),
            profiles.join(", "),
        ]);
    }
    t
}

fn slot_rows(slots: &[SlotRow]) -> Table {
    let mut t = Table::new(&["SLOT", "UUID", "GPU", "NUMA", "TYPE", "STATE"]);
    for s in slots {
        t.row(vec![
            format!("{}/{}", s.profile, s.index),
            s.uuid.clone(),
            opt(s.gpu.as_deref()),
            numa(s.numa_node),
            opt(s.type_id.as_deref()),
            match &s.fault {
                Some(f) => format!("{} (GPU faulted: {f})", s.state),
                None => s.state.clone(),
            },
        ]);
    }
    t
}

/// The human form of an apply: what changed, then the placement per GPU and per slot.
fn render_summary(s: &PoolSummary) -> String {
    let mut o = if s.changed {
        format!(
            "pool {} applied on {}: {} created, {} removed, {} kept\n",
            s.pool,
            s.host,
            s.created.len(),
            s.removed.len(),
            s.kept
        )
    } else {
        format!(
            "pool {} on {}: already applied, nothing changed ({} slots kept)\n",
            s.pool, s.host, s.kept
        )
    };
    if !s.gpus.is_empty() {
        o.push('\n');
        o.push_str(&gpu_rows(&s.gpus).render());
    }
    // Unchanged slots are what `pool status` shows; after a change, show where each one went.
    if s.changed {
        o.push('\n');
        o.push_str(&slot_rows(&s.slots).render());
    }
    o
}

/// The human form of `pool status`.
fn render_status(pools: &[PoolStatus]) -> String {
    if pools.is_empty() {
        return "no pools applied (apply one with `vgpuctl pool apply FILE`)\n".into();
    }
    let mut o = String::new();
    for (i, p) in pools.iter().enumerate() {
        if i > 0 {
            o.push('\n');
        }
        let running = p.slots.iter().filter(|s| s.state == "running").count();
        o.push_str(&format!(
            "pool {}{} (policy {}, autostart {}): {running} of {} slots running{}\n\n",
            p.pool,
            if p.description.is_empty() {
                String::new()
            } else {
                format!(" — {}", p.description)
            },
            p.policy,
            if p.autostart { "on" } else { "off" },
            p.slots.len(),
            if p.in_sync {
                ""
            } else {
                "; apply it again to converge"
            }
        ));
        if !p.gpus.is_empty() {
            o.push_str(&gpu_rows(&p.gpus).render());
            o.push('\n');
        }
        o.push_str(&slot_rows(&p.slots).render());
    }
    o
}

fn plan(
    host: &HostArgs,
    file: &Path,
    dir: Option<&Path>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let cat = catalog(dir)?;
    let pool = load_file(file, &cat).map_err(|e| CliError::BadArgument(e.to_string()))?;
    let host = host.open()?;
    let inv = discover_host(host.as_ref())?;
    let plan =
        plan_pool(&pool, &cat, &inv, &[]).map_err(|e| CliError::BadArgument(e.to_string()))?;
    if json {
        return write_json(out, &plan);
    }
    write!(out, "{}", render(&plan))?;
    Ok(())
}

fn numa(n: Option<u32>) -> String {
    n.map_or_else(|| "-".into(), |n| n.to_string())
}

/// The human form: steps, kept slots, load per GPU, a summary and any shortfall.
pub(super) fn render(p: &PoolPlan) -> String {
    let mut s = format!(
        "pool {} on {} (policy {})\n\n",
        p.pool,
        p.host,
        p.policy.as_str()
    );
    let mut t = Table::new(&["ACTION", "SLOT", "UUID", "GPU", "NUMA", "WHAT"]);
    for step in &p.steps {
        match step {
            PoolStep::Remove { slot, gpu, holds } => t.row(vec![
                "remove".into(),
                format!("{}/{}", slot.profile, slot.index),
                slot.uuid.to_string(),
                gpu.clone(),
                "-".into(),
                holds.clone(),
            ]),
            PoolStep::EnableVfs { gpu, num_vfs, .. } => t.row(vec![
                "enable-vfs".into(),
                "-".into(),
                "-".into(),
                gpu.clone(),
                "-".into(),
                format!("enable {num_vfs} SR-IOV VFs"),
            ]),
            PoolStep::Create {
                slot,
                gpu,
                numa_node,
                target,
                start,
            } => t.row(vec![
                "create".into(),
                format!("{}/{}", slot.profile, slot.index),
                slot.uuid.to_string(),
                gpu.clone(),
                numa(*numa_node),
                match start {
                    Some(st) => format!("{target} at slice {st}"),
                    None => target.to_string(),
                },
            ]),
        }
    }
    for k in &p.keep {
        t.row(vec![
            "keep".into(),
            format!("{}/{}", k.slot.profile, k.slot.index),
            k.slot.uuid.to_string(),
            k.gpu.clone(),
            "-".into(),
            match &k.fault {
                Some(f) => format!("{} (kept as is: GPU faulted: {f})", k.holds),
                None => k.holds.clone(),
            },
        ]);
    }
    if t.is_empty() {
        s.push_str("nothing to do\n");
    } else {
        s.push_str(&t.render());
    }
    if !p.gpus.is_empty() {
        let mut g = Table::new(&["GPU", "MODEL", "NUMA", "KEPT", "NEW"]);
        for l in &p.gpus {
            g.row(vec![
                l.gpu.clone(),
                l.model.clone(),
                numa(l.numa_node),
                l.kept.to_string(),
                l.created.to_string(),
            ]);
        }
        s.push('\n');
        s.push_str(&g.render());
    }
    s.push_str(&format!(
        "\n{} to create, {} to remove, {} kept",
        p.creates(),
        p.removes(),
        p.keep.len()
    ));
    if p.shortfall.is_empty() {
        s.push_str("; every slot placed\n");
    } else {
        s.push_str("; short:\n");
        for x in &p.shortfall {
            s.push_str(&format!(
                "  {}: {} of {} placed, {} missing: {}\n",
                x.profile, x.placed, x.wanted, x.missing, x.reason
            ));
        }
        if !p.proven_optimal {
            s.push_str("  (the search budget ran out: more may fit)\n");
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// `vgpuctl` with `args` (which start with the program name, as `argv` does).
    fn run(args: &[&str]) -> (i32, String, String) {
        crate::cli::run_for_test(&args[1..])
    }

    fn pool_file(name: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../data/pools.d")
            .join(name)
            .display()
            .to_string()
    }

    #[test]
    fn plan_prints_steps_load_and_summary() {
        let f = pool_file("vdi-floor.toml");
        let (code, out, err) = run(&["vgpuctl", "--sim", "demo", "pool", "plan", &f]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("pool vdi-floor on simulated host 'demo' (policy consolidate)"));
        assert!(out.contains("enable 8 SR-IOV VFs"), "{out}");
        assert!(
            out.contains("44 to create, 0 to remove, 0 kept; every slot placed"),
            "{out}"
        );
        let (code, out, _) = run(&["vgpuctl", "--sim", "demo", "pool", "plan", &f, "--json"]);
        assert_eq!(code, 0);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["pool"], "vdi-floor");
        assert_eq!(v["steps"].as_array().unwrap().len(), 45);
        assert_eq!(v["steps"][0]["action"], "enable-vfs");
        assert_eq!(v["steps"][1]["action"], "create");
        assert!(v["steps"][1]["slot"]["uuid"].is_string());
    }

    #[test]
    fn errors_are_one_line_with_exit_code_2() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, "name = \"x\"\n[profiles]\nvdi-2g = -1\n").unwrap();
        let (code, out, err) = run(&[
            "vgpuctl",
            "--sim",
            "demo",
            "pool",
            "plan",
            bad.to_str().unwrap(),
        ]);
        assert_eq!((code, out.as_str()), (2, ""));
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("bad.toml:3: field `profiles` gives vdi-2g = -1"),
            "{err}"
        );
        let (code, _, err) = run(&[
            "vgpuctl",
            "--sim",
            "demo",
            "pool",
            "plan",
            "/nonexistent.toml",
        ]);
        assert_eq!(code, 2);
        assert!(
            err.starts_with("vgpuctl: /nonexistent.toml: cannot read pool file"),
            "{err}"
        );
    }
}
