//! mdev attributes of a create: written in order once the device exists, and a refused one undoes the
//! create (device removed, ledger entry dropped), as mdevctl's `start` does.

use super::*;
use crate::daemon::api::MdevAttr;
use crate::daemon::reconcile::{LedgerUndo, ReconcileStep, execute, plan};

fn with_attrs(mut d: Definition, attrs: &[(&str, &str)]) -> Definition {
    d.attrs = attrs
        .iter()
        .map(|(n, v)| MdevAttr::new(n, v).unwrap())
        .collect();
    d
}

const ATTRS: [(&str, &str); 3] = [
    ("assign_adapter", "5"),
    ("assign_domain", "4"),
    ("assign_control_domain", "4"),
];

#[test]
fn the_plan_carries_the_definitions_attributes_and_they_are_written_in_order() {
    let mut h = host(&[("matrix", &[("vfio_ap-passthrough", 2)])]);
    let defs = vec![with_attrs(
        def(1, "matrix", "vfio_ap-passthrough", true),
        &ATTRS,
    )];
    let p = plan(&h.input(&defs));
    assert!(matches!(
        &p.steps[..],
        [ReconcileStep::Create { attrs, .. }] if *attrs == defs[0].attrs
    ));
    let report = execute(&p, &mut h);
    assert!(report.succeeded(), "{report:?}");
    let written: Vec<(MdevUuid, String, String)> = ATTRS
        .iter()
        .map(|(n, v)| (u(1), n.to_string(), v.to_string()))
        .collect();
    assert_eq!(h.attrs_written, written);
    assert!(h.devices.contains_key(&u(1)) && h.ledger.contains_key(&u(1)));
}

#[test]
fn a_refused_attribute_removes_the_device_and_its_entry_and_stops_there() {
    let mut h = host(&[("matrix", &[("vfio_ap-passthrough", 2)])]);
    h.refused_attrs.insert("assign_domain".into());
    let defs = vec![with_attrs(
        def(1, "matrix", "vfio_ap-passthrough", true),
        &ATTRS,
    )];
    let report = execute(&plan(&h.input(&defs)), &mut h);
    let failure = report.failure.as_ref().expect("the create fails");
    assert!(
        failure.error.0.contains("assign_domain") && failure.error.0.contains("\"4\""),
        "{}",
        failure.error
    );
    assert!(report.rollback_errors.is_empty(), "{report:?}");
    assert!(h.devices.is_empty(), "the device is removed again");
    assert!(h.ledger.is_empty(), "and its ledger entry dropped");
    assert_eq!(
        h.attrs_written,
        vec![(u(1), "assign_adapter".into(), "5".into())],
        "nothing is written after the refused attribute"
    );
}

#[test]
fn a_refused_attribute_whose_device_cannot_be_removed_keeps_the_entry() {
    let mut h = host(&[("matrix", &[("vfio_ap-passthrough", 2)])]);
    h.refused_attrs.insert("assign_adapter".into());
    // Calls: 0 put_ledgers, 1 create_device, 2 write_attr (refused), 3 remove_device.
    h.fail_calls.insert(3);
    let defs = vec![with_attrs(
        def(1, "matrix", "vfio_ap-passthrough", true),
        &ATTRS,
    )];
    let report = execute(&plan(&h.input(&defs)), &mut h);
    assert!(report.failure.is_some());
    assert!(matches!(
        report.rollback_errors[..],
        [ref e] if matches!(e.what, LedgerUndo::RemoveDevice { .. })
    ));
    assert!(h.devices.contains_key(&u(1)), "the removal failed");
    assert!(
        h.ledger.contains_key(&u(1)),
        "a device we made is never unrecorded"
    );
}
