//! The slots of `PoolStatus` rows, as the exports read them.

use std::collections::BTreeMap;

use vgpu_client::{PoolStatus, SlotRow};

use super::{Holds, PciIds, from_status};
use crate::cli::CliError;

fn row(profile: &str, index: u32, gpu: Option<&str>) -> SlotRow {
    SlotRow {
        profile: profile.into(),
        index,
        uuid: format!("00000000-0000-0000-0000-00000000000{index}"),
        gpu: gpu.map(Into::into),
        numa_node: None,
        type_id: gpu.map(|_| "nvidia-231".into()),
        parent: gpu.map(Into::into),
        type_name: gpu.map(|_| "GRID T4-2Q".into()),
        state: if gpu.is_some() { "running" } else { "missing" }.into(),
        vf: None,
        pci_id: None,
        iommu_group: None,
        fault: None,
    }
}

fn pool(name: &str, slots: Vec<SlotRow>) -> PoolStatus {
    PoolStatus {
        pool: name.into(),
        description: String::new(),
        policy: "consolidate".into(),
        autostart: true,
        applied_at: 0,
        wanted: BTreeMap::new(),
        in_sync: false,
        slots,
        gpus: Vec::new(),
    }
}

fn gpus() -> BTreeMap<String, (String, String)> {
    [
        ("0000:83:00.0", "NVIDIA T4"),
        ("0000:85:00.0", "NVIDIA L40S"),
    ]
    .into_iter()
    .map(|(id, m)| (id.to_string(), ("nvidia".to_string(), m.to_string())))
    .collect()
}

#[test]
fn mdev_and_vf_rows_become_slots_and_missing_ones_a_note() {
    let mut vf = row("vdi-2g", 2, Some("0000:85:00.0"));
    vf.parent = None;
    vf.type_id = Some("NVIDIA L40S-2Q on VF 0000:85:00.4".into());
    vf.type_name = Some("NVIDIA L40S-2Q".into());
    vf.vf = Some("0000:85:00.4".into());
    vf.pci_id = Some("10de:26b9".into());
    let status = vec![pool(
        "floor",
        vec![
            row("vdi-2g", 0, Some("0000:83:00.0")),
            row("vdi-2g", 1, None),
            vf,
        ],
    )];
    let s = from_status(&status, &[], &gpus()).unwrap();
    assert_eq!(s.pools, ["floor"]);
    assert_eq!(s.slots.len(), 2);
    assert_eq!(
        s.slots[0].holds,
        Holds::Mdev {
            parent: "0000:83:00.0".into(),
            type_id: "nvidia-231".into(),
            type_name: Some("GRID T4-2Q".into())
        }
    );
    assert_eq!(s.slots[0].model, "NVIDIA T4");
    match &s.slots[1].holds {
        Holds::Vf {
            vf, ids, vgpu_type, ..
        } => {
            assert_eq!(vf.unwrap().to_string(), "0000:85:00.4");
            assert_eq!(
                *ids,
                PciIds {
                    vendor: 0x10de,
                    device: 0x26b9
                }
            );
            assert_eq!(vgpu_type.as_deref(), Some("NVIDIA L40S-2Q"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    assert!(
        s.notes[0].contains("1 slots have no instance"),
        "{:?}",
        s.notes
    );
}

#[test]
fn rows_of_an_older_vgpud_are_left_out_with_the_reason() {
    let mut old = row("vdi-2g", 0, Some("0000:83:00.0"));
    old.parent = None;
    let s = from_status(&[pool("floor", vec![old])], &[], &gpus()).unwrap();
    assert!(s.slots.is_empty());
    assert!(
        s.notes[0].contains("does not report its mdev parent"),
        "{:?}",
        s.notes
    );
}

#[test]
fn unknown_pools_and_no_pools_are_refused() {
    let status = vec![pool("floor", vec![])];
    let e = from_status(&status, &["cad".into()], &gpus()).unwrap_err();
    assert!(
        matches!(&e, CliError::BadArgument(m) if m.contains("pool 'cad' is not applied (applied pools: floor)")),
        "{e}"
    );
    let e = from_status(&[], &[], &gpus()).unwrap_err();
    assert!(e.to_string().contains("vgpud has applied no pool"), "{e}");
}

#[test]
fn pci_ids_read_only_the_documented_form() {
    assert_eq!(
        PciIds::parse("10de:26b9"),
        Some(PciIds {
            vendor: 0x10de,
            device: 0x26b9
        })
    );
    assert_eq!(PciIds::parse("10de26b9"), None);
    assert_eq!(PciIds::parse("0x10de:26b9"), None);
}
