//! Encoding round trips and the crash/reopen property test.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ -~]{0,12}",
        Just("\"'\\\n\t#[]=".to_string())
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any valid definition encodes to text that decodes to the same definition.
    #[test]
    fn definition_encoding_round_trips(
        n in 0u32..1000,
        label in proptest::option::of(text()),
        profile in proptest::option::of("[a-z0-9-]{1,16}"),
        autostart: bool,
        created_at in 0u64..=(i64::MAX as u64),
        attrs in proptest::collection::vec(("[a-z_.-][a-z0-9_.-]{0,15}", text()), 0..8),
    ) {
        let attrs: Vec<crate::daemon::api::MdevAttr> = attrs
            .iter()
            .filter_map(|(n, v)| crate::daemon::api::MdevAttr::new(n, v).ok())
            .collect();
        let d = Definition { label, profile, autostart, created_at, attrs, ..def(n) };
        let back = Definition::decode(&d.encode().unwrap()).unwrap();
        prop_assert_eq!(back, d);
    }
}

/// One step of the crash property test.
#[derive(Debug, Clone)]
enum Op {
    PutDef(u32, bool, Option<String>),
    RemoveDef(u32),
    PutLedger(u32, bool),
    RemoveLedger(u32),
    PutLedgers(Vec<u32>),
    /// Applies pool `n` again, at a time that depends on the second number.
    PutPool(u32, u32),
    RemovePool(u32),
    /// Writes VF slot `n`, made or still pending.
    PutVfSlot(u32, bool),
    RemoveVfSlot(u32),
    /// Simulated crash: drop the store without any cleanup, optionally after an in-flight write
    /// reached its temp file but not the rename (in the directory `SUBS[i % 4]`), then reopen.
    Crash(Option<(usize, u32, Vec<u8>)>),
}

/// The record directories, for in-flight writes of the crash test.
const SUBS: [&str; 4] = ["definitions", "ledger", "pools", "vf-slots"];

fn op() -> impl Strategy<Value = Op> {
    let id = 0u32..6;
    prop_oneof![
        4 => (id.clone(), any::<bool>(), proptest::option::of("[a-z ]{0,8}"))
            .prop_map(|(n, a, l)| Op::PutDef(n, a, l)),
        2 => id.clone().prop_map(Op::RemoveDef),
        3 => (id.clone(), any::<bool>()).prop_map(|(n, a)| Op::PutLedger(n, a)),
        2 => id.clone().prop_map(Op::RemoveLedger),
        2 => proptest::collection::btree_set(id.clone(), 1..4)
            .prop_map(|ids| Op::PutLedgers(ids.into_iter().collect())),
        2 => (id.clone(), 0u32..1000).prop_map(|(n, t)| Op::PutPool(n, t)),
        1 => id.clone().prop_map(Op::RemovePool),
        3 => (id.clone(), any::<bool>()).prop_map(|(n, made)| Op::PutVfSlot(n, made)),
        2 => id.clone().prop_map(Op::RemoveVfSlot),
        2 => proptest::option::of((0usize..4, id, proptest::collection::vec(any::<u8>(), 0..64)))
            .prop_map(Op::Crash),
    ]
}

/// The committed state the store must show.
#[derive(Default)]
struct Model {
    defs: BTreeMap<MdevUuid, Definition>,
    led: BTreeMap<MdevUuid, LedgerEntry>,
    pools: BTreeMap<String, AppliedPool>,
    vf_slots: BTreeMap<MdevUuid, VfSlotRecord>,
}

fn check_equal(s: &StateDir, m: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(defs_of(s), m.defs.values().cloned().collect::<Vec<_>>());
    prop_assert_eq!(ledger_of(s), m.led.values().cloned().collect::<Vec<_>>());
    prop_assert_eq!(pools_of(s), m.pools.values().cloned().collect::<Vec<_>>());
    prop_assert_eq!(
        vf_slots_of(s),
        m.vf_slots.values().cloned().collect::<Vec<_>>()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Random put/remove sequences of every record kind with simulated crashes: every reopen sees
    /// exactly the last committed state, nothing is set aside, and stray temp files are cleaned.
    #[test]
    fn reopen_after_crash_sees_last_committed_state(ops in proptest::collection::vec(op(), 1..40)) {
        let tmp = tempfile::tempdir().unwrap();
        let mut m = Model::default();
        let (mut s, _) = StateDir::open(tmp.path()).unwrap();
        for op in ops {
            match op {
                Op::PutDef(n, autostart, label) => {
                    let d = Definition { autostart, label, ..def(n) };
                    s.put_definition(&d).unwrap();
                    m.defs.insert(d.uuid, d);
                }
                Op::RemoveDef(n) => {
                    let got = s.remove_definition(&uuid(n)).unwrap();
                    prop_assert_eq!(got, m.defs.remove(&uuid(n)));
                }
                Op::PutLedger(n, adopted) => {
                    let mut e = ledger(n);
                    e.ownership = if adopted { LedgerOwnership::Adopted } else { LedgerOwnership::Daemon };
                    s.put_ledger(&e).unwrap();
                    m.led.insert(e.uuid, e);
                }
                Op::RemoveLedger(n) => {
                    let got = s.remove_ledger(&uuid(n)).unwrap();
                    prop_assert_eq!(got, m.led.remove(&uuid(n)));
                }
                Op::PutLedgers(ids) => {
                    let entries: Vec<LedgerEntry> = ids
                        .iter()
                        .map(|n| LedgerEntry { label: Some(format!("batch {ids:?}")), ..ledger(*n) })
                        .collect();
                    s.put_ledgers(&entries).unwrap();
                    for e in entries {
                        m.led.insert(e.uuid, e);
                    }
                }
                Op::PutPool(n, t) => {
                    let p = AppliedPool { applied_at: 1_700_000_000 + u64::from(t), ..pool(n) };
                    s.put_pool(&p).unwrap();
                    m.pools.insert(p.name.clone(), p);
                }
                Op::RemovePool(n) => {
                    let name = pool(n).name;
                    let got = s.remove_pool(&name).unwrap();
                    prop_assert_eq!(got, m.pools.remove(&name));
                }
                Op::PutVfSlot(n, made) => {
                    let mut r = vf_slot(n);
                    if !made {
                        r.created = None;
                    }
                    s.put_vf_slot(&r).unwrap();
                    m.vf_slots.insert(r.uuid, r);
                }
                Op::RemoveVfSlot(n) => {
                    let u = vf_slot(n).uuid;
                    let got = s.remove_vf_slot(&u).unwrap();
                    prop_assert_eq!(got, m.vf_slots.remove(&u));
                }
                Op::Crash(stray) => {
                    let stray_path = stray.map(|(sub, n, bytes)| {
                        let dir = tmp.path().join(SUBS[sub % SUBS.len()]);
                        write_temp(&dir, &format!("{}.toml", uuid(n)), &bytes).unwrap()
                    });
                    drop(s);
                    let (reopened, report) = StateDir::open(tmp.path()).unwrap();
                    s = reopened;
                    prop_assert!(report.set_aside.is_empty(), "{:?}", report);
                    prop_assert_eq!(report.temp_files_removed, stray_path.into_iter().collect::<Vec<_>>());
                }
            }
            check_equal(&s, &m)?;
        }
        drop(s);
        let (s, report) = StateDir::open(tmp.path()).unwrap();
        prop_assert!(report.set_aside.is_empty());
        check_equal(&s, &m)?;
    }
}
