//! VF slot records (`vf-slots/<slot uuid>.toml`): pool slots held by SR-IOV VFs. Sysfs does not say
//! which slot a VF serves, so the record says it: the slot, its GPU, the VF, how many VFs its PF
//! needs, what the slot holds and — once made — what the backend did (which undoes it).
//!
//! ```toml
//! schema = 1
//! uuid = "6c264794-831f-518a-9f46-aed451324919"   # the slot's UUID (pool::SlotId)
//! pool = "vdi-floor"
//! profile = "vdi-2g"
//! index = 3
//! gpu = "0000:03:00.0"
//! pf = "0000:03:00.0"
//! vf = "0000:03:00.1"
//! num_vfs = 8                                     # 0: the VFs were not vgpud's to enable
//!
//! [holds]
//! kind = "sriov-vf"                               # or "nvidia-vgpu" with type_id and type_name
//!
//! [created]                                       # absent while the slot is being made
//! kind = "vf"                                     # or "nvidia-vgpu" (pf, vf, type_id) or "mdev"
//! pf = "0000:03:00.0"
//! vf = "0000:03:00.1"
//!
//! [created.bind]                                  # the VF's driver before (absent fields: none)
//! addr = "0000:03:00.1"
//! ```
//!
//! Every table rejects unknown fields. The on-disk structs below mirror the in-memory types so that
//! the file format is the store's alone, whatever the backend types become.

use serde::{Deserialize, Serialize};

use mdev_types::ids::{MdevUuid, PciAddress};
use vgpu_host::ops::BindRecord;

use super::record::{
    Record, Rejection, SCHEMA, UUID_NAME_RULE, decode_versioned, describe, uuid_of_file_name,
};
use crate::backend::Created;
use crate::pool::{Pool, SlotId};

/// What a VF slot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VfKind {
    /// The VF itself, bound to vfio-pci.
    SriovVf,
    /// A vGPU type set on the VF (NVIDIA vendor-specific VFIO).
    NvidiaVgpu {
        /// The numeric vGPU type id (`creatable_vgpu_types`).
        type_id: u32,
        /// The type's name, e.g. `NVIDIA L40S-2B`.
        type_name: String,
    },
}

/// One pool slot held by a VF (`vf-slots/<slot uuid>.toml`). Written before the VF is touched and
/// completed (with [`VfSlotRecord::created`]) after, so a crash leaves a record the next start can
/// finish or undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VfSlotRecord {
    /// The slot's UUID (`SlotId::new(pool, profile, index)`; also the file name).
    pub uuid: MdevUuid,
    /// The pool the slot belongs to.
    pub pool: String,
    /// The profile of the pool the slot serves.
    pub profile: String,
    /// The slot's number among the pool's slots of that profile.
    pub index: u32,
    /// The GPU (PF) id as clients see it.
    pub gpu: String,
    /// The physical function whose VF holds the slot.
    pub pf: PciAddress,
    /// The virtual function that holds the slot.
    pub vf: PciAddress,
    /// The VF count the PF must have for this slot (enabled again after a reboot); 0 when the VFs
    /// were there already and are not vgpud's to enable.
    pub num_vfs: u32,
    /// What the slot holds.
    pub holds: VfKind,
    /// What the backend did; `None` while the slot is being made.
    pub created: Option<Created>,
}

/// Schema-1 on-disk form of a VF slot record.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VfSlotV1 {
    schema: i64,
    uuid: MdevUuid,
    pool: String,
    profile: String,
    index: u32,
    gpu: String,
    pf: PciAddress,
    vf: PciAddress,
    num_vfs: u32,
    holds: HoldsV1,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    created: Option<CreatedV1>,
}

/// On-disk form of [`VfKind`].
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum HoldsV1 {
    SriovVf,
    NvidiaVgpu { type_id: u32, type_name: String },
}

/// On-disk form of [`Created`].
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
enum CreatedV1 {
    Vf {
        pf: PciAddress,
        vf: PciAddress,
        bind: BindV1,
    },
    NvidiaVgpu {
        pf: PciAddress,
        vf: PciAddress,
        type_id: u32,
    },
}

/// On-disk form of a [`BindRecord`].
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct BindV1 {
    addr: PciAddress,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    previous_override: Option<String>,
}

impl From<&VfKind> for HoldsV1 {
    fn from(k: &VfKind) -> Self {
        match k.clone() {
            VfKind::SriovVf => HoldsV1::SriovVf,
            VfKind::NvidiaVgpu { type_id, type_name } => HoldsV1::NvidiaVgpu { type_id, type_name },
        }
    }
}

impl From<HoldsV1> for VfKind {
    fn from(k: HoldsV1) -> Self {
        match k {
            HoldsV1::SriovVf => VfKind::SriovVf,
            HoldsV1::NvidiaVgpu { type_id, type_name } => VfKind::NvidiaVgpu { type_id, type_name },
        }
    }
}

impl From<&Created> for CreatedV1 {
    fn from(c: &Created) -> Self {
        match c.clone() {
            Created::Vf { pf, vf, bind } => CreatedV1::Vf {
                pf,
                vf,
                bind: BindV1 {
                    addr: bind.addr,
                    previous_driver: bind.previous_driver,
                    previous_override: bind.previous_override,
                },
            },
            Created::NvidiaVgpu { pf, vf, type_id } => CreatedV1::NvidiaVgpu { pf, vf, type_id },
        }
    }
}

impl From<CreatedV1> for Created {
    fn from(c: CreatedV1) -> Self {
        match c {
            CreatedV1::Vf { pf, vf, bind } => Created::Vf {
                pf,
                vf,
                bind: BindRecord {
                    addr: bind.addr,
                    previous_driver: bind.previous_driver,
                    previous_override: bind.previous_override,
                },
            },
            CreatedV1::NvidiaVgpu { pf, vf, type_id } => Created::NvidiaVgpu { pf, vf, type_id },
        }
    }
}

impl Record for VfSlotRecord {
    const KIND: &'static str = "VF slot record";
    const KEY_FIELD: &'static str = "uuid";
    const NAME_RULE: &'static str = UUID_NAME_RULE;
    type Key = MdevUuid;

    fn key(&self) -> &MdevUuid {
        &self.uuid
    }

    fn key_of_file_name(name: &str) -> Option<MdevUuid> {
        uuid_of_file_name(name)
    }

    fn encode(&self) -> Result<String, String> {
        let r = self.clone();
        toml::to_string(&VfSlotV1 {
            schema: SCHEMA,
            uuid: r.uuid,
            pool: r.pool,
            profile: r.profile,
            index: r.index,
            gpu: r.gpu,
            pf: r.pf,
            vf: r.vf,
            num_vfs: r.num_vfs,
            holds: HoldsV1::from(&r.holds),
            created: r.created.as_ref().map(CreatedV1::from),
        })
        .map_err(|e| e.to_string())
    }

    fn decode(text: &str) -> Result<Self, Rejection> {
        decode_versioned(text, |text| {
            let r: VfSlotV1 = toml::from_str(text).map_err(|e| describe(text, &e))?;
            Ok((
                r.schema,
                VfSlotRecord {
                    uuid: r.uuid,
                    pool: r.pool,
                    profile: r.profile,
                    index: r.index,
                    gpu: r.gpu,
                    pf: r.pf,
                    vf: r.vf,
                    num_vfs: r.num_vfs,
                    holds: r.holds.into(),
                    created: r.created.map(Created::from),
                },
            ))
        })
    }

    fn validate(&self) -> Result<(), String> {
        if !Pool::is_valid_name(&self.pool) {
            return Err(format!("`pool = {:?}` is not a pool name", self.pool));
        }
        if self.profile.trim().is_empty() {
            return Err("`profile` is empty".into());
        }
        if self.gpu.trim().is_empty() {
            return Err("`gpu` is empty".into());
        }
        if let VfKind::NvidiaVgpu { type_name, .. } = &self.holds
            && type_name.trim().is_empty()
        {
            return Err("`holds.type_name` is empty".into());
        }
        let slot = SlotId::new(&self.pool, &self.profile, self.index);
        if slot.uuid != self.uuid {
            return Err(format!(
                "`uuid = \"{}\"` is not the UUID of slot {}/{}/{} ({})",
                self.uuid, self.pool, self.profile, self.index, slot.uuid
            ));
        }
        Ok(())
    }
}
