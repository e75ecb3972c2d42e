//! The D-Bus face of the daemon: a thin adapter that turns method calls into [`Command`]s for the core,
//! checks who may change things ([`auth`]), maps [`CoreError`]s to D-Bus errors ([`errors`]), and keeps
//! one object per GPU and per instance in step with the core's events.
//!
//! Objects: `/org/vgpumanager/Manager1` (`org.vgpumanager.Manager1` and the standard ObjectManager,
//! served by vgpud itself, `object_manager.rs`),
//! `/org/vgpumanager/Manager1/gpu/<id>` (`org.vgpumanager.Gpu1`), `/org/vgpumanager/Manager1/instance/<uuid>`
//! (`org.vgpumanager.Instance1`); zbus adds Properties and Peer to each, and vgpud its own
//! Introspectable (`introspect.rs`) to each node, these and the ones above them.
//! `data/org.vgpumanager.Manager1.xml` is their introspection.

mod admission;
pub mod auth;
pub mod bus_name;
mod callers;
pub mod decode;
pub mod embedded_bus;
pub mod errors;
mod faults;
mod gpu;
mod gpu_work;
mod instance;
mod introspect;
mod manager;
mod migration;
mod mirror;
mod object_manager;
mod pools;
pub mod private_socket;
mod strict;

use std::sync::Arc;

use thiserror::Error;
use tokio::sync::broadcast;
use zbus::Connection;
use zbus::message::Header;

use crate::daemon::api::limits;
use crate::daemon::api::*;
use vgpu_client::MANAGER_PATH;

pub use admission::{MAX_PENDING, MAX_RUNNING, MAX_WORKERS, RESERVED_WORKERS};
pub use auth::{Authorizer, Caller};
pub use errors::ApiError;

/// What the D-Bus layer drives: the daemon engine (or anything that handles every [`Command`] the
/// same way). Each command's reply type is fixed by the command, so the layer never meets a reply it
/// did not ask for.
pub trait Executor:
    Handle<ListGpus>
    + Handle<ListOffers>
    + Handle<GetGpuCapacity>
    + Handle<ListInstances>
    + Handle<GetInstance>
    + Handle<CreateInstance>
    + Handle<DefineInstance>
    + Handle<StartInstance>
    + Handle<StopInstance>
    + Handle<DestroyInstance>
    + Handle<UndefineInstance>
    + Handle<SetAutostart>
    + Handle<ListDefinitions>
    + Handle<ListFaults>
    + Handle<AdoptDefinition>
    + Handle<StartDefinition>
    + Handle<RedefineInstance>
    + Handle<Reconcile>
    + Handle<PlanPool>
    + Handle<ApplyPool>
    + Handle<GetPoolStatus>
    + Handle<RemovePool>
    + Handle<GetScheduling>
    + Handle<PlanScheduling>
    + Handle<ApplyScheduling>
    + Handle<Preflight>
    + Handle<MigrationInfo>
    + Handle<PrepareIncoming>
    + Handle<AbortIncoming>
    + Handle<CompleteIncoming>
    + Handle<OpenDevice>
    + Handle<GetMetrics>
    + Send
    + Sync
    + 'static
{
    /// A receiver of every event sent from now on, and how many were sent before its first.
    fn subscribe(&self) -> (broadcast::Receiver<Event>, u64);
    /// How many events have been sent so far (every subscriber's count of events received, plus
    /// its starting count, reaches it once it has caught up).
    fn events_sent(&self) -> u64;
    /// The generation of the instance list (see [`Core::views_generation`](crate::daemon::engine::Core::views_generation)),
    /// if this executor keeps one; `None` disables caching of the list.
    fn views_generation(&self) -> Option<u64> {
        None
    }
}

impl Executor for crate::daemon::engine::Core {
    fn subscribe(&self) -> (broadcast::Receiver<Event>, u64) {
        crate::daemon::engine::Core::subscribe_counted(self)
    }

    fn events_sent(&self) -> u64 {
        crate::daemon::engine::Core::events_sent(self)
    }

    fn views_generation(&self) -> Option<u64> {
        Some(crate::daemon::engine::Core::views_generation(self))
    }
}

/// Runs `cmd` on `exec` off the async threads (it may do blocking sysfs and disk I/O), or inline when
/// it is answered from memory alone.
async fn call<C: Command>(exec: &Arc<dyn Executor>, cmd: C) -> Result<C::Reply, QueryError>
where
    dyn Executor: Handle<C>,
{
    if C::ACCESS.is_memory_read() {
        // No I/O: a hop to the blocking pool would cost more than the command.
        return Ok(exec.handle(cmd)?);
    }
    let exec = Arc::clone(exec);
    Ok(tokio::task::spawn_blocking(move || exec.handle(cmd)).await??)
}

/// Why the D-Bus layer got no answer from the engine.
#[derive(Debug, Error)]
pub enum QueryError {
    /// The engine refused the command.
    #[error(transparent)]
    Core(#[from] CoreError),
    /// The worker thread that ran the command panicked or was cancelled (see the log).
    #[error("the worker thread running the command failed: {0}")]
    Worker(#[from] tokio::task::JoinError),
}

impl From<QueryError> for ApiError {
    fn from(e: QueryError) -> ApiError {
        match e {
            QueryError::Core(e) => e.into(),
            QueryError::Worker(e) => ApiError::internal(e),
        }
    }
}

/// Where a call came from.
#[derive(Debug, Clone)]
enum Origin {
    /// The bus: the caller is its sender, identified through the bus.
    Bus,
    /// A connection on vgpud's private socket, identified by its peer credentials
    /// ([`private_socket`]).
    Private(Arc<private_socket::PrivatePeer>),
}

/// State shared by the method handlers.
struct Shared {
    exec: Arc<dyn Executor>,
    auth: Authorizer,
    mirror: mirror::MirrorHandle,
    /// How many calls each client has pending, and which clients have gone.
    admission: Arc<admission::Admission>,
    /// The objects served below the manager, whose generation the object manager's answers follow.
    served: Arc<object_manager::Served>,
    /// The last `ListInstances` answer and the views generation it is current for.
    instance_list: std::sync::Mutex<Option<(u64, Arc<Vec<vgpu_client::InstanceInfo>>)>>,
}

impl Shared {
    /// Runs `cmd` for the caller of `hdr`: admission (at most [`MAX_PENDING`] calls pending per
    /// share — a user, or a connection of root or vgpud's user — [`MAX_RUNNING`] of them on the
    /// workers), authorization (commands that change state or hold a device), execution unless the
    /// client has gone meanwhile, then, for changes, waits until the objects and signals reflect the
    /// result. Manager1 and Instance1 methods all come through
    /// here.
    async fn run<C: Command>(
        &self,
        conn: &Connection,
        hdr: &Header<'_>,
        cmd: C,
    ) -> Result<C::Reply, ApiError>
    where
        dyn Executor: Handle<C>,
    {
        self.run_from(&Origin::Bus, conn, hdr, cmd).await
    }

    /// [`Shared::run`] for a call that came from `origin`: a call on the private socket is admitted
    /// as its privileged peer's own share and authorized by the peer's credentials, with no bus to
    /// ask.
    async fn run_from<C: Command>(
        &self,
        origin: &Origin,
        conn: &Connection,
        hdr: &Header<'_>,
        cmd: C,
    ) -> Result<C::Reply, ApiError>
    where
        dyn Executor: Handle<C>,
    {
        let method = hdr.member().map(|m| m.as_str()).unwrap_or("(no member)");
        // No method takes a file descriptor, and those a call brings stay in vgpud's table until
        // the call is answered: refused before admission, such a call never waits holding them.
        if let Some(n) = hdr.unix_fds().filter(|n| *n > 0) {
            return Err(ApiError::invalid(format!(
                "{method} takes no file descriptors, and the call carried {n}: send it without any"
            )));
        }
        let ticket = match origin {
            Origin::Bus => admit_call(&self.auth, &self.admission, conn, hdr, method).await?,
            Origin::Private(peer) => {
                self.admission
                    .admit(Some(&peer.name), admission::Principal::Privileged, method)?
            }
        };
        let access = C::ACCESS;
        if access.needs_authorization() {
            let caller = match origin {
                Origin::Bus => self.auth.authorize_change(conn, hdr).await?,
                // Only root and vgpud's own user get a connection there (checked on accept).
                Origin::Private(peer) => peer.caller.clone(),
            };
            // Bounded: a request carries client text (labels, pool and scheduling texts).
            let command = limits::clip_debug(&cmd, limits::LOG_REQUEST_BYTES);
            tracing::info!(%caller, %command, "request");
        }
        let result = if access.is_memory_read() {
            // No I/O and no worker thread: answered at once.
            Ok(self.exec.handle(cmd)?)
        } else {
            match on_worker(&self.exec, &ticket, cmd).await {
                Ok(r) => r,
                Err(admission::Gone) => {
                    tracing::debug!(
                        client = ticket.client(),
                        method,
                        "client gone: call dropped"
                    );
                    return Err(admission::gone_error(&ticket, method));
                }
            }
        };
        if access.is_change() {
            // Even a failed command may have changed something (a rolled-back step); settle always.
            match origin {
                // The reply follows the change's signals: a subscribed caller has seen them all.
                Origin::Bus => self.mirror.settle().await,
                // No signals reach the private socket: the objects alone are waited for, and the
                // signals go out on the bus while the reply does.
                Origin::Private(_) => self.mirror.settle_objects().await,
            }
            // A change may also move what no object change shows (Gpu1.Scheduling, read from the
            // host): the object manager's next answer is built anew.
            self.served.changed();
        }
        result.map_err(|e| {
            // The message clients get, bounded (`ApiError::new`), is the one logged.
            let e = ApiError::from(e);
            if access.needs_authorization() {
                tracing::info!(error = %e.message(), "request refused");
            }
            e
        })
    }
}

/// Admits the call `hdr` (of `method`, as messages name it) for its caller's share.
async fn admit_call(
    auth: &Authorizer,
    admission: &Arc<admission::Admission>,
    conn: &Connection,
    hdr: &Header<'_>,
    method: &str,
) -> Result<admission::Ticket, ApiError> {
    let principal = auth.principal(conn, hdr).await;
    admission.admit(hdr.sender().map(|s| s.as_str()), principal, method)
}

/// Runs `cmd` for the admitted call `ticket` on a worker thread once the call has its places there
/// (see [`admission::Ticket::running`]); `Err(Gone)` when the client disconnected before it ran,
/// then it never runs.
async fn on_worker<C: Command>(
    exec: &Arc<dyn Executor>,
    ticket: &admission::Ticket,
    cmd: C,
) -> Result<Result<C::Reply, QueryError>, admission::Gone>
where
    dyn Executor: Handle<C>,
{
    let _running = ticket.running().await?;
    let gone = ticket.gone_flag();
    let exec = Arc::clone(exec);
    let ran = tokio::task::spawn_blocking(move || {
        // Queued behind other work: the client may have gone meanwhile.
        if gone.is_gone() {
            return None;
        }
        Some(exec.handle(cmd))
    })
    .await;
    match ran {
        Ok(Some(r)) => Ok(r.map_err(QueryError::from)),
        Ok(None) => Err(admission::Gone),
        Err(e) => Ok(Err(QueryError::from(e))),
    }
}

/// Follows the bus's `NameOwnerChanged` signals: a unique name without a new owner is a client that
/// disconnected, whose calls that have not started are then dropped and whose identity is forgotten;
/// a new unique name is a client that connected, which is identified at once
/// ([`Authorizer::prefetch`]).
async fn follow_departures(
    conn: &Connection,
    admission: Arc<admission::Admission>,
    auth: Authorizer,
) -> zbus::Result<tokio::task::JoinHandle<()>> {
    use zbus::export::futures_core::Stream;
    let dbus = zbus::fdo::DBusProxy::new(conn).await?;
    let mut changes = dbus.receive_name_owner_changed().await?;
    let (conn, own) = (conn.clone(), conn.unique_name().map(|n| n.to_string()));
    Ok(tokio::spawn(async move {
        while let Some(signal) =
            std::future::poll_fn(|cx| std::pin::Pin::new(&mut changes).poll_next(cx)).await
        {
            let Ok(args) = signal.args() else { continue };
            let zbus::names::BusName::Unique(name) = args.name() else {
                continue;
            };
            if args.new_owner().is_none() {
                admission.disconnected(name.as_str());
                auth.forget(name.as_str());
            } else if own.as_deref() != Some(name.as_str()) {
                auth.prefetch(&conn, name.to_owned());
            }
        }
    }))
}

/// Why the objects could not be served.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The engine could not list GPUs or instances.
    #[error("cannot read the initial GPUs and instances: {0}")]
    Core(#[from] QueryError),
    /// zbus refused to register an object.
    #[error("cannot register the D-Bus objects: {0}")]
    Register(#[from] zbus::Error),
}

/// The served objects; dropping it stops keeping them in step with the core.
pub struct Service {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    mirror: mirror::MirrorHandle,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service")
            .field("tasks", &self.tasks.len())
            .finish_non_exhaustive()
    }
}

impl Service {
    /// Serves Manager1 also on a private socket at `path`, for root and vgpud's own user
    /// ([`private_socket`]); it listens until the returned handle is dropped. Must run inside the
    /// Tokio runtime.
    pub fn listen_private(
        &self,
        path: &std::path::Path,
    ) -> Result<private_socket::PrivateSocket, private_socket::PrivateSocketError> {
        private_socket::listen(path, Arc::clone(&self.shared))
    }

    /// A handle to tell the service that GPUs may have changed without any instance changing (a
    /// driver loaded, a parent registered): their objects are then re-read. Usable from any thread.
    pub fn gpu_refresher(&self) -> GpuRefresher {
        GpuRefresher(self.mirror.clone())
    }
}

/// See [`Service::gpu_refresher`].
#[derive(Debug, Clone)]
pub struct GpuRefresher(mirror::MirrorHandle);

impl GpuRefresher {
    /// Schedules a refresh of the GPU objects (bursts are coalesced).
    pub fn gpus_changed(&self) {
        self.0.refresh_gpus();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The initial objects, or none when the host cannot be read: the daemon serves anyway (its state
/// directory is usable) and the objects appear when the host is read again.
fn unless_host_unreadable<T>(
    r: Result<Vec<T>, QueryError>,
    what: &str,
) -> Result<Vec<T>, QueryError> {
    match r {
        Err(QueryError::Core(CoreError::Host(e))) => {
            tracing::error!(error = %e, "cannot read the host: serving no {what} until it reads");
            Ok(Vec::new())
        }
        other => other,
    }
}

/// Registers the manager, ObjectManager, GPU and instance objects on `conn` and starts following the
/// core's events. Requesting the well-known name is left to the caller, to do after this returns, so
/// that clients never see the name before the objects.
pub async fn serve(conn: &Connection, exec: Arc<dyn Executor>) -> Result<Service, ServeError> {
    serve_with(conn, exec, Authorizer::default()).await
}

/// [`serve`] with a given authorizer (e.g. another admin group).
pub async fn serve_with(
    conn: &Connection,
    exec: Arc<dyn Executor>,
    auth: Authorizer,
) -> Result<Service, ServeError> {
    serve_objects(conn, exec, auth, introspect::Answered::ByVgpud).await
}

/// [`serve_with`], with Introspect answered as `introspection` says (by zbus only in the tests'
/// reference service).
async fn serve_objects(
    conn: &Connection,
    exec: Arc<dyn Executor>,
    auth: Authorizer,
    introspection: introspect::Answered,
) -> Result<Service, ServeError> {
    let (events, events_before) = exec.subscribe();
    let instances = unless_host_unreadable(mirror::list_instances(&exec).await, "instances")?;
    let gpus = unless_host_unreadable(mirror::list_gpus(&exec).await, "GPUs")?;
    let server = conn.object_server();
    let admission = Arc::new(admission::Admission::default());
    let served = Arc::new(object_manager::Served::default());
    let introspection = Arc::new(introspect::Introspection::new(
        Arc::clone(&served),
        Arc::clone(&admission),
        auth.clone(),
        introspection,
    ));
    let om = object_manager::ObjectManager::new(
        Arc::clone(&served),
        Arc::clone(&admission),
        auth.clone(),
    );
    introspection.learn(&om);
    server.at(MANAGER_PATH, om).await?;
    introspect::install(
        server,
        &zbus::ObjectPath::from_static_str_unchecked(MANAGER_PATH),
        &introspection,
    )
    .await?;
    let (handle, mut tasks) = mirror::start(
        conn,
        Arc::clone(&exec),
        mirror::Objects {
            served: Arc::clone(&served),
            admission: Arc::clone(&admission),
            auth: auth.clone(),
            introspection: Arc::clone(&introspection),
        },
        (events, events_before),
        instances,
        gpus,
    )
    .await?;
    match follow_departures(conn, Arc::clone(&admission), auth.clone()).await {
        Ok(task) => tasks.push(task),
        // A peer-to-peer connection has no bus to report departures: calls then simply run.
        Err(e) => {
            tracing::warn!(error = %e, "cannot follow clients' disconnections: calls of clients that have gone still run")
        }
    }
    let shared = Arc::new(Shared {
        exec,
        auth,
        mirror: handle.clone(),
        admission,
        served,
        instance_list: std::sync::Mutex::new(None),
    });
    let manager = strict::Strict::wrap(manager::Manager {
        shared: Arc::clone(&shared),
        origin: Origin::Bus,
    });
    introspection.learn(&manager);
    server.at(MANAGER_PATH, manager).await?;
    Ok(Service {
        tasks,
        mirror: handle,
        shared,
    })
}
