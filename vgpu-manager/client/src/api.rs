//! The async high-level client: one connection to vgpud and one method per call a front end makes, each
//! failing with a [`ClientError`] that names the method and the bus. [`crate::blocking::Client`] runs
//! these same methods on a runtime of its own.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_core::Stream;
use mdev_types::ids::MdevUuid;
use zbus::{Connection, Variant};

use crate::bus::{connect, connect_daemon};
use crate::paths::{gpu_path, instance_path, instance_uuid};
use crate::proxy::{Gpu1Proxy, Instance1Proxy, Manager1Proxy};
use crate::{
    BusAddress, ClientError, DefinitionInfo, FaultInfo, GpuInfo, GpuOffers, InstanceInfo,
    PoolRemoval, PoolStatus, PoolSummary, TARGET_PROFILE, TARGET_TYPE,
};

/// What `Create`/`Define` make an instance of: a profile or an exact mdev type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TargetKind {
    /// A profile name (the daemon picks the type on the chosen GPU).
    Profile,
    /// An exact mdev type id such as `nvidia-231`.
    Type,
}

impl TargetKind {
    /// The `target_kind` argument of `Create`/`Define`: [`TARGET_PROFILE`] or [`TARGET_TYPE`].
    pub fn as_str(self) -> &'static str {
        match self {
            TargetKind::Profile => TARGET_PROFILE,
            TargetKind::Type => TARGET_TYPE,
        }
    }
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to create or define.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewInstance {
    /// Whether [`NewInstance::target`] is a profile or a type.
    pub kind: TargetKind,
    /// The profile name or mdev type id.
    pub target: String,
    /// The GPU (PCI address or parent name); `None` lets the daemon choose.
    pub gpu: Option<String>,
    /// The UUID; `None` lets the daemon choose.
    pub uuid: Option<String>,
    /// A free-form label saying who asked (a VM name, `libvirt:<domain>`); `None` for none.
    pub label: Option<String>,
    /// mdev attributes (name, value), written in this order to the device after each create, as
    /// mdevctl's `attrs` are (option `attrs` of `Create`/`Define`); none when empty.
    pub attrs: Vec<(String, String)>,
}

impl NewInstance {
    /// An instance of mdev type `type_id`, anywhere, with a UUID the daemon picks.
    pub fn of_type(type_id: &str) -> Self {
        NewInstance {
            kind: TargetKind::Type,
            target: type_id.to_string(),
            gpu: None,
            uuid: None,
            label: None,
            attrs: Vec::new(),
        }
    }

    /// An instance of profile `name`, anywhere, with a UUID the daemon picks.
    pub fn of_profile(name: &str) -> Self {
        NewInstance {
            kind: TargetKind::Profile,
            ..NewInstance::of_type(name)
        }
    }
}

/// One step of an `Apply`, from its `PoolProgress` signals: step `done` of `total` finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolProgress<'a> {
    /// The name of the pool being applied.
    pub pool: &'a str,
    /// Steps finished so far, this one included.
    pub done: u32,
    /// Steps the apply has in all.
    pub total: u32,
    /// What this step did, in words (`create vdi-2g/0 on 0000:3b:00.0`).
    pub step: &'a str,
}

/// A connection to vgpud with the Manager1 calls front ends make. Cheap to share by reference; every
/// method takes `&self`.
#[derive(Debug, Clone)]
pub struct Client {
    bus: BusAddress,
    /// `bus` as error messages name it.
    bus_name: String,
    conn: Connection,
    manager: Manager1Proxy<'static>,
    call_timeout: Option<Duration>,
}

impl Client {
    /// Connects to vgpud on `bus`, checking that it owns its name there (see [`connect_daemon`]).
    pub async fn connect(bus: &BusAddress) -> Result<Self, ClientError> {
        let conn = connect_daemon(bus).await?;
        Client::with_connection(conn, bus).await
    }

    /// Connects to `bus` without asking whether vgpud is there, saving that round trip: a daemon that
    /// is not running shows at the first call instead (as [`ClientError::NotRunning`] on a message bus
    /// that answers for unowned names, as the system bus and vgpud's embedded bus do). What `vgpuctl`
    /// uses: a one-shot client makes one call.
    pub async fn connect_unchecked(bus: &BusAddress) -> Result<Self, ClientError> {
        let conn = connect(bus).await?;
        Client::with_connection(conn, bus).await
    }

    /// Connects for Manager1's method calls alone, by the shortest way this process may take: vgpud's
    /// private socket when there is one it may use ([`crate::private`]: root or vgpud's own user,
    /// the system bus or [`crate::private::PRIVATE_SOCKET_ENV`]), else `bus` as
    /// [`Client::connect_unchecked`]. A private socket that refuses the connection (a vgpud that
    /// stopped and left it) is passed over for the bus. Signals, and the per-instance and per-GPU
    /// objects, are not served on the private socket: clients of those use [`Client::connect`].
    pub async fn connect_for_calls(bus: &BusAddress) -> Result<Self, ClientError> {
        let env = std::env::var_os(crate::private::PRIVATE_SOCKET_ENV);
        if let Some(path) = crate::private::private_socket_path(bus, env.as_deref())
            && crate::private::may_use(&path, nix::unistd::geteuid().as_raw())
        {
            // On failure the bus still answers (and names the problem if vgpud is not running).
            if let Ok(conn) = crate::private::connect_private(&path).await {
                return Client::with_connection(conn, &BusAddress::Private(path)).await;
            }
        }
        Client::connect_unchecked(bus).await
    }

    /// A client over an existing connection to `bus` (one that also serves objects, say).
    pub async fn with_connection(conn: Connection, bus: &BusAddress) -> Result<Self, ClientError> {
        let bus_name = bus.to_string();
        // Properties are read when asked for: a caching proxy would add `GetAll` and `AddMatch` round
        // trips to the first read, and a one-shot client reads each property once.
        let manager = Manager1Proxy::builder(&conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(|e| ClientError::from_call("(connect)", &bus_name, e))?;
        Ok(Client {
            bus: bus.clone(),
            bus_name,
            conn,
            manager,
            call_timeout: None,
        })
    }

    /// Gives up each later call after `timeout`, failing it with a timed-out I/O error. Without it a
    /// call waits as long as the daemon takes.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = Some(timeout);
        self
    }

    /// The bus this client is connected to.
    pub fn bus(&self) -> &BusAddress {
        &self.bus
    }

    /// The D-Bus connection, for calls this API does not wrap.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The Manager1 proxy, for calls and signals this API does not wrap.
    pub fn manager(&self) -> &Manager1Proxy<'static> {
        &self.manager
    }

    /// The Gpu1 proxy of GPU `id` (PCI address or parent name).
    pub async fn gpu(&self, id: &str) -> Result<Gpu1Proxy<'static>, ClientError> {
        Gpu1Proxy::builder(&self.conn)
            .path(gpu_path(id))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(self.error("(connect)"))
    }

    /// The Instance1 proxy of instance `uuid`.
    pub async fn instance(&self, uuid: &str) -> Result<Instance1Proxy<'static>, ClientError> {
        Instance1Proxy::builder(&self.conn)
            .path(instance_path(uuid))
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .map_err(self.error("(connect)"))
    }

    /// The mdev attributes (name, value) of instance `uuid`'s definition, in write order (its
    /// `Attributes` property); none for a transient or foreign instance.
    pub async fn instance_attrs(&self, uuid: &str) -> Result<Vec<(String, String)>, ClientError> {
        if let BusAddress::Private(_) = self.bus {
            // No Instance1 objects there: vgpud's own definitions carry the same attributes.
            let defs = self.list_definitions().await?;
            return Ok(defs
                .into_iter()
                .find(|d| d.uuid.eq_ignore_ascii_case(uuid) && d.owner != "foreign")
                .map(|d| d.attrs)
                .unwrap_or_default());
        }
        let proxy = self.instance(uuid).await?;
        self.call("Get(Attributes)", proxy.attributes()).await
    }

    /// Turns a zbus failure of `method` into the client's error.
    pub(crate) fn error(&self, method: &str) -> impl Fn(zbus::Error) -> ClientError + '_ {
        let method = method.to_string();
        move |e| ClientError::from_call(&method, &self.bus_name, e)
    }

    /// Runs the call `f` of `method` within the call timeout, if any.
    pub(crate) async fn call<T>(
        &self,
        method: &str,
        f: impl Future<Output = zbus::Result<T>>,
    ) -> Result<T, ClientError> {
        let result = match self.call_timeout {
            Some(limit) => within(limit, method, &self.bus_name, f).await?,
            None => f.await,
        };
        result.map_err(self.error(method))
    }

    /// The daemon's version (the Manager1 `Version` property).
    pub async fn version(&self) -> Result<String, ClientError> {
        self.call("Version", self.manager.version()).await
    }

    /// Every instance: vgpud's (running or defined) and foreign ones (`ListInstances`).
    pub async fn list_instances(&self) -> Result<Vec<InstanceInfo>, ClientError> {
        self.call("ListInstances", self.manager.list_instances())
            .await
    }

    /// Every GPU with its mdev types and running instances (`ListGpus`).
    pub async fn list_gpus(&self) -> Result<Vec<GpuInfo>, ClientError> {
        self.call("ListGpus", self.manager.list_gpus()).await
    }

    /// Instance `uuid` (`GetInstance`); an unknown UUID is the daemon's `NotFound` refusal.
    pub async fn get_instance(&self, uuid: &str) -> Result<InstanceInfo, ClientError> {
        self.call("GetInstance", self.manager.get_instance(uuid))
            .await
    }

    /// Instance `uuid`, or `None` when the daemon knows no such instance.
    pub async fn find_instance(&self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        match self.get_instance(uuid).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if e.kind() == Some("NotFound") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates and starts a transient instance (`Create`) and returns it as the daemon now shows it.
    pub async fn create(&self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        self.new_instance("Create", req, None).await
    }

    /// Creates and starts a transient instance (`Create`) and returns its UUID, without reading the
    /// instance back: one round trip, for callers that need nothing else of it.
    pub async fn create_uuid(&self, req: &NewInstance) -> Result<MdevUuid, ClientError> {
        self.new_instance_path("Create", req, None).await
    }

    /// Persists a definition without starting it (`Define`), starting with the daemon when
    /// `autostart`, and returns it.
    pub async fn define(
        &self,
        req: &NewInstance,
        autostart: bool,
    ) -> Result<InstanceInfo, ClientError> {
        self.new_instance("Define", req, Some(autostart)).await
    }

    /// `Create` (without `autostart`) or `Define` (with it), then `GetInstance` of the UUID its reply
    /// names.
    async fn new_instance(
        &self,
        method: &str,
        req: &NewInstance,
        autostart: Option<bool>,
    ) -> Result<InstanceInfo, ClientError> {
        let uuid = self.new_instance_path(method, req, autostart).await?;
        self.get_instance(&uuid.to_string()).await
    }

    /// `Create` (without `autostart`) or `Define` (with it): the UUID its reply names.
    async fn new_instance_path(
        &self,
        method: &str,
        req: &NewInstance,
        autostart: Option<bool>,
    ) -> Result<MdevUuid, ClientError> {
        let mut options: HashMap<&str, Variant<'_>> = HashMap::new();
        if let Some(l) = &req.label {
            options.insert("label", Variant::from(l.as_str()));
        }
        if let Some(a) = autostart {
            options.insert("autostart", Variant::from(a));
        }
        if !req.attrs.is_empty() {
            options.insert("attrs", Variant::from(req.attrs.clone()));
        }
        let kind = req.kind.as_str();
        let gpu = req.gpu.as_deref().unwrap_or("");
        let uuid = req.uuid.as_deref().unwrap_or("");
        let m = &self.manager;
        let path = if autostart.is_some() {
            self.call(method, m.define(kind, &req.target, gpu, uuid, options))
                .await?
        } else {
            self.call(method, m.create(kind, &req.target, gpu, uuid, options))
                .await?
        };
        instance_uuid(&path).ok_or_else(|| ClientError::BadObjectPath {
            method: method.to_string(),
            path: path.to_string(),
        })
    }

    /// Every definition by parent and UUID, vgpud's and the foreign files of `/etc/mdevctl.d`
    /// (`ListDefinitions`).
    pub async fn list_definitions(&self) -> Result<Vec<DefinitionInfo>, ClientError> {
        self.call("ListDefinitions", self.manager.list_definitions())
            .await
    }

    /// Every device vgpud's discovery could not read (`ListFaults`): none on a healthy host.
    pub async fn list_faults(&self) -> Result<Vec<FaultInfo>, ClientError> {
        self.call("ListFaults", self.manager.list_faults()).await
    }

    /// Takes the foreign definition of `uuid` on `parent` into vgpud (`AdoptDefinition`), then
    /// returns its instance (`GetInstance`).
    pub async fn adopt_definition(
        &self,
        parent: &str,
        uuid: &str,
    ) -> Result<InstanceInfo, ClientError> {
        let method = "AdoptDefinition";
        let path = self
            .call(method, self.manager.adopt_definition(parent, uuid))
            .await?;
        let uuid = instance_uuid(&path).ok_or_else(|| ClientError::BadObjectPath {
            method: method.to_string(),
            path: path.to_string(),
        })?;
        self.get_instance(&uuid.to_string()).await
    }

    /// Replaces the type, start mode and attributes of instance `uuid`'s definition in place
    /// (`Redefine`); a running device stays as it is until its next start.
    pub async fn redefine(
        &self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: &[(String, String)],
    ) -> Result<(), ClientError> {
        let call = self
            .manager
            .redefine(uuid, type_id, autostart, attrs.to_vec());
        self.call("Redefine", call).await
    }

    /// Makes the target instance of a live migration here (`PrepareIncoming`) from `fingerprint` (the
    /// JSON of `vgpuctl migration fingerprint`), on `gpu` if given, waiting `timeout` for a VM; returns
    /// the JSON reply (docs/json.md).
    pub async fn prepare_incoming(
        &self,
        fingerprint: &str,
        gpu: Option<&str>,
        uuid: Option<&str>,
        timeout: Option<Duration>,
    ) -> Result<String, ClientError> {
        self.prepare_incoming_with(
            fingerprint,
            &PrepareOptions {
                gpu,
                uuid,
                timeout,
                numa_node: None,
            },
        )
        .await
    }

    /// [`Client::prepare_incoming`] with every option of `PrepareIncoming`.
    pub async fn prepare_incoming_with(
        &self,
        fingerprint: &str,
        o: &PrepareOptions<'_>,
    ) -> Result<String, ClientError> {
        let mut options: HashMap<&str, Variant<'_>> = HashMap::new();
        if let Some(g) = o.gpu {
            options.insert("gpu", Variant::from(g));
        }
        if let Some(u) = o.uuid {
            options.insert("uuid", Variant::from(u));
        }
        if let Some(t) = o.timeout {
            options.insert(
                "timeout",
                Variant::from(u32::try_from(t.as_secs()).unwrap_or(u32::MAX)),
            );
        }
        if let Some(n) = o.numa_node {
            options.insert("numa_node", Variant::from(n));
        }
        let call = self.manager.prepare_incoming(fingerprint, options);
        self.call("PrepareIncoming", call).await
    }

    /// Releases incoming migration target `uuid` (`AbortIncoming`).
    pub async fn abort_incoming(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("AbortIncoming", self.manager.abort_incoming(uuid))
            .await
    }

    /// Turns incoming migration target `uuid` into an ordinary instance (`CompleteIncoming`).
    pub async fn complete_incoming(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("CompleteIncoming", self.manager.complete_incoming(uuid))
            .await
    }

    /// Starts defined instance `uuid` (`Start`).
    pub async fn start(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("Start", self.manager.start(uuid)).await
    }

    /// Starts `uuid`'s one definition, on `parent` when given, as mdevctl's `start --uuid` does
    /// (`StartDefinition`): a foreign definition, or one of a UUID defined on several parents, is
    /// taken over first; none, or several without a parent, is refused with kind `State`.
    pub async fn start_definition(
        &self,
        uuid: &str,
        parent: Option<&str>,
    ) -> Result<(), ClientError> {
        let call = self
            .manager
            .start_definition(uuid, parent.unwrap_or_default());
        self.call("StartDefinition", call).await
    }

    /// Stops instance `uuid`, keeping its definition (`Stop`).
    pub async fn stop(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("Stop", self.manager.stop(uuid)).await
    }

    /// Removes instance `uuid` entirely: its device and its definition (`Destroy`).
    pub async fn destroy(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("Destroy", self.manager.destroy(uuid)).await
    }

    /// Deletes the definition of `uuid`; a running device stays, as a transient instance (`Undefine`).
    pub async fn undefine(&self, uuid: &str) -> Result<(), ClientError> {
        self.call("Undefine", self.manager.undefine(uuid)).await
    }

    /// Sets whether definition `uuid` starts with the daemon (`SetAutostart`).
    pub async fn set_autostart(&self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        self.call("SetAutostart", self.manager.set_autostart(uuid, autostart))
            .await
    }

    /// Converges the host to the desired state now (`Reconcile`).
    pub async fn reconcile(&self) -> Result<(), ClientError> {
        self.call("Reconcile", self.manager.reconcile()).await
    }

    /// The pools the daemon has applied and their slots now (`PoolStatus`, decoded).
    pub async fn pool_status(&self) -> Result<Vec<PoolStatus>, ClientError> {
        let text = self.call("PoolStatus", self.manager.pool_status()).await?;
        decode("PoolStatus", &text)
    }

    /// Removes pool `name`, giving back every slot it holds (`RemovePool`, decoded); a pool vgpud
    /// does not know is no error (`applied` is false and nothing is removed).
    pub async fn remove_pool(&self, name: &str) -> Result<PoolRemoval, ClientError> {
        let text = self
            .call("RemovePool", self.manager.remove_pool(name))
            .await?;
        decode("RemovePool", &text)
    }

    /// What each GPU can give each profile of vgpud's catalog now (`ListOffers`, decoded).
    pub async fn list_offers(&self) -> Result<Vec<GpuOffers>, ClientError> {
        let text = self.call("ListOffers", self.manager.list_offers()).await?;
        decode("ListOffers", &text)
    }

    /// Every metric family vgpud exports (`Metrics`): `format` `prometheus` or `openmetrics`.
    pub async fn metrics(&self, format: &str) -> Result<String, ClientError> {
        self.call("Metrics", self.manager.metrics(format)).await
    }

    /// Applies a pool (its TOML text) with `Apply`, calling `on_step` for each `PoolProgress` signal
    /// as it arrives (the subscription is made before the call, so no step is missed), and returns
    /// what the apply did. An error of `on_step` stops the wait and is returned.
    pub async fn apply_pool<E: From<ClientError>>(
        &self,
        pool_toml: &str,
        mut on_step: impl FnMut(PoolProgress<'_>) -> Result<(), E>,
    ) -> Result<PoolSummary, E> {
        let mut progress = self
            .subscribe_progress()
            .await
            .map_err(self.error("PoolProgress"))?;
        let mut show = |m: zbus::Result<zbus::Message>| {
            let Some(signal) = m
                .ok()
                .filter(|m| {
                    m.header()
                        .path()
                        .is_some_and(|p| p.as_str() == crate::MANAGER_PATH)
                })
                .and_then(crate::proxy::PoolProgress::from_message)
            else {
                // Another message: the stream sees every message the connection receives.
                return Ok(());
            };
            match signal.args() {
                Ok(a) => each_step(a.pool, a.done, a.total, a.step, &mut on_step),
                // A signal this client cannot read is no step it can show.
                Err(_) => Ok(()),
            }
        };
        let call = self.call("Apply", self.manager.apply(pool_toml));
        let stream = &mut progress.stream;
        let taken = async {
            tokio::pin!(call);
            let result = loop {
                tokio::select! {
                    r = &mut call => break r,
                    Some(m) = next(stream) => show(m)?,
                }
            };
            // The daemon sends every signal before its reply, and the connection reads its
            // messages in order, so the signals not taken yet are already queued: take them
            // without waiting (a timeout of zero polls the stream once before it expires).
            while let Ok(Some(m)) = tokio::time::timeout(Duration::ZERO, next(stream)).await {
                show(m)?;
            }
            Ok::<_, E>(result)
        }
        .await;
        // Also when `on_step` failed: a persistent connection would keep the rule otherwise.
        progress.unsubscribe().await;
        let text = taken??;
        Ok(decode("Apply", &text)?)
    }

    /// Starts taking vgpud's `PoolProgress` signals without waiting for the bus to confirm the
    /// subscription, as sd-bus's `sd_bus_add_match_async` does (sd_bus_add_match(3)): a bus reads
    /// one connection's messages in the order they were sent and handles each before the next
    /// (dbus-daemon, and vgpud's embedded bus), so the match rule is in place before vgpud receives
    /// a call sent after it, and every signal that call causes is delivered. Waiting for the bus's
    /// answer, and for a proxy's lookup of vgpud's unique name, would cost round trips before the
    /// call. A refused subscription shows no progress; the call's answer is the same. On a
    /// connection to vgpud itself (its private socket, no bus) no signal comes, and nothing is
    /// asked.
    async fn subscribe_progress(&self) -> zbus::Result<Progress> {
        // Made first, so that no message that arrives after the rule is sent can pass it by.
        let stream = zbus::MessageStream::from(&self.conn);
        let rule = self.conn.unique_name().is_some().then(|| {
            format!(
                "type='signal',sender='{}',path='{}',interface='{}',member='PoolProgress'",
                crate::SERVICE,
                crate::MANAGER_PATH,
                crate::MANAGER_INTERFACE
            )
        });
        if let Some(rule) = &rule {
            self.conn.send(&bus_call("AddMatch", rule)?).await?;
        }
        Ok(Progress {
            stream,
            conn: self.conn.clone(),
            rule,
        })
    }
}

/// The messages of a `PoolProgress` subscription made by [`Client::subscribe_progress`].
struct Progress {
    /// Every message the connection receives from now on (signals are picked by their header).
    stream: zbus::MessageStream,
    conn: Connection,
    /// The match rule the bus was asked for, `None` without a bus.
    rule: Option<String>,
}

impl Progress {
    /// Asks the bus to drop the subscription, without waiting for its answer.
    async fn unsubscribe(self) {
        if let Some(rule) = &self.rule
            && let Ok(m) = bus_call("RemoveMatch", rule)
        {
            // A connection gone takes its rules with it.
            let _ = self.conn.send(&m).await;
        }
    }
}

/// A call of the bus's own `method` (`AddMatch`, `RemoveMatch`) with the match rule `rule`.
fn bus_call(method: &str, rule: &str) -> zbus::Result<zbus::Message> {
    zbus::Message::method_call("/org/freedesktop/DBus", method)
        .destination("org.freedesktop.DBus")
        .interface("org.freedesktop.DBus")
        .build(&(rule,))
}

/// Calls `on_step` for each step one `PoolProgress` signal reports. vgpud sends the steps that
/// finish within moments of each other in one signal, one step per line of `step`, with `done`
/// counting them all: the lines are steps `done - lines + 1` to `done`.
fn each_step<E>(
    pool: &str,
    done: u32,
    total: u32,
    step: &str,
    on_step: &mut impl FnMut(PoolProgress<'_>) -> Result<(), E>,
) -> Result<(), E> {
    let mut steps: Vec<&str> = step.lines().collect();
    // A step without words is still a step.
    if steps.is_empty() {
        steps.push("");
    }
    let first = done.saturating_sub(u32::try_from(steps.len() - 1).unwrap_or(u32::MAX));
    for (n, line) in (first..).zip(steps) {
        on_step(PoolProgress {
            pool,
            done: n,
            total,
            step: line,
        })?;
    }
    Ok(())
}

/// The next item of `stream` (what `StreamExt::next` does, without its crate).
async fn next<S: Stream + Unpin>(stream: &mut S) -> Option<S::Item> {
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut *stream).poll_next(cx)).await
}

/// Parses the JSON report of `method`.
pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    method: &str,
    text: &str,
) -> Result<T, ClientError> {
    serde_json::from_str(text).map_err(|source| ClientError::BadJson {
        method: method.to_string(),
        source,
    })
}

/// Runs `f`, giving up after `limit`: a timeout is reported as a timed-out I/O error of `method`.
pub(crate) async fn within<T>(
    limit: Duration,
    method: &str,
    bus: &str,
    f: impl Future<Output = T>,
) -> Result<T, ClientError> {
    tokio::time::timeout(limit, f).await.map_err(|_| {
        ClientError::from_call(
            method,
            bus,
            zbus::Error::InputOutput(Arc::new(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer within {} s (is vgpud stuck? `systemctl status vgpud`)",
                    limit.as_secs()
                ),
            ))),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_of(done: u32, total: u32, step: &str) -> Vec<(u32, u32, String)> {
        let mut seen = Vec::new();
        each_step::<()>("p", done, total, step, &mut |p| {
            seen.push((p.done, p.total, p.step.to_string()));
            Ok(())
        })
        .unwrap();
        seen
    }

    #[test]
    fn a_progress_signal_of_several_lines_is_that_many_steps_ending_at_done() {
        assert_eq!(
            steps_of(7, 9, "create a\ncreate b\ncreate c"),
            vec![
                (5, 9, "create a".into()),
                (6, 9, "create b".into()),
                (7, 9, "create c".into())
            ]
        );
        assert_eq!(steps_of(1, 9, "create a"), vec![(1, 9, "create a".into())]);
        assert_eq!(steps_of(2, 9, ""), vec![(2, 9, String::new())]);
    }

    #[test]
    fn target_kinds_are_the_wire_words() {
        assert_eq!(TargetKind::Profile.as_str(), "profile");
        assert_eq!(TargetKind::Type.to_string(), "type");
        let p = NewInstance::of_profile("vdi-2g");
        assert_eq!((p.kind, p.target.as_str()), (TargetKind::Profile, "vdi-2g"));
        assert_eq!(p.uuid, None);
    }

    #[test]
    fn reports_that_are_not_the_documented_json_name_the_method() {
        let e = decode::<Vec<PoolStatus>>("PoolStatus", "{").unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("vgpud's PoolStatus answer is not the documented JSON ("),
            "{text}"
        );
        assert!(matches!(e, ClientError::BadJson { .. }));
    }
}

/// The options of `PrepareIncoming` ([`Client::prepare_incoming_with`]); `None` leaves vgpud's default.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrepareOptions<'a> {
    /// Only this GPU (PCI address or parent name).
    pub gpu: Option<&'a str>,
    /// The target instance's UUID (default: a new random one).
    pub uuid: Option<&'a str>,
    /// How long the target waits for a VM (default 600 s).
    pub timeout: Option<Duration>,
    /// Prefer a GPU on this NUMA node (others that fit are used when none on it does).
    pub numa_node: Option<u32>,
}
