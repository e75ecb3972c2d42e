//! Ledger batches.

use super::*;

#[test]
fn a_ledger_batch_is_one_file_and_survives_reopen() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    let batch: Vec<LedgerEntry> = (1..40).map(ledger).collect();
    s.put_ledgers(&batch).unwrap();
    assert_eq!(ledger_of(&s), batch);
    assert_eq!(names_in(&tmp.path().join("ledger")), ["batch-1.toml"]);
    drop(s);
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(ledger_of(&s), batch);
    assert!(report.set_aside.is_empty(), "{report:?}");
    assert_eq!(report.ledger_entries, batch.len());
}

#[test]
fn an_entrys_own_file_overrides_its_batch_copy_and_removal_takes_both() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    s.put_ledgers(&[ledger(1), ledger(2), ledger(3)]).unwrap();
    let mut renewed = ledger(2);
    renewed.label = Some("renewed".into());
    s.put_ledger(&renewed).unwrap();
    // A second batch renews 3 again.
    let mut again = ledger(3);
    again.label = Some("second batch".into());
    s.put_ledgers(&[again.clone(), ledger(4)]).unwrap();
    drop(s);
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(s.get_ledger(&uuid(2)), Some(&renewed));
    assert_eq!(s.get_ledger(&uuid(3)), Some(&again));
    // Removal reaches every copy: nothing comes back on reopen.
    assert_eq!(s.remove_ledger(&uuid(2)).unwrap(), Some(renewed));
    assert_eq!(s.remove_ledger(&uuid(3)).unwrap(), Some(again));
    drop(s);
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(ledger_of(&s), vec![ledger(1), ledger(4)]);
    // A batch left empty is deleted.
    s.remove_ledger(&uuid(1)).unwrap();
    s.remove_ledger(&uuid(4)).unwrap();
    assert!(names_in(&tmp.path().join("ledger")).is_empty());
    drop(s);
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    assert!(ledger_of(&s).is_empty());
}

#[test]
fn an_invalid_or_repeated_entry_refuses_the_whole_batch_before_writing() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    let mut bad = ledger(3);
    bad.parent = "a b".into();
    let err = s.put_ledgers(&[ledger(1), ledger(2), bad]).unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&format!("{}.toml", uuid(3))),
        "{err}"
    );
    let err = s
        .put_ledgers(&[ledger(1), ledger(2), ledger(1)])
        .unwrap_err();
    assert!(matches!(err, StoreError::Invalid { .. }), "{err:?}");
    assert!(err.to_string().contains("twice"), "{err}");
    assert!(ledger_of(&s).is_empty());
    assert!(names_in(&tmp.path().join("ledger")).is_empty());
}

#[test]
fn unusable_batches_are_moved_aside_and_the_rest_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    s.put_ledgers(&[ledger(1)]).unwrap();
    s.put_ledger(&ledger(9)).unwrap();
    drop(s);
    let good = fs::read_to_string(tmp.path().join("ledger/batch-1.toml")).unwrap();
    let entry = good.split_once("[[entry]]").unwrap().1.to_string();
    plant(
        tmp.path(),
        "ledger",
        "batch-2.toml",
        b"schema = 1\n[[entry]]\nuuid = 3\n",
    );
    plant(
        tmp.path(),
        "ledger",
        "batch-3.toml",
        format!("schema = 1\n[[entry]]{entry}[[entry]]{entry}").as_bytes(),
    );
    plant(
        tmp.path(),
        "ledger",
        "batch-4.toml",
        format!("schema = 7\n[[entry]]{entry}").as_bytes(),
    );
    plant(
        tmp.path(),
        "ledger",
        "batch-5.toml",
        format!("schema = 1\n[[entry]]\nschema = 1{entry}").as_bytes(),
    );
    let (s, report) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(ledger_of(&s), vec![ledger(1), ledger(9)]);
    let reasons: Vec<(String, String)> = report
        .set_aside
        .iter()
        .map(|a| {
            (
                a.file.file_name().unwrap().to_string_lossy().into_owned(),
                a.reason.to_string(),
            )
        })
        .collect();
    assert_eq!(reasons.len(), 4, "{reasons:?}");
    let why = |name: &str| {
        reasons
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, r)| r.clone())
            .unwrap()
    };
    assert!(why("batch-3.toml").contains("repeats"), "{reasons:?}");
    assert!(why("batch-4.toml").contains("schema = 7"), "{reasons:?}");
    assert!(why("batch-5.toml").contains("own `schema`"), "{reasons:?}");
    assert!(matches!(
        report
            .set_aside
            .iter()
            .find(|a| a.file.ends_with("batch-4.toml"))
            .unwrap()
            .reason,
        AsideReason::FutureSchema { found: 7 }
    ));
}

#[test]
fn removing_many_entries_rewrites_each_batch_once_and_takes_own_files_too() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    s.put_ledgers(&[ledger(1), ledger(2), ledger(3)]).unwrap();
    s.put_ledgers(&[ledger(4), ledger(5)]).unwrap();
    // 6 has only its own file; 2 has both.
    s.put_ledger(&ledger(6)).unwrap();
    let mut renewed = ledger(2);
    renewed.label = Some("renewed".into());
    s.put_ledger(&renewed).unwrap();
    s.remove_ledgers(&[uuid(2), uuid(4), uuid(5), uuid(6)])
        .unwrap();
    assert_eq!(ledger_of(&s), vec![ledger(1), ledger(3)]);
    // Batch 2 held only removed entries: it is gone; batch 1 keeps the others.
    assert_eq!(names_in(&tmp.path().join("ledger")), ["batch-1.toml"]);
    drop(s);
    let (mut s, report) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(ledger_of(&s), vec![ledger(1), ledger(3)]);
    assert!(report.set_aside.is_empty(), "{report:?}");
    // UUIDs without an entry are no error; nothing is left after the rest goes.
    s.remove_ledgers(&[uuid(1), uuid(3), uuid(9)]).unwrap();
    s.remove_ledgers(&[]).unwrap();
    assert!(names_in(&tmp.path().join("ledger")).is_empty());
    drop(s);
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    assert!(ledger_of(&s).is_empty());
}

#[test]
fn removing_many_definitions_keeps_the_rest_and_promotes_alternates() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut s, _) = StateDir::open(tmp.path()).unwrap();
    for n in 1..=4 {
        s.put_definition(&def(n)).unwrap();
    }
    // 3 also has a definition on another parent, which becomes its main one.
    let mut alternate = def(3);
    alternate.parent = "0000:3c:00.0".into();
    s.put_alternate(&alternate).unwrap();
    let removed = s.remove_definitions(&[uuid(1), uuid(3), uuid(7)]).unwrap();
    let removed: Vec<MdevUuid> = removed.iter().map(|d| d.uuid).collect();
    assert_eq!(removed, vec![uuid(1), uuid(3)]);
    drop(s);
    let (s, _) = StateDir::open(tmp.path()).unwrap();
    assert_eq!(defs_of(&s), vec![def(2), alternate, def(4)]);
}
