//! Tests of the state directory: round trips, atomicity, corruption handling, locking, and a
//! crash/reopen property test against an in-memory model, for every record kind.

use std::fs;
use std::path::Path;

use mdev_types::ids::MdevUuid;

use super::fsio::{TEMP_PREFIX, write_temp};
use super::record::Record;
use super::*;

fn uuid(n: u32) -> MdevUuid {
    format!("00000000-0000-4000-8000-{n:012x}").parse().unwrap()
}

fn def(n: u32) -> Definition {
    Definition {
        uuid: uuid(n),
        parent: "0000:3b:00.0".into(),
        gpu: "0000:3b:00.0".into(),
        type_id: "nvidia-231".parse().unwrap(),
        profile: Some("vdi-2g".into()),
        autostart: true,
        label: Some(format!("vm-{n}")),
        created_at: 1_700_000_000 + u64::from(n),
        attrs: Vec::new(),
    }
}

fn ledger(n: u32) -> LedgerEntry {
    LedgerEntry {
        uuid: uuid(n),
        parent: "mbochs".into(),
        type_id: "mbochs-1".parse().unwrap(),
        ownership: if n.is_multiple_of(2) {
            LedgerOwnership::Daemon
        } else {
            LedgerOwnership::Adopted
        },
        created_at: 1_700_000_000,
        gpu: n.is_multiple_of(3).then(|| "0000:3b:00.0".to_string()),
        profile: n.is_multiple_of(3).then(|| "vdi-2g".to_string()),
        label: Some(format!("vm-{n}")),
    }
}

/// An applied pool `pool-<n>` (applied at a time that depends on `n`).
fn pool(n: u32) -> AppliedPool {
    AppliedPool {
        name: format!("pool-{n}"),
        text: format!(
            "name = \"pool-{n}\"\ndescription = \"desks {n}\"\nautostart = {}\n\n[profiles]\nvdi-2g = {}\n",
            n.is_multiple_of(2),
            n + 1
        ),
        applied_at: 1_700_000_000 + u64::from(n) * 61,
    }
}

/// A VF slot record: slot `n` of pool `pool-<n % 2>`, an xe VF or an NVIDIA vGPU, made or pending.
fn vf_slot(n: u32) -> VfSlotRecord {
    let pool = format!("pool-{}", n % 2);
    let slot = crate::pool::SlotId::new(&pool, "vdi-2g", n);
    let pf: mdev_types::ids::PciAddress = "0000:03:00.0".parse().unwrap();
    let vf: mdev_types::ids::PciAddress =
        format!("0000:03:{:02x}.{}", n / 8, n % 8).parse().unwrap();
    let (holds, created) = if n.is_multiple_of(2) {
        (
            VfKind::SriovVf,
            crate::backend::Created::Vf {
                pf,
                vf,
                bind: vgpu_host::ops::BindRecord {
                    addr: vf,
                    previous_driver: None,
                    previous_override: n.is_multiple_of(4).then(|| "vfio-pci".to_string()),
                },
            },
        )
    } else {
        (
            VfKind::NvidiaVgpu {
                type_id: 1155,
                type_name: "NVIDIA L40S-2B".into(),
            },
            crate::backend::Created::NvidiaVgpu {
                pf,
                vf,
                type_id: 1155,
            },
        )
    };
    VfSlotRecord {
        uuid: slot.uuid,
        pool,
        profile: "vdi-2g".into(),
        index: n,
        gpu: "0000:03:00.0".into(),
        pf,
        vf,
        num_vfs: if n.is_multiple_of(2) { 8 } else { 0 },
        holds,
        created: (!n.is_multiple_of(3)).then_some(created),
    }
}

fn pools_of(s: &StateDir) -> Vec<AppliedPool> {
    s.pools().cloned().collect()
}

fn vf_slots_of(s: &StateDir) -> Vec<VfSlotRecord> {
    s.vf_slots().cloned().collect()
}

fn defs_of(s: &StateDir) -> Vec<Definition> {
    s.definitions().cloned().collect()
}

fn ledger_of(s: &StateDir) -> Vec<LedgerEntry> {
    s.ledger().cloned().collect()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Writes `text` as a definition file named `name` directly (as a crash, a disk error or an admin
/// with an editor might have left it).
fn plant(root: &Path, sub: &str, name: &str, bytes: &[u8]) {
    fs::write(root.join(sub).join(name), bytes).unwrap();
}

mod alternates;
mod attrs;
mod batch;
mod crash;
mod kinds;
mod records;
