//! `vgpuctl match PROFILE`, `vgpuctl profiles list`, `vgpuctl profiles check FILE…`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;
use vgpu_host::discover::discover as discover_host;

use super::{CliError, HostArgs, Table, write_json};
use crate::profile::reason::fmt_mib;
use crate::profile::{Catalog, MatchReport, Profile, check_files, match_profile};

/// The catalog: the shipped profiles, overlaid with a directory's when given.
pub(super) fn catalog(dir: Option<&Path>) -> Result<Catalog, CliError> {
    let builtin = Catalog::builtin().map_err(|e| CliError::Profile(e.to_string()))?;
    match dir {
        None => Ok(builtin),
        Some(d) => {
            let extra = Catalog::load_dir(d).map_err(|e| CliError::Profile(e.to_string()))?;
            Ok(builtin.overlay(extra))
        }
    }
}

fn profile_row(p: &Profile) -> Vec<String> {
    let list = |v: Vec<&str>| v.join(",");
    vec![
        p.name.clone(),
        p.class.as_str().to_string(),
        if p.framebuffer_mib == 0 {
            "-".into()
        } else {
            fmt_mib(p.framebuffer_mib)
        },
        p.heads.to_string(),
        p.max_resolution
            .map(|r| r.to_string())
            .unwrap_or_else(|| "-".into()),
        p.weight.to_string(),
        list(p.vendors.iter().map(|v| v.as_str()).collect()),
        list(p.backends.iter().map(|b| b.as_str()).collect()),
    ]
}

pub(super) fn list(dir: Option<&Path>, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let cat = catalog(dir)?;
    if json {
        return write_json(out, &cat.profiles());
    }
    let mut t = Table::new(&[
        "PROFILE",
        "CLASS",
        "FRAMEBUFFER",
        "HEADS",
        "RESOLUTION",
        "WEIGHT",
        "VENDORS",
        "BACKENDS",
    ]);
    for p in cat.profiles() {
        t.row(profile_row(p));
    }
    write!(out, "{}", t.render())?;
    Ok(())
}

#[derive(Serialize)]
struct CheckResult {
    file: PathBuf,
    ok: bool,
    profile: Option<String>,
    error: Option<String>,
}

pub(super) fn check(files: &[PathBuf], json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let results: Vec<CheckResult> = files
        .iter()
        .zip(check_files(files))
        .map(|(f, r)| match r {
            Ok(p) => CheckResult {
                file: f.clone(),
                ok: true,
                profile: Some(p.name),
                error: None,
            },
            Err(e) => CheckResult {
                file: f.clone(),
                ok: false,
                profile: None,
                error: Some(e.to_string().trim_end().to_string()),
            },
        })
        .collect();
    let failed = results.iter().filter(|r| !r.ok).count();
    if json {
        write_json(out, &results)?;
    } else {
        for r in &results {
            match (&r.profile, &r.error) {
                (Some(name), _) => writeln!(out, "ok     {}: profile {name}", r.file.display())?,
                (_, Some(e)) => writeln!(out, "error  {e}")?,
                _ => {}
            }
        }
    }
    if failed > 0 {
        return Err(CliError::Profile(format!(
            "{failed} of {} profile file(s) are invalid (see above)",
            results.len()
        )));
    }
    Ok(())
}

pub(super) fn render_match(r: &MatchReport) -> String {
    let mut s = format!("profile {} on {}\n\n", r.profile, r.host);
    let mut t = Table::new(&[
        "GPU",
        "MODEL",
        "NUMA",
        "BEST OPTION",
        "FRAMEBUFFER",
        "CAPACITY",
    ]);
    let mut refusals = Vec::new();
    for g in &r.gpus {
        let numa = g
            .numa_node
            .map(|n| n.to_string())
            .unwrap_or_else(|| "-".into());
        match &g.best {
            Some(o) => t.row(vec![
                g.gpu.clone(),
                g.model.clone(),
                numa,
                o.target.to_string(),
                o.framebuffer_mib.map(fmt_mib).unwrap_or_else(|| "-".into()),
                o.capacity.to_string(),
            ]),
            None => {
                t.row(vec![
                    g.gpu.clone(),
                    g.model.clone(),
                    numa,
                    "cannot serve (see below)".into(),
                ]);
                // The closest misses; `--json` has all of them.
                let mut why: Vec<String> =
                    g.refused.iter().take(3).map(|r| r.to_string()).collect();
                if g.refused.len() > 3 {
                    why.push(format!("{} more with --json", g.refused.len() - 3));
                }
                refusals.push(format!("  {}: {}\n", g.gpu, why.join(" | ")));
            }
        }
    }
    s.push_str(&t.render());
    if !refusals.is_empty() {
        s.push('\n');
        s.push_str(&refusals.concat());
    }
    let servable = r.servable().count();
    s.push_str(&format!(
        "\n{servable} of {} GPU(s) can serve {}\n",
        r.gpus.len(),
        r.profile
    ));
    s
}

pub(super) fn matching(
    host: &HostArgs,
    profile: &str,
    dir: Option<&Path>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let cat = catalog(dir)?;
    let profile = cat
        .resolve(profile)
        .map_err(|e| CliError::Profile(e.to_string()))?;
    let host = host.open()?;
    let inv = discover_host(host.as_ref())?;
    let report = match_profile(&profile, &inv);
    if json {
        return write_json(out, &report);
    }
    write!(out, "{}", render_match(&report))?;
    Ok(())
}
