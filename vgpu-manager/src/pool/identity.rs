//! Stable slot identity: every slot of a pool has a UUID derived from the pool's name, the profile and
//! the slot's index, so a VM keeps its vGPU across reboots and re-applies, on any host, without a
//! registry — and two pools never collide (unlike numbering by VM id).
//!
//! `uuid = UUIDv5(NAMESPACE, "<pool>/<profile>/<index>")` (RFC 9562 §5.5, SHA-1 name-based), where
//! `NAMESPACE` is `UUIDv5(NAMESPACE_URL, "urn:vgpu-manager:pool-slot")` =
//! `cb0c4456-3fed-5659-b32e-3cd99acc6957` (the test `namespace_is_derived_as_documented` pins it).
//! Pool and profile names contain no `/`, so the name is unambiguous.

use mdev_types::ids::MdevUuid;
use serde::Serialize;

/// The namespace of slot UUIDs (see the module documentation for its derivation).
pub fn namespace() -> MdevUuid {
    MdevUuid::from_uuid(uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_URL,
        b"urn:vgpu-manager:pool-slot",
    ))
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
            uuid: MdevUuid::derived(&namespace(), &format!("{pool}/{profile}/{index}")),
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
}
