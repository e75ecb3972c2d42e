//! Receiving a device from vgpud: `Instance1.OpenDevice` hands over the fds a VMM needs, so the VMM
//! can run without the rights to open `/dev/vfio` itself.

use std::collections::HashMap;

use mdev_types::ids::MdevUuid;
use mdev_types::vfio_api::{OpenedDevice, VfioBackend, VfioTarget};
use zbus::Variant;

use crate::{Client, ClientError};

impl Client {
    /// Asks vgpud for the fds of running instance `uuid` through `backend` (or the daemon's choice),
    /// bound and attached for DMA or, with `bind` false, as the unbound cdev and an iommufd (as
    /// `vgpu-vfio`'s `OpenedDeviceExt::open` opens them). The device stays open as long as the
    /// returned value (or its fds) lives.
    pub async fn open_device(
        &self,
        uuid: &MdevUuid,
        backend: Option<VfioBackend>,
        bind: bool,
    ) -> Result<OpenedDevice, ClientError> {
        let proxy = self.instance(&uuid.to_string()).await?;
        let mut options = HashMap::new();
        let name = backend.map_or("auto", VfioBackend::as_str);
        options.insert("backend", Variant::from(name));
        options.insert("bind", Variant::from(bind));
        let (device, iommu, kind, ioas, group) = match proxy.open_device(options).await {
            Ok(reply) => reply,
            // Instances are objects: an unknown UUID has none.
            Err(e) if unknown_object(&e) => {
                return Err(ClientError::Daemon {
                    kind: "NotFound".into(),
                    message: format!("no instance {uuid}: `vgpuctl list` shows the instances"),
                });
            }
            Err(e) => return Err(self.error("OpenDevice")(e)),
        };
        let Ok(backend) = kind.parse::<VfioBackend>() else {
            return Err(ClientError::Bus {
                method: "OpenDevice".into(),
                source: zbus::Error::Failure(format!(
                    "the daemon answered with unknown backend '{kind}'"
                )),
            });
        };
        let ioas_id = (backend == VfioBackend::Iommufd && ioas != 0).then_some(ioas);
        Ok(OpenedDevice::from_parts(
            VfioTarget::Mdev(*uuid),
            group,
            backend,
            device.into(),
            iommu.into(),
            ioas_id,
        ))
    }
}

/// Whether `e` says the called object does not exist.
fn unknown_object(e: &zbus::Error) -> bool {
    match e {
        zbus::Error::FDO(f) => matches!(**f, zbus::fdo::Error::UnknownObject(_)),
        zbus::Error::MethodError(name, _, _) => {
            name.as_str() == "org.freedesktop.DBus.Error.UnknownObject"
        }
        _ => false,
    }
}
