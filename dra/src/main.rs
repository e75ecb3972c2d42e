//! `vgpu-dra-plugin`: the Kubernetes DRA kubelet plugin of vgpu-manager (see `docs/dra.md`).
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use vgpu_client::BusAddress;
use vgpu_dra::claim::ProxyEndpoint;
use vgpu_dra::driver::Failpoint;
use vgpu_dra::plugin::{self, PluginConfig};

/// Serves vgpud's vGPUs to the kubelet as a Dynamic Resource Allocation driver.
#[derive(Debug, Parser)]
#[command(name = "vgpu-dra-plugin", version)]
struct Args {
    /// The DRA driver name, as in the DeviceClass selector and the ResourceSlices.
    #[arg(long, env = "DRA_DRIVER_NAME", default_value = plugin::DEFAULT_DRIVER)]
    driver_name: String,
    /// This node's name (the pool of its devices); in a DaemonSet, from `spec.nodeName`.
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// The directory the kubelet watches for registration sockets.
    #[arg(long, default_value = plugin::DEFAULT_REGISTRY_DIR)]
    registry_dir: PathBuf,
    /// The kubelet's plugins directory; the plugin uses `<dir>/<driver name>/`.
    #[arg(long, default_value = plugin::DEFAULT_PLUGINS_DIR)]
    plugins_dir: PathBuf,
    /// The CDI spec directory the container runtime reads.
    #[arg(long, default_value = plugin::DEFAULT_CDI_DIR)]
    cdi_dir: PathBuf,
    /// The host directory for device-metadata files [default: PLUGINS_DIR/DRIVER_NAME/metadata].
    #[arg(long)]
    metadata_dir: Option<PathBuf>,
    /// vgpud's bus: `system`, `session` or a D-Bus address.
    #[arg(long, default_value = "system")]
    bus: BusAddress,
    /// The API server proxy: `unix:/path` or `http://host:port` (`kubectl proxy`).
    #[arg(
        long,
        env = "KUBE_API_PROXY",
        default_value = "unix:/run/vgpu-dra/kube-api.sock"
    )]
    api_proxy: ProxyEndpoint,
    /// How often the device-health stream reports to the kubelet, in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    health_interval_ms: u64,
    /// How often the node's ResourceSlices are checked and published again, in milliseconds (also
    /// at once after every prepare and unprepare).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..))]
    slice_interval_ms: u64,
    /// Publish no ResourceSlices (another component publishes this node's devices).
    #[arg(long)]
    no_resource_slices: bool,
    /// Crash tests only: stop for good at this point of a prepare (`after-plan`, `after-create`).
    #[arg(long, env = "VGPU_DRA_FAILPOINT", hide = true)]
    failpoint: Option<Failpoint>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VGPU_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let a = Args::parse();
    let cfg = PluginConfig {
        driver_name: a.driver_name,
        node_name: a.node_name,
        registry_dir: a.registry_dir,
        plugins_dir: a.plugins_dir,
        cdi_dir: a.cdi_dir,
        metadata_dir: a.metadata_dir,
        bus: a.bus,
        api: a.api_proxy,
        health_interval: std::time::Duration::from_millis(a.health_interval_ms),
        failpoint: a.failpoint,
        slice_interval: (!a.no_resource_slices)
            .then(|| std::time::Duration::from_millis(a.slice_interval_ms)),
    };
    match plugin::run(cfg).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut msg = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                msg.push_str(": ");
                msg.push_str(&s.to_string());
                src = s.source();
            }
            eprintln!("vgpu-dra-plugin: {msg}");
            ExitCode::FAILURE
        }
    }
}
