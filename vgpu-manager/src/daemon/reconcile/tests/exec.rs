//! Executor: success, failure at every call with full rollback, and failing rollbacks.

use super::*;
use crate::daemon::reconcile::{LedgerUndo, ReconcileStep, execute, plan};

/// Three creates (one renewing a stale entry), two dropped entries, one kept device, interleaved.
fn scenario() -> (FakeHost, Vec<Definition>) {
    let h = host(&[("p", &[("a", 3)]), ("q", &[("b", 1)])])
        .with_entry(entry(1, "p", "a"))
        .with_entry(entry(2, "p", "a"))
        .with_entry(entry(4, "q", "b"))
        .with_device(5, "p", "a")
        .with_entry(entry(5, "p", "a"));
    let defs = vec![
        def(2, "p", "a", true),
        def(3, "q", "b", true),
        def(6, "p", "a", true),
    ];
    (h, defs)
}

#[test]
fn success_applies_every_action() {
    let (mut h, defs) = scenario();
    let p = plan(&h.input(&defs));
    let report = execute(&p, &mut h);
    assert!(report.succeeded(), "{report:?}");
    assert_eq!(report.completed, p.actions().cloned().collect::<Vec<_>>());
    assert!(report.rolled_back.is_empty());
    let devices: Vec<_> = h.devices.keys().copied().collect();
    assert_eq!(devices, vec![u(2), u(3), u(5), u(6)]);
    let ledger: Vec<_> = h.ledger.keys().copied().collect();
    assert_eq!(ledger, vec![u(2), u(3), u(5), u(6)]);
    assert_eq!(h.ledger[&u(6)].created_at, 1_800_000_000);
    assert_eq!(h.ledger[&u(6)].ownership, LedgerOwnership::Daemon);
}

/// Runs the scenario with mutating call `k` failing; returns the report and the final host.
fn run_failing(
    k: usize,
    ghost: bool,
) -> (
    crate::daemon::reconcile::ExecReport<crate::daemon::reconcile::fake::FakeError>,
    FakeHost,
    FakeHost,
) {
    let (mut h, defs) = scenario();
    let before = h.clone();
    let p = plan(&h.input(&defs));
    h.fail_calls.insert(k);
    h.ghost_create = ghost;
    let report = execute(&p, &mut h);
    (report, h, before)
}

#[test]
fn a_failure_at_any_call_restores_the_host_exactly() {
    let (mut clean, defs) = scenario();
    let p = plan(&clean.input(&defs));
    execute(&p, &mut clean);
    let calls = clean.calls;
    assert_eq!(calls, 3 * 2 + 2, "3 creates (ledger + device) and 2 drops");
    for ghost in [false, true] {
        for k in 0..calls {
            let (report, after, before) = run_failing(k, ghost);
            let failure = report.failure.as_ref().expect("call k fails");
            assert!(failure.step.is_action());
            assert_eq!(p.steps[failure.index], failure.step);
            assert!(failure.error.to_string().contains(&format!("call {k}")));
            assert!(report.rollback_errors.is_empty(), "k={k}: {report:?}");
            let mut undone = report.completed.clone();
            undone.reverse();
            assert_eq!(report.rolled_back, undone, "k={k}");
            assert_eq!(after.state(), before.state(), "k={k} ghost={ghost}");
        }
    }
}

#[test]
fn a_failing_rollback_keeps_the_ledger_entry_of_a_device_left_behind() {
    // Calls: 0-2 the ledger entries of creates 2 (renewed), 3 and 6 (one batch), 3 drop 1,
    // 4 create 2, 5 create 3, 6 drop 4, 7 create 6.
    let (mut h, defs) = scenario();
    let p = plan(&h.input(&defs));
    // Fail creating device 6 (call 7). The failed create left nothing, so the rollback undoes,
    // newest first: 8 put_ledger(4), 9 remove_device(3), 10 remove_device(2), 11 put_ledger(1),
    // then the batch's entries (6, then 3 — kept, its device stays —, then 2).
    h.fail_calls.extend([7, 9]);
    let report = execute(&p, &mut h);
    let failure = report.failure.as_ref().unwrap();
    assert_eq!(*failure.step.uuid(), u(6));
    assert_eq!(report.rollback_errors.len(), 1, "{report:?}");
    let err = &report.rollback_errors[0];
    assert_eq!(*err.step.uuid(), u(3));
    assert!(matches!(err.what, LedgerUndo::RemoveDevice { .. }));
    // Device 3 is still there and still recorded as ours; everything else was undone.
    assert!(h.devices.contains_key(&u(3)));
    assert_eq!(h.ledger.get(&u(3)).map(|e| e.type_id.clone()), Some(t("b")));
    assert!(!h.devices.contains_key(&u(2)) && !h.devices.contains_key(&u(6)));
    assert_eq!(h.ledger.get(&u(2)), Some(&entry(2, "p", "a")));
    assert!(h.ledger.contains_key(&u(1)) && h.ledger.contains_key(&u(4)));
    assert!(!report.rolled_back.iter().any(|s| s.uuid() == &u(3)));
    // The next reconcile keeps it (ours, matching its definition).
    let again = plan(&h.input(&defs));
    assert!(again.steps.contains(&ReconcileStep::Keep {
        uuid: u(3),
        ownership: LedgerOwnership::Daemon
    }));
}

#[test]
fn an_unknown_outcome_of_create_keeps_the_ledger_entry() {
    let mut h = host(&[("p", &[("a", 1)])]);
    let defs = [def(1, "p", "a", true)];
    let p = plan(&h.input(&defs));
    h.fail_calls.insert(1);
    h.fail_exists = true;
    let report = execute(&p, &mut h);
    assert!(!report.succeeded());
    assert_eq!(report.rollback_errors.len(), 1);
    assert!(matches!(
        report.rollback_errors[0].what,
        LedgerUndo::CheckDevice { .. }
    ));
    assert!(
        h.ledger.contains_key(&u(1)),
        "entry kept while the device may exist"
    );
    // Next time, with the host readable again: no device, so the entry is renewed by a create.
    h.fail_exists = false;
    let again = plan(&h.input(&defs));
    assert!(matches!(
        &again.steps[..],
        [ReconcileStep::Create {
            replaces: Some(_),
            ..
        }]
    ));
    assert!(execute(&again, &mut h).succeeded());
    assert!(h.devices.contains_key(&u(1)));
}

#[test]
fn a_removal_takes_the_device_then_its_entry_and_a_failed_one_keeps_the_entry() {
    use crate::daemon::reconcile::{Removal, execute_steps};
    let removal = || Removal {
        uuid: u(1),
        parent: "p".into(),
    };
    let mut h = host(&[("p", &[("a", 1)])])
        .with_device(1, "p", "a")
        .with_entry(entry(1, "p", "a"));
    let report = execute_steps(&mut h, [(0, removal())]);
    assert!(report.succeeded(), "{report:?}");
    assert!(h.devices.is_empty() && h.ledger.is_empty());
    // The kernel refuses the removal (call 0): device and entry both stay, nothing else is tried.
    let mut h = host(&[("p", &[("a", 1)])])
        .with_device(1, "p", "a")
        .with_entry(entry(1, "p", "a"));
    let before = h.state();
    h.fail_calls.insert(0);
    let report = execute_steps(&mut h, [(0, removal())]);
    assert_eq!(report.failure.map(|f| f.step), Some(removal()));
    assert_eq!(h.state(), before);
    assert_eq!(h.calls, 1);
}
