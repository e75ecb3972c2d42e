//! VFIO on behalf of clients: the preflight of an instance, and opening one for an unprivileged VMM
//! (the fds are handed over by the transport; the core only opens).

use mdev_types::ids::MdevUuid;
use vgpu_vfio::{
    OpenedDevice, OpenedDeviceExt, VfioBackend, VfioCheckError, VfioTarget, preflight,
};

use super::{Core, lock};
use crate::daemon::api::{CoreError, InstanceState, Ownership, Reply};

fn vfio_error(uuid: MdevUuid, e: VfioCheckError) -> CoreError {
    match e {
        VfioCheckError::NoSuchTarget(_) => CoreError::NotFound { uuid },
        VfioCheckError::BadTarget(_) | VfioCheckError::BackendUnavailable { .. } => {
            CoreError::Invalid(e.to_string())
        }
        e => CoreError::State(e.to_string()),
    }
}

impl Core {
    /// [`crate::daemon::api::Command::Preflight`].
    pub(super) fn preflight(&self, uuid: MdevUuid) -> Result<Reply, CoreError> {
        let r = preflight(
            self.host.as_ref(),
            &VfioTarget::Mdev(uuid),
            &Default::default(),
        )
        .map_err(|e| vfio_error(uuid, e))?;
        serde_json::to_value(r)
            .map(Reply::Report)
            .map_err(|e| CoreError::Invalid(format!("preflight report: {e}")))
    }

    /// Opens running instance `uuid` through VFIO (the backend `backend`, or the automatic choice;
    /// bound and attached for DMA or not: [`OpenedDevice::open`]) so its fds can be handed to a VMM. Only instances vgpu-manager manages are handed out, and only
    /// while running. This is outside [`crate::daemon::api::Command`] because its result carries open
    /// fds, which are not data; the caller must be authorized like any change.
    pub fn open_device(
        &self,
        uuid: MdevUuid,
        backend: Option<VfioBackend>,
        bind: bool,
    ) -> Result<OpenedDevice, CoreError> {
        let parent = lock(&self.views)
            .get(&uuid)
            .map(|v| v.parent.clone())
            .ok_or(CoreError::NotFound { uuid })?;
        // Checked and opened under the parent's lock, so a Stop or Destroy cannot remove the device in
        // between.
        self.locks.with_parent(&parent, || {
            let view = lock(&self.views)
                .get(&uuid)
                .cloned()
                .ok_or(CoreError::NotFound { uuid })?;
            if view.ownership == Ownership::Foreign {
                return Err(CoreError::Foreign { uuid });
            }
            if view.state != InstanceState::Running {
                return Err(CoreError::State(format!(
                    "instance {uuid} is not running, so there is no device to open: Start it first"
                )));
            }
            OpenedDevice::open(self.host.as_ref(), &VfioTarget::Mdev(uuid), backend, bind)
                .map_err(|e| vfio_error(uuid, e))
        })
    }
}
