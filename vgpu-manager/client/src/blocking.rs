//! Blocking access to vgpud, for programs without an async runtime: the libvirt hook and the
//! `vgpuctl mdevctl`/`xml` front ends. [`Client`] runs the async [`crate::Client`]'s calls on a
//! one-thread runtime of its own, with a deadline on every call (a hook that hangs would hang
//! libvirtd, which runs hooks synchronously). [`ManagerCalls`] is the part of the API those front ends
//! use, as a trait, so their logic is tested against a fake as well as against the real daemon.

use std::future::Future;
use std::time::Duration;

use crate::api::within;
use crate::{
    BusAddress, ClientError, DefinitionInfo, GpuInfo, InstanceInfo, NewInstance, PoolStatus,
};

/// How long one D-Bus call of a blocking [`Client`] may take before it is abandoned.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The Manager1 calls the libvirt hook and the mdevctl front end make. `get_instance` answers `None`
/// for an unknown UUID; every other refusal is the daemon's error.
pub trait ManagerCalls {
    /// Every instance (`ListInstances`).
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError>;
    /// Every GPU (`ListGpus`).
    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError>;
    /// Instance `uuid` (`GetInstance`), with the daemon's `NotFound` as `None`.
    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError>;
    /// Creates and starts a transient instance (`Create`); returns it.
    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError>;
    /// Creates and starts a transient instance (`Create`) and returns its UUID alone. The default
    /// reads the instance back ([`ManagerCalls::create`]); [`Client`] saves that round trip.
    fn create_uuid(&mut self, req: &NewInstance) -> Result<String, ClientError> {
        Ok(self.create(req)?.uuid)
    }
    /// Persists a definition (`Define`); returns it.
    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError>;
    /// Starts a definition (`Start`).
    fn start(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// Starts `uuid`'s one definition, on `parent` when given, vgpud's or foreign, as mdevctl's
    /// `start --uuid` does (`StartDefinition`). The default (for daemons without it) refuses with
    /// kind `NotSupported`.
    fn start_definition(&mut self, uuid: &str, parent: Option<&str>) -> Result<(), ClientError> {
        let _ = parent;
        Err(ClientError::Daemon {
            kind: "NotSupported".into(),
            message: format!(
                "cannot start the definition of {uuid} in one call: this daemon has no StartDefinition"
            ),
        })
    }
    /// Stops an instance, keeping its definition (`Stop`).
    fn stop(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// Removes an instance and its definition (`Destroy`).
    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// Deletes a definition (`Undefine`).
    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError>;
    /// Sets whether a definition starts with the daemon (`SetAutostart`).
    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError>;
    /// The mdev attributes of instance `uuid`'s definition, in write order (`Attributes`).
    fn instance_attrs(&mut self, uuid: &str) -> Result<Vec<(String, String)>, ClientError>;
    /// Every definition by parent and UUID, vgpud's and foreign (`ListDefinitions`). The default
    /// (for daemons without foreign definitions) lists the defined instances.
    fn list_definitions(&mut self) -> Result<Vec<DefinitionInfo>, ClientError> {
        let mut out = Vec::new();
        for i in self.list_instances()?.into_iter().filter(|i| i.defined) {
            let attrs = self.instance_attrs(&i.uuid)?;
            let parent = if i.parent.is_empty() { i.gpu } else { i.parent };
            out.push(DefinitionInfo {
                parent,
                uuid: i.uuid,
                type_id: i.type_id,
                autostart: i.autostart,
                owner: "daemon".into(),
                attrs,
            });
        }
        Ok(out)
    }
    /// Replaces the type, start mode and attributes of `uuid`'s definition in place (`Redefine`).
    /// The default (for daemons without it) refuses with kind `NotSupported`.
    fn redefine(
        &mut self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: &[(String, String)],
    ) -> Result<(), ClientError> {
        let _ = (type_id, autostart, attrs);
        Err(ClientError::Daemon {
            kind: "NotSupported".into(),
            message: format!(
                "cannot change the definition of {uuid} in place: this daemon has no Redefine"
            ),
        })
    }
    /// Takes the foreign definition of `uuid` on `parent` into vgpud (`AdoptDefinition`); returns
    /// its instance. The default (for daemons without foreign definitions) refuses.
    fn adopt_definition(&mut self, parent: &str, uuid: &str) -> Result<InstanceInfo, ClientError> {
        Err(ClientError::Daemon {
            kind: "NotSupported".into(),
            message: format!(
                "cannot take over the definition of {uuid} on {parent}: this daemon keeps no foreign definitions"
            ),
        })
    }
}

/// A blocking client: the async [`crate::Client`] and the one-thread runtime it runs on. Every call
/// (and the connection) gives up after [`CALL_TIMEOUT`].
pub struct Client {
    rt: tokio::runtime::Runtime,
    inner: crate::Client,
}

impl Client {
    /// Connects to vgpud on `bus`, checking that it owns its name there (see
    /// [`crate::Client::connect`]).
    pub fn connect(bus: &BusAddress) -> Result<Self, ClientError> {
        Client::open(bus, crate::Client::connect(bus))
    }

    /// Connects to `bus` without asking whether vgpud is there (see
    /// [`crate::Client::connect_unchecked`]): one round trip fewer, for the libvirt hook, which runs
    /// on every guest start.
    pub fn connect_unchecked(bus: &BusAddress) -> Result<Self, ClientError> {
        Client::open(bus, crate::Client::connect_unchecked(bus))
    }

    /// Connects for Manager1's method calls by the shortest way open to this process (see
    /// [`crate::Client::connect_for_calls`]): vgpud's private socket, else `bus`.
    pub fn connect_for_calls(bus: &BusAddress) -> Result<Self, ClientError> {
        Client::open(bus, crate::Client::connect_for_calls(bus))
    }

    /// Makes the runtime and connects on it with `connect`.
    fn open(
        bus: &BusAddress,
        connect: impl Future<Output = Result<crate::Client, ClientError>>,
    ) -> Result<Self, ClientError> {
        let rt = crate::runtime()?;
        let inner = rt.block_on(within(CALL_TIMEOUT, "(connect)", &bus.to_string(), connect))??;
        Ok(Client {
            rt,
            inner: inner.with_call_timeout(CALL_TIMEOUT),
        })
    }

    /// Runs one call of the async client to completion.
    fn run<'a, T, F>(&'a self, call: impl FnOnce(&'a crate::Client) -> F) -> Result<T, ClientError>
    where
        F: Future<Output = Result<T, ClientError>> + 'a,
    {
        self.rt.block_on(call(&self.inner))
    }

    /// The async client underneath, for calls this wrapper does not offer (run them with
    /// [`Client::block_on`]).
    pub fn async_client(&self) -> &crate::Client {
        &self.inner
    }

    /// Runs `future` (a call of [`Client::async_client`], say) on this client's runtime.
    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.rt.block_on(future)
    }

    /// See [`crate::Client::list_instances`].
    pub fn list_instances(&self) -> Result<Vec<InstanceInfo>, ClientError> {
        self.run(|c| c.list_instances())
    }

    /// See [`crate::Client::list_gpus`].
    pub fn list_gpus(&self) -> Result<Vec<GpuInfo>, ClientError> {
        self.run(|c| c.list_gpus())
    }

    /// See [`crate::Client::find_instance`].
    pub fn find_instance(&self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        self.run(|c| c.find_instance(uuid))
    }

    /// See [`crate::Client::create`].
    pub fn create(&self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        self.run(|c| c.create(req))
    }

    /// See [`crate::Client::define`].
    pub fn define(&self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        self.run(|c| c.define(req, autostart))
    }

    /// See [`crate::Client::start`].
    pub fn start(&self, uuid: &str) -> Result<(), ClientError> {
        self.run(|c| c.start(uuid))
    }

    /// See [`crate::Client::start_definition`].
    pub fn start_definition(&self, uuid: &str, parent: Option<&str>) -> Result<(), ClientError> {
        self.run(|c| c.start_definition(uuid, parent))
    }

    /// See [`crate::Client::stop`].
    pub fn stop(&self, uuid: &str) -> Result<(), ClientError> {
        self.run(|c| c.stop(uuid))
    }

    /// See [`crate::Client::destroy`].
    pub fn destroy(&self, uuid: &str) -> Result<(), ClientError> {
        self.run(|c| c.destroy(uuid))
    }

    /// See [`crate::Client::undefine`].
    pub fn undefine(&self, uuid: &str) -> Result<(), ClientError> {
        self.run(|c| c.undefine(uuid))
    }

    /// See [`crate::Client::set_autostart`].
    pub fn set_autostart(&self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        self.run(|c| c.set_autostart(uuid, autostart))
    }

    /// See [`crate::Client::pool_status`].
    pub fn pool_status(&self) -> Result<Vec<PoolStatus>, ClientError> {
        self.run(|c| c.pool_status())
    }
}

impl ManagerCalls for Client {
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError> {
        Client::list_instances(self)
    }
    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError> {
        Client::list_gpus(self)
    }
    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        self.find_instance(uuid)
    }
    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        Client::create(self, req)
    }
    fn create_uuid(&mut self, req: &NewInstance) -> Result<String, ClientError> {
        self.run(|c| c.create_uuid(req)).map(|u| u.to_string())
    }
    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        Client::define(self, req, autostart)
    }
    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        Client::start(self, uuid)
    }
    fn start_definition(&mut self, uuid: &str, parent: Option<&str>) -> Result<(), ClientError> {
        Client::start_definition(self, uuid, parent)
    }
    fn stop(&mut self, uuid: &str) -> Result<(), ClientError> {
        Client::stop(self, uuid)
    }
    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError> {
        Client::destroy(self, uuid)
    }
    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError> {
        Client::undefine(self, uuid)
    }
    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        Client::set_autostart(self, uuid, autostart)
    }
    fn instance_attrs(&mut self, uuid: &str) -> Result<Vec<(String, String)>, ClientError> {
        self.run(|c| c.instance_attrs(uuid))
    }
    fn list_definitions(&mut self) -> Result<Vec<DefinitionInfo>, ClientError> {
        self.run(|c| c.list_definitions())
    }
    fn adopt_definition(&mut self, parent: &str, uuid: &str) -> Result<InstanceInfo, ClientError> {
        self.run(|c| c.adopt_definition(parent, uuid))
    }
    fn redefine(
        &mut self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: &[(String, String)],
    ) -> Result<(), ClientError> {
        self.run(|c| c.redefine(uuid, type_id, autostart, attrs))
    }
}

/// A borrowed daemon is a daemon, so callers can keep theirs after handing it to a function that
/// takes one by value.
impl<D: ManagerCalls + ?Sized> ManagerCalls for &mut D {
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
    fn create_uuid(&mut self, req: &NewInstance) -> Result<String, ClientError> {
        (**self).create_uuid(req)
    }
    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        (**self).define(req, autostart)
    }
    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        (**self).start(uuid)
    }
    fn start_definition(&mut self, uuid: &str, parent: Option<&str>) -> Result<(), ClientError> {
        (**self).start_definition(uuid, parent)
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
    fn instance_attrs(&mut self, uuid: &str) -> Result<Vec<(String, String)>, ClientError> {
        (**self).instance_attrs(uuid)
    }
    fn list_definitions(&mut self) -> Result<Vec<DefinitionInfo>, ClientError> {
        (**self).list_definitions()
    }
    fn adopt_definition(&mut self, parent: &str, uuid: &str) -> Result<InstanceInfo, ClientError> {
        (**self).adopt_definition(parent, uuid)
    }
    fn redefine(
        &mut self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: &[(String, String)],
    ) -> Result<(), ClientError> {
        (**self).redefine(uuid, type_id, autostart, attrs)
    }
}
