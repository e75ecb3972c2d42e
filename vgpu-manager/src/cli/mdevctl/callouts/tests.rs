//! The call-out rules against a fake runner (which scripts run, in which order, with which arguments
//! and input), and the real runner against real scripts.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use qemu_glue::mdevctl::StartMode;

use super::protocol::{Action, Call, Device, Event};
use super::runner::{Exit, Outcome, ProcessRunner, RunError, Runner};
use super::{CalloutError, Callouts};

/// Every call a fake saw, with its standard input.
type Calls = Rc<RefCell<Vec<(Call, Option<String>)>>>;

type Behaviour = Box<dyn Fn(&Call, Option<&[u8]>) -> Outcome>;

/// Scripts by path, each a function of its call; every call is recorded.
#[derive(Default)]
struct Fake {
    dirs: BTreeMap<PathBuf, Vec<PathBuf>>,
    scripts: BTreeMap<PathBuf, Behaviour>,
    calls: Calls,
}

impl Runner for Fake {
    fn entries(&self, dir: &Path) -> Option<Vec<PathBuf>> {
        self.dirs.get(dir).cloned()
    }

    fn run(&mut self, call: &Call, stdin: Option<&[u8]>) -> Result<Outcome, RunError> {
        self.calls.borrow_mut().push((
            call.clone(),
            stdin.map(|s| String::from_utf8_lossy(s).into_owned()),
        ));
        match self.scripts.get(&call.script) {
            Some(b) => Ok(b(call, stdin)),
            None => Err(RunError::Spawn {
                script: call.script.clone(),
                source: std::io::Error::from_raw_os_error(13),
            }),
        }
    }
}

const NEW: &str = "/usr/lib/mdevctl/scripts.d/callouts";
const OLD: &str = "/etc/mdevctl.d/scripts.d/callouts";
const NOTIFIERS: &str = "/usr/lib/mdevctl/scripts.d/notifiers";

fn caps(events: &str) -> String {
    format!(
        r#"{{"supports":{{"version":2,"actions":["start","stop","define","undefine","modify","attributes","capabilities","future-action"],"events":[{events}]}}}}"#
    )
}

/// A script that exits `rc` for everything.
fn rc(rc: i32) -> Behaviour {
    Box::new(move |_, _| Outcome::code(rc, ""))
}

/// A versioned script: answers capabilities (`events`), then exits `rc`.
fn versioned(events: &'static str, rc: i32) -> Behaviour {
    Box::new(move |c, _| match (c.event, c.action) {
        (Event::Get, Action::Capabilities) => Outcome::code(0, &caps(events)),
        _ => Outcome::code(rc, ""),
    })
}

struct Setup {
    fake: Fake,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            fake: Fake::default(),
        }
    }

    fn script(mut self, dir: &str, name: &str, b: Behaviour) -> Setup {
        let path = Path::new(dir).join(name);
        let list = self.fake.dirs.entry(PathBuf::from(dir)).or_default();
        list.push(path.clone());
        list.sort();
        self.fake.scripts.insert(path, b);
        self
    }

    fn build(self) -> (Callouts, Calls) {
        let calls = self.fake.calls.clone();
        let c = Callouts::with_runner(
            vec![PathBuf::from(NEW), PathBuf::from(OLD)],
            vec![PathBuf::from(NOTIFIERS)],
            Box::new(self.fake),
        )
        .echo_to(Box::new(std::io::sink()));
        (c, calls)
    }
}

fn dev() -> Device {
    Device {
        uuid: "976d8cc2-4bfc-43b9-b9f9-f4af2de91ab9".into(),
        parent: "0000:00:03.0".into(),
        mdev_type: "arbitrary_type".into(),
        start: StartMode::Manual,
        attrs: vec![("assign_adapter".into(), "5".into())],
    }
}

/// (script file name, event, action, state) of each call but the capabilities search.
fn seen(calls: &Calls) -> Vec<String> {
    calls
        .borrow()
        .iter()
        .filter(|(c, _)| c.action != Action::Capabilities)
        .map(|(c, _)| {
            format!(
                "{} {} {} {}",
                c.script.file_name().unwrap_or_default().to_string_lossy(),
                c.event,
                c.action,
                c.state.as_str()
            )
        })
        .collect()
}

fn start(c: &mut Callouts, force: bool) -> (Result<(), CalloutError>, bool) {
    let mut ran = false;
    let r = c.invoke(Action::Start, &dev(), force, |_| {
        ran = true;
        Ok::<(), CalloutError>(())
    });
    (r, ran)
}

#[test]
fn arguments_and_input_are_mdevctls() {
    let (mut c, calls) = Setup::new().script(NEW, "a", rc(0)).build();
    let (r, ran) = start(&mut c, false);
    assert!(r.is_ok() && ran);
    let calls = calls.borrow();
    let (first, input) = &calls[0];
    assert_eq!(first.action, Action::Capabilities);
    assert_eq!(input.as_deref(), Some(super::protocol::PROVIDES));
    let (pre, input) = &calls[1];
    assert_eq!(
        pre.args(),
        [
            "-t",
            "arbitrary_type",
            "-e",
            "pre",
            "-a",
            "start",
            "-s",
            "none",
            "-u",
            "976d8cc2-4bfc-43b9-b9f9-f4af2de91ab9",
            "-p",
            "0000:00:03.0"
        ]
    );
    assert_eq!(
        input.as_deref(),
        Some(r#"{"mdev_type":"arbitrary_type","start":"manual","attrs":[{"assign_adapter":"5"}]}"#)
    );
}

#[test]
fn the_first_script_in_name_order_answers() {
    let (mut c, calls) = Setup::new()
        .script(NEW, "99.sh", rc(0))
        .script(NEW, "00.sh", rc(1))
        .build();
    let (r, ran) = start(&mut c, false);
    assert!(
        matches!(r, Err(CalloutError::Failed { status: 1, .. })),
        "{r:?}"
    );
    assert!(!ran, "a refusing pre call-out stops the command");
    assert_eq!(seen(&calls), ["00.sh pre start none"]);
}

#[test]
fn force_goes_on_and_post_is_told_the_result() {
    let (mut c, calls) = Setup::new().script(NEW, "00.sh", rc(1)).build();
    let (r, ran) = start(&mut c, true);
    assert!(r.is_ok() && ran);
    assert_eq!(
        seen(&calls),
        ["00.sh pre start none", "00.sh post start success"]
    );
    let (mut c, calls) = Setup::new()
        .script(NEW, "00.sh", rc(0))
        .script(NOTIFIERS, "n", rc(1))
        .build();
    let r = c.invoke(Action::Stop, &dev(), false, |_| {
        Err::<(), _>(CalloutError::NoLiveScript {
            uuid: String::new(),
            mdev_type: String::new(),
            parent: String::new(),
        })
    });
    assert!(r.is_err());
    assert_eq!(
        seen(&calls),
        [
            "00.sh pre stop none",
            "00.sh post stop failure",
            "n notify stop failure"
        ]
    );
}

#[test]
fn the_new_directory_comes_first_and_exit_2_means_not_my_type() {
    let (mut c, calls) = Setup::new()
        .script(NEW, "script.sh", rc(0))
        .script(OLD, "script.sh", rc(1))
        .build();
    assert!(start(&mut c, false).0.is_ok());
    assert_eq!(
        seen(&calls),
        ["script.sh pre start none", "script.sh post start success"]
    );
    let (mut c, calls) = Setup::new()
        .script(NEW, "script.sh", rc(2))
        .script(OLD, "script.sh", rc(1))
        .build();
    assert!(start(&mut c, false).0.is_err());
    let pre: Vec<PathBuf> = calls
        .borrow()
        .iter()
        .filter(|(c, _)| c.event == Event::Pre)
        .map(|(c, _)| c.script.clone())
        .collect();
    assert_eq!(
        pre,
        [
            Path::new(NEW).join("script.sh"),
            Path::new(OLD).join("script.sh")
        ]
    );
    // Only scripts that say "not mine": the command goes on as if there were none.
    let (mut c, _) = Setup::new().script(NEW, "a", rc(2)).build();
    assert!(start(&mut c, false).0.is_ok());
}

#[test]
fn a_script_that_cannot_run_is_skipped() {
    let mut s = Setup::new().script(NEW, "b", rc(1));
    s.fake
        .dirs
        .get_mut(Path::new(NEW))
        .unwrap()
        .insert(0, Path::new(NEW).join("a-not-executable"));
    let (mut c, calls) = s.build();
    assert!(start(&mut c, false).0.is_err());
    assert!(seen(&calls).contains(&"b pre start none".to_string()));
}

#[test]
fn a_versioned_script_answers_alone_and_only_for_what_it_lists() {
    let all = r#""pre","post","notify","get""#;
    // An unversioned script sorts first but is never asked once a versioned one exists.
    let (mut c, calls) = Setup::new()
        .script(NEW, "rc1", rc(1))
        .script(NEW, "ver-rc0", versioned(all, 0))
        .build();
    assert!(start(&mut c, false).0.is_ok());
    assert_eq!(
        seen(&calls),
        ["ver-rc0 pre start none", "ver-rc0 post start success"]
    );
    let (mut c, _) = Setup::new()
        .script(NEW, "rc0", rc(0))
        .script(NEW, "ver-rc1", versioned(all, 1))
        .build();
    assert!(start(&mut c, false).0.is_err());
    // A versioned script without the pre event refuses every command.
    let (mut c, _) = Setup::new()
        .script(NEW, "v", versioned(r#""post""#, 0))
        .build();
    assert!(matches!(
        start(&mut c, false).0,
        Err(CalloutError::Unsupported {
            event: Event::Pre,
            ..
        })
    ));
}

#[test]
fn capabilities_are_asked_once_per_parent_and_type() {
    let (mut c, calls) = Setup::new()
        .script(NEW, "v", versioned(r#""pre","post""#, 0))
        .build();
    assert!(start(&mut c, false).0.is_ok());
    assert!(start(&mut c, false).0.is_ok());
    let other = Device {
        mdev_type: "other".into(),
        ..dev()
    };
    assert!(
        c.invoke(Action::Start, &other, false, |_| Ok::<(), CalloutError>(()))
            .is_ok()
    );
    let asked = calls
        .borrow()
        .iter()
        .filter(|(c, _)| c.action == Action::Capabilities)
        .count();
    assert_eq!(asked, 2);
}

fn answering(stdout: &'static str) -> Behaviour {
    Box::new(move |c, _| match c.event {
        Event::Get if c.action == Action::Attributes => Outcome::code(0, stdout),
        _ => Outcome::code(0, ""),
    })
}

#[test]
fn get_attributes_reads_the_answer_as_mdevctl_does() {
    let attrs = |stdout: &'static str| {
        let (mut c, calls) = Setup::new().script(NEW, "s", answering(stdout)).build();
        let r = c.attributes(&dev());
        let stdin = calls
            .borrow()
            .iter()
            .find(|(c, _)| c.action == Action::Attributes)
            .map(|(_, i)| i.clone());
        assert_eq!(stdin, Some(None), "get attributes has no input");
        r
    };
    assert_eq!(
        attrs("[{\"attribute0\": \"VALUE\"}]\0\0").ok(),
        Some(Some(vec![("attribute0".into(), "VALUE".into())]))
    );
    assert_eq!(attrs("").ok(), Some(None));
    assert_eq!(attrs("[{}]").ok(), Some(Some(Vec::new())));
    assert!(matches!(
        attrs("not json"),
        Err(CalloutError::AttributesJson { .. })
    ));
    assert!(matches!(
        attrs("[{\"a\": 1}]"),
        Err(CalloutError::AttributesShape { .. })
    ));
    let (mut c, _) = Setup::new().build();
    assert_eq!(c.attributes(&dev()).ok(), Some(None));
}

#[test]
fn live_modify_needs_a_versioned_script_with_the_live_event() {
    let (mut c, _) = Setup::new().script(NEW, "rc0", rc(0)).build();
    assert!(matches!(
        c.modify_live(&dev()),
        Err(CalloutError::NoLiveScript { .. })
    ));
    let (mut c, _) = Setup::new()
        .script(NEW, "v", versioned(r#""pre","post""#, 0))
        .build();
    assert!(matches!(
        c.modify_live(&dev()),
        Err(CalloutError::Unsupported {
            event: Event::Live,
            ..
        })
    ));
    let (mut c, calls) = Setup::new()
        .script(NEW, "v", versioned(r#""pre","post","live""#, 0))
        .script(NOTIFIERS, "n", rc(0))
        .build();
    assert!(c.modify_live(&dev()).is_ok());
    assert_eq!(seen(&calls), ["v live modify none", "n notify modify none"]);
    let live_input = calls
        .borrow()
        .iter()
        .find(|(c, _)| c.event == Event::Live)
        .and_then(|(_, i)| i.clone());
    assert_eq!(live_input, Some(dev().config_json()));
    let (mut c, _) = Setup::new()
        .script(NEW, "v", versioned(r#""live""#, 1))
        .build();
    assert!(matches!(
        c.modify_live(&dev()),
        Err(CalloutError::Failed { status: 1, .. })
    ));
}

fn write_script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap_or_else(|e| panic!("{e}"));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("{e}"));
    path
}

fn call_of(script: PathBuf) -> Call {
    Call {
        script,
        event: Event::Pre,
        action: Action::Start,
        state: super::protocol::State::None,
        mdev_type: "t".into(),
        uuid: "u".into(),
        parent: "p".into(),
    }
}

#[test]
fn the_process_runner_passes_arguments_and_input_and_keeps_the_output() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let s = write_script(
        tmp.path(),
        "echo",
        "echo \"$*\"; cat; echo oops >&2; exit 3\n",
    );
    let out = ProcessRunner::default()
        .run(&call_of(s), Some(b"{\"x\":1}"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.exit, Exit::Code(3));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "-t t -e pre -a start -s none -u u -p p\n{\"x\":1}"
    );
    assert_eq!(out.stderr, b"oops\n");
    let not_exec = tmp.path().join("plain");
    std::fs::write(&not_exec, "exit 0\n").unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(
        ProcessRunner::default().run(&call_of(not_exec), None),
        Err(RunError::Spawn { .. })
    ));
}

#[test]
fn the_process_runner_kills_a_script_that_hangs() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // The script's child keeps the pipes open too: the whole process group goes.
    let s = write_script(tmp.path(), "hang", "sleep 300 &\nsleep 300\n");
    let started = std::time::Instant::now();
    let r = ProcessRunner::new(std::time::Duration::from_secs(1)).run(&call_of(s.clone()), None);
    assert!(
        matches!(&r, Err(RunError::TimedOut { script, .. }) if *script == s),
        "{r:?}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    let message = r.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("hang") && message.contains("killed"),
        "{message}"
    );
}

#[test]
fn a_script_that_leaves_a_child_holding_its_output_still_returns() {
    let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let s = write_script(
        tmp.path(),
        "daemonizes",
        "echo started\nsleep 5 &\nexit 0\n",
    );
    let r = ProcessRunner::new(std::time::Duration::from_secs(1)).run(&call_of(s), None);
    // The script is done but its child holds stdout: its status and what it wrote stand.
    let out = r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.exit, Exit::Code(0));
    assert_eq!(out.stdout, b"started\n");
}

/// A script's behaviour in the search property: an exit status, or death by a signal.
fn ending(code: i32) -> Behaviour {
    Box::new(move |_, _| Outcome {
        exit: if code < 0 {
            Exit::Signal(9)
        } else {
            Exit::Code(code)
        },
        stdout: Vec::new(),
        stderr: Vec::new(),
    })
}

proptest::proptest! {
    /// Without versioned scripts, `pre` asks the scripts in directory-then-name order up to the
    /// first that neither says "not mine" (2) nor dies; the command runs when that one says 0, when
    /// none answers, or with --force; it fails exactly when the answer refuses and --force is absent.
    #[test]
    fn pre_asks_in_order_up_to_the_first_answer(
        scripts in proptest::collection::vec((proptest::bool::ANY, proptest::prop_oneof![
            proptest::strategy::Just(0), proptest::strategy::Just(1), proptest::strategy::Just(2),
            proptest::strategy::Just(3), proptest::strategy::Just(-1)]), 0..6),
        force in proptest::bool::ANY,
    ) {
        let mut s = Setup::new();
        let mut order: Vec<(bool, String, i32)> = Vec::new();
        for (i, (old, code)) in scripts.iter().enumerate() {
            let name = format!("{i:02}.sh");
            s = s.script(if *old { OLD } else { NEW }, &name, ending(*code));
            order.push((*old, name, *code));
        }
        // The new directory first, each in name order.
        order.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
        let (mut c, calls) = s.build();
        let (r, ran) = start(&mut c, force);
        let answer = order.iter().position(|(_, _, code)| *code != 2 && *code >= 0);
        let asked: Vec<String> = order
            .iter()
            .take(answer.map_or(order.len(), |a| a + 1))
            .map(|(_, n, _)| n.clone())
            .collect();
        let pre: Vec<String> = calls
            .borrow()
            .iter()
            .filter(|(c, _)| c.event == Event::Pre)
            .map(|(c, _)| c.script.file_name().unwrap_or_default().to_string_lossy().into_owned())
            .collect();
        proptest::prop_assert_eq!(pre, asked);
        let refused = answer.is_some_and(|a| order[a].2 != 0);
        proptest::prop_assert_eq!(ran, !refused || force);
        proptest::prop_assert_eq!(r.is_err(), refused && !force);
    }
}

#[test]
fn callouts_are_empty_only_without_any_script() {
    let (c, _) = Setup::new().build();
    assert!(c.is_empty(), "no directory lists anything");
    let (c, _) = Setup::new().script(OLD, "a", rc(0)).build();
    assert!(!c.is_empty(), "a call-out script");
    let (c, _) = Setup::new().script(NOTIFIERS, "n", rc(0)).build();
    assert!(!c.is_empty(), "a notifier");
    assert!(Callouts::none().is_empty());
}
