//! Running the plugin: load the checkpoint, connect to vgpud, roll back what a crash cut short,
//! serve the DRA service on `<plugins dir>/<driver>/dra.sock`, then the registration service on
//! `<registry dir>/<driver>-reg.sock` (the kubelet watches that directory and dials the socket), until
//! SIGTERM or SIGINT; both sockets are removed on the way out.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;
use vgpu_client::BusAddress;

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::claim::{ApiServer, ClaimSource, ProxyEndpoint};
use crate::driver::{Driver, DriverConfig, DriverError, Failpoint};
use crate::fsutil::{self, FsError};
use crate::grpc::{DraRouter, DraService, RegistrationService};
use crate::health::HealthService;
use crate::pb::pluginregistration as reg;
use crate::publish::{Published, Publisher};
use crate::slices;
use crate::vgpud::Vgpud;

/// The default directory the kubelet watches for registration sockets.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The default parent of the plugin's own directory.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The default CDI spec directory (the one containerd and CRI-O read by default).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// The default driver name.
pub const DEFAULT_DRIVER: &str = "vgpu.vgpu-manager.io";

/// Everything the plugin needs to know to run.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The DRA driver name.
    pub driver_name: String,
    /// This node's name: the pool of its devices.
    pub node_name: String,
    /// The kubelet's registration directory.
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory; the plugin keeps `<it>/<driver>/`.
    pub plugins_dir: PathBuf,
    /// The CDI spec directory.
    pub cdi_dir: PathBuf,
    /// The host directory of device-metadata files; `None` for `<plugin dir>/metadata`.
    pub metadata_dir: Option<PathBuf>,
    /// vgpud's bus.
    pub bus: BusAddress,
    /// The API server proxy.
    pub api: ProxyEndpoint,
    /// How often the health stream reports.
    pub health_interval: std::time::Duration,
    /// Where a prepare stops for good (crash tests only).
    pub failpoint: Option<Failpoint>,
    /// How often the node's ResourceSlices are checked and published again (also at once after
    /// every prepare and unprepare); `None`: the plugin publishes none (another component does).
    pub slice_interval: Option<std::time::Duration>,
}

impl PluginConfig {
    /// `<plugins dir>/<driver>`: the DRA socket, the checkpoint and (by default) the metadata.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver_name)
    }

    /// The DRA service socket.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join("dra.sock")
    }

    /// The registration socket.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", self.driver_name))
    }

    /// The checkpoint file.
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir().join("checkpoint.json")
    }

    /// The metadata directory in effect.
    pub fn metadata_dir(&self) -> PathBuf {
        self.metadata_dir
            .clone()
            .unwrap_or_else(|| self.plugin_dir().join("metadata"))
    }
}

/// Why the plugin stopped.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The checkpoint is unusable.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// vgpud is unreachable.
    #[error("cannot reach vgpud on {bus}: start vgpud or pass its bus with --bus")]
    Vgpud {
        /// The bus.
        bus: String,
        /// The client's error.
        #[source]
        source: vgpu_client::ClientError,
    },
    /// Rolling back a prepare cut short failed.
    #[error(
        "cannot roll back a prepare cut short by the last stop; the plugin retries at its next start"
    )]
    Recover(#[source] Box<DriverError>),
    /// A directory could not be made.
    #[error(transparent)]
    Fs(#[from] FsError),
    /// A socket could not be bound.
    #[error("cannot listen on {}: check that the directory is writable and no other plugin serves it", path.display())]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
    /// A gRPC server failed.
    #[error("the gRPC server on {} failed", path.display())]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// tonic's error.
        #[source]
        source: tonic::transport::Error,
    },
    /// Installing the signal handlers failed.
    #[error("cannot install the SIGTERM handler")]
    Signal(#[source] std::io::Error),
}

/// Runs the plugin with vgpud on `cfg.bus` and the API server proxy at `cfg.api` until SIGTERM or
/// SIGINT.
pub async fn run(cfg: PluginConfig) -> Result<(), PluginError> {
    let client = vgpu_client::Client::connect(&cfg.bus)
        .await
        .map_err(|source| PluginError::Vgpud {
            bus: cfg.bus.to_string(),
            source,
        })?;
    let claims = ApiServer::new(cfg.api.clone());
    serve(cfg, Arc::new(client), Arc::new(claims), shutdown_signal()?).await
}

/// Runs the plugin over the given vgpud and claim source until `shutdown` completes.
pub async fn serve(
    cfg: PluginConfig,
    vgpud: Arc<dyn Vgpud>,
    claims: Arc<dyn ClaimSource>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), PluginError> {
    fsutil::ensure_dir(&cfg.plugin_dir())?;
    fsutil::ensure_dir(&cfg.registry_dir)?;
    let checkpoint = Checkpoint::load(&cfg.checkpoint(), &cfg.driver_name)?;
    let driver = Arc::new(Driver::new(
        DriverConfig {
            driver_name: cfg.driver_name.clone(),
            pool: cfg.node_name.clone(),
            cdi_dir: cfg.cdi_dir.clone(),
            metadata_dir: cfg.metadata_dir(),
            failpoint: cfg.failpoint,
        },
        vgpud,
        claims,
        checkpoint,
    ));
    let rec = driver
        .recover()
        .await
        .map_err(|e| PluginError::Recover(Box::new(e)))?;
    tracing::info!(
        rolled_back = rec.rolled_back.len(),
        destroyed = rec.destroyed.len(),
        kept = rec.kept,
        orphaned_pools_removed = rec.orphans.len(),
        restored = rec.restored.len(),
        unrestored = rec.unrestored.len(),
        "checkpoint reconciled"
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_for_servers = stop_rx.clone();
    let stopped = move || {
        let mut rx = stop_for_servers.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };

    let publisher = cfg.slice_interval.map(|every| {
        let p = Publisher::new(
            ApiServer::new(cfg.api.clone()),
            &cfg.driver_name,
            &cfg.node_name,
        );
        tokio::spawn(publish_loop(driver.clone(), p, every, stop_rx.clone()))
    });

    let dra_path = cfg.dra_socket();
    let dra_listener = listen(&dra_path)?;
    let health = HealthService::new(driver.clone(), cfg.health_interval, stop_rx.clone());
    let dra = Server::builder().serve_with_incoming_shutdown(
        DraRouter::new(DraService::new(driver), health),
        UnixListenerStream::new(dra_listener),
        stopped(),
    );

    let reg_path = cfg.registration_socket();
    let reg_listener = listen(&reg_path)?;
    let (registration, _state) =
        RegistrationService::new(&cfg.driver_name, &dra_path.display().to_string());
    let registrar = Server::builder().serve_with_incoming_shutdown(
        reg::registration_server::RegistrationServer::new(registration),
        UnixListenerStream::new(reg_listener),
        stopped(),
    );
    tracing::info!(driver = %cfg.driver_name, dra = %dra_path.display(), registration = %reg_path.display(), "serving");

    let dra_task = tokio::spawn(dra);
    let reg_task = tokio::spawn(registrar);
    shutdown.await;
    tracing::info!("stopping");
    stop_tx.send_replace(true);
    // The registration socket goes first, so the kubelet stops dialing us before the service ends.
    let reg_result = reg_task.await;
    let _ = std::fs::remove_file(&reg_path);
    let dra_result = dra_task.await;
    let _ = std::fs::remove_file(&dra_path);
    if let Some(p) = publisher {
        let _ = p.await;
    }
    for (path, r) in [(reg_path, reg_result), (dra_path, dra_result)] {
        if let Ok(Err(source)) = r {
            return Err(PluginError::Serve { path, source });
        }
    }
    Ok(())
}

/// Publishes the node's ResourceSlices now, then again every `every` and after every prepare and
/// unprepare, until `stop`. A failure is logged and retried at the next turn; the slices already
/// published stay as they are meanwhile.
async fn publish_loop(
    driver: Arc<Driver>,
    publisher: Publisher,
    every: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let changes = driver.changes();
    loop {
        match publish_once(&driver, &publisher).await {
            Ok(p) if p.wrote() => tracing::info!(
                generation = p.generation,
                created = p.created,
                updated = p.updated,
                deleted = p.deleted,
                "ResourceSlices published"
            ),
            Ok(p) => tracing::debug!(generation = p.generation, "ResourceSlices up to date"),
            Err(e) => {
                tracing::warn!(error = %error_chain(e.as_ref()), "publishing ResourceSlices failed; retrying")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = changes.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

async fn publish_once(
    driver: &Driver,
    publisher: &Publisher,
) -> Result<Published, Box<dyn std::error::Error + Send + Sync>> {
    let now = driver.slice_inputs().await?;
    let ours = driver.vgpu_uuids().await;
    let our_pools = driver.vgpud_pools().await;
    let cfg = driver.config();
    let inputs = slices::Inputs {
        driver: &cfg.driver_name,
        node: &cfg.pool,
        offers: &now.offers,
        instances: &now.instances,
        ours: &ours,
        pools: &now.pools,
        our_pools: &our_pools,
    };
    Ok(publisher.sync(slices::build(inputs, 0)).await?)
}

/// An error and its sources, `: `-joined.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

/// Binds a Unix socket at `path`, replacing a stale socket a killed plugin left there.
fn listen(path: &Path) -> Result<UnixListener, PluginError> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(m) = std::fs::symlink_metadata(path)
        && m.file_type().is_socket()
    {
        let _ = std::fs::remove_file(path);
    }
    UnixListener::bind(path).map_err(|source| PluginError::Listen {
        path: path.to_path_buf(),
        source,
    })
}

fn shutdown_signal() -> Result<impl std::future::Future<Output = ()> + Send + 'static, PluginError>
{
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(PluginError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(PluginError::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
