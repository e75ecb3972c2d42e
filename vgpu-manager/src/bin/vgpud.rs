//! `vgpud`: the vgpu-manager daemon. Serves `org.vgpumanager.Manager1` on the system bus (default), the
//! session bus, a given bus address, or an embedded bus of its own (`--listen`), and keeps the host's
//! mdev instances in line with the persistent definitions in the state directory.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

use vgpu_client::{BusAddress, ClientError, SERVICE};
use vgpu_manager::cli::HostArgs;
use vgpu_manager::daemon::api::CoreError;
use vgpu_manager::daemon::dbus::bus_name::{self, NameError};
use vgpu_manager::daemon::dbus::embedded_bus::{self, EmbeddedBus, EmbeddedBusError};
use vgpu_manager::daemon::dbus::{self, Executor, ServeError};
use vgpu_manager::daemon::engine::{
    Core, FinishedApply, GpuImpact, STARTUP_RETRY_FIRST, StartupRetry, next_retry_delay,
};
use vgpu_manager::daemon::mdevctl_dir::{MdevctlDir, watch};
use vgpu_manager::daemon::metrics;
use vgpu_manager::daemon::pool_files::{PoolFileOutcome, apply_pool_files};
use vgpu_manager::profile::Catalog;

/// vgpud — the vgpu-manager daemon (virtual GPU lifecycle over D-Bus).
#[derive(Debug, Parser)]
#[command(name = "vgpud", version, about)]
struct Args {
    #[command(flatten)]
    host: HostArgs,
    /// Where definitions and the ownership ledger are kept.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/vgpu-manager")]
    state_dir: PathBuf,
    /// The bus to serve on: `system`, `session`, or a D-Bus address.
    #[arg(long, value_name = "system|session|ADDRESS", conflicts_with = "listen")]
    bus: Option<String>,
    /// Run an embedded bus listening on ADDRESS (e.g. unix:path=/run/vgpu-manager/bus.sock) and serve
    /// on it; clients use `vgpuctl --bus ADDRESS`.
    #[arg(long, value_name = "ADDRESS")]
    listen: Option<String>,
    /// With --listen: how long a call on the embedded bus waits for its reply before the bus answers
    /// it NoReply itself (dbus-daemon's reply_timeout limit). A callee that never answers holds the
    /// caller's places among its calls waiting for replies that long.
    #[arg(long, value_name = "SECONDS", default_value_t = embedded_bus::REPLY_TIMEOUT.as_secs(), requires = "listen",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    bus_reply_timeout: u64,
    /// Members of this group (besides root) may make changes. The shipped bus policy names
    /// vgpu-admin; change it to match when using another group.
    #[arg(long, value_name = "GROUP", default_value = vgpu_client::ADMIN_GROUP)]
    admin_group: String,
    /// Pool files applied once the daemon is ready and again on SIGHUP (`*.toml`; a missing directory
    /// is fine).
    #[arg(long, value_name = "DIR", default_value = vgpu_manager::pool::DEFAULT_DIR)]
    pools_dir: PathBuf,
    /// mdevctl's definition directory: vgpud keeps a file there in mdevctl's format for each of its
    /// definitions, and lists the other files as foreign definitions. Default: `etc/mdevctl.d` below
    /// --sysfs-root (`/etc/mdevctl.d` on the live host); none on a simulated host.
    #[arg(long, value_name = "DIR")]
    mdevctl_dir: Option<PathBuf>,
    /// Keep no mdevctl definition directory.
    #[arg(long, conflicts_with = "mdevctl_dir")]
    no_mdevctl_dir: bool,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics (docs/metrics.md), e.g. 127.0.0.1:9850.
    /// Off unless given. The metrics are readable by anyone who reaches the address (as vgpud's
    /// read-only D-Bus methods are by every local user): a non-loopback address exposes them to the
    /// network, which vgpud logs at start.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Also serve Manager1's methods on a private socket at PATH (mode 0600), for root and vgpud's
    /// own user only: `vgpuctl` run by them calls through it, skipping the bus broker (the shipped
    /// unit uses /run/vgpu-manager/private, where vgpuctl looks by default; docs/security.md). Off
    /// unless given.
    #[arg(long, value_name = "PATH")]
    private_socket: Option<PathBuf>,
}

impl Args {
    /// The mdevctl definition directory vgpud keeps, if any (see `--mdevctl-dir`).
    fn mdevctl_dir(&self) -> Option<MdevctlDir> {
        if self.no_mdevctl_dir {
            return None;
        }
        if let Some(d) = &self.mdevctl_dir {
            return Some(MdevctlDir::new(d));
        }
        if self.host.sim.is_some() {
            return None;
        }
        let root = self
            .host
            .sysfs_root
            .clone()
            .unwrap_or_else(|| PathBuf::from("/"));
        Some(MdevctlDir::below_root(&root))
    }
}

/// Why the daemon could not start or run.
#[derive(Debug, Error)]
enum DaemonError {
    #[error("{0}")]
    Host(String),
    #[error("the shipped profiles are broken: {0}")]
    Catalog(String),
    #[error("cannot open state directory {dir}: {source}")]
    StateDir { dir: String, source: CoreError },
    #[error("cannot start: {0}")]
    Startup(CoreError),
    #[error(transparent)]
    EmbeddedBus(#[from] EmbeddedBusError),
    #[error(transparent)]
    Bus(#[from] ClientError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The name is owned by another connection, the bus refused it, or the bus took it away: in
    /// every case vgpud exits non-zero (so that systemd's `Restart=on-failure` applies) rather than
    /// run without its name.
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("cannot watch for signals: {0}")]
    Signals(std::io::Error),
    #[error("a worker thread failed: {0}")]
    Join(String),
    #[error(transparent)]
    Metrics(#[from] metrics::http::HttpError),
    #[error(transparent)]
    PrivateSocket(#[from] dbus::private_socket::PrivateSocketError),
}

fn main() -> ExitCode {
    let (filter, filter_problem) =
        vgpu_manager::daemon::log_filter::log_filter(std::env::var("VGPU_LOG").ok().as_deref());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Some(problem) = filter_problem {
        tracing::warn!("{problem}");
    }
    let args = Args::parse();
    vgpu_manager::daemon::fd_budget::raise_nofile_limit();
    // Two workers whatever the core count: the daemon waits on the bus and on sysfs, and every worker
    // costs a thread and (with glibc) its own malloc arena, which on a many-core GPU host would multiply
    // the resident memory for nothing. Blocking work (sysfs, the state directory) runs on the blocking
    // pool, bounded for the same reason.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("vgpud: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            eprintln!("vgpud: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Feeds kernel uevents to the core on a thread of its own (the host's stream is blocking), and has
/// every GPU object re-read after those that may change more than one instance's GPU (a parent or
/// driver come or gone, a vGPU on an SR-IOV VF: `GpuImpact`).
fn forward_uevents(
    core: &Arc<Core>,
    events: std::sync::mpsc::Receiver<vgpu_host::uevent::Uevent>,
    gpus: dbus::GpuRefresher,
) {
    let core = Arc::downgrade(core);
    let spawned = std::thread::Builder::new()
        .name("uevents".into())
        .spawn(move || {
            for ev in events {
                let Some(core) = core.upgrade() else { break };
                if core.handle_uevent(&ev) == GpuImpact::All {
                    gpus.gpus_changed();
                }
            }
        });
    if let Err(e) = spawned {
        warn!(error = %e, "cannot start the uevent thread: parents that appear later are not noticed");
    }
}

/// Finishes, on the blocking pool, the pool applies the last shutdown (or a crash) stopped, logging
/// each outcome. Runs before the pool files are applied; both take the one apply lock in turn.
fn finish_interrupted_applies(core: &Arc<Core>) {
    let core = core.clone();
    tokio::task::spawn_blocking(move || {
        for f in core.finish_interrupted_applies() {
            match f {
                FinishedApply::Applied { pool, steps } => {
                    info!(%pool, steps, "the pool apply the last shutdown stopped is finished")
                }
                FinishedApply::Failed { pool, error } => {
                    error!(%pool, %error, "the pool apply the last shutdown stopped could not be finished; apply the pool again")
                }
            }
        }
    });
}

/// Retries the startup reconcile while it is owed (the host could not be read at start), waiting
/// `STARTUP_RETRY_FIRST`, then twice as long after each failed try, at most `STARTUP_RETRY_MAX`; every
/// GPU object is read again once it ran. Kernel events retry it too (`Core::handle_uevent`).
fn retry_startup_with_back_off(core: &Arc<Core>, gpus: dbus::GpuRefresher) {
    if !core.startup_owed() {
        return;
    }
    let core = Arc::downgrade(core);
    tokio::spawn(async move {
        let mut delay = STARTUP_RETRY_FIRST;
        loop {
            tokio::time::sleep(delay).await;
            let Some(core) = core.upgrade() else { break };
            match tokio::task::spawn_blocking(move || core.retry_startup()).await {
                Ok(StartupRetry::Done) => {
                    gpus.gpus_changed();
                    break;
                }
                // A kernel event ran it meanwhile (and had the GPUs read again).
                Ok(StartupRetry::NotOwed) => break,
                Ok(StartupRetry::StillOwed) => delay = next_retry_delay(delay),
                Err(e) => {
                    error!(error = %e, "the startup reconcile retry failed; restart vgpud");
                    break;
                }
            }
        }
    });
}

/// Follows changes others make in the mdevctl definition directory (an edit of one of vgpud's
/// files, a removed one), on a thread of its own.
fn watch_mdevctl_dir(core: &Arc<Core>) {
    let Some(dir) = core.mdevctl_dir() else {
        return;
    };
    let weak = Arc::downgrade(core);
    let watched = watch::watch(&dir, move || {
        let Some(core) = weak.upgrade() else {
            return false;
        };
        core.mdevctl_dir_changed();
        true
    });
    if let Err(e) = watched {
        warn!(error = %e, "mdevctl definition directory not watched");
    }
}

/// Starts the metrics listener on `addr` (`--metrics-listen`), rendering from the core's snapshot.
async fn serve_metrics(
    core: &Arc<Core>,
    addr: std::net::SocketAddr,
) -> Result<tokio::task::JoinHandle<()>, DaemonError> {
    let listener = metrics::http::MetricsListener::bind(addr).await?;
    let bound = listener.local_addr().unwrap_or(addr);
    if bound.ip().is_loopback() {
        info!(addr = %bound, "serving metrics at http://{bound}/metrics");
    } else {
        warn!(addr = %bound, "serving metrics at http://{bound}/metrics on a non-loopback address, as --metrics-listen asks: anyone who reaches it can read what vgpud reports; firewall it or use 127.0.0.1");
    }
    let weak = Arc::downgrade(core);
    let render: metrics::http::Render = Arc::new(move |format| match weak.upgrade() {
        Some(core) => core.metrics_text(format, metrics::Freshness::Throttled),
        None => String::new(),
    });
    Ok(listener.serve(render, metrics::http::Limits::default()))
}

/// The pool files and what applies them.
struct PoolFiles {
    core: Arc<Core>,
    catalog: Arc<Catalog>,
    dir: PathBuf,
}

impl PoolFiles {
    /// Applies every pool file on the blocking pool, logging each outcome.
    fn apply_in_background(&self, why: &'static str) {
        let (core, catalog, dir) = (self.core.clone(), self.catalog.clone(), self.dir.clone());
        tokio::task::spawn_blocking(move || match apply_pool_files(&core, &catalog, &dir) {
            Ok(outcomes) if outcomes.is_empty() => {
                info!(dir = %dir.display(), on = why, "no pool files");
            }
            Ok(outcomes) => {
                for o in outcomes {
                    match o {
                        PoolFileOutcome::Applied {
                            file,
                            pool,
                            changed,
                        } => {
                            info!(file = %file.display(), %pool, changed, on = why, "pool file applied")
                        }
                        PoolFileOutcome::Failed { file, reason } => {
                            error!(file = %file.display(), %reason, on = why, "pool file not applied")
                        }
                    }
                }
            }
            Err(e) => error!(dir = %dir.display(), error = %e, "cannot read the pool files"),
        });
    }
}

async fn run(args: Args) -> Result<(), DaemonError> {
    let host = args
        .host
        .open()
        .map_err(|e| DaemonError::Host(e.to_string()))?;
    // Subscribe before the start-up reconcile so that a parent appearing in between is not missed.
    let uevents = host.subscribe();
    if uevents.is_none() {
        info!(host = %host.describe(), "this host reports no kernel events; reconcile runs on start and on request");
    }
    let catalog = Catalog::builtin().map_err(|e| DaemonError::Catalog(e.to_string()))?;
    let pool_catalog = catalog.clone();
    let dir = args.state_dir.clone();
    let mdevctl_dir = args.mdevctl_dir();
    let core =
        tokio::task::spawn_blocking(move || Core::open_with(host, &dir, catalog, mdevctl_dir))
            .await
            .map_err(|e| DaemonError::Join(e.to_string()))?
            .map_err(|source| match source {
                CoreError::Store(_) => DaemonError::StateDir {
                    dir: args.state_dir.display().to_string(),
                    source,
                },
                other => DaemonError::Startup(other),
            })?;
    let core = Arc::new(core);
    watch_mdevctl_dir(&core);

    // The embedded bus must outlive the connection; it removes its socket when dropped.
    let (embedded, bus): (Option<EmbeddedBus>, BusAddress) = match &args.listen {
        Some(listen) => {
            let options = embedded_bus::BusOptions {
                reply_timeout: std::time::Duration::from_secs(args.bus_reply_timeout),
            };
            let b = embedded_bus::start(listen, &options)?;
            let addr = BusAddress::Address(b.address().to_string());
            (Some(b), addr)
        }
        None => (None, args.bus.as_deref().unwrap_or("system").parse()?),
    };
    let conn = vgpu_client::connect(&bus).await?;
    let exec: Arc<dyn Executor> = core.clone();
    let auth = dbus::Authorizer::with_admin_group(&args.admin_group);
    let service = dbus::serve_with(&conn, exec, auth).await?;
    // Events that arrived since the subscription above wait in the channel until now.
    if let Some(rx) = uevents {
        forward_uevents(&core, rx, service.gpu_refresher());
    }
    retry_startup_with_back_off(&core, service.gpu_refresher());
    // Exclusively: not replaceable, not queued, never taken from another owner.
    let mut name = bus_name::own(&conn, SERVICE, &bus.to_string()).await?;
    info!(name = SERVICE, "ready on {bus}");
    let private = match &args.private_socket {
        Some(path) => Some(service.listen_private(path)?),
        None => None,
    };
    let metrics_listener = match args.metrics_listen {
        Some(addr) => Some(serve_metrics(&core, addr).await?),
        None => None,
    };

    let mut term = signal(SignalKind::terminate()).map_err(DaemonError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(DaemonError::Signals)?;
    let mut hup = signal(SignalKind::hangup()).map_err(DaemonError::Signals)?;
    // The pool files are applied once the name is owned, so clients see the progress; a SIGHUP
    // applies them again (after an edit).
    let pools = PoolFiles {
        core: core.clone(),
        catalog: Arc::new(pool_catalog),
        dir: args.pools_dir.clone(),
    };
    finish_interrupted_applies(&core);
    pools.apply_in_background("start");
    let outcome = {
        // One watch for the whole run (not re-created per loop turn), so that a loss being checked
        // is never dropped half-way by another branch.
        let lost = name.lost();
        tokio::pin!(lost);
        loop {
            tokio::select! {
                _ = term.recv() => { info!("SIGTERM: shutting down"); core.begin_shutdown(); break Ok(()); }
                _ = int.recv() => { info!("SIGINT: shutting down"); core.begin_shutdown(); break Ok(()); }
                _ = hup.recv() => pools.apply_in_background("SIGHUP"),
                // The name taken away, or the bus connection gone with it. Running on without the
                // name would leave clients unanswered (or answered by a new owner): exit non-zero
                // instead, so that the service manager starts vgpud again.
                _ = conn.closed() => {
                    break Err(DaemonError::Name(NameError::Closed {
                        name: SERVICE.to_string(),
                        bus: bus.to_string(),
                    }));
                }
                lost = &mut lost => break Err(DaemonError::Name(lost)),
            }
        }
    };
    // Give the name up first so that no new call arrives, then stop following the core.
    if outcome.is_ok()
        && let Err(e) = name.release(&conn).await
    {
        warn!(error = %e, "cannot release the bus name");
    }
    if let Some(l) = metrics_listener {
        l.abort();
    }
    drop(private);
    drop(service);
    drop(conn);
    drop(embedded);
    info!("stopped");
    outcome
}
