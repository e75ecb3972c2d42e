//! The mdevctl directory's file format, its tolerance of what others leave there, and the crash rules
//! of definitions kept in both the store and the directory (a crash injected before every durable
//! step of define, modify and undefine, then a restart).

use std::fs;
use std::path::Path;

use mdev_types::ids::MdevUuid;

use super::*;
use crate::daemon::api::{DefinitionOwner, MdevAttr};
use crate::daemon::engine::persist::Persist;
use crate::daemon::store::StateDir;

const P: &str = "0000:00:03.0";

pub(super) fn uuid(n: u32) -> MdevUuid {
    format!("976d8cc2-4bfc-43b9-b9f9-{n:012x}").parse().unwrap()
}

pub(super) fn def(n: u32, autostart: bool) -> Definition {
    Definition {
        uuid: uuid(n),
        parent: P.into(),
        gpu: P.into(),
        type_id: "i915-GVTg_V5_4".parse().unwrap(),
        profile: None,
        autostart,
        label: None,
        created_at: 1,
        attrs: vec![MdevAttr::new("assign_adapter", "5").unwrap()],
    }
}

fn open(root: &Path) -> Persist {
    let (state, _) = StateDir::open(root.join("state")).unwrap();
    let mut p = Persist::new(state, Some(MdevctlDir::new(root.join("mdevctl.d"))));
    p.reconcile_files(true);
    p
}

fn file_text(root: &Path, n: u32) -> Option<String> {
    fs::read_to_string(root.join("mdevctl.d").join(P).join(uuid(n).to_string())).ok()
}

#[test]
fn files_are_written_in_mdevctls_format() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = MdevctlDir::new(tmp.path().join("mdevctl.d"));
    let path = dir.write(&def(1, true)).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    // mdevctl src/mdev.rs to_json, pretty, no final newline (its tests' define/*.expected files).
    assert_eq!(
        text,
        "{\n  \"mdev_type\": \"i915-GVTg_V5_4\",\n  \"start\": \"auto\",\n  \"attrs\": [\n    {\n      \"assign_adapter\": \"5\"\n    }\n  ]\n}"
    );
    assert_eq!(
        dir.read(P, &uuid(1)).unwrap(),
        Some(config_of(&def(1, true)))
    );
    assert!(dir.remove(P, &uuid(1)).unwrap());
    assert!(!dir.remove(P, &uuid(1)).unwrap());
    assert_eq!(dir.read(P, &uuid(1)).unwrap(), None);
    // A parent that cannot be a directory name is refused, naming the definition.
    let bad = Definition {
        parent: "../x".into(),
        ..def(2, false)
    };
    let e = dir.write(&bad).unwrap_err().to_string();
    assert!(e.contains(&uuid(2).to_string()), "{e}");
}

#[test]
fn a_malformed_file_is_reported_and_the_rest_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = MdevctlDir::new(tmp.path().join("mdevctl.d"));
    dir.write(&def(1, false)).unwrap();
    let pdir = tmp.path().join("mdevctl.d").join(P);
    fs::write(pdir.join(uuid(2).to_string()), "{ not json").unwrap();
    fs::write(pdir.join("not-a-uuid"), "ignored as mdevctl ignores it").unwrap();
    fs::create_dir_all(tmp.path().join("mdevctl.d/scripts.d/callouts")).unwrap();
    let scan = dir.scan();
    assert_eq!(scan.devices.len(), 1);
    assert_eq!(scan.devices[0].uuid, uuid(1));
    assert_eq!(scan.unreadable.len(), 1);
    assert!(
        scan.unreadable[0]
            .to_string()
            .contains(&uuid(2).to_string())
    );
}

#[test]
fn only_vgpuds_temporary_files_are_removed_at_start() {
    let tmp = tempfile::tempdir().unwrap();
    let pdir = tmp.path().join("mdevctl.d").join(P);
    fs::create_dir_all(&pdir).unwrap();
    fs::write(pdir.join(format!(".tmp.{}.1.2", uuid(1))), "{").unwrap();
    fs::write(pdir.join(".someone-elses"), "x").unwrap();
    let removed = MdevctlDir::new(tmp.path().join("mdevctl.d")).remove_stray_temps();
    assert_eq!(removed.len(), 1);
    assert!(pdir.join(".someone-elses").exists());
}

#[test]
fn start_up_reconciles_the_directory_with_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    {
        let mut p = open(root);
        p.put_definition(&def(1, false)).unwrap();
        p.put_definition(&def(2, false)).unwrap();
        p.put_definition(&def(3, false)).unwrap();
    }
    // While vgpud is down: one file removed, one edited, one broken, and a foreign one written.
    let pdir = root.join("mdevctl.d").join(P);
    fs::remove_file(pdir.join(uuid(1).to_string())).unwrap();
    fs::write(
        pdir.join(uuid(2).to_string()),
        r#"{"mdev_type": "i915-GVTg_V5_8", "start": "auto", "attrs": []}"#,
    )
    .unwrap();
    fs::write(pdir.join(uuid(3).to_string()), "{ broken").unwrap();
    fs::write(
        pdir.join(uuid(4).to_string()),
        r#"{"mdev_type": "i915-GVTg_V5_4", "start": "manual"}"#,
    )
    .unwrap();
    let p = open(root);
    // The removed file of an own definition is written again.
    assert_eq!(
        file_text(root, 1).as_deref(),
        Some(config_of(&def(1, false)).to_json_pretty().as_str())
    );
    // The edit is taken in.
    let two = p.get_definition(&uuid(2)).unwrap();
    assert_eq!(two.type_id.as_str(), "i915-GVTg_V5_8");
    assert!(two.autostart && two.attrs.is_empty());
    // The broken file is left as it is, and the definition kept.
    assert_eq!(file_text(root, 3).as_deref(), Some("{ broken"));
    assert!(p.get_definition(&uuid(3)).is_some());
    // The foreign file is listed as foreign, and not taken into the store.
    let all = p.all_definitions();
    let four: Vec<_> = all.iter().filter(|d| d.uuid == uuid(4)).collect();
    assert_eq!(four.len(), 1);
    assert_eq!(four[0].owner, DefinitionOwner::Foreign);
    assert!(p.get_definition(&uuid(4)).is_none());
    assert_eq!(
        all.iter()
            .filter(|d| d.owner == DefinitionOwner::Daemon)
            .count(),
        3
    );
}

/// One definition change, as the engine makes it.
#[derive(Debug, Clone, Copy)]
enum Change {
    Define,
    Modify,
    Undefine,
    /// The same undefine, as one of several removed together (a pool shrink's run).
    UndefineWithOthers,
}

/// What the definition of `uuid(1)` is after the change, or before it.
fn expected(change: Change, after: bool) -> Option<Definition> {
    match (change, after) {
        (Change::Define, false) | (Change::Undefine | Change::UndefineWithOthers, true) => None,
        (Change::Define, true)
        | (Change::Modify, false)
        | (Change::Undefine | Change::UndefineWithOthers, false) => Some(def(1, false)),
        (Change::Modify, true) => Some(def(1, true)),
    }
}

/// Store and file after a restart, compared with `want` (the file must hold exactly the store's
/// definition, or be absent with it).
fn holds(root: &Path, want: &Option<Definition>) -> bool {
    let p = open(root);
    let stored = p.get_definition(&uuid(1)).cloned();
    let file = file_text(root, 1);
    drop(p);
    stored == *want && file == want.as_ref().map(|d| config_of(d).to_json_pretty())
}

#[test]
fn a_crash_at_any_step_loses_no_acknowledged_change() {
    for change in [
        Change::Define,
        Change::Modify,
        Change::Undefine,
        Change::UndefineWithOthers,
    ] {
        let mut completed = false;
        for crash_at in 0..8 {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path();
            if let Some(d) = expected(change, false) {
                open(root).put_definition(&d).unwrap();
            }
            let mut p = open(root);
            p.fail_after(crash_at);
            let result = match change {
                Change::Define | Change::Modify => p
                    .put_definition(&expected(change, true).unwrap())
                    .map(|_| ()),
                Change::Undefine => p.remove_definition(&uuid(1)).map(|_| ()),
                // uuid(2) has no definition: it is passed over.
                Change::UndefineWithOthers => p.remove_definitions(&[uuid(2), uuid(1)]),
            };
            // The crash: nothing after the failed step runs; then vgpud starts again.
            drop(p);
            // A vgpud write interrupted between its temporary file and the rename.
            let pdir = root.join("mdevctl.d").join(P);
            if pdir.is_dir() {
                fs::write(pdir.join(format!(".tmp.{}.9.9", uuid(1))), "{").unwrap();
            }
            let (before, after) = (expected(change, false), expected(change, true));
            if result.is_ok() {
                // Acknowledged: the change is there, in the store and in the file.
                assert!(
                    holds(root, &after),
                    "{change:?}, crash after {crash_at} steps: acknowledged change lost"
                );
                completed = true;
            } else {
                // Not acknowledged: all or nothing, the file agreeing with the store.
                assert!(
                    holds(root, &before) || holds(root, &after),
                    "{change:?}, crash after {crash_at} steps: store and file disagree"
                );
            }
            assert!(
                !pdir.join(format!(".tmp.{}.9.9", uuid(1))).exists(),
                "leftover temporary file kept"
            );
        }
        assert!(completed, "{change:?} never completed within 8 steps");
    }
}

#[test]
fn the_parent_defining_a_uuid_is_found_without_reading_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = MdevctlDir::new(tmp.path().join("mdevctl.d"));
    // No directory yet: nobody defines anything.
    assert_eq!(dir.defining_parent(&uuid(1)), None);
    dir.write(&def(1, false)).unwrap();
    assert_eq!(dir.defining_parent(&uuid(1)).as_deref(), Some(P));
    assert_eq!(dir.defining_parent(&uuid(2)), None);
    // Another tool's file (any content) counts: the name is what mdevctl keys definitions by.
    fs::create_dir_all(tmp.path().join("mdevctl.d/mtty")).unwrap();
    fs::write(
        tmp.path().join("mdevctl.d/mtty").join(uuid(3).to_string()),
        "not json",
    )
    .unwrap();
    assert_eq!(dir.defining_parent(&uuid(3)).as_deref(), Some("mtty"));
    // A directory with the UUID's name is no definition.
    fs::create_dir_all(tmp.path().join("mdevctl.d/mtty").join(uuid(4).to_string())).unwrap();
    assert_eq!(dir.defining_parent(&uuid(4)), None);
    // Read for all UUIDs at once, the same answers; a name in another spelling is no lookup's.
    fs::write(
        tmp.path()
            .join("mdevctl.d/mtty")
            .join(uuid(5).to_string().to_uppercase()),
        "",
    )
    .unwrap();
    assert_eq!(dir.defining_parent(&uuid(5)), None);
    let all = dir.defined_uuids();
    for n in 1..=5 {
        assert_eq!(
            all.contains(&uuid(n)),
            dir.defining_parent(&uuid(n)).is_some(),
            "uuid {n}"
        );
    }
    assert_eq!(all.len(), 2, "{all:?}");
    assert!(
        MdevctlDir::new(tmp.path().join("none"))
            .defined_uuids()
            .is_empty()
    );
}

#[test]
fn files_written_together_match_single_writes_and_a_bad_parent_fails_alone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = MdevctlDir::new(tmp.path().join("mdevctl.d"));
    let other = "0000:00:04.0";
    let mut defs: Vec<Definition> = (1..=3).map(|n| def(n, n == 2)).collect();
    defs.push(Definition {
        parent: other.into(),
        gpu: other.into(),
        ..def(4, false)
    });
    defs.push(Definition {
        parent: "../x".into(),
        ..def(5, false)
    });
    let failures = dir.write_all(&defs);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].defs, vec![(uuid(5), "../x".to_string())]);
    assert!(
        failures[0].error.to_string().contains(&uuid(5).to_string()),
        "{}",
        failures[0].error
    );
    for d in &defs[..4] {
        assert_eq!(dir.read(&d.parent, &d.uuid).unwrap(), Some(config_of(d)));
    }
    // The same text a single write gives.
    let single = tempfile::tempdir().unwrap();
    let one = MdevctlDir::new(single.path());
    let path = one.write(&defs[1]).unwrap();
    assert_eq!(
        fs::read_to_string(path).unwrap(),
        file_text(tmp.path(), 2).unwrap()
    );
    assert!(
        !fs::read_dir(tmp.path().join("mdevctl.d").join(P))
            .unwrap()
            .any(|e| e.unwrap().file_name().to_string_lossy().starts_with('.'))
    );
    // Removed together: those that had a file are named, one without a file is not, and another
    // parent's file with the same directory layout stays.
    let keys = vec![
        (uuid(1), P.to_string()),
        (uuid(3), P.to_string()),
        (uuid(9), P.to_string()),
        (uuid(4), other.to_string()),
    ];
    let mut gone = dir.remove_all(&keys).unwrap();
    gone.sort();
    let mut want = vec![
        (uuid(1), P.to_string()),
        (uuid(3), P.to_string()),
        (uuid(4), other.to_string()),
    ];
    want.sort();
    assert_eq!(gone, want);
    assert_eq!(dir.read(P, &uuid(1)).unwrap(), None);
    assert_eq!(dir.read(other, &uuid(4)).unwrap(), None);
    assert_eq!(dir.read(P, &uuid(2)).unwrap(), Some(config_of(&defs[1])));
    // A parent with no directory has nothing to remove.
    assert!(
        dir.remove_all(&[(uuid(7), "0000:00:09.0".to_string())])
            .unwrap()
            .is_empty()
    );
}
