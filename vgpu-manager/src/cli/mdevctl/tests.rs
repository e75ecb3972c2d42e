//! The front end against the fake daemon, driven by the exact argument vectors libvirt's node-device
//! driver builds (libvirt tests/nodedevmdevctldata/*.argv and node_device_driver.c: options joined with
//! '=' by virCommandAddArgPair, `modify --uuid U --auto` as separate words).

use std::io::Write as _;

use clap::Parser;
use serde_json::Value;

use super::*;
use crate::hook::fake::{FakeDaemon, instance};

#[derive(Parser)]
struct T {
    #[command(subcommand)]
    c: MdevctlCommand,
}

const A: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const B: &str = "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e";

fn mdevctl(f: &mut FakeDaemon, line: &str) -> Result<String, String> {
    let argv = std::iter::once("mdevctl").chain(line.split_whitespace());
    let t = T::try_parse_from(argv).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    run_with(&t.c, f, &mut out).map_err(|e| e.to_string())?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

fn json_file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
    f.write_all(text.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    f
}

fn demo() -> FakeDaemon {
    let mut defined = instance(B, "nvidia-231", "stopped", true, "daemon");
    defined.autostart = true;
    FakeDaemon::new()
        .with(instance(A, "nvidia-222", "running", false, "foreign"))
        .with(defined)
}

#[test]
fn list_dumpjson_active_and_defined_in_mdevctl_shape() {
    let mut f = demo();
    let active: Value =
        serde_json::from_str(&mdevctl(&mut f, "list --dumpjson").unwrap_or_else(|e| panic!("{e}")))
            .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        active,
        serde_json::json!([{"0000:01:00.0": [{A: {"mdev_type": "nvidia-222", "start": "manual", "attrs": []}}]}])
    );
    let defined: Value = serde_json::from_str(
        &mdevctl(&mut f, "list --dumpjson --defined").unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        defined,
        serde_json::json!([{"0000:01:00.0": [{B: {"mdev_type": "nvidia-231", "start": "auto", "attrs": []}}]}])
    );
    // Filtered to one UUID: the bare configuration, as mdevctl prints it for a definition file.
    let one =
        mdevctl(&mut f, &format!("list -d --dumpjson -u {B}")).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        one.starts_with("{\n  \"mdev_type\": \"nvidia-231\""),
        "{one}"
    );
    assert_eq!(
        mdevctl(&mut f, "list --dumpjson -p 0000:ff:00.0")
            .ok()
            .as_deref(),
        Some("[]")
    );
}

#[test]
fn list_text_marks_defined_and_active() {
    let mut f = demo().with(instance(
        "11111111-2222-4333-8444-555555555555",
        "nvidia-231",
        "running",
        true,
        "daemon",
    ));
    let active = mdevctl(&mut f, "list").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        active,
        format!(
            "11111111-2222-4333-8444-555555555555 0000:01:00.0 nvidia-231 manual (defined)\n{A} 0000:01:00.0 nvidia-222 manual\n"
        )
    );
    let defined = mdevctl(&mut f, "list --defined").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        defined,
        format!(
            "11111111-2222-4333-8444-555555555555 0000:01:00.0 nvidia-231 manual (active)\n{B} 0000:01:00.0 nvidia-231 auto\n"
        )
    );
}

#[test]
fn types_dumpjson_lists_each_parent_with_availability() {
    let mut f = demo();
    let v: Value = serde_json::from_str(
        &mdevctl(&mut f, "types --dumpjson").unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        v,
        serde_json::json!([{"0000:01:00.0": [
            {"nvidia-222": {"available_instances": 16, "device_api": "vfio-pci"}},
            {"nvidia-231": {"available_instances": 8, "device_api": "vfio-pci"}}
        ]}])
    );
    let text = mdevctl(&mut f, "types").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        text.starts_with(
            "0000:01:00.0\n  nvidia-222\n    Available instances: 16\n    Device API: vfio-pci\n"
        ),
        "{text}"
    );
}

#[test]
fn libvirt_create_define_start_stop_undefine_and_autostart() {
    let mut f = FakeDaemon::new();
    let cfg = json_file(r#"{"mdev_type":"nvidia-231","start":"manual"}"#);
    let p = cfg.path().display();
    // nodeDeviceCreateXML → mdevctl start --parent=P --jsonfile=/dev/stdin --uuid=U
    assert_eq!(
        mdevctl(
            &mut f,
            &format!("start --parent=0000:01:00.0 --jsonfile={p} --uuid={A}")
        )
        .ok()
        .as_deref(),
        Some("")
    );
    assert_eq!(
        f.log.last().map(String::as_str),
        Some(&*format!(
            "create {A} type nvidia-231 gpu 0000:01:00.0 label -"
        ))
    );
    // Without --uuid the new UUID is printed (libvirt reads it from stdout).
    let out = mdevctl(
        &mut f,
        &format!("start --parent=0000:01:00.0 --jsonfile={p}"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.trim().parse::<mdev_types::ids::MdevUuid>().is_ok(),
        "{out}"
    );
    // nodeDeviceDefineXML → mdevctl define --parent=P --jsonfile=/dev/stdin --uuid=U
    let auto = json_file(r#"{"mdev_type":"nvidia-222","start":"auto"}"#);
    mdevctl(
        &mut f,
        &format!(
            "define --parent=0000:01:00.0 --jsonfile={} --uuid={B}",
            auto.path().display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(f.instances[B].defined && f.instances[B].autostart);
    // nodeDeviceCreate → start --uuid=U; nodeDeviceDestroy → stop --uuid=U
    mdevctl(&mut f, &format!("start --uuid={B}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.instances[B].state, "running");
    mdevctl(&mut f, &format!("stop --uuid={B}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.instances[B].state, "stopped");
    // nodeDeviceSetAutostart → modify --uuid U --manual / --auto
    mdevctl(&mut f, &format!("modify --uuid {B} --manual")).unwrap_or_else(|e| panic!("{e}"));
    assert!(!f.instances[B].autostart);
    mdevctl(&mut f, &format!("modify --uuid {B} --auto")).unwrap_or_else(|e| panic!("{e}"));
    assert!(f.instances[B].autostart);
    // nodeDeviceUndefine → undefine --uuid=U
    mdevctl(&mut f, &format!("undefine --uuid={B}")).unwrap_or_else(|e| panic!("{e}"));
    assert!(!f.instances.contains_key(B));
}

#[test]
fn libvirt_modify_probe_succeeds_and_defined_update_changes_type() {
    let mut f = demo();
    // nodeDeviceGetMdevctlModifySupportCheck: exit 0 means "modify --jsonfile/--defined/--live supported".
    let probe = T::try_parse_from([
        "mdevctl",
        "modify",
        "--defined",
        "--live",
        "--jsonfile",
        "b",
        "--help",
    ]);
    let e = probe.err().map(|e| e.kind());
    assert_eq!(e, Some(clap::error::ErrorKind::DisplayHelp));
    let cfg = json_file(r#"{"mdev_type":"nvidia-222","start":"manual"}"#);
    mdevctl(
        &mut f,
        &format!(
            "modify --parent=0000:01:00.0 --jsonfile={} --uuid={B} --defined",
            cfg.path().display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            f.instances[B].type_id.as_str(),
            f.instances[B].autostart,
            f.instances[B].defined
        ),
        ("nvidia-222", false, true)
    );
    let e = mdevctl(
        &mut f,
        &format!(
            "modify --parent=0000:01:00.0 --jsonfile={} --uuid={B} --live",
            cfg.path().display()
        ),
    )
    .unwrap_err();
    assert!(e.contains("--live"), "{e}");
}

#[test]
fn start_of_a_definition_with_another_type_is_refused_like_mdevctl() {
    let mut f = demo();
    let e = mdevctl(
        &mut f,
        &format!("start -u {B} -p 0000:01:00.0 -t nvidia-222"),
    )
    .unwrap_err();
    assert!(
        e.contains("already exists") && e.contains("nvidia-231"),
        "{e}"
    );
    let e = mdevctl(&mut f, "start -p 0000:01:00.0").unwrap_err();
    assert!(e.contains("insufficiently specified"), "{e}");
}

#[test]
fn unsupported_requests_say_why() {
    let mut f = demo();
    let e = mdevctl(&mut f, &format!("stop -u {B}")).unwrap_err();
    assert!(e.contains("not running"), "{e}");
    let e = mdevctl(&mut f, "undefine -u not-a-uuid").unwrap_err();
    assert!(e.contains("not a UUID"), "{e}");
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_json_files_attributes_reach_the_daemon_in_order_and_are_listed_back() {
    let mut f = demo();
    let file = json_file(
        r#"{"mdev_type":"nvidia-231","start":"manual","attrs":[{"assign_adapter":"5"},{"assign_domain":"4"}]}"#,
    );
    let p = file.path().display();
    let made = mdevctl(&mut f, &format!("define -p 0000:01:00.0 --jsonfile {p}"))
        .unwrap_or_else(|e| panic!("{e}"));
    let uuid = made.trim().to_string();
    let want = pairs(&[("assign_adapter", "5"), ("assign_domain", "4")]);
    assert_eq!(f.attrs.get(&uuid), Some(&want));
    let text = mdevctl(&mut f, &format!("list --defined --verbose -u {uuid}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        text,
        format!(
            "{uuid} 0000:01:00.0 nvidia-231 manual\n  Attrs:\n    @{{0}}: {{\"assign_adapter\":\"5\"}}\n    @{{1}}: {{\"assign_domain\":\"4\"}}\n"
        )
    );
    let json: Value = serde_json::from_str(
        &mdevctl(&mut f, &format!("list --defined --dumpjson -u {uuid}"))
            .unwrap_or_else(|e| panic!("{e}")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        json["attrs"],
        serde_json::json!([{"assign_adapter": "5"}, {"assign_domain": "4"}])
    );
}

#[test]
fn modify_adds_and_deletes_attributes_at_an_index_or_at_the_end() {
    let mut f = demo();
    f.attrs
        .insert(B.into(), pairs(&[("a", "1"), ("b", "2"), ("c", "3")]));
    let run = |f: &mut FakeDaemon, args: &str| {
        mdevctl(f, &format!("modify -u {B} {args}")).unwrap_or_else(|e| panic!("{args}: {e}"));
        f.attrs.get(B).cloned().unwrap_or_default()
    };
    assert_eq!(
        run(&mut f, "--addattr x --value 9 --index 1"),
        pairs(&[("a", "1"), ("x", "9"), ("b", "2"), ("c", "3")])
    );
    assert_eq!(
        run(&mut f, "--addattr y --value 8"),
        pairs(&[("a", "1"), ("x", "9"), ("b", "2"), ("c", "3"), ("y", "8")])
    );
    assert_eq!(
        run(&mut f, "--delattr --index 0"),
        pairs(&[("x", "9"), ("b", "2"), ("c", "3"), ("y", "8")])
    );
    assert_eq!(
        run(&mut f, "--delattr"),
        pairs(&[("x", "9"), ("b", "2"), ("c", "3")])
    );
    // The definition keeps its type and start mode.
    assert_eq!(
        (f.instances[B].type_id.as_str(), f.instances[B].autostart),
        ("nvidia-231", true)
    );
    let e = mdevctl(&mut f, &format!("modify -u {B} --delattr --index 7")).unwrap_err();
    assert!(e.contains("index 7"), "{e}");
    assert_eq!(f.attrs[B].len(), 3, "a refused modify changes nothing");
    // The index one past the last is refused too (mdevctl 1.2.0 panics there).
    let e = mdevctl(&mut f, &format!("modify -u {B} --delattr --index 3")).unwrap_err();
    assert!(e.contains("index 3"), "{e}");
    // Deleting the last of none changes nothing and succeeds, as mdevctl's pop does.
    for _ in 0..3 {
        run(&mut f, "--delattr");
    }
    assert_eq!(run(&mut f, "--delattr"), pairs(&[]));
}

#[test]
fn attributes_of_a_running_definition_are_not_changed_in_place() {
    let mut f = demo();
    if let Some(i) = f.instances.get_mut(B) {
        i.state = "running".into();
    }
    let e = mdevctl(&mut f, &format!("modify -u {B} --addattr x --value 1")).unwrap_err();
    assert!(e.contains("running") && e.contains("stop it"), "{e}");
}

#[test]
fn define_uuid_adopts_a_running_foreign_device() {
    let mut f = demo();
    mdevctl(&mut f, &format!("define --uuid {A}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        f.log.last().map(String::as_str),
        Some(&*format!(
            "define {A} type nvidia-222 gpu 0000:01:00.0 autostart false"
        ))
    );
    assert_eq!(
        (f.instances[A].owner.as_str(), f.instances[A].defined),
        ("adopted", true)
    );
}

#[test]
fn export_then_import_moves_definitions_between_the_tools() {
    let mut f = demo();
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dir.path().display().to_string();
    let listed = mdevctl(&mut f, &format!("export --dir {d}")).unwrap_or_else(|e| panic!("{e}"));
    let file = dir.path().join("0000:01:00.0").join(B);
    assert_eq!(listed.trim(), file.display().to_string());
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{e}"));
    assert!(text.contains("\"start\": \"auto\""), "{text}");
    // Into an empty daemon: the definition comes back with its type, parent and start mode.
    let mut empty = FakeDaemon::new();
    let dry = mdevctl(&mut empty, &format!("import --dir {d} --dry-run"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        dry.contains("would define nvidia-231") && empty.instances.is_empty(),
        "{dry}"
    );
    mdevctl(&mut empty, &format!("import --dir {d}")).unwrap_or_else(|e| panic!("{e}"));
    let i = &empty.instances[B];
    assert_eq!(
        (i.type_id.as_str(), i.parent.as_str(), i.autostart),
        ("nvidia-231", "0000:01:00.0", true)
    );
    // Importing again changes nothing.
    let again = mdevctl(&mut empty, &format!("import --dir {d}")).unwrap_or_else(|e| panic!("{e}"));
    assert!(again.contains("already defined"), "{again}");
}

#[test]
fn running_as_mdevctl_or_lsmdev_selects_the_front_end() {
    let p = |a: &str| Program::of(OsStr::new(a));
    assert_eq!(p("/usr/sbin/mdevctl"), Some(Program::Mdevctl));
    assert_eq!(p("lsmdev"), Some(Program::Lsmdev));
    assert_eq!(p("vgpuctl"), None);
    assert_eq!(p("/usr/bin/mdevctl-old"), None);
}

fn program(program: Program, line: &str) -> (i32, String, String) {
    let name = match program {
        Program::Mdevctl => "/usr/sbin/mdevctl",
        Program::Lsmdev => "/usr/sbin/lsmdev",
    };
    let argv = std::iter::once(name)
        .chain(line.split_whitespace())
        .map(OsString::from)
        .collect();
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run_program(
        program,
        argv,
        crate::cli::Teardown::Drop,
        &mut out,
        &mut err,
    );
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}

#[test]
fn as_mdevctl_the_usage_names_mdevctl_once() {
    let (code, out, _) = program(Program::Mdevctl, "--help");
    assert_eq!(code, 0);
    assert!(out.contains("Usage: mdevctl [OPTIONS] <COMMAND>"), "{out}");
    let (_, out, _) = program(Program::Mdevctl, "list --help");
    assert!(out.contains("Usage: mdevctl list [OPTIONS]"), "{out}");
    assert!(
        !out.contains("mdevctl mdevctl") && !out.contains("--sysfs-root"),
        "{out}"
    );
    let (code, _, err) = program(Program::Mdevctl, "bogus");
    assert_eq!(code, crate::cli::EXIT_USAGE);
    assert!(err.contains("Usage: mdevctl [OPTIONS] <COMMAND>"), "{err}");
    let (code, out, _) = program(Program::Lsmdev, "--help");
    assert_eq!(code, 0);
    assert!(out.contains("Usage: lsmdev [OPTIONS]"), "{out}");
}

#[test]
fn as_mdevctl_a_failure_is_reported_as_mdevctl_reports_it() {
    // No daemon on this bus: the command fails, as mdevctl's main reports an error (src/main.rs).
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let bus = format!("--bus=unix:path={}", dir.path().join("none").display());
    let (code, out, err) = program(Program::Mdevctl, &format!("list {bus}"));
    assert_eq!(code, EXIT_FAILED, "{err}");
    assert!(
        out.is_empty() && err.starts_with("Error: ") && err.ends_with('\n'),
        "{err}"
    );
}

#[test]
fn modify_options_combine_as_mdevctls_command_line_allows() {
    let mut f = demo();
    // One of --auto, --manual, --addattr, --delattr, --jsonfile is required: nothing, or --type alone,
    // is a usage error (mdevctl src/cli.rs), not a silent success.
    for line in [
        format!("modify --uuid {B}"),
        format!("modify --uuid {B} --type nvidia-222"),
        format!("modify --uuid {B} --auto --manual"),
    ] {
        let e = mdevctl(&mut f, &line).unwrap_err();
        assert!(e.contains("Usage:"), "{line}: {e}");
    }
    let e = mdevctl(&mut f, &format!("modify --uuid {B} --live --auto")).unwrap_err();
    assert_eq!(e, "'auto' cannot be changed on active mdev");
    assert!(f.log.is_empty(), "{:?}", f.log);
    // --type with --manual changes both.
    mdevctl(
        &mut f,
        &format!("modify --uuid {B} --type nvidia-222 --manual"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let b = &f.instances[B];
    assert_eq!((b.type_id.as_str(), b.autostart), ("nvidia-222", false));
    // A JSON file names a definition only with its parent.
    let cfg = json_file(r#"{"mdev_type":"nvidia-231","start":"auto"}"#);
    let e = mdevctl(
        &mut f,
        &format!("modify --uuid {B} --jsonfile {}", cfg.path().display()),
    )
    .unwrap_err();
    assert!(e.contains("Parent device required"), "{e}");
}

#[test]
fn start_parent_mdevs_starts_that_parents_auto_definitions() {
    const C: &str = "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3f";
    const D: &str = "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d40";
    let mut manual = instance(C, "nvidia-231", "stopped", true, "daemon");
    manual.autostart = false;
    let mut elsewhere = instance(D, "nvidia-231", "stopped", true, "daemon");
    elsewhere.autostart = true;
    elsewhere.parent = "0000:02:00.0".into();
    elsewhere.gpu = "0000:02:00.0".into();
    let mut f = demo().with(manual).with(elsewhere);
    mdevctl(&mut f, "start-parent-mdevs 0000:01:00.0").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.instances[B].state, "running");
    assert_eq!(f.instances[C].state, "stopped");
    assert_eq!(f.instances[D].state, "stopped");
    // Nothing due: still a success.
    mdevctl(&mut f, "start-parent-mdevs 0000:7f:00.0").unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn types_reads_every_mdev_parent_of_the_host_without_vgpud() {
    // A channel-subsystem parent (not a GPU) with mdevctl's fields; no daemon on the bus.
    let root = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let t = root
        .path()
        .join("sys/devices/css0/0.0.26ab/mdev_supported_types/vfio_ccw-io");
    std::fs::create_dir_all(&t).unwrap_or_else(|e| panic!("{e}"));
    for (f, v) in [
        ("available_instances", "4\n"),
        ("device_api", "vfio_mdev\n"),
        ("name", "I/O subchannel\n"),
        ("description", "line one\nline two\n"),
    ] {
        std::fs::write(t.join(f), v).unwrap_or_else(|e| panic!("{e}"));
    }
    std::fs::create_dir_all(root.path().join("sys/class/mdev_bus"))
        .unwrap_or_else(|e| panic!("{e}"));
    std::os::unix::fs::symlink(
        "../../devices/css0/0.0.26ab",
        root.path().join("sys/class/mdev_bus/0.0.26ab"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let host = HostArgs {
        sim: None,
        sim_journal: None,
        sysfs_root: Some(root.path().to_path_buf()),
    };
    let bus = BusArgs {
        bus: format!("unix:path={}", root.path().join("no-bus").display()),
    };
    let mut out = Vec::new();
    let t = T::try_parse_from(["mdevctl", "types"]).unwrap_or_else(|e| panic!("{e}"));
    run(&t.c, &bus, &host, &mut out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        String::from_utf8_lossy(&out),
        "0.0.26ab\n  vfio_ccw-io\n    Available instances: 4\n    Device API: vfio_mdev\n    Name: I/O subchannel\n    Description: line one, line two\n"
    );
}

#[test]
fn start_of_the_one_definition_is_one_call_and_a_refusal_keeps_mdevctls_words() {
    let mut f = demo();
    mdevctl(&mut f, &format!("start -u {B}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(f.instances[B].state, "running");
    assert_eq!(f.log, vec![format!("start-definition {B} -")]);
    // Started already: the one call is refused, and the full path says why as mdevctl does, without
    // trying the start again.
    let e = mdevctl(&mut f, &format!("start -u {B}")).unwrap_err();
    assert!(e.contains("is already running"), "{e}");
    assert_eq!(f.log.len(), 2, "{:?}", f.log);
    // Its parent named: the same one call, with the parent.
    f.log.clear();
    mdevctl(&mut f, &format!("stop -u {B}")).unwrap_or_else(|e| panic!("{e}"));
    mdevctl(&mut f, &format!("start -u {B} -p 0000:01:00.0")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        f.log,
        vec![
            format!("stop {B}"),
            format!("start-definition {B} 0000:01:00.0")
        ]
    );
    // Another parent: refused, as before the one call existed.
    let e = mdevctl(&mut f, &format!("start -u {B} -p 0000:02:00.0")).unwrap_err();
    assert!(e.contains("insufficiently specified"), "{e}");
}
