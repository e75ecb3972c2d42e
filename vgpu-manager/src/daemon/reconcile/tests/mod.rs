//! Tests of the planner and the executor, with shared builders.

mod attrs;
mod exec;
mod faults;
mod plan;
mod props;

use std::collections::BTreeMap;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::fake::FakeHost;
use crate::daemon::store::{Definition, LedgerEntry, LedgerOwnership};

fn u(n: u32) -> MdevUuid {
    format!("00000000-0000-4000-8000-{n:012x}").parse().unwrap()
}

fn t(s: &str) -> MdevTypeId {
    s.parse().unwrap()
}

fn def(n: u32, parent: &str, type_id: &str, autostart: bool) -> Definition {
    Definition {
        uuid: u(n),
        parent: parent.into(),
        gpu: parent.into(),
        type_id: t(type_id),
        profile: None,
        autostart,
        label: None,
        created_at: 1_700_000_000,
        attrs: Vec::new(),
    }
}

fn entry(n: u32, parent: &str, type_id: &str) -> LedgerEntry {
    LedgerEntry {
        uuid: u(n),
        parent: parent.into(),
        type_id: t(type_id),
        ownership: LedgerOwnership::Daemon,
        created_at: 1_700_000_000,
        gpu: None,
        profile: None,
        label: None,
    }
}

/// A host with these parents (name, [(type, capacity)]).
fn host(parents: &[(&str, &[(&str, u32)])]) -> FakeHost {
    FakeHost {
        parents: parents
            .iter()
            .map(|(p, types)| {
                let types: BTreeMap<MdevTypeId, u32> =
                    types.iter().map(|(id, cap)| (t(id), *cap)).collect();
                (p.to_string(), types)
            })
            .collect(),
        ..FakeHost::default()
    }
}

impl FakeHost {
    fn with_device(mut self, n: u32, parent: &str, type_id: &str) -> Self {
        self.devices.insert(u(n), (parent.into(), t(type_id)));
        self
    }

    fn with_entry(mut self, e: LedgerEntry) -> Self {
        self.ledger.insert(e.uuid, e);
        self
    }
}
