//! Definitions and ledger entries: round trips, file format, temp files, corruption, locking,
//! invalid records and write errors.

use std::os::unix::fs::PermissionsExt;

use super::*;

#[test]
fn round_trip_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("state");
    let mut bare = def(2);
    bare.profile = None;
    bare.label = None;
    bare.autostart = false;
    {
        let (mut s, report) = StateDir::open(&root).unwrap();
        assert_eq!(report, LoadReport::default());
        s.put_definition(&def(1)).unwrap();
        s.put_definition(&bare).unwrap();
        s.put_ledger(&ledger(1)).unwrap();
        s.put_ledger(&ledger(2)).unwrap();
        s.put_ledger(&ledger(3)).unwrap();
    }
    let (s, report) = StateDir::open(&root).unwrap();
    assert_eq!(report.definitions, 2);
    assert_eq!(report.ledger_entries, 3);
    assert!(report.set_aside.is_empty());
    assert_eq!(defs_of(&s), vec![def(1), bare.clone()]);
    assert_eq!(ledger_of(&s), vec![ledger(1), ledger(2), ledger(3)]);
    assert_eq!(ledger(3).gpu.as_deref(), Some("0000:3b:00.0"));
    assert_eq!(s.get_definition(&uuid(2)), Some(&bare));
    assert_eq!(s.get_ledger(&uuid(1)), Some(&ledger(1)));
    assert_eq!(s.get_definition(&uuid(3)), None);
}

#[test]
fn replace_and_remove_persist() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&def(1)).unwrap();
        let mut changed = def(1);
        changed.autostart = false;
        s.put_definition(&changed).unwrap();
        s.put_definition(&def(2)).unwrap();
        assert_eq!(s.remove_definition(&uuid(2)).unwrap(), Some(def(2)));
        assert_eq!(s.remove_definition(&uuid(2)).unwrap(), None);
        s.put_ledger(&ledger(5)).unwrap();
        assert_eq!(s.remove_ledger(&uuid(5)).unwrap(), Some(ledger(5)));
        assert_eq!(s.remove_ledger(&uuid(6)).unwrap(), None);
    }
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    let mut changed = def(1);
    changed.autostart = false;
    assert_eq!(defs_of(&s), vec![changed]);
    assert!(ledger_of(&s).is_empty());
    assert!(names_in(&tmp.path().join("ledger")).is_empty());
}

#[test]
fn file_format_is_toml_with_schema_first() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    s.put_definition(&def(7)).unwrap();
    s.put_ledger(&ledger(7)).unwrap();
    let name = format!("{}.toml", uuid(7));
    let text = fs::read_to_string(tmp.path().join("definitions").join(&name)).unwrap();
    assert!(text.starts_with("schema = 1\n"), "{text}");
    assert!(text.contains(&format!("uuid = \"{}\"", uuid(7))), "{text}");
    assert!(text.contains("autostart = true"), "{text}");
    let text = fs::read_to_string(tmp.path().join("ledger").join(&name)).unwrap();
    assert!(text.starts_with("schema = 1\n"), "{text}");
    assert!(text.contains("ownership = \"adopted\""), "{text}");
}

#[test]
fn created_directory_is_private() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("a/b/state");
    let (_s, _) = StateDir::open(&root).unwrap();
    for dir in [
        root.clone(),
        root.join("definitions"),
        root.join("ledger"),
        root.join("pools"),
        root.join("vf-slots"),
        root.join("corrupt"),
    ] {
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "{}", dir.display());
    }
}

#[test]
fn leftover_temp_files_are_removed_on_open() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        s.put_definition(&def(1)).unwrap();
        s.put_ledger(&ledger(1)).unwrap();
    }
    // An interrupted rewrite of def 1 (new contents never renamed) and an interrupted ledger write.
    let mut newer = def(1);
    newer.label = Some("never committed".into());
    let d = write_temp(
        &tmp.path().join("definitions"),
        &format!("{}.toml", uuid(1)),
        newer.encode().unwrap().as_bytes(),
    )
    .unwrap();
    let l = write_temp(&tmp.path().join("ledger"), "x.toml", b"garbage").unwrap();
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    let mut removed = report.temp_files_removed.clone();
    removed.sort();
    let mut expected = vec![d, l];
    expected.sort();
    assert_eq!(removed, expected);
    assert!(report.set_aside.is_empty());
    assert_eq!(defs_of(&s), vec![def(1)]);
    assert_eq!(ledger_of(&s), vec![ledger(1)]);
    for sub in ["definitions", "ledger"] {
        assert!(
            names_in(&tmp.path().join(sub))
                .iter()
                .all(|n| !n.starts_with(TEMP_PREFIX))
        );
    }
}

#[test]
fn corrupted_files_are_moved_aside_and_the_rest_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    {
        let (mut s, _) = StateDir::open(root).unwrap();
        s.put_definition(&def(1)).unwrap();
        s.put_ledger(&ledger(1)).unwrap();
    }
    let valid = def(2).encode().unwrap();
    let truncated = &valid[..valid.len() / 2];
    let cases: Vec<(&str, String, Vec<u8>, &str)> = vec![
        (
            "definitions",
            format!("{}.toml", uuid(2)),
            truncated.as_bytes().to_vec(),
            "line",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(3)),
            vec![0xff, 0xfe, 0, 1, 2],
            "UTF-8",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(4)),
            def(4)
                .encode()
                .unwrap()
                .replace("autostart = true", "autostart = \"yes\"")
                .into_bytes(),
            "line",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(5)),
            def(6).encode().unwrap().into_bytes(),
            "is named after",
        ),
        (
            "definitions",
            "notes.toml".into(),
            b"schema = 1\n".to_vec(),
            "<uuid>.toml",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(8)),
            def(8)
                .encode()
                .unwrap()
                .replace("schema = 1", "schema = 2")
                .into_bytes(),
            "schema = 2",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(9)),
            def(9)
                .encode()
                .unwrap()
                .replace("schema = 1\n", "")
                .into_bytes(),
            "no `schema`",
        ),
        (
            "definitions",
            format!("{}.toml", uuid(10)),
            format!("{}extra = 1\n", def(10).encode().unwrap()).into_bytes(),
            "unknown field",
        ),
        (
            "ledger",
            format!("{}.toml", uuid(11)),
            ledger(11)
                .encode()
                .unwrap()
                .replace("\"adopted\"", "\"foreign\"")
                .into_bytes(),
            "line",
        ),
        (
            "ledger",
            format!("{}.toml", uuid(12)),
            ledger(12)
                .encode()
                .unwrap()
                .replace("\"mbochs\"", "\"../../etc\"")
                .into_bytes(),
            "not a device name",
        ),
        (
            "ledger",
            format!("{}.toml", uuid(13)),
            Vec::new(),
            "no `schema`",
        ),
    ];
    for (sub, name, bytes, _) in &cases {
        plant(root, sub, name, bytes);
    }
    let (s, report) = StateDir::open(root).unwrap();
    assert_eq!(defs_of(&s), vec![def(1)]);
    assert_eq!(ledger_of(&s), vec![ledger(1)]);
    assert_eq!(report.set_aside.len(), cases.len(), "{report:#?}");
    for (sub, name, bytes, needle) in &cases {
        let file = root.join(sub).join(name);
        let aside = report
            .set_aside
            .iter()
            .find(|a| a.file == file)
            .unwrap_or_else(|| panic!("{} not set aside: {report:#?}", file.display()));
        let why = aside.reason.to_string();
        assert!(why.contains(needle), "{name}: {why:?} lacks {needle:?}");
        assert!(!file.exists());
        assert_eq!(aside.moved_to.parent().unwrap(), root.join("corrupt"));
        let moved_name = aside
            .moved_to
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(moved_name.starts_with(&format!("{name}.")), "{moved_name}");
        assert_eq!(
            &fs::read(&aside.moved_to).unwrap(),
            bytes,
            "contents preserved"
        );
    }
    let future = report
        .set_aside
        .iter()
        .find(|a| a.file.ends_with(format!("{}.toml", uuid(8))))
        .unwrap();
    assert_eq!(future.reason, AsideReason::FutureSchema { found: 2 });
    // Opening again finds a clean directory.
    drop(s);
    let (_s, report) = StateDir::open(root).unwrap();
    assert!(report.set_aside.is_empty());
}

#[test]
fn same_name_set_aside_twice_gets_distinct_names() {
    let tmp = tempfile::tempdir().unwrap();
    StateDir::open(tmp.path()).unwrap();
    let name = format!("{}.toml", uuid(1));
    let mut moved = Vec::new();
    for _ in 0..2 {
        plant(tmp.path(), "definitions", &name, b"not toml [");
        let (_s, report) = StateDir::open(tmp.path()).unwrap();
        assert_eq!(report.set_aside.len(), 1);
        moved.push(report.set_aside[0].moved_to.clone());
    }
    assert_ne!(moved[0], moved[1]);
    assert_eq!(names_in(&tmp.path().join("corrupt")).len(), 2);
}

#[test]
fn second_opener_is_refused_with_the_holders_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let (first, _) = StateDir::open(tmp.path()).unwrap();
    let err = StateDir::open(tmp.path()).unwrap_err();
    match &err {
        StoreError::Locked { dir, holder } => {
            assert_eq!(dir, tmp.path());
            assert_eq!(*holder, Some(std::process::id()));
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&tmp.path().display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("pid {}", std::process::id())),
        "{msg}"
    );
    drop(first);
    StateDir::open(tmp.path()).unwrap();
}

#[test]
fn invalid_records_are_refused_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    let mut bad = def(1);
    bad.parent = "../x".into();
    let err = s.put_definition(&bad).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("{}.toml", uuid(1))),
        "{err}"
    );
    let mut bad = def(2);
    bad.gpu = " ".into();
    assert!(matches!(
        s.put_definition(&bad),
        Err(StoreError::Invalid { .. })
    ));
    let mut bad = def(3);
    bad.profile = Some(String::new());
    assert!(matches!(
        s.put_definition(&bad),
        Err(StoreError::Invalid { .. })
    ));
    let mut bad = ledger(3);
    bad.gpu = Some(String::new());
    assert!(matches!(
        s.put_ledger(&bad),
        Err(StoreError::Invalid { .. })
    ));
    let mut bad = ledger(4);
    bad.parent = "a b".into();
    assert!(matches!(
        s.put_ledger(&bad),
        Err(StoreError::Invalid { .. })
    ));
    // Would be written by the TOML encoder but not read back (TOML integers are i64).
    let mut bad = def(5);
    bad.created_at = u64::MAX;
    assert!(matches!(
        s.put_definition(&bad),
        Err(StoreError::Invalid { .. })
    ));
    let mut bad = ledger(6);
    bad.created_at = i64::MAX as u64 + 1;
    assert!(matches!(
        s.put_ledger(&bad),
        Err(StoreError::Invalid { .. })
    ));
    bad.created_at = i64::MAX as u64;
    s.put_ledger(&bad).unwrap();
    assert!(s.remove_ledger(&bad.uuid).unwrap().is_some());
    assert!(defs_of(&s).is_empty());
    assert!(ledger_of(&s).is_empty());
    assert!(names_in(&tmp.path().join("ledger")).is_empty());
    assert!(names_in(&tmp.path().join("definitions")).is_empty());
}

#[test]
fn write_errors_name_the_file_and_leave_memory_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    // Replace the ledger directory by a file so that writing into it fails.
    let ledger_dir = tmp.path().join("ledger");
    fs::remove_dir(&ledger_dir).unwrap();
    fs::write(&ledger_dir, b"").unwrap();
    let err = s.put_ledger(&ledger(1)).unwrap_err();
    match &err {
        StoreError::Io { op, path, .. } => {
            assert_eq!(*op, StoreOp::Write);
            assert!(path.starts_with(&ledger_dir), "{}", path.display());
        }
        other => panic!("expected Io, got {other:?}"),
    }
    assert!(err.to_string().contains("could not write"), "{err}");
    assert_eq!(s.get_ledger(&uuid(1)), None);
}

#[test]
fn definitions_put_together_survive_reopen_and_a_failure_keeps_those_before_it() {
    let tmp = tempfile::tempdir().unwrap();
    {
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        let defs: Vec<Definition> = (1..=5).map(def).collect();
        s.put_definitions(&defs).unwrap();
        assert_eq!(defs_of(&s), defs);
        // One invalid among them: refused before anything is written.
        let mut bad: Vec<Definition> = (6..=8).map(def).collect();
        bad[2].gpu = " ".into();
        let (k, e) = s.put_definitions(&bad).unwrap_err();
        assert_eq!(k, 0);
        assert!(matches!(e, StoreError::Invalid { .. }), "{e}");
        assert_eq!(defs_of(&s).len(), 5);
    }
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(defs_of(&s), (1..=5).map(def).collect::<Vec<_>>());
    assert!(
        !names_in(&tmp.path().join("definitions"))
            .iter()
            .any(|n| n.starts_with(TEMP_PREFIX))
    );
    // The third one's name taken by a directory: the rename fails there, the first two are stored
    // (in memory and after a reopen), and no temporary file is left.
    let dir = tmp.path().join("definitions");
    let defs: Vec<Definition> = (11..=14).map(def).collect();
    fs::create_dir(dir.join(Definition::file_name(&uuid(13)))).unwrap();
    fs::write(
        dir.join(Definition::file_name(&uuid(13))).join("x"),
        b"keeps the directory non-empty",
    )
    .unwrap();
    let (k, e) = s.put_definitions(&defs).unwrap_err();
    assert_eq!(k, 2, "{e}");
    assert!(e.to_string().contains(&uuid(13).to_string()), "{e}");
    assert!(s.get_definition(&uuid(12)).is_some() && s.get_definition(&uuid(13)).is_none());
    assert!(!names_in(&dir).iter().any(|n| n.starts_with(TEMP_PREFIX)));
    fs::remove_dir_all(dir.join(Definition::file_name(&uuid(13)))).unwrap();
    drop(s);
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    assert!(s.get_definition(&uuid(12)).is_some() && s.get_definition(&uuid(13)).is_none());
    assert_eq!(defs_of(&s).len(), 7);
}
