//! The host integration files in data/: the udev rule (parsed and evaluated against recorded kernel
//! uevents, and checked by `udevadm verify` where the installed udev has it), the systemd unit and D-Bus
//! activation file (they must agree with each other and with the daemon's bus name), and the generated
//! completions and man page.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_client::SERVICE;

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../data")
        .join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(data(name)).unwrap_or_else(|e| panic!("data/{name}: {e}"))
}

/// One `KEY{attr}OP"value"` of a udev rule.
#[derive(Debug, Clone, PartialEq)]
struct Term {
    key: String,
    attr: Option<String>,
    op: String,
    value: String,
}

/// Parses a rules file into rules (lines, with `\` continuations), failing on anything udev would
/// reject: unknown operators, unquoted or unterminated values, assignments to match-only keys.
fn parse_rules(text: &str) -> Vec<Vec<Term>> {
    let joined = text.replace("\\\n", "");
    let mut rules = Vec::new();
    for (n, line) in joined.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut terms = Vec::new();
        let mut rest = line;
        while !rest.is_empty() {
            let key_end = rest
                .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
                .unwrap_or_else(|| panic!("line {}: no operator in {rest:?}", n + 1));
            let key = &rest[..key_end];
            rest = &rest[key_end..];
            let mut attr = None;
            if let Some(r) = rest.strip_prefix('{') {
                let close = r
                    .find('}')
                    .unwrap_or_else(|| panic!("line {}: unclosed {{", n + 1));
                attr = Some(r[..close].to_string());
                rest = &r[close + 1..];
            }
            let op = ["==", "!=", "+=", "-=", ":=", "="]
                .into_iter()
                .find(|o| rest.starts_with(o))
                .unwrap_or_else(|| panic!("line {}: bad operator after {key} in {rest:?}", n + 1));
            rest = rest[op.len()..]
                .strip_prefix('"')
                .unwrap_or_else(|| panic!("line {}: value of {key} not quoted", n + 1));
            let close = rest
                .find('"')
                .unwrap_or_else(|| panic!("line {}: unterminated value", n + 1));
            let value = rest[..close].to_string();
            rest = rest[close + 1..].trim_start();
            if let Some(r) = rest.strip_prefix(',') {
                rest = r.trim_start();
            } else {
                assert!(
                    rest.is_empty(),
                    "line {}: expected ',' before {rest:?}",
                    n + 1
                );
            }
            let matching = matches!(op, "==" | "!=");
            let match_only = [
                "ACTION",
                "SUBSYSTEM",
                "KERNEL",
                "DRIVER",
                "DEVPATH",
                "TEST",
                "ATTR",
            ];
            assert!(
                matching || !match_only.contains(&key),
                "line {}: {key} can only be matched, not assigned",
                n + 1
            );
            assert!(
                [
                    "ACTION",
                    "SUBSYSTEM",
                    "KERNEL",
                    "DRIVER",
                    "DEVPATH",
                    "TEST",
                    "ATTR",
                    "ENV",
                    "RUN",
                    "TAG"
                ]
                .contains(&key),
                "line {}: unknown key {key}",
                n + 1
            );
            terms.push(Term {
                key: key.into(),
                attr,
                op: op.into(),
                value,
            });
        }
        rules.push(terms);
    }
    rules
}

/// udev's pattern match (fnmatch with `*`, `?`, `[...]`, and `|` separating alternatives).
fn glob(pattern: &str, s: &str) -> bool {
    fn one(p: &[char], s: &[char]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some('*'), _) => one(&p[1..], s) || (!s.is_empty() && one(p, &s[1..])),
            (Some('?'), Some(_)) => one(&p[1..], &s[1..]),
            (Some('['), Some(c)) => {
                let close = p.iter().position(|&x| x == ']').unwrap_or(p.len());
                p[1..close].contains(c) && one(&p[(close + 1).min(p.len())..], &s[1..])
            }
            (Some(a), Some(b)) if a == b => one(&p[1..], &s[1..]),
            _ => false,
        }
    }
    let s: Vec<char> = s.chars().collect();
    pattern
        .split('|')
        .any(|alt| one(&alt.chars().collect::<Vec<_>>(), &s))
}

/// A recorded kernel uevent and the sysfs attributes of its device.
struct Event<'a> {
    what: &'a str,
    action: &'a str,
    subsystem: &'a str,
    env: &'a [(&'a str, &'a str)],
    attrs: &'a [(&'a str, &'a str)],
}

/// The RUN commands the rules give for `ev`.
fn evaluate(rules: &[Vec<Term>], ev: &Event<'_>) -> Vec<String> {
    let env: BTreeMap<&str, &str> = ev.env.iter().copied().collect();
    let attrs: BTreeMap<&str, &str> = ev.attrs.iter().copied().collect();
    let mut run = Vec::new();
    for rule in rules {
        let matched = rule
            .iter()
            .filter(|t| t.op == "==" || t.op == "!=")
            .all(|t| {
                // As systemd's udev-rules.c: an unset property reads as "" (TK_M_ENV), while a sysfs
                // attribute that cannot be read fails the term whatever the operator (token_match_attr).
                let actual = match (t.key.as_str(), t.attr.as_deref()) {
                    ("ACTION", _) => Some(ev.action),
                    ("SUBSYSTEM", _) => Some(ev.subsystem),
                    ("ENV", Some(k)) => Some(env.get(k).copied().unwrap_or("")),
                    ("ATTR", Some(k)) => attrs.get(k).copied(),
                    (k, _) => panic!("the evaluator does not know {k}"),
                };
                actual.is_some_and(|a| glob(&t.value, a) == (t.op == "=="))
            });
        if matched {
            run.extend(
                rule.iter()
                    .filter(|t| t.key == "RUN")
                    .map(|t| t.value.clone()),
            );
        }
    }
    run
}

#[test]
fn the_udev_rule_starts_vgpud_for_mdev_parents_and_sriov_gpu_pfs_only() {
    let rules = parse_rules(&read("90-vgpu-manager.rules"));
    assert!(!rules.is_empty());
    let start = "/usr/bin/systemctl --no-block start vgpud.service";
    let events = [
        // Recorded shapes: the parent's change event on registration, PCI add/bind with sysfs attributes.
        (
            true,
            Event {
                what: "NVIDIA T4 registers as mdev parent",
                action: "change",
                subsystem: "pci",
                env: &[("MDEV_STATE", "registered"), ("DRIVER", "nvidia")],
                attrs: &[("class", "0x030200")],
            },
        ),
        (
            true,
            Event {
                what: "mbochs sample parent registers",
                action: "change",
                subsystem: "mbochs",
                env: &[("MDEV_STATE", "registered")],
                attrs: &[],
            },
        ),
        (
            false,
            Event {
                what: "parent unregisters",
                action: "change",
                subsystem: "pci",
                env: &[("MDEV_STATE", "unregistered")],
                attrs: &[],
            },
        ),
        (
            true,
            Event {
                what: "L40S PF enumerated",
                action: "add",
                subsystem: "pci",
                env: &[],
                attrs: &[("class", "0x030200"), ("sriov_totalvfs", "32")],
            },
        ),
        (
            true,
            Event {
                what: "Flex 170 PF bound to xe",
                action: "bind",
                subsystem: "pci",
                env: &[("DRIVER", "xe")],
                attrs: &[("class", "0x038000"), ("sriov_totalvfs", "31")],
            },
        ),
        (
            false,
            Event {
                what: "iGPU without SR-IOV bound",
                action: "bind",
                subsystem: "pci",
                env: &[("DRIVER", "i915")],
                attrs: &[("class", "0x030000")],
            },
        ),
        (
            false,
            Event {
                what: "GPU whose SR-IOV capability has no VFs",
                action: "add",
                subsystem: "pci",
                env: &[],
                attrs: &[("class", "0x030200"), ("sriov_totalvfs", "0")],
            },
        ),
        (
            false,
            Event {
                what: "SR-IOV NIC PF",
                action: "add",
                subsystem: "pci",
                env: &[],
                attrs: &[("class", "0x020000"), ("sriov_totalvfs", "7")],
            },
        ),
        (
            false,
            Event {
                what: "L40S VF appears",
                action: "add",
                subsystem: "pci",
                env: &[],
                attrs: &[("class", "0x030200")],
            },
        ),
        (
            false,
            Event {
                what: "an mdev device is created",
                action: "add",
                subsystem: "mdev",
                env: &[("MDEV_TYPE", "nvidia-231")],
                attrs: &[],
            },
        ),
        (
            false,
            Event {
                what: "L40S PF removed",
                action: "remove",
                subsystem: "pci",
                env: &[],
                attrs: &[("class", "0x030200"), ("sriov_totalvfs", "32")],
            },
        ),
    ];
    for (want, ev) in &events {
        let got = evaluate(&rules, ev);
        if *want {
            assert_eq!(got, [start], "{}", ev.what);
        } else {
            assert!(got.is_empty(), "{}: {got:?}", ev.what);
        }
    }
    // Every RUN is an absolute program that does not block udev, starting a unit we ship.
    for t in rules.iter().flatten().filter(|t| t.key == "RUN") {
        assert!(
            t.value.starts_with('/') && t.value.contains("--no-block"),
            "{t:?}"
        );
        let unit = t.value.rsplit(' ').next().unwrap();
        assert!(
            data(unit).exists(),
            "RUN starts {unit}, which data/ does not ship"
        );
    }
}

#[test]
fn the_glob_matcher_follows_udev() {
    assert!(glob("add|bind", "bind") && !glob("add|bind", "unbind"));
    assert!(glob("0x03*", "0x030200") && !glob("0x03*", "0x020000"));
    assert!(glob("?*", "1") && !glob("?*", ""));
    assert!(glob("0x0[23]*", "0x030000") && !glob("0x0[23]*", "0x010000"));
}

#[test]
fn udevadm_verify_accepts_the_rule_where_available() {
    // `udevadm verify` exists since systemd 254; older udev (Debian 12 has 252) and machines without
    // udev rely on the parser above.
    let Ok(o) = Command::new("udevadm").arg("verify").arg("--help").output() else {
        eprintln!("udevadm not installed: the rule is checked by the structural test only");
        return;
    };
    if !o.status.success() {
        eprintln!("this udevadm has no `verify`: the rule is checked by the structural test only");
        return;
    }
    let v = Command::new("udevadm")
        .arg("verify")
        .arg(data("90-vgpu-manager.rules"))
        .output()
        .unwrap();
    assert!(
        v.status.success(),
        "{}{}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

/// `Key=value` lines of an INI-style file, by section.
fn ini(text: &str) -> BTreeMap<String, Vec<(String, String)>> {
    let mut out: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut section = String::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(section.clone())
                .or_default()
                .push((k.trim().into(), v.trim().into()));
        } else {
            panic!("not a key=value line: {line}");
        }
    }
    out
}

fn get<'a>(
    f: &'a BTreeMap<String, Vec<(String, String)>>,
    section: &str,
    key: &str,
) -> Option<&'a str> {
    f.get(section)?
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

#[test]
fn the_unit_is_dbus_activated_under_the_daemons_bus_name() {
    let unit = ini(&read("vgpud.service"));
    assert_eq!(get(&unit, "Service", "Type"), Some("dbus"));
    assert_eq!(get(&unit, "Service", "BusName"), Some(SERVICE));
    assert!(get(&unit, "Service", "ExecStart").is_some_and(|e| e.starts_with("/usr/bin/vgpud ")));
    // The file-descriptor budget docs/security.md sizes (systemd's default soft limit is 1024).
    assert_eq!(get(&unit, "Service", "LimitNOFILE"), Some("8192"));
    // Reload applies the pool files again: vgpud does that on SIGHUP.
    assert_eq!(
        get(&unit, "Service", "ExecReload"),
        Some("/bin/kill -HUP $MAINPID")
    );
    assert!(
        get(&unit, "Service", "ExecStart")
            .is_some_and(|e| e.contains("--pools-dir /etc/vgpu-manager/pools.d"))
    );
    // The private socket where vgpuctl looks by default, in the runtime directory systemd makes
    // writable under ProtectSystem=strict.
    let private = vgpu_client::private::PRIVATE_SOCKET;
    assert!(
        get(&unit, "Service", "ExecStart")
            .is_some_and(|e| e.contains(&format!("--private-socket {private}")))
    );
    assert_eq!(
        Some(
            format!(
                "/run/{}/private",
                get(&unit, "Service", "RuntimeDirectory").unwrap()
            )
            .as_str()
        ),
        Some(private)
    );
    // Started before libvirt's daemons (monolithic and modular), ordering only.
    let before: Vec<&str> = get(&unit, "Unit", "Before")
        .unwrap()
        .split_whitespace()
        .collect();
    for d in [
        "libvirtd.service",
        "virtnodedevd.service",
        "virtqemud.service",
    ] {
        assert!(before.contains(&d), "Before= lacks {d}: {before:?}");
    }
    assert!(
        get(&unit, "Unit", "Wants").is_none(),
        "ordering only: no Wants="
    );
    let alias = get(&unit, "Install", "Alias").unwrap();
    let activation = ini(&read("org.vgpumanager.Manager1.service"));
    assert_eq!(get(&activation, "D-BUS Service", "Name"), Some(SERVICE));
    assert_eq!(
        get(&activation, "D-BUS Service", "SystemdService"),
        Some(alias)
    );
    assert!(read("org.vgpumanager.Manager1.conf").contains(&format!("<allow own=\"{SERVICE}\"/>")));
}

#[test]
fn completions_and_man_pages_come_from_vgpuctl() {
    let exe = env!("CARGO_BIN_EXE_vgpuctl");
    for shell in ["bash", "zsh", "fish"] {
        let o = Command::new(exe)
            .args(["completions", shell])
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && s.contains("mdevctl") && s.contains("xml"),
            "{shell}: {s:.200}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let o = Command::new(exe)
        .args(["manpage", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let page = std::fs::read_to_string(dir.path().join("vgpuctl.1")).unwrap();
    assert!(
        page.starts_with(".ie \\n(.g .ds Aq") || page.contains(".TH vgpuctl 1"),
        "{page:.200}"
    );
    assert!(dir.path().join("vgpuctl-mdevctl-list.1").exists());
    let bad = Command::new(exe)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}
