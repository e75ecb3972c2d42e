//! Stable slot identity: every slot of a pool has a UUID derived from the pool's name, the profile and
//! the slot's index, so a VM keeps its vGPU across reboots and re-applies, on any host, without a
//! registry — and two pools never collide (unlike numbering by VM id).
//!
//! `uuid = UUIDv5(NAMESPACE, "<pool>/<profile>/<index>")` (RFC 9562 §5.5, SHA-1 name-based), where
//! `NAMESPACE` is `UUIDv5(NAMESPACE_URL, "urn:vgpu-manager:pool-slot")` =
//! `cb0c4456-3fed-5659-b32e-3cd99acc6957` (the test `namespace_is_derived_as_documented` pins it).
//! Pool and profile names contain no `/`, so the name is unambiguous.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use mdev_types::ids::MdevUuid;
use serde::Serialize;

use super::spec::MAX_SLOTS;

/// The namespace of slot UUIDs (see the module documentation for its derivation).
pub fn namespace() -> MdevUuid {
    static NAMESPACE: LazyLock<MdevUuid> = LazyLock::new(|| {
        MdevUuid::from_uuid(uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_URL,
            b"urn:vgpu-manager:pool-slot",
        ))
    });
    *NAMESPACE
}

/// The index of each of the [`MAX_SLOTS`] slot UUIDs of one profile in one pool.
type SlotIndexes = HashMap<MdevUuid, u32>;
/// A pool name and one of its profile names.
type PoolProfile = (String, String);

/// Slot indexes computed so far, by pool and profile name: finding which slot a UUID is means
/// hashing every possible slot of every profile (a thousand SHA-1 digests per profile), which a
/// pool's plan does on every apply. Bounded: past [`MEMO_LIMIT`] profiles it starts again.
static MEMO: LazyLock<Mutex<HashMap<PoolProfile, Arc<SlotIndexes>>>> =
    LazyLock::new(Default::default);
/// Pool and profile pairs [`MEMO`] holds at most (about 40 KiB each).
const MEMO_LIMIT: usize = 256;

/// The slot of `pool` that `uuid` names, among the slots of the profiles `profiles`; `None` when it
/// is none of them.
pub fn slot_of<'a>(
    pool: &str,
    profiles: impl IntoIterator<Item = &'a str>,
    uuid: &MdevUuid,
) -> Option<SlotId> {
    // Slot UUIDs are name-based (version 5): any other UUID is no slot, without a lookup.
    if uuid.as_uuid().get_version_num() != 5 {
        return None;
    }
    profiles.into_iter().find_map(|profile| {
        let index = *indexes(pool, profile).get(uuid)?;
        Some(SlotId {
            pool: pool.to_string(),
            profile: profile.to_string(),
            index,
            uuid: *uuid,
        })
    })
}

fn indexes(pool: &str, profile: &str) -> Arc<SlotIndexes> {
    let key = (pool.to_string(), profile.to_string());
    if let Some(found) = MEMO
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Arc::clone(found);
    }
    let made: Arc<SlotIndexes> = Arc::new(
        (0..MAX_SLOTS)
            .map(|i| (slot_uuid(pool, profile, i), i))
            .collect(),
    );
    let mut memo = MEMO.lock().unwrap_or_else(PoisonError::into_inner);
    if memo.len() >= MEMO_LIMIT {
        memo.clear();
    }
    memo.insert(key, Arc::clone(&made));
    made
}

/// The UUID of slot `index` of `profile` in `pool`.
fn slot_uuid(pool: &str, profile: &str, index: u32) -> MdevUuid {
    MdevUuid::derived(&namespace(), &format!("{pool}/{profile}/{index}"))
}

/// One slot of a pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct SlotId {
    /// The pool's name.
    pub pool: String,
    /// The name of the profile, within the pool, that the slot is for.
    pub profile: String,
    /// 0-based index among the pool's slots of this profile.
    pub index: u32,
    /// Its UUID (the mdev UUID, or the name the daemon records a VF slot under).
    pub uuid: MdevUuid,
}

impl SlotId {
    /// The slot `index` of `profile` in `pool`.
    pub fn new(pool: &str, profile: &str, index: u32) -> SlotId {
        SlotId {
            pool: pool.to_string(),
            profile: profile.to_string(),
            index,
            uuid: slot_uuid(pool, profile, index),
        }
    }

    /// `profile/index`: the slot's name within its pool, as progress lines and summaries show it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.profile, self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_is_derived_as_documented() {
        let doc = include_str!("identity.rs");
        let shown = namespace().to_string();
        assert!(
            doc.contains(&format!("`{shown}`")),
            "update the documented namespace to {shown}"
        );
    }

    #[test]
    fn slots_are_stable_and_distinct() {
        let a = SlotId::new("vdi", "vdi-2g", 0);
        assert_eq!(a, SlotId::new("vdi", "vdi-2g", 0));
        assert_ne!(a.uuid, SlotId::new("vdi", "vdi-2g", 1).uuid);
        assert_ne!(a.uuid, SlotId::new("vdi2", "vdi-2g", 0).uuid);
        assert_ne!(a.uuid, SlotId::new("vdi", "vdi-1g", 0).uuid);
        assert_eq!(a.uuid.as_uuid().get_version_num(), 5);
    }

    #[test]
    fn slot_of_finds_every_slot_and_nothing_else() {
        let profiles = ["vdi-1g", "vdi-2g"];
        for index in [0, 1, 47, MAX_SLOTS - 1] {
            let s = SlotId::new("vdi", "vdi-2g", index);
            assert_eq!(slot_of("vdi", profiles, &s.uuid), Some(s.clone()));
            // Asked again (from the memo), the same answer.
            assert_eq!(slot_of("vdi", profiles, &s.uuid), Some(s.clone()));
            assert_eq!(slot_of("vdi", ["vdi-1g"], &s.uuid), None);
            assert_eq!(slot_of("other", profiles, &s.uuid), None);
        }
        // Past the last index, and a random (version 4) UUID.
        let beyond = slot_uuid("vdi", "vdi-2g", MAX_SLOTS);
        assert_eq!(slot_of("vdi", profiles, &beyond), None);
        assert_eq!(slot_of("vdi", profiles, &MdevUuid::new_random()), None);
    }
}
