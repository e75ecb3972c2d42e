//! Receiving a device from vgpud: `Instance1.OpenDevice` hands over the fds a VMM needs, so the VMM
//! can run without the rights to open `/dev/vfio` itself.

use std::collections::HashMap;

use mdev_types::ids::MdevUuid;
use mdev_types::vfio_api::{OpenedDevice, VfioBackend, VfioTarget};
use zbus::{Connection, Variant};

use super::{ClientError, Instance1Proxy, instance_path};

/// Asks vgpud for the fds of running instance `uuid` through `backend` (or the daemon's choice), bound
/// and attached for DMA or, with `bind` false, as the unbound cdev and an iommufd (see
/// `vgpu-vfio`'s `OpenedDeviceExt::open`). The device stays open as long as the returned value (or its fds) lives.
pub async fn open_device(
    conn: &Connection,
    bus: &str,
    uuid: &MdevUuid,
    backend: Option<VfioBackend>,
    bind: bool,
) -> Result<OpenedDevice, ClientError> {
    let call_err = |e| ClientError::from_call("OpenDevice", bus, e);
    let path = instance_path(&uuid.to_string());
    let proxy = Instance1Proxy::builder(conn)
        .path(path)
        .build()
        .await
        .map_err(call_err)?;
    let mut options = HashMap::new();
    let name = backend.map_or("auto", VfioBackend::as_str);
    options.insert("backend", Variant::from(name));
    options.insert("bind", Variant::from(bind));
    let (device, iommu, kind, ioas, group) = proxy.open_device(options).await.map_err(|e| {
        // Instances are objects: an unknown UUID has none.
        let unknown = match &e {
            zbus::Error::FDO(f) => matches!(**f, zbus::fdo::Error::UnknownObject(_)),
            zbus::Error::MethodError(name, _, _) => {
                name.as_str() == "org.freedesktop.DBus.Error.UnknownObject"
            }
            _ => false,
        };
        if unknown {
            ClientError::Daemon {
                kind: "NotFound".into(),
                message: format!("no instance {uuid}: `vgpuctl list` shows the instances"),
            }
        } else {
            call_err(e)
        }
    })?;
    let backend = match kind.parse::<VfioBackend>() {
        Ok(b) => b,
        Err(_) => {
            let other = kind.as_str();
            return Err(ClientError::Bus {
                method: "OpenDevice".into(),
                source: zbus::Error::Failure(format!(
                    "the daemon answered with unknown backend '{other}'"
                )),
            });
        }
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
