//! `vgpuctl sched plan|apply|show`: time-slice scheduling of one GPU, offline over the selected host
//! (`--sim`, `--sysfs-root`, or the live kernel). JSON shapes are in docs/json.md.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;
use vgpu_host::discover::discover as discover_host;

use super::{CliError, HostArgs, Table, write_json};
use crate::backend::{Backend, BackendError, detect, detect_gpu};
use crate::profile::Priority;
use crate::sched::{
    ApplyReport, PlanOptions, SchedPlan, SchedRequest, SchedState, Setting, SettingTarget,
    TakesEffect, pct,
};

/// `vgpuctl sched …`.
#[derive(Debug, clap::Subcommand)]
pub(super) enum SchedCommand {
    /// Compute a GPU's scheduling plan: what each vGPU gets and what would be programmed.
    Plan(SchedArgs),
    /// Compute the plan and program it: sysfs now, modprobe/driver configuration printed as pending.
    Apply(SchedArgs),
    /// Show the scheduling programmed now, per GPU.
    Show {
        /// Only this GPU (PCI address or mdev parent name).
        #[arg(long, value_name = "ADDR")]
        gpu: Option<String>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
}

/// The host, the GPU's backend, and the plan.
type Planned = (
    std::sync::Arc<dyn vgpu_host::Host>,
    Box<dyn Backend>,
    SchedPlan,
);

/// What to plan for.
#[derive(Debug, clap::Args)]
pub(super) struct SchedArgs {
    /// The GPU (PCI address such as 0000:03:00.0 or 03:00.0, or an mdev parent name).
    #[arg(long, value_name = "ADDR")]
    gpu: String,
    /// Weights of the vGPUs that run on the GPU, comma-separated: `W`, `W:PRIORITY` or
    /// `SLOT=W[:PRIORITY]` (SLOT as `vgpuctl sched show` names it, e.g. vf2). Default: weight 1 for
    /// every vGPU that exists.
    #[arg(long, value_delimiter = ',', value_name = "W[:PRIO]")]
    weights: Vec<String>,
    /// One vGPU with this profile's weight, priority and framebuffer; repeat for more.
    #[arg(long, value_name = "NAME")]
    profile: Vec<String>,
    /// Also load the profiles in this directory.
    #[arg(long, value_name = "DIR")]
    profiles_dir: Option<PathBuf>,
    /// Round length to aim for, ms (per-VF quantum schedulers; default the vendor's).
    #[arg(long, value_name = "MS")]
    period_ms: Option<u32>,
    /// Time slice, ms (schedulers with one slice for all vGPUs; default the vendor's).
    #[arg(long, value_name = "MS")]
    time_slice_ms: Option<u32>,
    /// Keep each vGPU's share even while others are idle (NVIDIA fixed share, GIM solid).
    #[arg(long)]
    reserve: bool,
    /// Largest acceptable difference between requested and effective share, in percent.
    #[arg(long, value_name = "PERCENT", default_value_t = 1.0)]
    tolerance: f64,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
}

fn be(e: BackendError) -> CliError {
    CliError::BadArgument(e.to_string())
}

/// Parses one `--weights` item.
fn parse_weight(item: &str) -> Result<SchedRequest, CliError> {
    let bad = |why: &str| {
        CliError::BadArgument(format!(
            "--weights {item:?}: {why}; expected W, W:PRIORITY or SLOT=W[:PRIORITY] with W from 1 to 100 and PRIORITY low, normal or high"
        ))
    };
    let (slot, rest) = match item.split_once('=') {
        Some((s, r)) if !s.trim().is_empty() => (Some(s.trim().to_string()), r),
        Some(_) => return Err(bad("the slot name is empty")),
        None => (None, item),
    };
    let (w, prio) = match rest.split_once(':') {
        Some((w, p)) => (w, Some(p.trim())),
        None => (rest, None),
    };
    let weight = w
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|w| (1..=100).contains(w))
        .ok_or_else(|| bad("the weight is not a whole number from 1 to 100"))?;
    let priority = match prio {
        None => None,
        Some(p) => Some(p.parse::<Priority>().map_err(|_| bad("unknown priority"))?),
    };
    Ok(SchedRequest {
        slot,
        priority,
        ..SchedRequest::weight(weight)
    })
}

impl SchedArgs {
    fn options(&self) -> Result<PlanOptions, CliError> {
        if !(self.tolerance > 0.0 && self.tolerance <= 100.0) {
            return Err(CliError::BadArgument(format!(
                "--tolerance {}: give a percentage above 0 and at most 100, e.g. 1",
                self.tolerance
            )));
        }
        Ok(PlanOptions {
            period_ms: self.period_ms,
            time_slice_ms: self.time_slice_ms,
            reserve: self.reserve,
            tolerance: self.tolerance / 100.0,
        })
    }

    fn requests(&self, b: &dyn Backend) -> Result<Vec<SchedRequest>, CliError> {
        let mut reqs: Vec<SchedRequest> = self
            .weights
            .iter()
            .map(|w| parse_weight(w))
            .collect::<Result<_, _>>()?;
        if !self.profile.is_empty() {
            let cat = super::profiles::catalog(self.profiles_dir.as_deref())?;
            for name in &self.profile {
                let p = cat
                    .resolve(name)
                    .map_err(|e| CliError::Profile(e.to_string()))?;
                reqs.push(SchedRequest::from_profile(&p));
            }
        }
        if reqs.is_empty() {
            reqs = b.default_requests();
        }
        if reqs.is_empty() {
            return Err(CliError::BadArgument(format!(
                "{} has no vGPU yet: say what will run with --weights (e.g. --weights 10,30) or --profile NAME",
                b.gpu()
            )));
        }
        Ok(reqs)
    }

    fn plan(&self, host: &HostArgs) -> Result<Planned, CliError> {
        let h = host.open()?;
        let inv = discover_host(h.as_ref())?;
        let b = detect_gpu(h.as_ref(), &inv, &self.gpu).map_err(be)?;
        let plan = b.plan(&self.requests(b.as_ref())?, &self.options()?);
        Ok((h, b, plan))
    }
}

pub(super) fn run(
    cmd: &SchedCommand,
    host: &HostArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match cmd {
        SchedCommand::Plan(a) => {
            let (_, _, plan) = a.plan(host)?;
            if a.json {
                return write_json(out, &plan);
            }
            write!(out, "{}", render_plan(&plan))?;
            Ok(())
        }
        SchedCommand::Apply(a) => {
            let (h, b, plan) = a.plan(host)?;
            let report = b.apply(h.as_ref(), &plan).map_err(be)?;
            if a.json {
                return write_json(out, &report);
            }
            write!(out, "{}", render_apply(&report))?;
            Ok(())
        }
        SchedCommand::Show { gpu, json } => show(host, gpu.as_deref(), *json, out),
    }
}

/// One GPU in `sched show --json`.
#[derive(Serialize)]
struct ShowEntry {
    gpu: String,
    backend: Option<String>,
    state: Option<SchedState>,
    reason: Option<String>,
}

fn show(
    host: &HostArgs,
    gpu: Option<&str>,
    json: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let h = host.open()?;
    let inv = discover_host(h.as_ref())?;
    let mut entries = Vec::new();
    match gpu {
        Some(g) => {
            let b = detect_gpu(h.as_ref(), &inv, g).map_err(be)?;
            entries.push(ShowEntry {
                gpu: b.gpu().to_string(),
                backend: Some(b.kind().to_string()),
                state: Some(b.read_back(h.as_ref()).map_err(be)?),
                reason: None,
            });
        }
        None => {
            for d in detect(h.as_ref(), &inv).map_err(be)? {
                let state = match &d.backend {
                    Some(b) => Some(b.read_back(h.as_ref()).map_err(be)?),
                    None => None,
                };
                entries.push(ShowEntry {
                    backend: d.backend.as_ref().map(|b| b.kind().to_string()),
                    gpu: d.gpu,
                    state,
                    reason: d.why_none,
                });
            }
        }
    }
    if json {
        return write_json(out, &entries);
    }
    let mut s = String::new();
    for e in &entries {
        match (&e.state, &e.reason) {
            (Some(st), _) => s.push_str(&render_state(st)),
            (None, reason) => s.push_str(&format!(
                "GPU {}: no vGPU backend: {}\n",
                e.gpu,
                reason.as_deref().unwrap_or("-")
            )),
        }
        s.push('\n');
    }
    write!(out, "{}", s.trim_end_matches('\n'))?;
    writeln!(out)?;
    Ok(())
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|x| x.to_string()).unwrap_or_else(|| "-".into())
}

/// Where a setting goes and when, in a line.
fn setting_line(s: &Setting) -> String {
    let when = match s.takes_effect {
        TakesEffect::Now => "now",
        TakesEffect::ModuleLoad => "at the next module load",
        TakesEffect::AtCreate => "when the vGPU is created",
    };
    match &s.target {
        SettingTarget::Sysfs { path } => format!("{path} = {} ({when})", s.value),
        SettingTarget::ModuleOption { module, option } => {
            format!(
                "modprobe.d: options {module} {option}=\"{}\" ({when})",
                s.value
            )
        }
        SettingTarget::ConfigFile { path, key } => format!("{path}: {key}={} ({when})", s.value),
    }
}

/// The human report of `sched plan`.
pub(super) fn render_plan(p: &SchedPlan) -> String {
    let mut s = format!("GPU {} ({}): {}\n", p.gpu, p.backend, p.policy);
    let ms = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x} ms"));
    s.push_str(&format!(
        "round {}, worst-case wait {}, largest error {} (tolerance {})\n\n",
        ms(p.period_ms),
        ms(p.worst_case_wait_ms),
        pct(p.max_error),
        pct(p.tolerance)
    ));
    let mut t = Table::new(&[
        "SLOT",
        "DEVICE",
        "WEIGHT",
        "PRIORITY",
        "REQUESTED",
        "EFFECTIVE",
        "ERROR",
        "QUANTUM",
        "PREEMPT",
        "TYPE",
    ]);
    for x in &p.slots {
        t.row(vec![
            x.slot.clone(),
            opt(x.device.as_deref()),
            x.weight.to_string(),
            x.priority.map_or("-".into(), |p| p.as_str().to_string()),
            pct(x.requested_share),
            x.effective_share.map_or("-".into(), pct),
            x.error.map_or("-".into(), |e| format!("{:+.2}", e * 100.0)),
            x.quantum_ms.map_or("-".into(), |q| format!("{q} ms")),
            x.preempt_timeout_us
                .map_or("-".into(), |u| format!("{u} us")),
            opt(x.mdev_type.as_deref()),
        ]);
    }
    s.push_str(&t.render());
    let list = |title: &str, items: Vec<String>| -> String {
        if items.is_empty() {
            String::new()
        } else {
            format!(
                "\n{title}:\n{}",
                items.iter().map(|i| format!("  {i}\n")).collect::<String>()
            )
        }
    };
    s.push_str(&list(
        "settings",
        p.settings.iter().map(setting_line).collect(),
    ));
    s.push_str(&list("notes", p.notes.clone()));
    s.push_str(&list(
        "refused (apply will not program this plan)",
        p.refusals
            .iter()
            .map(|r| match &r.slot {
                Some(slot) => format!("{slot}: {} [{}]", r.reason, r.code),
                None => format!("{} [{}]", r.reason, r.code),
            })
            .collect(),
    ));
    s
}

/// The human report of `sched show` for one GPU.
pub(super) fn render_state(st: &SchedState) -> String {
    let mut s = format!("GPU {} ({}): {}\n", st.gpu, st.backend, st.policy);
    if !st.slots.is_empty() {
        let mut t = Table::new(&[
            "SLOT", "DEVICE", "QUANTUM", "PREEMPT", "PRIORITY", "WEIGHT", "SHARE",
        ]);
        for x in &st.slots {
            t.row(vec![
                x.slot.clone(),
                opt(x.device.as_deref()),
                x.quantum_ms.map_or("-".into(), |q| format!("{q} ms")),
                x.preempt_timeout_us
                    .map_or("-".into(), |u| format!("{u} us")),
                opt(x.priority.as_deref()),
                opt(x.weight),
                x.share.map_or("-".into(), pct),
            ]);
        }
        s.push_str(&t.render());
    }
    for n in &st.notes {
        s.push_str(&format!("  note: {n}\n"));
    }
    s
}

fn render_apply(r: &ApplyReport) -> String {
    let mut s = String::new();
    if r.written.is_empty() {
        s.push_str(&format!("{}: nothing to write now\n", r.gpu));
    } else {
        s.push_str(&format!("{}: wrote {} settings\n", r.gpu, r.written.len()));
    }
    if !r.pending.is_empty() {
        s.push_str("\nto put in place (not written by vgpuctl):\n");
        for p in &r.pending {
            s.push_str(&format!("  {}\n", setting_line(p)));
        }
    }
    for n in &r.notes {
        s.push_str(&format!("  note: {n}\n"));
    }
    s.push('\n');
    s.push_str(&render_state(&r.state));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_parse_with_slots_and_priorities() {
        let r = parse_weight("vf2=30:low").unwrap();
        assert_eq!(
            (r.slot.as_deref(), r.weight, r.priority),
            (Some("vf2"), 30, Some(Priority::Low))
        );
        let r = parse_weight("7").unwrap();
        assert_eq!((r.slot, r.weight, r.priority), (None, 7, None));
        for bad in ["0", "101", "x", "=5", "5:urgent", "vf1=-3"] {
            let e = parse_weight(bad).unwrap_err().to_string();
            assert!(
                e.contains("--weights") && e.contains("1 to 100"),
                "{bad}: {e}"
            );
        }
    }
}

#[cfg(test)]
mod cli_tests {
    //! `vgpuctl sched` end to end on simulated hosts.

    use crate::cli::run_for_test as run;

    #[test]
    fn plan_json_is_a_sched_plan() {
        let (code, out, err) = run(&[
            "--sim",
            "demo",
            "sched",
            "plan",
            "--gpu",
            "03:00.0",
            "--weights",
            "10,30",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["backend"], "intel-xe-sriov");
        assert_eq!(v["slots"][1]["quantum_ms"], 24);
        assert_eq!(v["slots"][1]["requested_share"], 0.75);
        assert_eq!(v["settings"][0]["target"]["kind"], "sysfs");
        assert_eq!(v["refusals"].as_array().map(Vec::len), Some(0));
        // The JSON reads back into the type the daemon uses.
        let plan: crate::sched::SchedPlan = serde_json::from_str(&out).unwrap();
        assert_eq!(plan.slots.len(), 2);
    }

    #[test]
    fn apply_programs_and_show_reads_back() {
        let (code, out, err) = run(&[
            "--sim",
            "vendors",
            "sched",
            "apply",
            "--gpu",
            "3b:00.0",
            "--weights",
            "1,1,2,4",
        ]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("wrote 10 settings"), "{out}");
        assert!(out.contains("vf4   0000:3b:00.4  16 ms"), "{out}");
        let (code, out, _) = run(&["--sim", "vendors", "sched", "show", "--json"]);
        assert_eq!(code, 0);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let l40s = v
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["gpu"] == "0000:86:00.0")
            .unwrap();
        assert_eq!(l40s["backend"], "nvidia-vfio");
        assert_eq!(l40s["state"]["policy"], "equal share (3 ms slices)");
    }

    #[test]
    fn refusals_block_apply_with_one_line() {
        let (code, out, err) = run(&[
            "--sim",
            "demo",
            "sched",
            "apply",
            "--gpu",
            "01:00.0",
            "--weights",
            "1,3",
        ]);
        assert_eq!(code, 2, "{out}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.contains("cannot be applied") && err.contains("weights 1, 3 differ"),
            "{err}"
        );
        // plan shows the same refusal but succeeds.
        let (code, out, _) = run(&[
            "--sim",
            "demo",
            "sched",
            "plan",
            "--gpu",
            "01:00.0",
            "--weights",
            "1,3",
        ]);
        assert_eq!(code, 0);
        assert!(out.contains("[unequal-weights]"), "{out}");
    }

    #[test]
    fn bad_input_is_one_line_exit_2() {
        for args in [
            &[
                "--sim",
                "demo",
                "sched",
                "plan",
                "--gpu",
                "0000:99:00.0",
                "--weights",
                "1",
            ][..],
            &[
                "--sim",
                "demo",
                "sched",
                "plan",
                "--gpu",
                "03:00.0",
                "--weights",
                "0",
            ],
            &["--sim", "demo", "sched", "plan", "--gpu", "03:00.0"],
            &[
                "--sim",
                "demo",
                "sched",
                "plan",
                "--gpu",
                "03:00.0",
                "--weights",
                "1",
                "--tolerance",
                "0",
            ],
            &[
                "--sim",
                "demo",
                "sched",
                "plan",
                "--gpu",
                "03:00.0",
                "--profile",
                "nope",
            ],
        ] {
            let (code, _, err) = run(args);
            assert_eq!(code, 2, "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(err.starts_with("vgpuctl: "), "{err}");
        }
    }

    #[test]
    fn profiles_give_weights() {
        let (code, out, err) = run(&[
            "--sim",
            "demo",
            "sched",
            "plan",
            "--gpu",
            "86:00.0",
            "--profile",
            "compute-8g",
            "--profile",
            "compute-8g",
            "--json",
        ]);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["slots"][0]["label"], "compute-8g");
        assert_eq!(v["slots"][0]["weight"], 50);
        assert_eq!(v["policy"], "SW round-robin");
    }
}
