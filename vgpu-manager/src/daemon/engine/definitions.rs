//! Definitions by parent and UUID, vgpud's and the foreign ones of mdevctl's definition directory, and
//! taking a foreign one over on an explicit request.

use tracing::info;

use mdev_types::ids::MdevUuid;

use super::instances::Instances;
use super::lock;
use crate::daemon::api::{
    CoreError, DefinitionView, InstanceSpec, InstanceTarget, InstanceView, StateError, parse_attrs,
};

impl Instances {
    /// Every definition, vgpud's and foreign (see [`crate::daemon::api::ListDefinitions`]).
    pub(super) fn list_definitions(&self) -> Vec<DefinitionView> {
        let (own, dir) = lock(&self.store).own_definitions();
        super::persist::foreign_definitions(own, dir.as_ref())
    }

    /// Takes the foreign definition of `uuid` on `parent` into the store, as a Define of its content
    /// would (see [`crate::daemon::api::AdoptDefinition`]).
    pub(super) fn adopt_definition(
        &self,
        parent: String,
        uuid: MdevUuid,
    ) -> Result<InstanceView, CoreError> {
        let config = {
            let store = lock(&self.store);
            if let Some(own) = store.get_definition(&uuid) {
                if own.parent == parent {
                    drop(store);
                    return self.get(&uuid);
                }
                return Err(StateError::DefinedElsewhere {
                    uuid,
                    defined_on: own.parent.clone(),
                    parent,
                }
                .into());
            }
            store.foreign_definition(&parent, &uuid)?
        };
        let attrs = parse_attrs(config.attrs.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .map_err(|e| CoreError::Invalid(e.into()))?;
        let view = self.define(InstanceSpec {
            target: InstanceTarget::Type(config.mdev_type.clone()),
            gpu: Some(parent.clone()),
            uuid: Some(uuid),
            autostart: config.start.is_auto(),
            label: None,
            attrs,
        })?;
        info!(%uuid, %parent, type_id = %config.mdev_type, "foreign mdevctl definition adopted on request");
        Ok(view)
    }

    /// See [`super::Core::mdevctl_dir_changed`].
    pub(super) fn mdevctl_dir_changed(&self) {
        let changed = lock(&self.store).reconcile_files(false);
        for uuid in changed {
            self.refresh_one(&uuid);
        }
    }
}
