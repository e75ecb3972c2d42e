//! The D-Bus face of the daemon: a thin adapter that turns method calls into [`Command`]s for the core,
//! checks who may change things ([`auth`]), maps [`CoreError`]s to D-Bus errors ([`errors`]), and keeps
//! one object per GPU and per instance in step with the core's events.
//!
//! Objects: `/org/vgpumanager/Manager1` (`org.vgpumanager.Manager1` and the standard ObjectManager),
//! `/org/vgpumanager/Manager1/gpu/<id>` (`org.vgpumanager.Gpu1`), `/org/vgpumanager/Manager1/instance/<uuid>`
//! (`org.vgpumanager.Instance1`); zbus adds Properties, Introspectable and Peer to each.
//! `data/org.vgpumanager.Manager1.xml` is their introspection.

pub mod auth;
mod callers;
pub mod embedded_bus;
pub mod errors;
mod gpu;
mod gpu_work;
mod instance;
mod manager;
mod mirror;
mod pools;

use std::sync::Arc;

use thiserror::Error;
use tokio::sync::broadcast;
use zbus::Connection;

use crate::client::MANAGER_PATH;
use crate::daemon::api::{Command, CoreError, Event, Reply};

pub use auth::{Authorizer, Caller};
pub use errors::ApiError;

/// What the D-Bus layer drives: the daemon core (or anything that executes [`Command`]s the same way).
pub trait Executor: Send + Sync + 'static {
    /// Executes one command; blocking (sysfs I/O), so the D-Bus layer calls it off the async threads.
    /// Every [`Event`] a command causes must be sent before this returns.
    fn execute(&self, cmd: Command) -> Result<Reply, CoreError>;
    /// A receiver of every event sent from now on.
    fn subscribe(&self) -> broadcast::Receiver<Event>;
    /// The generation of the instance list (see [`Core::views_generation`](crate::daemon::core::Core::views_generation)),
    /// if this executor keeps one; `None` disables caching of the list.
    fn views_generation(&self) -> Option<u64> {
        None
    }
    /// Opens a running instance through VFIO for hand-off to a VMM (see
    /// [`Core::open_device`](crate::daemon::core::Core::open_device)); blocking. Executors without
    /// devices refuse.
    fn open_device(
        &self,
        uuid: mdev_types::ids::MdevUuid,
        backend: Option<vgpu_vfio::VfioBackend>,
        bind: bool,
    ) -> Result<vgpu_vfio::OpenedDevice, CoreError> {
        let _ = (uuid, backend, bind);
        Err(CoreError::NotSupported(
            "this daemon has no devices to open".into(),
        ))
    }
}

impl Executor for crate::daemon::core::Core {
    fn execute(&self, cmd: Command) -> Result<Reply, CoreError> {
        crate::daemon::core::Core::execute(self, cmd)
    }

    fn subscribe(&self) -> broadcast::Receiver<Event> {
        crate::daemon::core::Core::subscribe(self)
    }

    fn views_generation(&self) -> Option<u64> {
        Some(crate::daemon::core::Core::views_generation(self))
    }

    fn open_device(
        &self,
        uuid: mdev_types::ids::MdevUuid,
        backend: Option<vgpu_vfio::VfioBackend>,
        bind: bool,
    ) -> Result<vgpu_vfio::OpenedDevice, CoreError> {
        crate::daemon::core::Core::open_device(self, uuid, backend, bind)
    }
}

/// State shared by the method handlers.
struct Shared {
    exec: Arc<dyn Executor>,
    auth: Authorizer,
    mirror: mirror::MirrorHandle,
    /// The last `ListInstances` answer and the views generation it is current for.
    instance_list: std::sync::Mutex<Option<(u64, Arc<Vec<crate::client::InstanceInfo>>)>>,
}

/// Why the objects could not be served.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The core could not list GPUs or instances.
    #[error("cannot read the initial GPUs and instances: {0}")]
    Core(#[from] CoreError),
    /// zbus refused to register an object.
    #[error("cannot register the D-Bus objects: {0}")]
    Register(#[from] zbus::Error),
}

/// The served objects; dropping it stops keeping them in step with the core.
#[derive(Debug)]
pub struct Service {
    tasks: Vec<tokio::task::JoinHandle<()>>,
    mirror: mirror::MirrorHandle,
}

impl Service {
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
    let events = exec.subscribe();
    let instances = mirror::list_instances(&exec).await?;
    let gpus = mirror::list_gpus(&exec).await?;
    let server = conn.object_server();
    // The ObjectManager goes first so that later objects below it are announced with InterfacesAdded.
    server.at(MANAGER_PATH, zbus::fdo::ObjectManager).await?;
    let (handle, tasks) = mirror::start(conn, Arc::clone(&exec), events, instances, gpus).await?;
    let shared = Arc::new(Shared {
        exec,
        auth,
        mirror: handle.clone(),
        instance_list: std::sync::Mutex::new(None),
    });
    server.at(MANAGER_PATH, manager::Manager { shared }).await?;
    Ok(Service {
        tasks,
        mirror: handle,
    })
}
