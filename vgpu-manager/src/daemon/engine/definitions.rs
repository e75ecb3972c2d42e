//! Definitions by parent and UUID, vgpud's and the foreign ones of mdevctl's definition directory, and
//! taking a foreign one over on an explicit request.

use tracing::info;

use mdev_types::ids::MdevUuid;

use super::choose::Placement;
use super::instances::Instances;
use super::lock;
use super::views::device_identity;
use crate::daemon::api::{
    CoreError, DefinitionOwner, DefinitionView, InstanceSpec, InstanceTarget, InstanceView,
    StateError, parse_attrs,
};

impl Instances {
    /// Every definition, vgpud's and foreign (see [`crate::daemon::api::ListDefinitions`]).
    pub(super) fn list_definitions(&self) -> Vec<DefinitionView> {
        let (own, dir) = lock(&self.store).own_definitions();
        super::persist::foreign_definitions(own, dir.as_ref())
    }

    /// Starts `uuid`'s one definition (on `parent` when given) as mdevctl's `start --uuid` does (see
    /// [`crate::daemon::api::StartDefinition`]): a foreign one, or one among several parents', is
    /// adopted first; refused before anything changes when there is none or several.
    pub(super) fn start_definition(
        &self,
        uuid: MdevUuid,
        parent: Option<String>,
    ) -> Result<Option<InstanceView>, CoreError> {
        let of_uuid: Vec<DefinitionView> = self
            .list_definitions()
            .into_iter()
            .filter(|d| d.uuid == uuid)
            .collect();
        let several = of_uuid.len() > 1;
        let mut chosen: Vec<DefinitionView> = of_uuid
            .iter()
            .filter(|d| parent.as_ref().is_none_or(|p| *p == d.parent))
            .cloned()
            .collect();
        let d = match chosen.len() {
            0 => return Err(StateError::NoDefinition { uuid, parent }.into()),
            1 => chosen.remove(0),
            _ => {
                let parents = chosen.into_iter().map(|d| d.parent).collect();
                return Err(StateError::SeveralDefinitions { uuid, parents }.into());
            }
        };
        if d.owner == DefinitionOwner::Foreign || several {
            self.adopt_definition(d.parent, uuid)?;
        }
        self.start(uuid)
    }

    /// Makes the definition of `uuid` on `parent` the one vgpud acts on for `uuid` (see
    /// [`crate::daemon::api::AdoptDefinition`]): a foreign one is taken into the store, as a Define of
    /// its content would; one of vgpud's on another parent than the UUID's main definition (an
    /// alternate) becomes the main one. Refused while the UUID's device runs on another parent.
    pub(super) fn adopt_definition(
        &self,
        parent: String,
        uuid: MdevUuid,
    ) -> Result<InstanceView, CoreError> {
        let config = {
            let mut store = lock(&self.store);
            match store.get_definition(&uuid) {
                Some(main) if main.parent == parent => {
                    drop(store);
                    return self.get(&uuid);
                }
                Some(_) => {
                    if let Some((running_on, _)) = device_identity(self.host.as_ref(), &uuid)
                        && running_on != parent
                    {
                        return Err(StateError::RunsElsewhere {
                            uuid,
                            running_on,
                            parent,
                        }
                        .into());
                    }
                    if store.definition_on(&uuid, &parent).is_some() {
                        store.select_definition(&uuid, &parent)?;
                        drop(store);
                        info!(%uuid, %parent, "definition on another parent made the one vgpud acts on");
                        self.refresh_one(&uuid);
                        return self.get(&uuid);
                    }
                }
                None => {}
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
        if lock(&self.store).select_definition(&uuid, &parent)? {
            self.refresh_one(&uuid);
        }
        info!(%uuid, %parent, type_id = %config.mdev_type, "foreign mdevctl definition adopted on request");
        if view.parent == parent {
            Ok(view)
        } else {
            self.get(&uuid)
        }
    }

    /// `define` of `uuid` on `place`'s parent while `uuid` has its main definition on another parent:
    /// the new one is kept as an alternate (mdevctl keys definitions by parent and UUID), listed and
    /// made the main one by a request naming its parent. `None` when the UUID has no definition
    /// elsewhere (the caller defines as usual).
    pub(super) fn define_alternate(
        &self,
        uuid: MdevUuid,
        place: &Placement,
        req: &InstanceSpec,
    ) -> Result<Option<InstanceView>, CoreError> {
        let _reserved = self.reserve_new_for_adoption(uuid)?;
        let mut store = lock(&self.store);
        match store.get_definition(&uuid) {
            Some(main) if main.parent != place.parent => {}
            _ => return Ok(None),
        }
        if store.definition_on(&uuid, &place.parent).is_some() {
            return Err(CoreError::Exists { uuid });
        }
        let def = place.definition(uuid, req);
        store.put_alternate(&def)?;
        drop(store);
        info!(%uuid, parent = %def.parent, type_id = %def.type_id, "instance defined on a further parent");
        self.get(&uuid).map(Some)
    }

    /// See [`super::Core::mdevctl_dir_changed`].
    pub(super) fn mdevctl_dir_changed(&self) {
        let changed = lock(&self.store).reconcile_files(false);
        for uuid in changed {
            self.refresh_one(&uuid);
        }
    }
}
