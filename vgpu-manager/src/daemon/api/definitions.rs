//! Definitions as mdevctl keys them, by parent and UUID: vgpud's own and the foreign ones found in
//! mdevctl's definition directory (`/etc/mdevctl.d`), and the request that takes a foreign one over.

use std::fmt;

use mdev_types::ids::{MdevTypeId, MdevUuid};

use super::{Access, Command, InstanceView, MdevAttr};

/// Who keeps a definition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DefinitionOwner {
    /// A definition of vgpud's state directory (its file in the mdevctl directory is vgpud's).
    Daemon,
    /// A file of the mdevctl directory that is not one of vgpud's definitions (an administrator's or
    /// the real mdevctl's): listed, never started by vgpud's automatic actions.
    Foreign,
}

impl DefinitionOwner {
    /// The owner's one name, used on D-Bus and in JSON: `daemon` or `foreign`.
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionOwner::Daemon => "daemon",
            DefinitionOwner::Foreign => "foreign",
        }
    }
}

impl fmt::Display for DefinitionOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One definition, as mdevctl lists it: parent, UUID, type, start mode and attributes, and who keeps
/// it. The same UUID may be defined on several parents (by foreign files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DefinitionView {
    /// The mdev parent's device name (the directory of its file).
    pub parent: String,
    /// The UUID (the file's name).
    pub uuid: MdevUuid,
    /// The mdev type.
    pub type_id: MdevTypeId,
    /// Started when its parent appears (mdevctl's `"start": "auto"`).
    pub autostart: bool,
    /// mdev attributes (name, value), in write order.
    pub attrs: Vec<(String, String)>,
    /// vgpud's or foreign.
    pub owner: DefinitionOwner,
}

/// Lists every definition: vgpud's own (from its store) and the foreign ones in mdevctl's definition
/// directory (read at each call), sorted by parent then UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListDefinitions;

impl Command for ListDefinitions {
    type Reply = Vec<DefinitionView>;
    const ACCESS: Access = Access::Read;
}

/// Makes the definition of `uuid` on `parent` the one later requests naming the UUID act on: a foreign
/// one is taken into vgpud's store (as a Define with the file's type, start mode and attributes
/// would); when vgpud defines the UUID on several parents (mdevctl keys definitions by parent and
/// UUID), the one on `parent` becomes the UUID's main definition. Naming the main definition again
/// answers its instance; while the UUID's device runs on another parent it is refused (State).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdoptDefinition {
    /// The parent whose directory holds the file.
    pub parent: String,
    /// The definition's UUID.
    pub uuid: MdevUuid,
}

impl Command for AdoptDefinition {
    type Reply = InstanceView;
    const ACCESS: Access = Access::Change;
}

/// Starts the definition of `uuid` as mdevctl's `start --uuid` does (mdevctl src/main.rs
/// `start_command_helper`): the UUID's one definition, on `parent` when given, vgpud's or foreign. A
/// foreign one, or one of several parents' definitions, is first made the one vgpud acts on (as
/// [`AdoptDefinition`] does), then started as `StartInstance` starts it. Refused without touching
/// anything when the UUID has no such definition, or has several and no parent is named. Replies the
/// view after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartDefinition {
    /// The definition's UUID.
    pub uuid: MdevUuid,
    /// The parent of the definition to start; `None` for the UUID's one definition.
    pub parent: Option<String>,
}

impl Command for StartDefinition {
    type Reply = Option<InstanceView>;
    const ACCESS: Access = Access::Change;
}

/// Replaces the type, start mode and attributes of instance `uuid`'s definition in place (mdevctl's
/// `modify` without `--live`): a running device is not touched, the new definition applies from its
/// next start. Replies the view after the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedefineInstance {
    /// The instance's UUID.
    pub uuid: MdevUuid,
    /// The new mdev type.
    pub type_id: MdevTypeId,
    /// The new start mode.
    pub autostart: bool,
    /// The new attributes, in write order.
    pub attrs: Vec<MdevAttr>,
}

impl Command for RedefineInstance {
    type Reply = Option<InstanceView>;
    const ACCESS: Access = Access::Change;
}
