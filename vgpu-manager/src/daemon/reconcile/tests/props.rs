//! Property tests over random hosts, ledgers and definitions.

use proptest::prelude::*;
use proptest::sample::Index;

use super::*;
use crate::daemon::reconcile::{BlockReason, ReconcileStep, execute, plan};

const PARENTS: [&str; 4] = ["p0", "p1", "p2", "p3"];
const TYPES: [&str; 3] = ["t0", "t1", "t2"];

/// A random host, ledger and definition set. `p3` is never registered.
fn scenario() -> impl Strategy<Value = (FakeHost, Vec<Definition>)> {
    let parents = proptest::collection::vec(
        (
            any::<bool>(),
            proptest::collection::vec(proptest::option::of(0u32..4), 3),
        ),
        3,
    );
    let devices = proptest::collection::vec((0u32..12, 0usize..3, 0usize..3), 0..8);
    let ledger = proptest::collection::vec(
        (
            0u32..12,
            0usize..4,
            0usize..3,
            any::<bool>(),
            proptest::option::of(any::<Index>()),
        ),
        0..8,
    );
    let defs = proptest::collection::vec((0u32..12, 0usize..4, 0usize..3, any::<bool>()), 0..10);
    (parents, devices, ledger, defs).prop_map(|(parents, devices, ledger, defs)| {
        let mut h = FakeHost::default();
        for (i, (present, caps)) in parents.into_iter().enumerate() {
            if present {
                let types = caps
                    .into_iter()
                    .enumerate()
                    .filter_map(|(j, cap)| cap.map(|c| (t(TYPES[j]), c)))
                    .collect();
                h.parents.insert(PARENTS[i].to_string(), types);
            }
        }
        // Devices exist only on registered parents with offered types (the kernel's rule), possibly
        // beyond today's capacity (capacity can shrink, e.g. after a framebuffer change).
        for (n, p, ty) in devices {
            let offered = h
                .parents
                .get(PARENTS[p])
                .is_some_and(|ts| ts.contains_key(&t(TYPES[ty])));
            if offered {
                h.devices
                    .entry(u(n))
                    .or_insert((PARENTS[p].to_string(), t(TYPES[ty])));
            }
        }
        for (n, p, ty, adopted, follow_device) in ledger {
            let mut e = entry(n, PARENTS[p], TYPES[ty]);
            // Often an accurate entry for an existing device (ours), otherwise a random one.
            let device = follow_device
                .filter(|_| !h.devices.is_empty())
                .and_then(|i| h.devices.iter().nth(i.index(h.devices.len())));
            if let Some((uuid, (dp, dt))) = device {
                e.uuid = *uuid;
                e.parent = dp.clone();
                e.type_id = dt.clone();
            }
            if adopted {
                e.ownership = LedgerOwnership::Adopted;
            }
            h.ledger.insert(e.uuid, e);
        }
        let mut seen = std::collections::BTreeSet::new();
        let defs = defs
            .into_iter()
            .filter(|(n, ..)| seen.insert(*n))
            .map(|(n, p, ty, autostart)| def(n, PARENTS[p], TYPES[ty], autostart))
            .collect();
        (h, defs)
    })
}

/// Devices present before whose ledger entry does not describe them: someone else's.
fn foreign(h: &FakeHost) -> Vec<MdevUuid> {
    h.devices
        .iter()
        .filter(|(uuid, (p, ty))| {
            !h.ledger
                .get(uuid)
                .is_some_and(|e| e.parent == *p && e.type_id == *ty)
        })
        .map(|(uuid, _)| *uuid)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Reconcile never removes or changes an existing device, never claims a foreign one, respects
    /// capacity, leaves only accurate ledger entries, creates every creatable autostart device, and
    /// is idempotent.
    #[test]
    fn reconcile_is_safe_complete_and_idempotent((before, defs) in scenario()) {
        let p = plan(&before.input(&defs));
        let mut h = before.clone();
        let report = execute(&p, &mut h);
        prop_assert!(report.succeeded(), "{:?}", report);

        for (uuid, dev) in &before.devices {
            prop_assert_eq!(h.devices.get(uuid), Some(dev), "existing device {} changed", uuid);
        }
        for uuid in foreign(&before) {
            prop_assert!(!h.ledger.contains_key(&uuid), "foreign {} claimed", uuid);
            let created = p.steps.iter().any(|s| matches!(s, ReconcileStep::Create { uuid: c, .. } if *c == uuid));
            let reported = p.steps.iter().any(|s| matches!(s, ReconcileStep::ReportForeign { uuid: c, .. } if *c == uuid));
            prop_assert!(!created && reported, "foreign {} created or not reported", uuid);
        }
        for e in h.ledger.values() {
            prop_assert_eq!(h.devices.get(&e.uuid), Some(&(e.parent.clone(), e.type_id.clone())), "stale entry");
        }
        for (parent, types) in &h.parents {
            for (ty, cap) in types {
                let limit = (*cap).max(before.used(parent, ty));
                prop_assert!(h.used(parent, ty) <= limit, "{} on {} over capacity", ty, parent);
            }
        }
        for d in defs.iter().filter(|d| d.autostart) {
            let Some(types) = h.parents.get(&d.parent) else {
                if !before.devices.contains_key(&d.uuid) {
                    let wait = ReconcileStep::Wait { uuid: d.uuid, parent: d.parent.clone() };
                    prop_assert!(p.steps.contains(&wait), "{} does not wait", d.uuid);
                }
                continue;
            };
            match h.devices.get(&d.uuid) {
                Some(dev) if !before.devices.contains_key(&d.uuid) => {
                    prop_assert_eq!(dev, &(d.parent.clone(), d.type_id.clone()));
                }
                Some(_) => {} // existed already: kept or reported as a conflict
                None => {
                    let blocked = p.steps.iter().find_map(|s| match s {
                        ReconcileStep::Blocked { uuid, reason } if *uuid == d.uuid => Some(reason.clone()),
                        _ => None,
                    });
                    match blocked {
                        Some(BlockReason::TypeNotOffered { .. }) => {
                            prop_assert!(!types.contains_key(&d.type_id));
                        }
                        Some(BlockReason::NoCapacity { .. }) => {
                            let cap = types.get(&d.type_id).copied().unwrap_or(0);
                            prop_assert!(h.used(&d.parent, &d.type_id) >= cap);
                        }
                        None => prop_assert!(false, "autostart {} neither created nor blocked", d.uuid),
                    }
                }
            }
        }

        let again = plan(&h.input(&defs));
        prop_assert!(again.is_noop(), "second plan acts: {:?}", again);
    }

    /// Whatever the input, a failure at any mutating call leaves host and ledger as they were.
    #[test]
    fn any_failure_is_rolled_back_completely(
        (before, defs) in scenario(),
        k in any::<Index>(),
        ghost: bool,
    ) {
        let p = plan(&before.input(&defs));
        let mut dry = before.clone();
        execute(&p, &mut dry);
        prop_assume!(dry.calls > 0);
        let mut h = before.clone();
        h.fail_calls.insert(k.index(dry.calls));
        h.ghost_create = ghost;
        let report = execute(&p, &mut h);
        prop_assert!(report.failure.is_some());
        prop_assert!(report.rollback_errors.is_empty());
        prop_assert_eq!(h.state(), before.state());
    }
}
