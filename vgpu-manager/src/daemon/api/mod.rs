//! The daemon's internal API: one [`Command`] type per request, each with its typed reply
//! ([`Command::Reply`]), the views clients see, the [`Event`]s that report changes, and [`CoreError`].
//! The D-Bus layer and tests drive commands through [`Handle`]; the engine never knows who called, and
//! nothing here is serialized for a transport: the D-Bus layer converts replies at its edge.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use mdev_types::ids::{MdevTypeId, MdevUuid};

mod attrs;
mod command;
mod definitions;
mod error;
mod faults;
pub mod limits;
mod metrics;
mod migration;

pub use attrs::{
    AttrError, MAX_ATTR_NAME_BYTES, MAX_ATTR_VALUE_BYTES, MAX_ATTRS, MdevAttr, parse_attrs,
};
pub use command::*;
pub use definitions::{
    AdoptDefinition, DefinitionOwner, DefinitionView, ListDefinitions, RedefineInstance,
    StartDefinition,
};
pub use error::{CoreError, RequestError, StateError, UndoFailure, VfInUse};
pub use faults::ListFaults;
pub use metrics::GetMetrics;
pub use migration::{
    AbortIncoming, CompleteIncoming, DEFAULT_INCOMING_TIMEOUT, IncomingView, MAX_INCOMING_TIMEOUT,
    PrepareIncoming,
};

/// Who created an instance, which decides whether the daemon may ever remove it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Ownership {
    /// The daemon created it.
    Daemon,
    /// It existed before and was taken over by an explicit definition with its UUID.
    Adopted,
    /// Someone else made it (mdevctl, a shell); shown, never touched.
    Foreign,
}

/// The lifecycle state of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Its device exists.
    Running,
    /// Defined, device not created.
    Stopped,
    /// Defined with autostart, but its parent is not registered (driver not loaded yet).
    WaitingForParent,
}

/// A word that names no [`InstanceState`] or [`Ownership`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{word:?} is not {what}: expected one of {expected}")]
pub struct UnknownWord {
    /// The word given.
    pub word: String,
    /// What it should have named (`an instance state`).
    pub what: &'static str,
    /// The words accepted.
    pub expected: &'static str,
}

impl InstanceState {
    /// Every state, in the order of [`InstanceState::as_str`]'s documentation.
    pub const ALL: [InstanceState; 3] = [
        InstanceState::Running,
        InstanceState::Stopped,
        InstanceState::WaitingForParent,
    ];

    /// The state's one name, used on D-Bus, in JSON and in status rows: `running`, `stopped` or
    /// `waiting-for-parent` (the same words serde writes).
    pub fn as_str(self) -> &'static str {
        match self {
            InstanceState::Running => "running",
            InstanceState::Stopped => "stopped",
            InstanceState::WaitingForParent => "waiting-for-parent",
        }
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for InstanceState {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        InstanceState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownWord {
                word: s.to_string(),
                what: "an instance state",
                expected: "running, stopped, waiting-for-parent",
            })
    }
}

impl Ownership {
    /// Every ownership.
    pub const ALL: [Ownership; 3] = [Ownership::Daemon, Ownership::Adopted, Ownership::Foreign];

    /// The ownership's one name, used on D-Bus (`Owner`) and in JSON: `daemon`, `adopted` or
    /// `foreign` (the same words serde writes).
    pub fn as_str(self) -> &'static str {
        match self {
            Ownership::Daemon => "daemon",
            Ownership::Adopted => "adopted",
            Ownership::Foreign => "foreign",
        }
    }
}

impl fmt::Display for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Ownership {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ownership::ALL
            .into_iter()
            .find(|o| o.as_str() == s)
            .ok_or_else(|| UnknownWord {
                word: s.to_string(),
                what: "an instance owner",
                expected: "daemon, adopted, foreign",
            })
    }
}

/// An instance as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceView {
    /// UUID.
    pub uuid: MdevUuid,
    /// The GPU id (PCI address or parent name).
    pub gpu: String,
    /// The mdev parent device name.
    pub parent: String,
    /// The mdev type.
    pub type_id: MdevTypeId,
    /// The profile it was made from, if any.
    pub profile: Option<String>,
    /// State.
    pub state: InstanceState,
    /// Persistent definition exists.
    pub defined: bool,
    /// Starts automatically.
    pub autostart: bool,
    /// Who owns it.
    pub ownership: Ownership,
    /// Free-form label of who asked for it.
    pub label: Option<String>,
    /// IOMMU group, while running.
    pub iommu_group: Option<u32>,
    /// When it was created or defined (seconds since the Unix epoch).
    pub created_at: u64,
    /// The definition's mdev attributes, in write order (none for a transient or foreign instance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attrs: Vec<MdevAttr>,
}

/// A GPU as clients see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuView {
    /// GPU id (PCI address or parent name).
    pub id: String,
    /// Vendor (`nvidia`, `intel`, …).
    pub vendor: String,
    /// Model name.
    pub model: String,
    /// Driver.
    pub driver: Option<String>,
    /// NUMA node.
    pub numa_node: Option<u32>,
    /// mdev types with (type id, available instances).
    pub types: Vec<(MdevTypeId, u32)>,
    /// Instances on it (running).
    pub instances: Vec<MdevUuid>,
    /// `ok`, or `faulted: ` and the fault (path, cause, fix) when discovery could not read it: nothing
    /// is placed on it then, and its instances and definitions are kept.
    pub health: String,
}

/// Something that changed, for signals and property updates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A new instance (created, defined, or first seen).
    InstanceAdded(InstanceView),
    /// An instance is gone entirely (no device, no definition).
    InstanceRemoved(MdevUuid),
    /// An instance's state, autostart or definition changed.
    InstanceChanged(InstanceView),
    /// A step of a pool apply finished (the `PoolProgress` signal).
    PoolProgress {
        /// The pool.
        pool: String,
        /// Steps finished so far (this one included).
        done: u32,
        /// Steps in the apply.
        total: u32,
        /// The step, in a line (`create vdi-2g/3 on 0000:83:00.0 as nvidia-231`).
        step: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_and_owner_words_round_trip_and_match_serde() {
        for st in InstanceState::ALL {
            assert_eq!(st.as_str().parse::<InstanceState>(), Ok(st));
            assert_eq!(
                serde_json::to_value(st).unwrap(),
                serde_json::Value::from(st.as_str())
            );
        }
        for o in Ownership::ALL {
            assert_eq!(o.to_string().parse::<Ownership>(), Ok(o));
            assert_eq!(
                serde_json::to_value(o).unwrap(),
                serde_json::Value::from(o.as_str())
            );
        }
        let e = "paused".parse::<InstanceState>().unwrap_err();
        assert!(e.to_string().contains("waiting-for-parent"), "{e}");
    }
}
