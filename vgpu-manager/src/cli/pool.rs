//! `vgpuctl pool plan FILE`: what applying a pool would create, remove and keep on the selected host
//! (`--sim`, `--sysfs-root` or the live kernel). Nothing changes. Offline, VF slots a daemon holds are
//! unknown, so only mdev slots count as existing.

use std::io::Write;
use std::path::{Path, PathBuf};

use mdev_types::discover::discover as discover_host;

use super::profiles::catalog;
use super::{CliError, HostArgs, Table, write_json};
use crate::pool::{PoolPlan, Step, load_file, plan_pool};

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
}

pub(super) fn run(cmd: &PoolCommand, host: &HostArgs, out: &mut dyn Write) -> Result<(), CliError> {
    match cmd {
        PoolCommand::Plan {
            file,
            profiles_dir,
            json,
        } => plan(host, file, profiles_dir.as_deref(), *json, out),
    }
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
            Step::Remove { slot, gpu, holds } => t.row(vec![
                "remove".into(),
                format!("{}/{}", slot.profile, slot.index),
                slot.uuid.to_string(),
                gpu.clone(),
                "-".into(),
                holds.clone(),
            ]),
            Step::EnableVfs { gpu, num_vfs, .. } => t.row(vec![
                "enable-vfs".into(),
                "-".into(),
                "-".into(),
                gpu.clone(),
                "-".into(),
                format!("enable {num_vfs} SR-IOV VFs"),
            ]),
            Step::Create {
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
            k.holds.clone(),
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

    fn run(args: &[&str]) -> (i32, String, String) {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = crate::cli::run(args.iter().copied(), &mut out, &mut err);
        (
            code,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
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
