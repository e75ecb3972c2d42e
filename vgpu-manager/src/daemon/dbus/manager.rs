//! `org.vgpumanager.Manager1` at `/org/vgpumanager/Manager1`: each method turns its arguments into one
//! [`Command`], checks the caller for mutating ones, runs it on the core (off the async threads, as it
//! does blocking sysfs I/O), waits until the object tree shows the outcome, and answers.

use std::collections::HashMap;
use std::sync::Arc;

use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, ObjectPath, OwnedObjectPath, OwnedVariant, Variant, interface};

use super::Shared;
use super::errors::ApiError;
use super::pools::{self, json_text};
use crate::daemon::api::limits::{self, ClientText, clip};
use crate::daemon::api::*;
use mdev_types::ids::{IdError, MdevUuid};
use vgpu_client::{
    DefinitionInfo, FaultInfo, GpuInfo, InstanceInfo, TARGET_PROFILE, TARGET_TYPE, instance_path,
};

/// The manager object.
pub(super) struct Manager {
    pub(super) shared: Arc<Shared>,
    /// Where this manager's calls come from: the bus, or one connection of the private socket.
    pub(super) origin: super::Origin,
}

fn invalid(msg: String) -> ApiError {
    ApiError::invalid(msg)
}

/// The error of an identifier that does not parse, echoing at most [`limits::ECHO_BYTES`] of it.
fn id_error(e: IdError) -> ApiError {
    let c = |s: String| clip(&s).to_string();
    invalid(
        match e {
            IdError::PciAddress(s) => IdError::PciAddress(c(s)),
            IdError::Uuid(s) => IdError::Uuid(c(s)),
            IdError::MdevType(s) => IdError::MdevType(c(s)),
            IdError::PciId(s) => IdError::PciId(c(s)),
            IdError::IommuGroup(s) => IdError::IommuGroup(c(s)),
        }
        .to_string(),
    )
}

pub(super) fn parse_uuid(uuid: &str) -> Result<MdevUuid, ApiError> {
    uuid.parse().map_err(id_error)
}

/// Builds the request of `Create`/`Define` from the D-Bus arguments.
pub(super) fn parse_request(
    method: &str,
    target_kind: &str,
    target: &str,
    gpu: &str,
    uuid: &str,
    options: &HashMap<String, OwnedVariant>,
) -> Result<InstanceSpec, ApiError> {
    let checked = |what, text| limits::check_text(what, text).map_err(CoreError::from);
    let target = match target_kind {
        TARGET_PROFILE if !target.trim().is_empty() => {
            checked(ClientText::Profile, target)?;
            InstanceTarget::Profile(target.trim().to_string())
        }
        TARGET_PROFILE => return Err(invalid(format!("{method}: the profile name is empty"))),
        TARGET_TYPE => {
            checked(ClientText::TypeId, target.trim())?;
            InstanceTarget::Type(target.parse().map_err(id_error)?)
        }
        other => {
            return Err(invalid(format!(
                "{method}: target kind '{}' is neither '{TARGET_PROFILE}' nor '{TARGET_TYPE}'",
                clip(other)
            )));
        }
    };
    checked(ClientText::Gpu, gpu)?;
    let gpu = (!gpu.trim().is_empty()).then(|| gpu.trim().to_string());
    let uuid = if uuid.trim().is_empty() {
        None
    } else {
        Some(parse_uuid(uuid)?)
    };
    let mut req = InstanceSpec {
        target,
        gpu,
        uuid,
        autostart: false,
        label: None,
        attrs: Vec::new(),
    };
    let known = if method == "Define" {
        "label (s), autostart (b), attrs (a(ss))"
    } else {
        "label (s), attrs (a(ss))"
    };
    for (key, value) in options {
        match (key.as_str(), &**value) {
            ("label", Variant::Str(s)) => {
                limits::check_label(ClientText::Label, s.as_str()).map_err(CoreError::from)?;
                req.label = Some(s.as_str().to_string()).filter(|s| !s.is_empty())
            }
            ("autostart", Variant::Bool(b)) if method == "Define" => req.autostart = *b,
            ("attrs", Variant::Array(a)) if a.element_signature() == "(ss)" => {
                req.attrs = attrs_option(a).map_err(CoreError::from)?;
            }
            ("label" | "autostart" | "attrs", v) if method == "Define" || key != "autostart" => {
                return Err(invalid(format!(
                    "{method}: option '{key}' has type '{}'; known options: {known}",
                    v.value_signature()
                )));
            }
            _ => {
                return Err(invalid(format!(
                    "{method}: unknown option '{}'; known options: {known}",
                    clip(key)
                )));
            }
        }
    }
    Ok(req)
}

/// The `attrs` option: (name, value) pairs in write order, each checked ([`MdevAttr::new`]).
fn attrs_option(a: &zbus::Array<'_>) -> Result<Vec<MdevAttr>, RequestError> {
    let pairs = a.inner().iter().filter_map(|pair| match pair {
        Variant::Structure(s) => match s.fields() {
            [Variant::Str(n), Variant::Str(v)] => Some((n.as_str(), v.as_str())),
            _ => None,
        },
        _ => None,
    });
    Ok(parse_attrs(pairs)?)
}

impl Manager {
    /// Runs `cmd` for the caller of `hdr`, as this manager's origin identifies it
    /// ([`Shared::run_from`](super::Shared)).
    async fn run<C: Command>(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        cmd: C,
    ) -> Result<C::Reply, ApiError>
    where
        dyn super::Executor: Handle<C>,
    {
        self.shared.run_from(&self.origin, conn, hdr, cmd).await
    }

    /// The cached instance list, if it is current for generation `g`.
    fn cached_list(&self, g: u64) -> Option<Arc<Vec<InstanceInfo>>> {
        match &*self.list_cache() {
            Some((cached, list)) if *cached == g => Some(Arc::clone(list)),
            _ => None,
        }
    }

    fn list_cache(&self) -> std::sync::MutexGuard<'_, Option<(u64, Arc<Vec<InstanceInfo>>)>> {
        // Plain data: a panic elsewhere cannot leave it inconsistent.
        self.shared
            .instance_list
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The vgpu-manager daemon: GPUs, mdev instances and their lifecycle. Mutating methods need root or
/// membership in group vgpu-admin (and, where polkit runs, action org.vgpumanager.manage). Errors are
/// org.vgpumanager.Error.KIND (NotFound, Foreign, Exists, Invalid, Faulted, State, TypeFull, Kernel, Host,
/// Store, AccessDenied, Shortfall, NotSupported, LimitsExceeded, Internal) with a one-line message that
/// says what to do. LimitsExceeded: the caller's connection already has 64 calls pending at vgpud
/// (Manager1, Instance1, GetManagedObjects and Gpu1.Scheduling reads together); retry once replies
/// come back.
#[interface(name = "org.vgpumanager.Manager1")]
impl Manager {
    /// Every GPU with the mdev types it offers (and how many more fit) and its running instances.
    #[zbus(out_args("gpus"))]
    async fn list_gpus(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<GpuInfo>, ApiError> {
        let gpus = self.run(conn, &hdr, ListGpus).await?;
        Ok(gpus.iter().map(super::gpu::info).collect())
    }

    /// Every instance: created or defined by vgpud, and foreign ones (made by mdevctl or by hand).
    /// Each row: uuid, gpu, parent, type, profile ("" for none), state, defined, autostart, owner,
    /// label ("" for none), IOMMU group (-1 for none), created (seconds since the Unix epoch). An
    /// instance's object path is not in the row: it is /org/vgpumanager/Manager1/instance/ followed by
    /// the UUID with '_' for '-'.
    #[zbus(out_args("instances"))]
    async fn list_instances(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Arc<Vec<InstanceInfo>>, ApiError> {
        // Listing is the hot read (dashboards, provisioning loops): while nothing changed, the answer
        // built last time is sent again, with no copy of the views and no conversion.
        let generation = self.shared.exec.views_generation();
        if let Some(g) = generation
            && let Some(list) = self.cached_list(g)
        {
            return Ok(list);
        }
        let views = self.run(conn, &hdr, ListInstances).await?;
        let list = Arc::new(views.iter().map(super::instance::info).collect::<Vec<_>>());
        if let Some(g) = generation {
            // Read after generation `g`: at least as new as `g` (see `Core::views_generation`).
            *self.list_cache() = Some((g, Arc::clone(&list)));
        }
        Ok(list)
    }

    /// One instance by UUID.
    #[zbus(out_args("instance"))]
    async fn get_instance(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(InstanceInfo,), ApiError> {
        let uuid = parse_uuid(uuid)?;
        let v = self.run(conn, &hdr, GetInstance { uuid }).await?;
        Ok((super::instance::info(&v),))
    }

    /// Every definition as mdevctl keys them, by parent and UUID, sorted so: vgpud's own and the
    /// foreign files of mdevctl's definition directory (/etc/mdevctl.d; an administrator's or the
    /// real mdevctl's: listed, never started by vgpud on its own). Each row: parent, uuid, type,
    /// autostart, owner ("daemon" or "foreign"), attributes (name, value) in write order.
    #[zbus(out_args("definitions"))]
    async fn list_definitions(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<DefinitionInfo>, ApiError> {
        let defs = self.run(conn, &hdr, ListDefinitions).await?;
        Ok(defs
            .into_iter()
            .map(|d| DefinitionInfo {
                parent: d.parent,
                uuid: d.uuid.to_string(),
                type_id: d.type_id.to_string(),
                autostart: d.autostart,
                owner: d.owner.to_string(),
                attrs: d.attrs,
            })
            .collect())
    }

    /// Every device the host's discovery cannot read now (none on a healthy host): such a device is not
    /// managed (nothing is placed on it; its instances and definitions are kept) until it reads again.
    /// Each row: scope (pci-device, mdev-parent, mdev-instance, iommu-group), device (PCI address,
    /// parent name, UUID or group number), the kernel path whose read failed, the problem, and the
    /// fix ("" when none is known).
    #[zbus(out_args("faults"))]
    async fn list_faults(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<Vec<FaultInfo>, ApiError> {
        let faults = self.run(conn, &hdr, ListFaults).await?;
        Ok(faults.iter().map(super::faults::info).collect())
    }

    /// Makes the definition of uuid on parent the one later calls naming the UUID act on: a foreign
    /// one (its file in /etc/mdevctl.d) is taken into vgpud, as a Define of the file's type, start
    /// mode and attributes; of a UUID vgpud defines on several parents (as mdevctl, by parent and
    /// UUID), the one on parent becomes the UUID's main definition. Refused (State) while the UUID's
    /// device runs on another parent.
    #[zbus(out_args("instance"))]
    async fn adopt_definition(
        &self,
        parent: &str,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, ApiError> {
        let uuid = parse_uuid(uuid)?;
        limits::check_text(ClientText::Gpu, parent).map_err(CoreError::from)?;
        let parent = parent.to_string();
        let v = self
            .run(conn, &hdr, AdoptDefinition { parent, uuid })
            .await?;
        Ok(instance_path(&v.uuid.to_string()))
    }

    /// Replaces the type, start mode and attributes (name, value, in write order) of a definition in
    /// place, as mdevctl's modify does: a running device is not touched, the new definition applies
    /// from its next start.
    async fn redefine(
        &self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: Vec<(String, String)>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        limits::check_text(ClientText::TypeId, type_id).map_err(CoreError::from)?;
        let type_id = type_id.parse().map_err(id_error)?;
        let attrs = parse_attrs(attrs.iter().map(|(n, v)| (n.as_str(), v.as_str())))
            .map_err(|e| CoreError::from(RequestError::from(e)))?;
        let change = RedefineInstance {
            uuid,
            type_id,
            autostart,
            attrs,
        };
        self.run(conn, &hdr, change).await?;
        Ok(())
    }

    /// Creates and starts a transient instance. target_kind: "profile" or "type"; gpu and uuid may be
    /// empty (the daemon chooses). Options: label (s); attrs (a(ss)): mdev attributes (name, value)
    /// written in order to /sys/bus/mdev/devices/UUID/NAME once the device exists, as mdevctl's attrs
    /// are; a refused one fails the call and the device is removed again.
    #[zbus(out_args("instance"))]
    // The D-Bus signature fixes the five arguments; header and connection come from zbus.
    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        target_kind: &str,
        target: &str,
        gpu: &str,
        uuid: &str,
        options: HashMap<String, OwnedVariant>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, ApiError> {
        let req = parse_request("Create", target_kind, target, gpu, uuid, &options)?;
        let v = self.run(conn, &hdr, CreateInstance(req)).await?;
        Ok(instance_path(&v.uuid.to_string()))
    }

    /// Persists a definition without starting it. Arguments as for Create; options: label (s),
    /// autostart (b), attrs (a(ss), written at each start).
    #[zbus(out_args("instance"))]
    // The D-Bus signature fixes the five arguments; header and connection come from zbus.
    #[allow(clippy::too_many_arguments)]
    async fn define(
        &self,
        target_kind: &str,
        target: &str,
        gpu: &str,
        uuid: &str,
        options: HashMap<String, OwnedVariant>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<OwnedObjectPath, ApiError> {
        let req = parse_request("Define", target_kind, target, gpu, uuid, &options)?;
        let v = self.run(conn, &hdr, DefineInstance(req)).await?;
        Ok(instance_path(&v.uuid.to_string()))
    }

    /// Removes an instance entirely: its device and its definition (Stop keeps the definition).
    async fn destroy(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, DestroyInstance { uuid }).await?;
        Ok(())
    }

    /// Starts a defined instance (creates its device).
    async fn start(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, StartInstance { uuid }).await?;
        Ok(())
    }

    /// Starts a definition as mdevctl's start --uuid does: the UUID's one definition, on parent when
    /// not empty, vgpud's or a foreign file of /etc/mdevctl.d. A foreign one, or one of a UUID defined
    /// on several parents, is first made the one vgpud acts on (as AdoptDefinition does), then started
    /// as Start starts it. Refused (State) before anything changes when there is no such definition,
    /// or several and parent is empty.
    async fn start_definition(
        &self,
        uuid: &str,
        parent: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        limits::check_text(ClientText::Gpu, parent).map_err(CoreError::from)?;
        let parent = (!parent.is_empty()).then(|| parent.to_string());
        self.run(conn, &hdr, StartDefinition { uuid, parent })
            .await?;
        Ok(())
    }

    /// Stops an instance: removes its device, keeps its definition.
    async fn stop(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, StopInstance { uuid }).await?;
        Ok(())
    }

    /// Deletes a definition; a running device stays, as a transient instance.
    async fn undefine(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, UndefineInstance { uuid }).await?;
        Ok(())
    }

    /// Makes the target instance of a live migration here from the source's fingerprint (JSON of
    /// `vgpuctl migration fingerprint`): refused with every reason when its state cannot load on this
    /// host; else an instance of the type on a parent that fits, with a new UUID, held as incoming
    /// until CompleteIncoming, AbortIncoming or its timeout (then released, unless a VM holds its
    /// device). Options: gpu (s), uuid (s), timeout (u, seconds; default 600), numa_node (u: among the
    /// parents that fit, prefer one on this NUMA node). Returns JSON: uuid, source, parent, gpu,
    /// numa_node, type, until, hostdev_xml (for the target domain XML), target_mdevs (source → target
    /// UUID, as Nova's libvirt driver passes them), notes.
    async fn prepare_incoming(
        &self,
        fingerprint: &str,
        options: HashMap<String, OwnedVariant>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let req = super::migration::parse_prepare(fingerprint, &options)?;
        let v = self.run(conn, &hdr, req).await?;
        json_text(&super::migration::IncomingJson::from(&v))
    }

    /// Releases an incoming migration target (the migration was given up): its device is removed.
    async fn abort_incoming(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, AbortIncoming { uuid }).await
    }

    /// Turns an incoming migration target into an ordinary instance (the migration succeeded).
    async fn complete_incoming(
        &self,
        uuid: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, CompleteIncoming { uuid }).await
    }

    /// Sets whether a definition starts automatically.
    async fn set_autostart(
        &self,
        uuid: &str,
        autostart: bool,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        let uuid = parse_uuid(uuid)?;
        self.run(conn, &hdr, SetAutostart { uuid, autostart })
            .await?;
        Ok(())
    }

    /// Converges the host to the desired state now (normally done at start-up and on kernel events).
    async fn reconcile(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<(), ApiError> {
        self.run(conn, &hdr, Reconcile).await?;
        self.shared.mirror.refresh_gpus();
        Ok(())
    }

    /// Dry run of a pool (a pool file's TOML text): JSON of what applying it would create, remove and
    /// keep, per GPU, and any shortfall. Nothing changes.
    #[zbus(out_args("plan"))]
    async fn plan(
        &self,
        pool_toml: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let cmd = pools::plan_command(pool_toml)?;
        json_text(&self.run(conn, &hdr, cmd).await?)
    }

    /// Makes the host match a pool: each slot an instance with its stable UUID, defined and running.
    /// SR-IOV VF slots are made through the GPU's vendor backend and recorded. Emits PoolProgress as
    /// steps finish; returns a JSON summary, after every PoolProgress and instance signal of the
    /// apply. Applying twice changes nothing. A pool that does not fit
    /// (Error.Shortfall) is refused before any change; a failed step undoes this apply.
    #[zbus(out_args("summary"))]
    async fn apply(
        &self,
        pool_toml: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let cmd = pools::apply_command(pool_toml)?;
        json_text(&self.run(conn, &hdr, cmd).await?)
    }

    /// Removes a pool: each of its slots is given back (mdev instances destroyed, VFs released) and
    /// the pool forgotten; returns a JSON summary (docs/json.md, `RemovePool`). A pool vgpud does
    /// not know changes nothing.
    #[zbus(out_args("removal"))]
    async fn remove_pool(
        &self,
        name: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let cmd = RemovePool {
            name: name.to_string(),
        };
        json_text(&self.run(conn, &hdr, cmd).await?)
    }

    /// The pools applied through vgpud and their slots, as a JSON array.
    #[zbus(out_args("pools"))]
    async fn pool_status(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        json_text(&self.run(conn, &hdr, GetPoolStatus).await?)
    }

    /// What each GPU can give each profile of the catalog when it has room, with its occupancy now,
    /// as a JSON array (docs/json.md, `ListOffers`). Read-only.
    #[zbus(out_args("offers"))]
    async fn list_offers(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        json_text(&self.run(conn, &hdr, ListOffers).await?)
    }

    /// Every metric family vgpud exports (docs/metrics.md), as `vgpud --metrics-listen` serves them at
    /// /metrics: format "prometheus" (or "") for the Prometheus text format 0.0.4, "openmetrics" for
    /// OpenMetrics 1.0. Read-only: the host is read only when something changed since the last answer.
    #[zbus(out_args("text"))]
    async fn metrics(
        &self,
        format: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let format = match format {
            "" => crate::daemon::metrics::Format::Prometheus,
            word => word
                .parse()
                .map_err(|e: crate::daemon::metrics::text::UnknownFormat| {
                    ApiError::invalid(e.to_string())
                })?,
        };
        self.run(conn, &hdr, GetMetrics { format }).await
    }

    /// A GPU's time-slice scheduling plan as JSON. requests: a JSON array of {"weight": W, "slot"?,
    /// "priority"?, "framebuffer_mib"?, "label"?}, or "" for weight 1 on every existing vGPU.
    #[zbus(out_args("plan"))]
    async fn plan_scheduling(
        &self,
        gpu: &str,
        requests: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let requests = pools::sched_requests("PlanScheduling", requests)?;
        let cmd = PlanScheduling {
            gpu: pools::sched_gpu(gpu)?,
            requests,
        };
        json_text(&self.run(conn, &hdr, cmd).await?)
    }

    /// Plans as PlanScheduling and programs the plan (refused when it cannot be honoured); returns a
    /// JSON report of what was written, what is pending (driver configuration) and the state read back.
    #[zbus(out_args("report"))]
    async fn apply_scheduling(
        &self,
        gpu: &str,
        requests: &str,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, ApiError> {
        let requests = pools::sched_requests("ApplyScheduling", requests)?;
        let cmd = ApplyScheduling {
            gpu: pools::sched_gpu(gpu)?,
            requests,
        };
        json_text(&self.run(conn, &hdr, cmd).await?)
    }

    /// The daemon's version.
    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    /// An instance appeared (created, defined, or first seen).
    #[zbus(signal)]
    pub(super) async fn instance_added(
        emitter: &SignalEmitter<'_>,
        instance: ObjectPath<'_>,
        uuid: &str,
    ) -> zbus::Result<()>;

    /// An instance is gone entirely (no device, no definition).
    #[zbus(signal)]
    pub(super) async fn instance_removed(
        emitter: &SignalEmitter<'_>,
        instance: ObjectPath<'_>,
        uuid: &str,
    ) -> zbus::Result<()>;

    /// An instance's State changed (running, stopped, waiting-for-parent).
    #[zbus(signal)]
    pub(super) async fn instance_state_changed(
        emitter: &SignalEmitter<'_>,
        instance: ObjectPath<'_>,
        uuid: &str,
        state: &str,
    ) -> zbus::Result<()>;

    /// Steps of an Apply finished: done of total steps so far; step names each step finished since
    /// the pool's previous PoolProgress, one per line (the last line is step done). Steps that finish
    /// within 50 ms of the pool's previous signal are held and sent together with the next one, or
    /// once the 50 ms have passed; the first and the last step go out at once.
    #[zbus(signal)]
    pub(super) async fn pool_progress(
        emitter: &SignalEmitter<'_>,
        pool: &str,
        done: u32,
        total: u32,
        step: &str,
    ) -> zbus::Result<()>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, Variant<'static>)]) -> HashMap<String, OwnedVariant> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OwnedVariant::try_from(v.clone()).unwrap()))
            .collect()
    }

    #[test]
    fn requests_parse_profiles_types_and_options() {
        let r = parse_request(
            "Define",
            "profile",
            "vdi-2g",
            "",
            "",
            &opts(&[
                ("autostart", Variant::from(true)),
                ("label", Variant::from("vm1")),
            ]),
        )
        .unwrap();
        assert_eq!(r.target, InstanceTarget::Profile("vdi-2g".into()));
        assert!(r.autostart);
        assert_eq!(r.label.as_deref(), Some("vm1"));
        assert_eq!((r.gpu, r.uuid), (None, None));
        let r = parse_request(
            "Create",
            "type",
            "nvidia-231",
            "0000:3b:00.0",
            "4b20d080-1b54-4048-85b3-a6a62d165c01",
            &opts(&[]),
        )
        .unwrap();
        assert_eq!(
            r.target,
            InstanceTarget::Type("nvidia-231".parse().unwrap())
        );
        assert_eq!(r.gpu.as_deref(), Some("0000:3b:00.0"));
        assert!(r.uuid.is_some());
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let msg = |r: Result<InstanceSpec, ApiError>| r.unwrap_err().message().to_string();
        assert!(
            msg(parse_request("Create", "flavour", "x", "", "", &opts(&[]))).contains("'flavour'")
        );
        assert!(
            msg(parse_request(
                "Create",
                "profile",
                "x",
                "",
                "bogus",
                &opts(&[])
            ))
            .contains("'bogus' is not an mdev UUID")
        );
        assert!(
            msg(parse_request(
                "Create",
                "profile",
                "x",
                "",
                "",
                &opts(&[("autostart", Variant::from(true))])
            ))
            .contains("unknown option 'autostart'")
        );
        assert!(
            msg(parse_request(
                "Define",
                "profile",
                "x",
                "",
                "",
                &opts(&[("autostart", Variant::from("yes"))])
            ))
            .contains("has type 's'")
        );
        assert!(msg(parse_request("Create", "profile", " ", "", "", &opts(&[]))).contains("empty"));
        let long = "p".repeat(limits::MAX_NAME_BYTES + 1);
        let e = parse_request("Create", "profile", &long, "", "", &opts(&[])).unwrap_err();
        assert_eq!(e.error_name(), "org.vgpumanager.Error.Invalid");
        assert!(
            e.message().starts_with(
                "the profile name is 256 bytes long, more than the limit of 255 bytes"
            ),
            "{}",
            e.message()
        );
        let e = parse_request("Define", "profile", "vdi-1g", &long, "", &opts(&[])).unwrap_err();
        assert!(
            e.message().starts_with("the GPU id is 256 bytes long"),
            "{}",
            e.message()
        );
        let e = parse_request("Create", "type", &"t".repeat(65), "", "", &opts(&[])).unwrap_err();
        assert!(
            e.message()
                .contains("the mdev type id is 65 bytes long, more than the limit of 64 bytes"),
            "{}",
            e.message()
        );
    }
}
