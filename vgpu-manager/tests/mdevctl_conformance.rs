//! mdevctl conformance: mdevctl's own test cases (mdevctl src/tests/*.rs) and libvirt's
//! (tests/nodedevmdevctltest.c), run through `vgpuctl` invoked as `mdevctl` against the real vgpud on a
//! fake root built as those tests build theirs, compared byte for byte with mdevctl's expected outputs
//! (tests/fixtures/mdevctl, sources in its README; the case list is tests/fixtures/mdevctl/cases.txt).
//!
//! Needs root and FUSE (the fake root's `create`/`remove` attributes are FUSE files); without them it
//! fails, or prints SKIPPED under `VGPU_TESTS_ALLOW_SKIP=1`.
//!
//! Every case passes or fails. The known failures are the table in docs/mdevctl.md: this test fails when
//! a case not in the table fails, and when a case in the table passes (so the table stays true). It
//! prints the pass ratio.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use dbus_common::Daemon;
use dbus_common::mdevctl::{FakeKernel, FakeRoot, KernelWrite};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mdevctl")
}

/// One parsed case of cases.txt.
#[derive(Debug, Default, Clone)]
struct Case {
    name: String,
    setup: Vec<String>,
    argv: Vec<String>,
    stdin: Option<String>,
    expect_ok: bool,
    expect_text: Option<String>,
    checks: Vec<String>,
}

fn parse_cases(text: &str) -> Vec<Case> {
    let mut vars: Vec<(String, String)> = Vec::new();
    let mut setups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cases = Vec::new();
    let subst = |line: &str, vars: &[(String, String)]| {
        // Longest names first, so $UV is not read as $U followed by V.
        let mut sorted: Vec<&(String, String)> = vars.iter().collect();
        sorted.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
        let mut out = line.to_string();
        for (n, v) in sorted {
            out = out.replace(&format!("${n}"), v);
        }
        out
    };
    for block in text.split("\n\n") {
        let lines: Vec<String> = block
            .lines()
            .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
            .map(|l| subst(l.trim(), &vars))
            .collect();
        let Some(first) = lines.first() else { continue };
        if first.starts_with("= ") {
            for l in &lines {
                let mut w = l.splitn(3, ' ');
                let (_, n, v) = (w.next(), w.next().unwrap(), w.next().unwrap());
                vars.push((n.to_string(), v.to_string()));
            }
            continue;
        }
        if let Some(name) = first.strip_prefix("setup ") {
            setups.insert(name.to_string(), lines[1..].to_vec());
            continue;
        }
        let name = first
            .strip_prefix("case ")
            .unwrap_or_else(|| panic!("cases.txt: a block starts with {first:?}"));
        let mut c = Case {
            name: name.to_string(),
            ..Case::default()
        };
        let mut expected = false;
        for l in &lines[1..] {
            let (word, rest) = l.split_once(' ').unwrap_or((l, ""));
            match word {
                "with" => c.setup.extend(
                    setups
                        .get(rest)
                        .unwrap_or_else(|| panic!("{name}: no setup {rest}"))
                        .iter()
                        .cloned(),
                ),
                "parent" | "active" | "defined" | "callout" | "notifier" | "device-attr" => {
                    c.setup.push(l.clone())
                }
                "run" => c.argv = rest.split_whitespace().map(str::to_string).collect(),
                "stdin" => c.stdin = Some(rest.to_string()),
                "expect" => {
                    expected = true;
                    let (what, text) = rest.split_once(' ').unwrap_or((rest, ""));
                    c.expect_ok = match what {
                        "ok" => true,
                        "fail" => false,
                        _ => panic!("{name}: expect ok|fail, not {what}"),
                    };
                    c.expect_text = (!text.is_empty()).then(|| text.to_string());
                }
                _ => c.checks.push(l.clone()),
            }
        }
        assert!(
            expected && !c.argv.is_empty(),
            "{name}: needs run and expect"
        );
        cases.push(c);
    }
    cases
}

/// The call-out scripts the cases name: ours, written to the protocol of mdevctl(8) ("CALLOUT SCRIPTS":
/// arguments `-t TYPE -e EVENT -a ACTION -s STATE -u UUID -p PARENT`, the configuration on standard
/// input, exit 0 to go on, 1 to refuse, 2 for "not my device type"; `-e get -a capabilities` answers the
/// versions and events a script supports, `-e get -a attributes` the device's attributes as JSON).
fn script(name: &str) -> String {
    let head = "#!/bin/sh\nwhile [ $# -gt 1 ]; do case \"$1\" in -e) event=$2;; -a) action=$2;; -u) uuid=$2;; esac; shift 2; done\ncat >/dev/null\n";
    let caps = |events: &str| {
        format!(
            "if [ \"$event\" = get ] && [ \"$action\" = capabilities ]; then printf '{{\"supports\":{{\"version\":2,\"actions\":[\"start\",\"stop\",\"define\",\"undefine\",\"modify\",\"attributes\",\"capabilities\"],\"events\":[{events}]}}}}'; exit 0; fi\n"
        )
    };
    let all = "\"pre\",\"post\",\"notify\",\"get\"";
    let live = "\"pre\",\"post\",\"notify\",\"get\",\"live\"";
    let body = match name {
        "rc0" => "exit 0\n".to_string(),
        "rc1" => "exit 1\n".to_string(),
        "rc2" => "exit 2\n".to_string(),
        "good-json" => {
            "if [ \"$event\" = get ]; then printf '[{\"attribute0\": \"VALUE\"}]'; fi\nexit 0\n"
                .to_string()
        }
        "bad-json" => "if [ \"$event\" = get ]; then printf 'not json'; fi\nexit 0\n".to_string(),
        "ver-rc0" => format!("{}exit 0\n", caps(all)),
        "ver-rc1" => format!("{}exit 1\n", caps(all)),
        // Live changes are supported for the UUID 11111111-1111-1111-0000-000000000000 only.
        "live-rc0" | "modify-active" | "live-rc1" => {
            let rc = if name == "live-rc1" { 1 } else { 0 };
            format!(
                "if [ \"$uuid\" = 11111111-1111-1111-0000-000000000000 ]; then {}else {}fi\nif [ \"$event\" = live ]; then exit {rc}; fi\nexit 0\n",
                caps(live),
                caps(all)
            )
        }
        // A script that changes any running device live (s390-tools' ap-check does for vfio_ap).
        "live-any" => format!("{}exit 0\n", caps(live)),
        _ => panic!("no call-out script {name}"),
    };
    format!("{head}{body}")
}

/// Builds the case's root; returns the writable attributes the fake kernel gives each new device
/// (`device-attr NAME` lines).
fn build(root: &FakeRoot, setup: &[String]) -> Vec<String> {
    let mut device_attrs = Vec::new();
    for l in setup {
        let (word, rest) = l.split_once(' ').unwrap();
        let w: Vec<&str> = rest.split_whitespace().collect();
        match word {
            "parent" => {
                let f: Vec<&str> = rest.split('|').collect();
                root.parent(
                    f[0],
                    f[1],
                    f[2].parse().unwrap(),
                    f[3],
                    f.get(4).copied().unwrap_or(""),
                    f.get(5).copied(),
                );
            }
            "active" => root.active(w[0], w[1], w[2]),
            "defined" => root.defined(w[0], w[1], &fixtures().join(w[2])),
            "callout" => {
                let dest = w.get(1).filter(|d| **d != "old").copied().unwrap_or(w[0]);
                root.callout(dest, &script(w[0]), w.contains(&"old"));
            }
            "device-attr" => device_attrs.push(w[0].to_string()),
            "notifier" => root.notifier(w[0]),
            _ => unreachable!(),
        }
    }
    device_attrs
}

/// What one run produced.
struct Ran {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
    writes: Vec<KernelWrite>,
}

/// Runs case `c` on a fresh root and vgpud, and checks what it did.
async fn run_case(c: &Case, mdevctl: &Path) -> Result<(), String> {
    let tmp = tempfile::tempdir().unwrap();
    let root = FakeRoot::new(&tmp.path().join("root"));
    let device_attrs = build(&root, &c.setup);
    let kernel = FakeKernel::start_with(&root.root, &device_attrs);
    let daemon = match Daemon::on_sysfs_root(tmp.path(), &root.root).await {
        Ok(d) => d,
        Err(log) => return Err(format!("vgpud does not start on this tree: {log}")),
    };
    let argv: Vec<String> = c
        .argv
        .iter()
        .map(|a| match a.strip_prefix('@') {
            Some(f) => fixtures().join(f).display().to_string(),
            None => a.clone(),
        })
        .collect();
    let input = c
        .stdin
        .as_ref()
        .map(|f| std::fs::read(fixtures().join(f)).unwrap())
        .unwrap_or_default();
    let mut child = Command::new(mdevctl)
        .args(&argv)
        .env("VGPU_BUS", &daemon.bus)
        // mdevctl's tests inject their root; ours reaches the front end as it reaches vgpuctl (the front
        // end reads the kernel's mdev types itself, as mdevctl does).
        .env("VGPU_SYSFS_ROOT", &root.root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&input).unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    drop(daemon);
    let writes = kernel.finish();
    let ran = Ran {
        code: out.status.code(),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        writes,
    };
    check(c, &ran, &root)
}

/// Removes empty `attrs` arrays (mdevctl prints them, libvirt's files leave them out; both mean none).
fn normalize(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(m) => {
            m.retain(|k, x| !(k == "attrs" && x.as_array().is_some_and(Vec::is_empty)));
            m.values_mut().for_each(normalize);
        }
        serde_json::Value::Array(a) => a.iter_mut().for_each(normalize),
        _ => {}
    }
}

fn check(c: &Case, ran: &Ran, root: &FakeRoot) -> Result<(), String> {
    let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
    let failed = ran.code != Some(0);
    if c.expect_ok && failed {
        return Err(format!(
            "failed (exit {:?}) where mdevctl succeeds: {}",
            ran.code,
            ran.stderr.trim()
        ));
    }
    if !c.expect_ok {
        if !failed {
            return Err("succeeded where mdevctl fails".into());
        }
        if let Some(t) = &c.expect_text
            && !ran.stderr.contains(t.as_str())
        {
            return Err(format!(
                "error text differs: mdevctl says {t:?}, we say {:?}",
                ran.stderr.trim()
            ));
        }
        // What the kernel saw still counts for a failed command (a create undone by a remove).
        for chk in c
            .checks
            .iter()
            .filter(|l| l.starts_with("created ") || l.starts_with("removed "))
        {
            kernel_check(chk, ran, "")?;
        }
        for chk in c.checks.iter().filter(|l| l.starts_with("notified ")) {
            notified_check(chk, root)?;
        }
        return Ok(());
    }
    let printed = stdout.trim().to_string();
    let uuid_of = |w: &str| {
        if w == "printed" {
            printed.clone()
        } else {
            w.to_string()
        }
    };
    for chk in &c.checks {
        let w: Vec<&str> = chk.split_whitespace().collect();
        match w[0] {
            "stdout" => {
                let want = std::fs::read(fixtures().join(w[1])).unwrap();
                if want != ran.stdout {
                    return Err(format!(
                        "stdout differs from {}:\n--- mdevctl\n{}\n--- ours\n{}",
                        w[1],
                        String::from_utf8_lossy(&want),
                        stdout
                    ));
                }
            }
            "stdout-empty" if !ran.stdout.is_empty() => {
                return Err(format!("prints {stdout:?} where mdevctl prints nothing"));
            }
            "stdout-uuid" => {
                let ok = stdout.ends_with('\n')
                    && stdout.len() == 37
                    && printed.parse::<mdev_types::ids::MdevUuid>().is_ok();
                if !ok {
                    return Err(format!(
                        "prints {stdout:?} where mdevctl prints a UUID line"
                    ));
                }
            }
            "stdout-json" => {
                let mut want: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(fixtures().join(w[1])).unwrap())
                        .unwrap();
                let mut got: serde_json::Value = serde_json::from_str(&stdout)
                    .map_err(|e| format!("stdout is not JSON ({e}): {stdout}"))?;
                normalize(&mut want);
                normalize(&mut got);
                if want != got {
                    return Err(format!("JSON differs from {}: {stdout}", w[1]));
                }
            }
            "config" => {
                let path = root.config_base().join(w[1]).join(uuid_of(w[2]));
                let want = std::fs::read(fixtures().join(w[3])).unwrap();
                match std::fs::read(&path) {
                    Ok(got) if got == want => {}
                    Ok(got) => {
                        return Err(format!(
                            "/etc/mdevctl.d/{}/{} differs from {}: {}",
                            w[1],
                            w[2],
                            w[3],
                            String::from_utf8_lossy(&got)
                        ));
                    }
                    Err(_) => {
                        return Err(format!(
                            "no /etc/mdevctl.d/{}/{} written (mdevctl writes {})",
                            w[1], w[2], w[3]
                        ));
                    }
                }
            }
            "created" | "removed" => kernel_check(chk, ran, &printed)?,
            "wrote" => {
                let path = root
                    .root
                    .join("sys/bus/mdev/devices")
                    .join(uuid_of(w[1]))
                    .join(w[2]);
                let got = std::fs::read_to_string(&path).unwrap_or_default();
                if got != w[3] {
                    return Err(format!(
                        "attribute {} of {} holds {got:?} where mdevctl writes {:?}",
                        w[2], w[1], w[3]
                    ));
                }
            }
            "undefined" => {
                let left: Vec<PathBuf> = std::fs::read_dir(root.config_base())
                    .unwrap()
                    .flatten()
                    .map(|p| p.path().join(w[1]))
                    .filter(|p| p.exists())
                    .filter(|p| {
                        w.get(2)
                            .is_none_or(|parent| p.parent().unwrap().ends_with(parent))
                    })
                    .collect();
                if !left.is_empty() {
                    return Err(format!("definition files remain: {left:?}"));
                }
            }
            "stdout-empty" => {}
            "notified" => notified_check(chk, root)?,
            other => panic!("{}: unknown check {other}", c.name),
        }
    }
    Ok(())
}

/// A `notified ARGS…` check: a notifier was called with exactly these arguments.
fn notified_check(chk: &str, root: &FakeRoot) -> Result<(), String> {
    let want = chk.trim_start_matches("notified ").trim();
    let seen = root.notified();
    if seen.iter().any(|l| l.trim() == want) {
        return Ok(());
    }
    Err(format!(
        "no notifier call with {want:?} (calls seen: {seen:?})"
    ))
}

/// A `created PARENT TYPE UUID` or `removed UUID` check against the kernel writes seen (`printed`: the
/// UUID the command printed, for `printed` as the UUID).
fn kernel_check(chk: &str, ran: &Ran, printed: &str) -> Result<(), String> {
    let w: Vec<&str> = chk.split_whitespace().collect();
    let uuid_of = |u: &str| {
        if u == "printed" {
            printed.to_string()
        } else {
            u.to_string()
        }
    };
    if w[0] == "created" {
        let want = KernelWrite::Create {
            parent: w[1].into(),
            ty: w[2].into(),
            text: uuid_of(w[3]),
        };
        if !ran.writes.contains(&want) {
            return Err(format!(
                "no write of {:?} to {}/{}/create (writes seen: {:?})",
                uuid_of(w[3]),
                w[1],
                w[2],
                ran.writes
            ));
        }
        return Ok(());
    }
    let want = KernelWrite::Remove {
        uuid: w[1].into(),
        text: "1".into(),
    };
    if !ran.writes.contains(&want) {
        return Err(format!(
            "no write of \"1\" to {}/remove (writes seen: {:?})",
            w[1], ran.writes
        ));
    }
    Ok(())
}

/// The known-failure table of docs/mdevctl.md (below its "## Known differences" heading): the first cell
/// of each row is a case name in backquotes.
fn known_failures() -> BTreeSet<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/mdevctl.md");
    let text = std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
    let (_, table) = text
        .split_once("## Known differences")
        .expect("docs/mdevctl.md has a \"## Known differences\" section");
    table
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn mdevctl_conformance() {
    if !dbus_common::fuse_attr::require_fuse("mdevctl_conformance") {
        return;
    }
    let cases = parse_cases(&std::fs::read_to_string(fixtures().join("cases.txt")).unwrap());
    let names: BTreeSet<String> = cases.iter().map(|c| c.name.clone()).collect();
    assert_eq!(names.len(), cases.len(), "case names repeat in cases.txt");
    let known = known_failures();
    let stale: Vec<&String> = known.difference(&names).collect();
    assert!(
        stale.is_empty(),
        "docs/mdevctl.md lists cases that cases.txt does not have: {stale:?}"
    );

    let bin = tempfile::tempdir().unwrap();
    let mdevctl = bin.path().join("mdevctl");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_vgpuctl"), &mdevctl).unwrap();
    let only = std::env::var("MDEVCTL_CASE").ok();

    let mut passed = 0;
    let mut unexpected = Vec::new();
    let mut fixed = Vec::new();
    let mut ran_cases = 0;
    for c in &cases {
        if only.as_deref().is_some_and(|o| !c.name.contains(o)) {
            continue;
        }
        ran_cases += 1;
        let verdict = run_case(c, &mdevctl).await;
        match (&verdict, known.contains(&c.name)) {
            (Ok(()), false) => passed += 1,
            (Ok(()), true) => {
                passed += 1;
                fixed.push(c.name.clone());
            }
            (Err(why), false) => {
                println!("FAIL {}: {why}", c.name);
                unexpected.push(c.name.clone());
            }
            (Err(why), true) => println!("FAIL {} (listed): {why}", c.name),
        }
    }
    println!("mdevctl conformance: {passed}/{ran_cases} byte-identical");
    assert!(
        unexpected.is_empty(),
        "cases that fail but are not in docs/mdevctl.md's table: {unexpected:?}"
    );
    assert!(
        fixed.is_empty(),
        "cases in docs/mdevctl.md's table that now pass (remove their rows): {fixed:?}"
    );
}
