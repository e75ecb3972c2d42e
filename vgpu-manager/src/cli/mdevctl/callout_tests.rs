//! The front end's commands with real call-out scripts below a temporary root, against the fake
//! daemon: which commands a refusing `pre` call-out stops, what the scripts are told, and where their
//! answers go (`get attributes`, `live`).

use std::path::Path;

use clap::Parser;

use super::callouts::Callouts;
use super::*;
use crate::hook::fake::{FakeDaemon, instance};

#[derive(Parser)]
struct T {
    #[command(subcommand)]
    c: MdevctlCommand,
}

const RUNNING: &str = "4b20d080-1b54-4048-85b3-a6a62d165c01";
const DEFINED: &str = "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e";
const OWN: &str = "3eee6cd9-35ad-43bd-9be1-14ee2b7389c9";
const P: &str = "0000:01:00.0";

/// A root with one call-out script `body` (after a line that appends its arguments and input to
/// `calls.log` below the root).
struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn with_script(body: &str) -> Root {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let scripts = dir.path().join("usr/lib/mdevctl/scripts.d/callouts");
        std::fs::create_dir_all(&scripts).unwrap_or_else(|e| panic!("{e}"));
        let log = dir.path().join("calls.log");
        let path = scripts.join("script.sh");
        let text = format!(
            "#!/bin/sh\nin=$(cat)\necho \"$* <$in>\" >> '{}'\n{body}",
            log.display()
        );
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        Root { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.path().join("calls.log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn run(&self, f: &mut FakeDaemon, line: &str) -> Result<String, CliError> {
        let argv = std::iter::once("mdevctl").chain(line.split_whitespace());
        let t = T::try_parse_from(argv).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Vec::new();
        let mut co = Callouts::below(self.path()).echo_to(Box::new(std::io::sink()));
        run_with_callouts(&t.c, f, &mut co, &mut out)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}

fn daemon() -> FakeDaemon {
    FakeDaemon::new()
        .with(instance(RUNNING, "nvidia-222", "running", false, "foreign"))
        .with(instance(DEFINED, "nvidia-231", "stopped", true, "daemon"))
        .with(instance(OWN, "nvidia-231", "running", true, "daemon"))
}

fn json_file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(f.path(), text).unwrap_or_else(|e| panic!("{e}"));
    f
}

#[test]
fn a_refusing_pre_callout_stops_every_command_and_force_overrides_it() {
    let root = Root::with_script("exit 1\n");
    let commands = [
        format!("start -u {DEFINED}"),
        format!("start -u 59e8b599-afdd-4766-a59e-415ef4f5a492 -p {P} -t nvidia-231"),
        format!("stop -u {OWN}"),
        format!("undefine -u {DEFINED}"),
        format!("modify -u {DEFINED} --auto"),
        format!("define -p {P} -t nvidia-231"),
    ];
    for c in &commands {
        let mut f = daemon();
        let e = root.run(&mut f, c).err();
        assert!(
            matches!(e, Some(CliError::Callout(_))),
            "{c}: {e:?} (log {:?})",
            f.log
        );
        assert!(f.log.is_empty(), "{c} reached vgpud: {:?}", f.log);
        let mut f = daemon();
        root.run(&mut f, &format!("{c} --force"))
            .unwrap_or_else(|e| panic!("{c} --force: {e}"));
        assert_eq!(f.log.len(), 1, "{c} --force: {:?}", f.log);
    }
    // The refusal names the script and the way out.
    let e = root
        .run(&mut daemon(), &format!("stop -u {OWN}"))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("script.sh") && e.contains("--force"), "{e}");
}

#[test]
fn the_scripts_are_told_the_device_and_its_new_configuration() {
    let root = Root::with_script("exit 0\n");
    let mut f = daemon();
    f.attrs
        .insert(DEFINED.into(), vec![("assign_adapter".into(), "5".into())]);
    root.run(&mut f, &format!("modify -u {DEFINED} --auto"))
        .unwrap_or_else(|e| panic!("{e}"));
    let conf = r#"{"mdev_type":"nvidia-231","start":"auto","attrs":[{"assign_adapter":"5"}]}"#;
    let calls: Vec<String> = root
        .calls()
        .into_iter()
        .filter(|c| !c.contains("-a capabilities"))
        .collect();
    assert_eq!(
        calls,
        [
            format!("-t nvidia-231 -e pre -a modify -s none -u {DEFINED} -p {P} <{conf}>"),
            format!("-t nvidia-231 -e post -a modify -s success -u {DEFINED} -p {P} <{conf}>"),
        ]
    );
}

#[test]
fn a_new_device_is_made_with_the_uuid_the_scripts_saw() {
    let root = Root::with_script("exit 0\n");
    let mut f = daemon();
    let printed = root
        .run(&mut f, &format!("start -p {P} -t nvidia-231"))
        .unwrap_or_else(|e| panic!("{e}"));
    let uuid = printed.trim();
    assert!(f.instances.contains_key(uuid), "{printed:?}");
    assert!(
        root.calls()
            .iter()
            .any(|c| c.contains("-e pre -a start") && c.contains(&format!("-u {uuid} "))),
        "{:?}",
        root.calls()
    );
}

const ATTRS: &str = "if [ \"$4\" = get ] && [ \"$6\" = attributes ]; then printf '[{\"assign_adapter\": \"7\"}]'; fi\nexit 0\n";

#[test]
fn get_attributes_fills_the_active_list_and_a_definition_of_a_running_device() {
    let root = Root::with_script(ATTRS);
    let mut f = daemon();
    let listed = root
        .run(&mut f, &format!("list --dumpjson -u {RUNNING}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.contains("\"assign_adapter\": \"7\""), "{listed}");
    // The defined list shows the definition's attributes, not the script's.
    let defined = root
        .run(&mut f, "list --defined --dumpjson")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!defined.contains("assign_adapter"), "{defined}");
    let root = Root::with_script(
        "if [ \"$4\" = get ] && [ \"$6\" = attributes ]; then printf 'not json'; fi\nexit 0\n",
    );
    let e = root
        .run(&mut daemon(), &format!("define -u {RUNNING}"))
        .err();
    assert!(
        matches!(e, Some(CliError::Callout(_))),
        "a bad answer fails the define: {e:?}"
    );
    // In the list, a bad answer is left out.
    let listed = root
        .run(&mut daemon(), "list --dumpjson")
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.contains("\"attrs\": []"), "{listed}");
}

const LIVE: &str = "if [ \"$4\" = get ] && [ \"$6\" = capabilities ]; then printf '{\"supports\":{\"version\":2,\"actions\":[\"modify\"],\"events\":[\"pre\",\"post\",\"live\"]}}'; fi\nexit 0\n";

#[test]
fn live_modify_goes_to_a_script_with_the_live_event() {
    let cfg = json_file(r#"{"mdev_type":"nvidia-222","start":"manual","attrs":[{"a":"1"}]}"#);
    let live = format!(
        "modify -u {RUNNING} -p {P} --live --jsonfile {}",
        cfg.path().display()
    );
    let root = Root::with_script("exit 0\n");
    let e = root.run(&mut daemon(), &live).err().map(|e| e.to_string());
    assert!(
        e.as_deref()
            .is_some_and(|e| e.starts_with("No callout script with version support found")),
        "{e:?}"
    );
    let root = Root::with_script(LIVE);
    let mut f = daemon();
    root.run(&mut f, &live).unwrap_or_else(|e| panic!("{e}"));
    assert!(f.log.is_empty(), "vgpud changes nothing: {:?}", f.log);
    assert!(
        root.calls().iter().any(|c| c.starts_with(&format!(
            "-t nvidia-222 -e live -a modify -s none -u {RUNNING} -p {P} <{{\"mdev_type\":\"nvidia-222\""
        ))),
        "{:?}",
        root.calls()
    );
    // Another type, or a device that does not run, is refused before any script runs.
    let other = json_file(r#"{"mdev_type":"nvidia-231","start":"manual"}"#);
    let e = root
        .run(
            &mut daemon(),
            &format!(
                "modify -u {RUNNING} --live --jsonfile {}",
                other.path().display()
            ),
        )
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some("'type' cannot be changed on active mdev")
    );
    let e = root
        .run(
            &mut daemon(),
            &format!(
                "modify -u {DEFINED} --live --jsonfile {}",
                cfg.path().display()
            ),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("is not active"), "{e}");
}

#[test]
fn live_and_defined_runs_live_then_the_modify_callouts() {
    let root = Root::with_script(LIVE);
    let mut f = FakeDaemon::new().with(instance(RUNNING, "nvidia-222", "running", true, "foreign"));
    let cfg = json_file(r#"{"mdev_type":"nvidia-222","start":"manual"}"#);
    root.run(
        &mut f,
        &format!(
            "modify -u {RUNNING} -p {P} --live --defined --jsonfile {}",
            cfg.path().display()
        ),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let events: Vec<String> = root
        .calls()
        .iter()
        .filter_map(|c| c.split_whitespace().nth(3).map(str::to_string))
        .collect();
    assert_eq!(events, ["get", "live", "pre", "post"]);
    assert!(
        f.log.is_empty(),
        "the definition did not change: {:?}",
        f.log
    );
    // vgpud's own running instance: refused before the live call-out (its definition could not be
    // rewritten while it runs).
    let root = Root::with_script(LIVE);
    let cfg = json_file(r#"{"mdev_type":"nvidia-231","start":"auto"}"#);
    let e = root
        .run(
            &mut daemon(),
            &format!(
                "modify -u {OWN} -p {P} --live --defined --jsonfile {}",
                cfg.path().display()
            ),
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("stopping it"), "{e}");
    assert!(
        !root.calls().iter().any(|c| c.contains("-e live")),
        "{:?}",
        root.calls()
    );
}
