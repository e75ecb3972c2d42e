//! VFIO on behalf of clients: the preflight of an instance, and opening one for an unprivileged VMM
//! (the fds are handed over by the transport; the core only opens).

use mdev_types::ids::MdevUuid;
use vgpu_vfio::{
    MigrationSupport, OpenedDevice, OpenedDeviceExt, PreflightReport, VfioBackend, VfioTarget,
    migration_support, preflight,
};

use std::sync::Arc;

use vgpu_host::Host;

use super::instances::Instances;
use super::lock;
use crate::daemon::api::{CoreError, InstanceState, Ownership, StateError};

/// The VFIO service: preflight and opening running instances (whose views and per-parent locks it
/// takes from [`Instances`]).
pub(super) struct Vfio {
    host: Arc<dyn Host>,
    instances: Arc<Instances>,
}

impl Vfio {
    /// The service over `host`, for the instances of `instances`.
    pub(super) fn new(host: Arc<dyn Host>, instances: Arc<Instances>) -> Vfio {
        Vfio { host, instances }
    }

    /// [`crate::daemon::api::Preflight`].
    pub(super) fn preflight(&self, uuid: MdevUuid) -> Result<PreflightReport, CoreError> {
        preflight(
            self.host.as_ref(),
            &VfioTarget::Mdev(uuid),
            &Default::default(),
        )
        .map_err(|e| CoreError::vfio(uuid, e))
    }

    /// [`crate::daemon::api::MigrationInfo`].
    pub(super) fn migration_info(&self, uuid: MdevUuid) -> Result<MigrationSupport, CoreError> {
        migration_support(self.host.as_ref(), &VfioTarget::Mdev(uuid), None)
            .map_err(|e| CoreError::vfio(uuid, e))
    }

    /// Opens running instance `uuid` through VFIO (the backend `backend`, or the automatic choice;
    /// bound and attached for DMA or not: [`OpenedDevice::open`]) so its fds can be handed to a VMM.
    /// Only instances vgpu-manager manages are handed out, and only while running
    /// ([`crate::daemon::api::OpenDevice`]).
    pub(super) fn open_device(
        &self,
        uuid: MdevUuid,
        backend: Option<VfioBackend>,
        bind: bool,
    ) -> Result<OpenedDevice, CoreError> {
        let parent = lock(&self.instances.views)
            .get(&uuid)
            .map(|v| v.parent.clone())
            .ok_or(CoreError::NotFound { uuid })?;
        // Checked and opened under the parent's lock, so a Stop or Destroy cannot remove the device in
        // between.
        self.instances.locks.with_parent(&parent, || {
            let view = lock(&self.instances.views)
                .get(&uuid)
                .cloned()
                .ok_or(CoreError::NotFound { uuid })?;
            if view.ownership == Ownership::Foreign {
                return Err(CoreError::Foreign { uuid });
            }
            if view.state != InstanceState::Running {
                return Err(StateError::NoDeviceToOpen { uuid }.into());
            }
            OpenedDevice::open(self.host.as_ref(), &VfioTarget::Mdev(uuid), backend, bind)
                .map_err(|e| CoreError::vfio(uuid, e))
        })
    }
}
