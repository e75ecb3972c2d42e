//! A faulted GPU's instances and definitions are kept: the planner never drops or creates what it could
//! not read.

use std::path::PathBuf;

use mdev_types::fault::{DeviceFault, FaultCause, FaultScope};
use mdev_types::model::Inventory;

use super::*;
use crate::daemon::reconcile::{ReconcileInput, ReconcileStep, plan};

fn fault(scope: FaultScope, device: &str) -> DeviceFault {
    DeviceFault {
        scope,
        device: device.into(),
        path: PathBuf::from("/sys/class/mdev_bus/x/vendor"),
        cause: FaultCause::Errno {
            op: "reading".into(),
            errno: "EIO".into(),
            code: 5,
        },
        fix: None,
    }
}

#[test]
fn a_faulted_parent_keeps_its_ledger_entries_and_definitions() {
    // The parent "sick" is not listed (it could not be read); its devices are not seen either.
    let h = host(&[("p", &[("a", 2)])])
        .with_entry(entry(1, "sick", "a"))
        .with_entry(entry(2, "sick", "a"));
    let mut input = h.input(&[def(2, "sick", "a", true), def(3, "sick", "a", true)]);
    input.faulted_parents = vec!["sick".into()];
    let p = plan(&input);
    assert!(p.is_noop(), "nothing dropped or created: {:?}", p.steps);
    for n in [1, 2, 3] {
        assert!(
            p.steps.contains(&ReconcileStep::Unreadable {
                uuid: u(n),
                parent: Some("sick".into())
            }),
            "{n}: {:?}",
            p.steps
        );
    }
    // Without the fault, the same input drops the entries (the parent is simply gone).
    input.faulted_parents.clear();
    assert!(!plan(&input).is_noop());
}

#[test]
fn an_unreadable_device_keeps_its_ledger_entry() {
    let h = host(&[("p", &[("a", 2)])]).with_entry(entry(1, "p", "a"));
    let mut input = h.input(&[def(1, "p", "a", true)]);
    input.unreadable_instances = vec![u(1)];
    let p = plan(&input);
    assert_eq!(
        p.steps,
        vec![ReconcileStep::Unreadable {
            uuid: u(1),
            parent: Some("p".into())
        }]
    );
    assert!(
        p.steps[0].to_string().contains("could not be read")
            || p.steps[0].to_string().contains("faulted")
    );
}

#[test]
fn the_input_carries_the_inventory_faults() {
    let inv = Inventory {
        host: "test".into(),
        pci_devices: vec![],
        mdev_parents: vec![],
        mdev_instances: vec![],
        iommu_groups: vec![],
        gpus: vec![],
        faults: vec![
            fault(FaultScope::PciDevice, "0000:01:00.0"),
            fault(FaultScope::MdevParent, "mtty"),
            fault(FaultScope::MdevInstance, &u(7).to_string()),
            fault(FaultScope::IommuGroup, "3"),
        ],
    };
    let input = ReconcileInput::from_inventory([], [entry(7, "mtty", "a")], &inv);
    assert_eq!(input.faulted_parents, vec!["0000:01:00.0", "mtty"]);
    assert_eq!(input.unreadable_instances, vec![u(7)]);
    assert!(plan(&input).is_noop());
}
