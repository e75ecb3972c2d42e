//! Blocking access to vgpud for the libvirt hook and the `vgpuctl mdevctl`/`xml` front ends: a small
//! trait over the Manager1 calls they need, so their logic is tested against a fake as well as against
//! the real daemon, and a D-Bus implementation with a deadline on every call (a hook that hangs would
//! hang libvirtd, which runs hooks synchronously).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use zbus::Variant;

use crate::client::{
    BusAddress, ClientError, GpuInfo, InstanceInfo, Manager1Proxy, TARGET_PROFILE, TARGET_TYPE,
    connect,
};

/// How long one D-Bus call may take before it is abandoned.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What to create or define.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    /// `profile` or `type` ([`TARGET_PROFILE`], [`TARGET_TYPE`]).
    pub kind: &'static str,
    /// The profile name or mdev type id.
    pub target: String,
    /// The GPU (PCI address or parent name); `None` lets the daemon choose.
    pub gpu: Option<String>,
    /// The UUID; `None` lets the daemon choose.
    pub uuid: Option<String>,
    /// A label (who asked).
    pub label: Option<String>,
}

impl NewInstance {
    /// An instance of mdev type `type_id`.
    pub fn of_type(type_id: &str) -> Self {
        NewInstance {
            kind: TARGET_TYPE,
            target: type_id.to_string(),
            gpu: None,
            uuid: None,
            label: None,
        }
    }

    /// An instance of profile `name`.
    pub fn of_profile(name: &str) -> Self {
        NewInstance {
            kind: TARGET_PROFILE,
            ..NewInstance::of_type(name)
        }
    }
}

/// The Manager1 calls the glue needs. `get_instance` answers `None` for an unknown UUID; every other
/// refusal is the daemon's error.
pub trait VgpuDaemon {
    /// `ListInstances`.
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError>;
    /// `ListGpus`.
    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError>;
    /// `GetInstance`, with `NotFound` as `None`.
    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError>;
    /// `Create`; returns the new instance.
    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError>;
    /// `Define`; returns the new definition.
    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError>;
    /// `Start`.
    fn start(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// `Stop`.
    fn stop(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// `Destroy`.
    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// `Undefine`.
    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// `SetAutostart`.
    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError>;
}

/// [`VgpuDaemon`] over D-Bus, with its own single-threaded runtime.
pub struct DbusDaemon {
    rt: tokio::runtime::Runtime,
    bus: String,
    manager: Manager1Proxy<'static>,
}

impl DbusDaemon {
    /// Connects to vgpud on `bus`.
    pub fn connect(bus: &BusAddress) -> Result<Self, ClientError> {
        let rt = crate::client::runtime()?;
        let name = bus.to_string();
        let manager = rt.block_on(async {
            let conn = within("(connect)", &name, connect(bus)).await??;
            Manager1Proxy::new(&conn)
                .await
                .map_err(|e| ClientError::from_call("(connect)", &name, e))
        })?;
        Ok(DbusDaemon {
            rt,
            bus: name,
            manager,
        })
    }

    fn call<T>(
        &self,
        method: &str,
        f: impl std::future::Future<Output = zbus::Result<T>>,
    ) -> Result<T, ClientError> {
        self.rt.block_on(async {
            within(method, &self.bus, f)
                .await?
                .map_err(|e| ClientError::from_call(method, &self.bus, e))
        })
    }

    fn new_instance(
        &mut self,
        method: &str,
        req: &NewInstance,
        autostart: Option<bool>,
    ) -> Result<InstanceInfo, ClientError> {
        let mut options: HashMap<&str, Variant<'_>> = HashMap::new();
        if let Some(l) = &req.label {
            options.insert("label", Variant::from(l.as_str()));
        }
        if let Some(a) = autostart {
            options.insert("autostart", Variant::from(a));
        }
        let gpu = req.gpu.as_deref().unwrap_or("");
        let uuid = req.uuid.as_deref().unwrap_or("");
        let m = &self.manager;
        let path = if autostart.is_some() {
            self.call(method, m.define(req.kind, &req.target, gpu, uuid, options))?
        } else {
            self.call(method, m.create(req.kind, &req.target, gpu, uuid, options))?
        };
        // The object path ends in the UUID with '_' for '-' (crate::client::instance_path).
        let uuid = path
            .as_str()
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .replace('_', "-");
        self.call("GetInstance", self.manager.get_instance(&uuid))
    }
}

/// Runs `f` with [`CALL_TIMEOUT`]; a timeout is reported as an I/O error of the call.
async fn within<T>(
    method: &str,
    bus: &str,
    f: impl std::future::Future<Output = T>,
) -> Result<T, ClientError> {
    tokio::time::timeout(CALL_TIMEOUT, f).await.map_err(|_| {
        ClientError::from_call(
            method,
            bus,
            zbus::Error::InputOutput(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {} s (is vgpud stuck? `systemctl status vgpud`)",
                    CALL_TIMEOUT.as_secs()
                ),
            ))),
        )
    })
}

impl VgpuDaemon for DbusDaemon {
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError> {
        self.call("ListInstances", self.manager.list_instances())
    }

    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError> {
        self.call("ListGpus", self.manager.list_gpus())
    }

    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        match self.call("GetInstance", self.manager.get_instance(uuid)) {
            Ok(i) => Ok(Some(i)),
            Err(e) if e.kind() == Some("NotFound") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        self.new_instance("Create", req, None)
    }

    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        self.new_instance("Define", req, Some(autostart))
    }

    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.call("Start", self.manager.start(uuid))
    }

    fn stop(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.call("Stop", self.manager.stop(uuid))
    }

    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.call("Destroy", self.manager.destroy(uuid))
    }

    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.call("Undefine", self.manager.undefine(uuid))
    }

    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        self.call("SetAutostart", self.manager.set_autostart(uuid, autostart))
    }
}

/// A borrowed daemon is a daemon, so callers can keep theirs after handing it to [`super::run`].
impl<D: VgpuDaemon + ?Sized> VgpuDaemon for &mut D {
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError> {
        (**self).list_instances()
    }
    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError> {
        (**self).list_gpus()
    }
    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        (**self).get_instance(uuid)
    }
    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        (**self).create(req)
    }
    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        (**self).define(req, autostart)
    }
    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        (**self).start(uuid)
    }
    fn stop(&mut self, uuid: &str) -> Result<(), ClientError> {
        (**self).stop(uuid)
    }
    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError> {
        (**self).destroy(uuid)
    }
    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError> {
        (**self).undefine(uuid)
    }
    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        (**self).set_autostart(uuid, autostart)
    }
}
