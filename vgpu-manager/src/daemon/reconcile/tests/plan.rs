//! Planner rules, one scenario each.

use mdev_types::model::{Inventory, MdevInstance, MdevParent, MdevType};
use mdev_types::parse::TypeDescription;

use super::*;
use crate::daemon::reconcile::{
    BlockReason, ConflictReason, HostInstance, HostParent, HostType, ReconcileInput, ReconcileStep,
    plan,
};

#[test]
fn autostart_definition_without_device_is_created() {
    let h = host(&[("p", &[("a", 2)])]);
    let p = plan(&h.input(&[def(1, "p", "a", true)]));
    assert_eq!(
        p.steps,
        vec![ReconcileStep::Create {
            uuid: u(1),
            parent: "p".into(),
            type_id: t("a"),
            replaces: None,
            attrs: Vec::new(),
        }]
    );
}

#[test]
fn missing_parent_waits_and_stopped_definitions_stay_stopped() {
    let h = host(&[("p", &[("a", 2)])]);
    let p = plan(&h.input(&[def(1, "late", "a", true), def(2, "p", "a", false)]));
    assert_eq!(
        p.steps,
        vec![ReconcileStep::Wait {
            uuid: u(1),
            parent: "late".into()
        }]
    );
    assert!(p.is_noop());
}

#[test]
fn ledger_entry_without_device_is_dropped_unless_recreated() {
    let h = host(&[("p", &[("a", 2)])])
        .with_entry(entry(1, "p", "a"))
        .with_entry(entry(2, "p", "a"))
        .with_entry(entry(3, "p", "a"))
        .with_entry(entry(4, "gone", "a"));
    let defs = [
        def(2, "p", "a", false),
        def(3, "p", "a", true),
        def(4, "gone", "a", true),
    ];
    let p = plan(&h.input(&defs));
    assert_eq!(
        p.steps,
        vec![
            ReconcileStep::DropLedger {
                entry: entry(1, "p", "a")
            },
            ReconcileStep::DropLedger {
                entry: entry(2, "p", "a")
            },
            ReconcileStep::Create {
                uuid: u(3),
                parent: "p".into(),
                type_id: t("a"),
                replaces: Some(entry(3, "p", "a")),
                attrs: Vec::new(),
            },
            ReconcileStep::DropLedger {
                entry: entry(4, "gone", "a")
            },
            ReconcileStep::Wait {
                uuid: u(4),
                parent: "gone".into()
            },
        ]
    );
}

#[test]
fn our_running_devices_are_kept_even_without_definition() {
    let mut adopted = entry(2, "p", "a");
    adopted.ownership = LedgerOwnership::Adopted;
    let h = host(&[("p", &[("a", 4), ("b", 4)])])
        .with_device(1, "p", "a")
        .with_entry(entry(1, "p", "a"))
        .with_device(2, "p", "a")
        .with_entry(adopted)
        .with_device(3, "p", "a")
        .with_entry(entry(3, "p", "a"));
    let p = plan(&h.input(&[def(1, "p", "a", true), def(3, "p", "b", true)]));
    assert_eq!(
        p.steps,
        vec![
            ReconcileStep::Keep {
                uuid: u(1),
                ownership: LedgerOwnership::Daemon
            },
            ReconcileStep::Keep {
                uuid: u(2),
                ownership: LedgerOwnership::Adopted
            },
            ReconcileStep::Conflict {
                uuid: u(3),
                reason: ConflictReason::DefinitionMismatch {
                    defined_parent: "p".into(),
                    defined_type: t("b"),
                    actual_parent: "p".into(),
                    actual_type: t("a"),
                },
            },
        ]
    );
    assert!(p.is_noop());
}

#[test]
fn foreign_devices_are_reported_and_block_their_definitions() {
    let h = host(&[("p", &[("a", 4)])])
        .with_device(1, "p", "a")
        .with_device(2, "p", "a");
    let p = plan(&h.input(&[def(2, "p", "a", true)]));
    assert_eq!(
        p.steps,
        vec![
            ReconcileStep::ReportForeign {
                uuid: u(1),
                parent: "p".into(),
                type_id: t("a")
            },
            ReconcileStep::ReportForeign {
                uuid: u(2),
                parent: "p".into(),
                type_id: t("a")
            },
            ReconcileStep::Conflict {
                uuid: u(2),
                reason: ConflictReason::ForeignDevice {
                    parent: "p".into(),
                    type_id: t("a")
                },
            },
        ]
    );
    assert!(p.is_noop());
    let msg = p.steps[2].to_string();
    assert!(
        msg.contains(&u(2).to_string()) && msg.contains("another tool"),
        "{msg}"
    );
}

#[test]
fn ledger_entry_for_a_different_device_is_dropped_and_the_device_is_foreign() {
    // Intent written for type a, then someone else created the UUID with type b.
    let h = host(&[("p", &[("a", 4), ("b", 4)])])
        .with_device(1, "p", "b")
        .with_entry(entry(1, "p", "a"));
    let p = plan(&h.input(&[]));
    assert_eq!(
        p.steps,
        vec![
            ReconcileStep::DropLedger {
                entry: entry(1, "p", "a")
            },
            ReconcileStep::ReportForeign {
                uuid: u(1),
                parent: "p".into(),
                type_id: t("b")
            },
        ]
    );
}

#[test]
fn capacity_and_missing_types_block_creates() {
    let h = host(&[("p", &[("a", 3)])]).with_device(9, "p", "a");
    let defs = [
        def(1, "p", "a", true),
        def(2, "p", "a", true),
        def(3, "p", "a", true),
        def(4, "p", "zz", true),
    ];
    let p = plan(&h.input(&defs));
    let creates: Vec<_> = p.actions().map(|s| *s.uuid()).collect();
    assert_eq!(creates, vec![u(1), u(2)]);
    assert!(p.steps.contains(&ReconcileStep::Blocked {
        uuid: u(3),
        reason: BlockReason::NoCapacity {
            parent: "p".into(),
            type_id: t("a")
        }
    }));
    assert!(p.steps.contains(&ReconcileStep::Blocked {
        uuid: u(4),
        reason: BlockReason::TypeNotOffered {
            parent: "p".into(),
            type_id: t("zz")
        }
    }));
}

#[test]
fn input_from_inventory_takes_instances_parents_and_availability() {
    let inv = Inventory {
        host: "test".into(),
        pci_devices: vec![],
        mdev_parents: vec![MdevParent {
            name: "mbochs".into(),
            pci: None,
            driver: Some("mbochs".into()),
            types: vec![MdevType {
                id: t("mbochs-1"),
                name: None,
                description: None,
                details: TypeDescription::SampleVideoMemory { mib: 16 },
                device_api: "vfio-pci".into(),
                available_instances: 3,
                instances: vec![u(5)],
            }],
        }],
        mdev_instances: vec![MdevInstance {
            uuid: u(5),
            parent: "mbochs".into(),
            type_id: t("mbochs-1"),
            iommu_group: None,
            driver: None,
        }],
        iommu_groups: vec![],
        gpus: vec![],
        faults: vec![],
    };
    let input = ReconcileInput::from_inventory([def(1, "mbochs", "mbochs-1", true)], [], &inv);
    assert_eq!(
        input.instances,
        vec![HostInstance {
            uuid: u(5),
            parent: "mbochs".into(),
            type_id: t("mbochs-1")
        }]
    );
    assert_eq!(
        input.parents,
        vec![HostParent {
            name: "mbochs".into(),
            types: vec![HostType {
                id: t("mbochs-1"),
                available: 3
            }]
        }]
    );
    let p = plan(&input);
    assert_eq!(p.actions().count(), 1);
    assert!(
        p.steps
            .iter()
            .any(|s| matches!(s, ReconcileStep::ReportForeign { uuid, .. } if *uuid == u(5)))
    );
}

#[test]
fn duplicate_host_uuid_does_not_panic() {
    let mut input = host(&[("p", &[("a", 1)])])
        .with_device(1, "p", "a")
        .input(&[]);
    input.instances.push(input.instances[0].clone());
    let p = plan(&input);
    assert_eq!(p.steps.len(), 1);
}
