//! vgpud's Prometheus metrics on the real kernel: `vgpuctl metrics` (the text exposition format 0.0.4
//! that `/metrics` serves, through `Manager1.Metrics`) after a create through vgpud and a foreign mdev
//! made behind its back through sysfs. The text must pass the host's `promtool check metrics` (Debian
//! package `prometheus`, run chrooted into the host's root shared over 9p), and its values must be
//! what sysfs says: `available_instances` of each sample type, one instance of the created type, the
//! created instance owned by the daemon and the sysfs one foreign, both running, every GPU healthy.

use std::io::Write;
use std::process::{Command, Stdio};

use super::daemon::{availability, daemon, ensure_restored, vgpuctl};
use super::guest::Guest;
use super::qemu_attach::HOSTROOT;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, SAMPLE_TYPES, available, test_uuid};
use super::vgpud::{TargetKind, Vgpud};

/// The tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![Test::new(
        "metrics_pass_promtool_and_match_sysfs",
        metrics_match_sysfs,
    )]
}

/// `promtool` in the host's root, as Debian's `prometheus` package installs it.
const PROMTOOL: &str = "/usr/bin/promtool";

/// One sample line of the exposition text: metric name, labels in order, value.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: Vec<(String, String)>,
    value: f64,
}

/// Parses the sample lines of a text exposition (comments skipped). Label values written by vgpud
/// escape `\`, `"` and newline (exposition format 0.0.4); those are undone here.
fn samples(text: &str) -> Result<Vec<Sample>, TestError> {
    let bad = |line: &str, why: &str| TestError::Check(format!("metrics line {line:?}: {why}"));
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (head, value) = line.rsplit_once(' ').ok_or_else(|| bad(line, "no value"))?;
        let value: f64 = value
            .parse()
            .map_err(|e| bad(line, &format!("value: {e}")))?;
        let (name, labels) = match head.split_once('{') {
            None => (head.to_string(), Vec::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .ok_or_else(|| bad(line, "unclosed labels"))?;
                (
                    name.to_string(),
                    parse_labels(body).ok_or_else(|| bad(line, "labels"))?,
                )
            }
        };
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    Ok(out)
}

fn parse_labels(mut body: &str) -> Option<Vec<(String, String)>> {
    let mut labels = Vec::new();
    while !body.is_empty() {
        let (key, rest) = body.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '"' => break i,
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                c => value.push(c),
            }
        };
        labels.push((key.to_string(), value));
        body = rest[end + 1..]
            .strip_prefix(',')
            .unwrap_or(&rest[end + 1..]);
    }
    Some(labels)
}

/// The value of the one sample of `name` whose labels include every pair of `with`.
fn value_of(all: &[Sample], name: &str, with: &[(&str, &str)]) -> Result<f64, TestError> {
    let found: Vec<&Sample> = all
        .iter()
        .filter(|s| {
            s.name == name
                && with
                    .iter()
                    .all(|(k, v)| s.labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .collect();
    match found.as_slice() {
        [one] => Ok(one.value),
        [] => Err(TestError::Check(format!(
            "no sample {name}{with:?} in vgpud's metrics"
        ))),
        many => Err(TestError::Check(format!(
            "{} samples {name}{with:?} in vgpud's metrics: {many:?}",
            many.len()
        ))),
    }
}

/// The label `key` of the one sample of `name` with `with`.
fn label_of(
    all: &[Sample],
    name: &str,
    with: (&str, &str),
    key: &str,
) -> Result<String, TestError> {
    value_of(all, name, &[with])?;
    all.iter()
        .find(|s| {
            s.name == name
                && s.labels
                    .iter()
                    .any(|(k, v)| (k.as_str(), v.as_str()) == with)
        })
        .and_then(|s| s.labels.iter().find(|(k, _)| k == key))
        .map(|(_, v)| v.clone())
        .ok_or_else(|| TestError::Check(format!("{name}{with:?} has no label {key}")))
}

/// `vgpuctl metrics --bus BUS`: its text.
fn scrape(d: &Vgpud) -> Result<String, TestError> {
    let out = vgpuctl(d, &["metrics"])?;
    ensure(out.status.success(), || {
        format!(
            "vgpuctl metrics failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    String::from_utf8(out.stdout)
        .map_err(|e| TestError::Check(format!("vgpuctl metrics printed non-UTF-8 text: {e}")))
}

/// `promtool check metrics` of `text` on its stdin: Ok when it exits 0 (it prints lint findings and
/// exits 1 for any of them).
fn promtool_check(text: &str) -> TestResult {
    let host_promtool = format!("{HOSTROOT}{PROMTOOL}");
    ensure(std::path::Path::new(&host_promtool).is_file(), || {
        format!(
            "{PROMTOOL} is not in the host's root ({host_promtool}): install Debian's prometheus package on the host (.ci/run does)"
        )
    })?;
    // busybox chroot; a clean environment so nothing of the guest's leaks into the host's binary.
    let mut child = Command::new("chroot")
        .args([HOSTROOT, PROMTOOL, "check", "metrics"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TestError::Check(format!("cannot run chroot {HOSTROOT} {PROMTOOL}: {e}")))?;
    let mut stdin = child
        .stdin
        .take()
        .ok_or_else(|| TestError::Check("promtool has no stdin".into()))?;
    stdin
        .write_all(text.as_bytes())
        .map_err(|e| TestError::Check(format!("writing the metrics to promtool: {e}")))?;
    drop(stdin);
    let out = child
        .wait_with_output()
        .map_err(|e| TestError::Check(format!("waiting for promtool: {e}")))?;
    ensure(out.status.success(), || {
        format!(
            "promtool check metrics refused vgpud's metrics ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(Outcome::Passed)
}

fn metrics_match_sysfs(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let foreign = test_uuid("metrics", 0);
    mdevs.create("mtty", "mtty-1", foreign)?;
    let (_work, d) = daemon("metrics")?;
    let ours = test_uuid("metrics", 1);
    d.create(TargetKind::Type, "mdpy-xga", "mdpy", Some(&ours))?;
    mdevs.adopt(ours);

    let text = scrape(&d)?;
    promtool_check(&text)?;
    let all = samples(&text)?;

    for t in SAMPLE_TYPES {
        let sysfs = available(&g.host, t.parent, t.id)?;
        // mtty is a serial-port sample, not a display: discovery lists only display parents as GPUs
        // (vgpu_host::discover, `is_display_parent`), so only mdpy's and mbochs's types are metrics.
        if t.parent == "mtty" {
            continue;
        }
        ensure_eq(
            format_args!(
                "vgpu_type_available_instances of {}/{} against sysfs",
                t.parent, t.id
            ),
            value_of(
                &all,
                "vgpu_type_available_instances",
                &[("gpu", t.parent), ("type", t.id)],
            )?,
            f64::from(sysfs),
        )?;
        let created = if t.id == "mdpy-xga" { 1.0 } else { 0.0 };
        ensure_eq(
            format_args!("vgpu_type_instances of {}/{}", t.parent, t.id),
            value_of(
                &all,
                "vgpu_type_instances",
                &[("gpu", t.parent), ("type", t.id)],
            )?,
            created,
        )?;
    }
    for gpu in ["mdpy", "mbochs"] {
        ensure_eq(
            format_args!("vgpu_gpu_healthy of {gpu}"),
            value_of(&all, "vgpu_gpu_healthy", &[("gpu", gpu)])?,
            1.0,
        )?;
    }
    let (ours_s, foreign_s) = (ours.to_string(), foreign.to_string());
    ensure_eq(
        "owners in vgpu_instance_info (created, sysfs-made)",
        (
            label_of(&all, "vgpu_instance_info", ("uuid", &ours_s), "owner")?,
            label_of(&all, "vgpu_instance_info", ("uuid", &foreign_s), "owner")?,
        ),
        ("daemon".to_string(), "foreign".to_string()),
    )?;
    ensure_eq(
        "type of the created instance in vgpu_instance_info",
        label_of(&all, "vgpu_instance_info", ("uuid", &ours_s), "type")?,
        "mdpy-xga".to_string(),
    )?;
    for uuid in [&ours_s, &foreign_s] {
        ensure_eq(
            format_args!("vgpu_instance_state of {uuid} (running)"),
            value_of(
                &all,
                "vgpu_instance_state",
                &[("uuid", uuid), ("state", "running")],
            )?,
            1.0,
        )?;
    }
    ensure(
        value_of(
            &all,
            "vgpu_operations_total",
            &[("op", "create"), ("result", "ok")],
        )? >= 1.0,
        || "vgpu_operations_total{op=\"create\",result=\"ok\"} counts the create".to_string(),
    )?;

    // Destroyed through vgpud: gone from the metrics, its type's count and availability back.
    d.destroy(&ours)?;
    mdevs.forget(&ours);
    let all = samples(&scrape(&d)?)?;
    ensure_eq(
        "vgpu_type_instances of mdpy/mdpy-xga after the destroy",
        value_of(
            &all,
            "vgpu_type_instances",
            &[("gpu", "mdpy"), ("type", "mdpy-xga")],
        )?,
        0.0,
    )?;
    ensure_eq(
        "vgpu_type_available_instances of mdpy/mdpy-xga after the destroy",
        value_of(
            &all,
            "vgpu_type_available_instances",
            &[("gpu", "mdpy"), ("type", "mdpy-xga")],
        )?,
        f64::from(available(&g.host, "mdpy", "mdpy-xga")?),
    )?;
    ensure(
        !all.iter().any(|s| {
            s.name == "vgpu_instance_info"
                && s.labels.iter().any(|(k, v)| k == "uuid" && *v == ours_s)
        }),
        || format!("destroyed {ours} is still in vgpu_instance_info"),
    )?;
    d.stop()?;
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines_parse_with_escaped_labels() {
        let text = "# HELP x y\n# TYPE x gauge\nx{a=\"1\",b=\"q\\\"\\\\\\n\"} 2\nup 1\n";
        let all = samples(text).unwrap();
        assert_eq!(
            all[0].labels,
            vec![("a".into(), "1".into()), ("b".into(), "q\"\\\n".into())]
        );
        assert_eq!(value_of(&all, "x", &[("a", "1")]).unwrap(), 2.0);
        assert_eq!(value_of(&all, "up", &[]).unwrap(), 1.0);
        assert!(value_of(&all, "x", &[("a", "2")]).is_err());
        assert!(samples("x{a=\"1\" 2\n").is_err());
    }
}
