//! The metrics exposition of whole engines on simulated hosts: the golden text of `--sim demo`
//! (regenerated with `VGPU_BLESS=1 cargo test -p vgpu-manager --test metrics_exposition`; review the
//! diff), values that follow instance changes, and `promtool check metrics` (Debian package
//! `prometheus`) on the output of every simulated host. Without promtool the test fails, unless
//! `VGPU_TESTS_ALLOW_SKIP=1` is set: then it prints `SKIPPED: <reason>` to stderr.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use vgpu_host::Host;
use vgpu_manager::daemon::api::{
    ApplyPool, CreateInstance, DestroyInstance, GetMetrics, InstanceSpec, InstanceTarget,
};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::daemon::metrics::Format;
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

const GOLDEN: &str = "tests/fixtures/metrics/demo.prom";
const UUID: &str = "3b2e8a9c-1f4d-4c8e-9a7b-5d6e0f1a2b3c";

fn open(sim: &str, dir: &Path) -> Core {
    let host = Arc::new(SimHost::builtin(sim).unwrap());
    Core::open(host as Arc<dyn Host>, dir, Catalog::builtin().unwrap()).unwrap()
}

fn metrics(core: &Core, format: Format) -> String {
    core.execute(GetMetrics { format }).unwrap()
}

/// The lines that do not change from run to run: everything but the process, the durations and
/// the reconcile time.
fn stable(text: &str) -> String {
    let volatile = [
        "process_",
        "vgpu_operation_duration_seconds",
        "vgpu_reconcile_last_success_timestamp_seconds",
    ];
    text.lines()
        .filter(|l| {
            let name = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            !volatile.iter().any(|v| name.starts_with(v))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The value of the one sample whose line starts with `prefix`.
fn value(text: &str, prefix: &str) -> f64 {
    let hits: Vec<&str> = text.lines().filter(|l| l.starts_with(prefix)).collect();
    assert_eq!(hits.len(), 1, "{prefix}: {hits:?}");
    hits[0].rsplit(' ').next().unwrap().parse().unwrap()
}

fn create_labelled(core: &Core) {
    core.execute(CreateInstance(InstanceSpec {
        target: InstanceTarget::Profile("vdi-2g".into()),
        gpu: Some("0000:01:00.0".into()),
        uuid: Some(UUID.parse().unwrap()),
        autostart: false,
        label: Some("libvirt:win11-\"desk\"".into()),
        attrs: Vec::new(),
    }))
    .unwrap();
}

#[test]
fn the_demo_host_exposition_matches_its_golden_text() {
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    create_labelled(&core);
    let text = stable(&metrics(&core, Format::Prometheus));
    if std::env::var_os("VGPU_BLESS").is_some() {
        std::fs::write(GOLDEN, &text).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap();
    assert!(
        text == golden,
        "the exposition of --sim demo differs from {GOLDEN}; after an intended change run \
         `VGPU_BLESS=1 cargo test -p vgpu-manager --test metrics_exposition` and review the diff.\n{text}"
    );
}

#[test]
fn values_follow_creates_destroys_and_operations() {
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    let avail = "vgpu_type_available_instances{gpu=\"0000:01:00.0\",type=\"nvidia-223\",";
    let before = metrics(&core, Format::Prometheus);
    create_labelled(&core);
    let after = metrics(&core, Format::Prometheus);
    assert_eq!(value(&after, avail), value(&before, avail) - 1.0, "{after}");
    let info = format!("vgpu_instance_info{{uuid=\"{UUID}\"");
    let line = after.lines().find(|l| l.starts_with(&info)).unwrap();
    assert!(
        line.contains("domain=\"win11-\\\"desk\\\"\"") && line.contains("owner=\"daemon\""),
        "{line}"
    );
    assert_eq!(
        value(
            &after,
            &format!("vgpu_instance_state{{uuid=\"{UUID}\",state=\"running\"}}")
        ),
        1.0
    );
    assert_eq!(
        value(&after, "vgpu_operations_total{op=\"create\",result=\"ok\"}"),
        1.0
    );
    let refused = core.execute(DestroyInstance {
        uuid: "00000000-0000-4000-8000-000000000001".parse().unwrap(),
    });
    assert!(refused.is_err());
    let now = metrics(&core, Format::Prometheus);
    assert_eq!(
        value(
            &now,
            "vgpu_operations_total{op=\"destroy\",result=\"NotFound\"}"
        ),
        1.0
    );
    assert!(value(&now, "vgpu_reconcile_runs_total") >= 1.0);
    assert!(value(&now, "vgpu_reconcile_last_success_timestamp_seconds") > 1.7e9);
    assert_eq!(
        value(&now, "vgpu_operation_duration_seconds_count{op=\"create\"}"),
        1.0
    );
    // A kernel event is counted, and a snapshot built after it.
    core.handle_uevent(&vgpu_host::uevent::Uevent::new(
        "change",
        "/devices/pci0000:00/0000:00:02.0",
        Some("pci"),
    ));
    let now = metrics(&core, Format::Prometheus);
    assert_eq!(value(&now, "vgpu_uevents_total"), 1.0);
    // Nothing changed since: the snapshot is not rebuilt (the same text but for the process).
    assert_eq!(stable(&now), stable(&metrics(&core, Format::Prometheus)));
}

#[test]
fn pool_slots_are_counted_by_state() {
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    let toml = std::fs::read_to_string("tests/fixtures/pools/vdi-mixed.toml").unwrap();
    core.execute(ApplyPool { toml }).unwrap();
    let t = metrics(&core, Format::Prometheus);
    assert_eq!(
        value(&t, "vgpu_pool_slots{pool=\"vdi-mixed\",state=\"running\"}"),
        12.0,
        "{t}"
    );
    assert_eq!(
        value(&t, "vgpu_pool_slots_wanted{pool=\"vdi-mixed\"}"),
        12.0
    );
    assert_eq!(
        value(&t, "vgpu_operations_total{op=\"pool_apply\",result=\"ok\"}"),
        1.0
    );
    assert!(
        t.lines()
            .filter(|l| l.starts_with("vgpu_instance_info{") && l.contains("pool=\"vdi-mixed\""))
            .count()
            == 12,
        "{t}"
    );
}

#[test]
fn openmetrics_ends_with_eof_and_names_counters_without_total() {
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    let t = metrics(&core, Format::OpenMetrics);
    assert!(
        t.ends_with("\n# EOF\n"),
        "{}",
        &t[t.len().saturating_sub(200)..]
    );
    assert!(t.contains("# TYPE vgpu_operations counter\n"), "{t}");
    assert!(t.contains("# TYPE vgpu_gpu info\n"), "{t}");
    assert!(t.contains("\nvgpu_operations_total{"), "{t}");
}

/// promtool, or `None` after SKIPPED under `VGPU_TESTS_ALLOW_SKIP=1`; else the test fails.
fn promtool(test: &str) -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("promtool");
    }
    let why = "promtool is not installed (Debian package prometheus; .ci/run installs it)";
    if std::env::var("VGPU_TESTS_ALLOW_SKIP").as_deref() == Ok("1") {
        eprintln!("SKIPPED: {test}: {why}; VGPU_TESTS_ALLOW_SKIP=1 allowed the skip");
        return None;
    }
    panic!("{test}: {why}. Install it (apt-get install prometheus) or set VGPU_TESTS_ALLOW_SKIP=1");
}

#[test]
fn promtool_accepts_the_exposition_of_every_simulated_host() {
    let Some(promtool) = promtool("promtool_accepts_the_exposition_of_every_simulated_host") else {
        return;
    };
    for sim in SimHost::builtin_names() {
        let dir = tempfile::tempdir().unwrap();
        let core = open(sim, dir.path());
        let text = metrics(&core, Format::Prometheus);
        let mut child = Command::new(promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "promtool check metrics refused the exposition of --sim {sim}: {}{}\n{text}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Every sample and family name of the demo host's exposition with a pool applied.
fn exposed_names() -> std::collections::BTreeSet<String> {
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    let toml = std::fs::read_to_string("tests/fixtures/pools/vdi-mixed.toml").unwrap();
    core.execute(ApplyPool { toml }).unwrap();
    let text = metrics(&core, Format::Prometheus);
    let mut names = std::collections::BTreeSet::new();
    for l in text.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let mut parts = t.split(' ');
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            names.insert(name.to_string());
            if kind == "histogram" {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
        } else if !l.starts_with('#') {
            names.insert(l.split(['{', ' ']).next().unwrap().to_string());
        }
    }
    names
}

/// The metric names a PromQL expression uses (ours: `vgpu_`, `vgpud_`, `process_`).
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_string = false;
    let mut word = String::new();
    for c in expr.chars().chain(std::iter::once(' ')) {
        if c == '"' {
            in_string = !in_string;
        }
        if !in_string && (c.is_ascii_alphanumeric() || c == '_' || c == ':') {
            word.push(c);
            continue;
        }
        if ["vgpu_", "vgpud_", "process_"]
            .iter()
            .any(|p| word.starts_with(p))
        {
            out.push(std::mem::take(&mut word));
        }
        word.clear();
    }
    out
}

#[test]
fn the_grafana_dashboard_queries_only_metrics_that_exist() {
    let names = exposed_names();
    let text = std::fs::read_to_string("../data/grafana-vgpu.json").unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut queried = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            let used = metric_names(expr);
            assert!(
                !used.is_empty(),
                "{}: {expr} queries none of our metrics",
                panel["title"]
            );
            for m in used {
                assert!(
                    names.contains(&m),
                    "{}: {expr}: no metric {m} is exposed",
                    panel["title"]
                );
                queried += 1;
            }
        }
    }
    assert!(queried >= 20, "only {queried} metrics queried");
    // The capacity, pool, type and operation views the dashboard is for.
    for m in [
        "vgpu_profile_capacity",
        "vgpu_type_available_instances",
        "vgpu_pool_slots",
        "vgpu_operations_total",
        "vgpu_operation_duration_seconds_bucket",
    ] {
        assert!(text.contains(m), "the dashboard does not show {m}");
    }
}

#[test]
fn docs_metrics_md_lists_every_family() {
    let doc = std::fs::read_to_string("../docs/metrics.md").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let core = open("demo", dir.path());
    let text = metrics(&core, Format::Prometheus);
    for l in text.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let name = t.split(' ').next().unwrap();
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "docs/metrics.md has no row for {name}"
            );
        }
    }
    assert_eq!(
        metric_names("sum by (op) (rate(vgpu_operations_total{result!=\"vgpu_x\"}[5m]))"),
        ["vgpu_operations_total"]
    );
}
