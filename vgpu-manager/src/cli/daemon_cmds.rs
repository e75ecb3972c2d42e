//! The `vgpuctl` commands that talk to vgpud over D-Bus: list, create, destroy, start, stop, define,
//! undefine, autostart, status. Human tables by default, `--json` for scripts; a daemon refusal is one
//! line (`vgpuctl: <message>`) with exit code 2.

use std::io::Write;

use clap::{ArgGroup, Args, Subcommand};
use serde::Serialize;
use vgpu_client::{
    BusAddress, Client, DefinitionInfo, FaultInfo, GpuInfo, InstanceInfo, NewInstance,
};
use zbus::OwnedObjectPath;

use super::{CliError, Table, write_json};

/// Which bus vgpud is on.
#[derive(Debug, Clone, Args)]
pub struct BusArgs {
    /// The bus vgpud is on: `system` (default), `session`, or an address such as
    /// unix:path=/run/vgpu-manager/bus.sock (a `vgpud --listen` bus).
    #[arg(
        long,
        value_name = "ADDRESS",
        env = "VGPU_BUS",
        global = true,
        default_value = "system"
    )]
    pub bus: String,
}

/// What to make an instance of.
#[derive(Debug, Clone, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["profile", "type_id"])))]
pub struct TargetArgs {
    /// A profile name (`vgpuctl profiles` lists them), e.g. vdi-2g.
    #[arg(long, value_name = "NAME")]
    profile: Option<String>,
    /// An exact mdev type id, e.g. nvidia-231.
    #[arg(long = "type", value_name = "TYPE")]
    type_id: Option<String>,
    /// The GPU to use (PCI address or parent name); default: the daemon chooses.
    #[arg(long, value_name = "ADDR")]
    gpu: Option<String>,
    /// The UUID to give it; default: a random one.
    #[arg(long, value_name = "UUID")]
    uuid: Option<String>,
    /// A free-form label (a VM name, a pool slot).
    #[arg(long, value_name = "TEXT")]
    label: Option<String>,
    /// An mdev attribute written to the device after each create, as NAME=VALUE (repeat it: they are
    /// written in the order given, as mdevctl's `attrs`; a refused one removes the device again).
    #[arg(long = "attr", value_name = "NAME=VALUE", value_parser = parse_attr)]
    attrs: Vec<(String, String)>,
}

/// `NAME=VALUE` of `--attr` (the value may hold `=`; the daemon checks the name).
fn parse_attr(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .ok_or_else(|| format!("'{text}' is not NAME=VALUE"))
}

/// The `vgpuctl` subcommands served by vgpud over D-Bus.
#[derive(Debug, Subcommand)]
pub enum DaemonCommand {
    /// List instances known to vgpud (its own, defined ones, and foreign ones).
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create and start a transient instance.
    Create {
        #[command(flatten)]
        target: TargetArgs,
        /// Print the instance as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Define a persistent instance (not started; see `start` and `autostart`).
    Define {
        #[command(flatten)]
        target: TargetArgs,
        /// Start it whenever vgpud starts or its GPU appears.
        #[arg(long)]
        autostart: bool,
        /// Print the instance as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Remove an instance entirely: its device and its definition (`stop` keeps the definition).
    Destroy {
        /// The instance's mdev UUID.
        uuid: String,
    },
    /// Start a defined instance.
    Start {
        /// The instance's mdev UUID.
        uuid: String,
    },
    /// Stop an instance, keeping its definition.
    Stop {
        /// The instance's mdev UUID.
        uuid: String,
    },
    /// Delete an instance's definition (a running device stays, as a transient instance).
    Undefine {
        /// The instance's mdev UUID.
        uuid: String,
    },
    /// Turn autostart of a defined instance on (or off with --disable).
    Autostart {
        /// The instance's mdev UUID.
        uuid: String,
        /// Turn autostart off.
        #[arg(long)]
        disable: bool,
    },
    /// What each GPU can give each profile when it has room, with its occupancy now.
    Offers {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the daemon's GPUs and instance counts, or one instance in detail.
    Status {
        /// One instance to show.
        uuid: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one daemon command against the bus in `bus`.
pub fn run(cmd: &DaemonCommand, bus: &BusArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let bus: BusAddress = bus.bus.parse()?;
    let rt = vgpu_client::runtime()?;
    rt.block_on(async {
        // Manager1's methods are all a daemon command calls: vgpud's private socket serves them.
        let client = Client::connect_for_calls(&bus).await?;
        dispatch(&client, cmd, out).await
    })
}

/// The stable JSON form of an instance (absent values are `null`).
#[derive(Debug, Serialize)]
struct InstanceJson<'a> {
    uuid: &'a str,
    path: OwnedObjectPath,
    gpu: &'a str,
    parent: &'a str,
    #[serde(rename = "type")]
    type_id: &'a str,
    profile: Option<&'a str>,
    state: &'a str,
    defined: bool,
    autostart: bool,
    owner: &'a str,
    label: Option<&'a str>,
    iommu_group: Option<u32>,
    created_at: u64,
}

impl<'a> From<&'a InstanceInfo> for InstanceJson<'a> {
    fn from(i: &'a InstanceInfo) -> Self {
        InstanceJson {
            uuid: &i.uuid,
            path: i.path(),
            gpu: &i.gpu,
            parent: &i.parent,
            type_id: &i.type_id,
            profile: i.profile(),
            state: &i.state,
            defined: i.defined,
            autostart: i.autostart,
            owner: &i.owner,
            label: i.label(),
            iommu_group: i.iommu_group(),
            created_at: i.created_at,
        }
    }
}

/// A foreign definition (a file in mdevctl's definition directory vgpud did not write, not running)
/// in `list --json`: the keys of [`InstanceJson`], with `owner` `foreign`, `state` `stopped`,
/// `defined` true, and null where a definition has no value (`path`: no object until it is adopted).
#[derive(Debug, Serialize)]
struct ForeignDefinitionJson<'a> {
    uuid: &'a str,
    path: Option<OwnedObjectPath>,
    gpu: &'a str,
    parent: &'a str,
    #[serde(rename = "type")]
    type_id: &'a str,
    profile: Option<&'a str>,
    state: &'static str,
    defined: bool,
    autostart: bool,
    owner: &'static str,
    label: Option<&'a str>,
    iommu_group: Option<u32>,
    created_at: Option<u64>,
}

impl<'a> From<&'a DefinitionInfo> for ForeignDefinitionJson<'a> {
    fn from(d: &'a DefinitionInfo) -> Self {
        ForeignDefinitionJson {
            uuid: &d.uuid,
            path: None,
            gpu: &d.parent,
            parent: &d.parent,
            type_id: &d.type_id,
            profile: None,
            state: "stopped",
            defined: true,
            autostart: d.autostart,
            owner: "foreign",
            label: None,
            iommu_group: None,
            created_at: None,
        }
    }
}

/// One row of `list --json`: an instance or a foreign definition.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum ListRowJson<'a> {
    Instance(InstanceJson<'a>),
    ForeignDefinition(ForeignDefinitionJson<'a>),
}

/// The foreign definitions vgpud lists (none from a vgpud without `ListDefinitions`).
async fn foreign_definition_list(client: &Client) -> Vec<DefinitionInfo> {
    match client.list_definitions().await {
        Ok(d) => d.into_iter().filter(|d| d.is_foreign()).collect(),
        Err(e) => {
            tracing::debug!(error = %e, "no definitions listed");
            Vec::new()
        }
    }
}

/// After `define --type`: a type the parent does not list (yet) is kept, as mdevctl keeps it (its
/// `define` checks nothing against the parent), with a warning on stderr, since starting it fails
/// until the parent offers the type.
async fn warn_if_unlisted(client: &Client, i: &InstanceInfo) {
    let Ok(gpus) = client.list_gpus().await else {
        return;
    };
    let listed = gpus
        .iter()
        .filter(|g| g.id == i.gpu)
        .any(|g| g.types.iter().any(|t| t.type_id == i.type_id));
    if !listed {
        eprintln!(
            "warning: {} does not list mdev type {} (yet): {} is defined, but starting it fails until the parent offers that type (`vgpuctl discover` lists the types)",
            i.parent, i.type_id, i.uuid
        );
    }
}

/// The stable JSON form of a GPU.
#[derive(Debug, Serialize)]
struct GpuJson<'a> {
    id: &'a str,
    path: &'a str,
    vendor: &'a str,
    model: &'a str,
    driver: Option<&'a str>,
    numa_node: Option<u32>,
    types: Vec<TypeJson<'a>>,
    instances: &'a [String],
}

#[derive(Debug, Serialize)]
struct TypeJson<'a> {
    #[serde(rename = "type")]
    type_id: &'a str,
    available: u32,
}

impl<'a> From<&'a GpuInfo> for GpuJson<'a> {
    fn from(g: &'a GpuInfo) -> Self {
        GpuJson {
            id: &g.id,
            path: g.path.as_str(),
            vendor: &g.vendor,
            model: &g.model,
            driver: g.driver(),
            numa_node: g.numa_node(),
            types: g
                .types
                .iter()
                .map(|t| TypeJson {
                    type_id: &t.type_id,
                    available: t.available,
                })
                .collect(),
            instances: &g.instances,
        }
    }
}

#[derive(Debug, Serialize)]
struct StatusJson<'a> {
    version: String,
    gpus: Vec<GpuJson<'a>>,
    instances: Vec<InstanceJson<'a>>,
    faults: Vec<FaultJson<'a>>,
}

#[derive(Debug, Serialize)]
struct FaultJson<'a> {
    scope: &'a str,
    device: &'a str,
    path: &'a str,
    problem: &'a str,
    fix: Option<&'a str>,
}

impl<'a> From<&'a FaultInfo> for FaultJson<'a> {
    fn from(f: &'a FaultInfo) -> Self {
        FaultJson {
            scope: &f.scope,
            device: &f.device,
            path: &f.path,
            problem: &f.problem,
            fix: f.fix(),
        }
    }
}

/// The devices vgpud could not read: a table and each known fix below it; nothing on a healthy host.
fn render_faults(faults: &[FaultInfo]) -> String {
    if faults.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&["FAULTED", "KIND", "PATH", "PROBLEM"]);
    for f in faults {
        t.row(vec![
            f.device.clone(),
            f.scope.clone(),
            f.path.clone(),
            f.problem.clone(),
        ]);
    }
    let mut s = format!(
        "\n{} device(s) could not be read and are not managed until they read again (their instances and definitions are kept):\n",
        faults.len()
    );
    s.push_str(&t.render());
    for f in faults {
        if let Some(fix) = f.fix() {
            s.push_str(&format!("  {}: {fix}\n", f.device));
        }
    }
    s
}

/// The faulted devices, or none from a vgpud without `ListFaults` (older than the method).
async fn list_faults(client: &Client) -> Result<Vec<FaultInfo>, CliError> {
    match client.list_faults().await {
        Ok(f) => Ok(f),
        // An older vgpud answers UnknownMethod; a refusal of the daemon (a host it cannot read) is shown.
        Err(e @ vgpu_client::ClientError::Bus { .. }) => {
            tracing::debug!(error = %e, "no faults listed");
            Ok(Vec::new())
        }
        Err(e) => Err(e.into()),
    }
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

fn yes_no(b: bool) -> String {
    if b { "yes" } else { "no" }.into()
}

fn instance_table(instances: &[InstanceInfo]) -> Table {
    let mut t = Table::new(&[
        "UUID",
        "STATE",
        "GPU",
        "TYPE",
        "PROFILE",
        "DEFINED",
        "AUTOSTART",
        "OWNER",
        "LABEL",
    ]);
    for i in instances {
        t.row(vec![
            i.uuid.clone(),
            i.state.clone(),
            i.gpu.clone(),
            i.type_id.clone(),
            dash(&i.profile),
            yes_no(i.defined),
            yes_no(i.autostart),
            i.owner.clone(),
            dash(&i.label),
        ]);
    }
    t
}

/// Lists the foreign definitions (files in mdevctl's definition directory vgpud did not write) under
/// the instances, when there are any. A vgpud without `ListDefinitions` has none to show.
fn foreign_definitions(foreign: Vec<DefinitionInfo>, out: &mut dyn Write) -> Result<(), CliError> {
    if foreign.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nforeign definitions in /etc/mdevctl.d (not started by vgpud; `mdevctl start -u UUID` takes one over):"
    )?;
    let mut t = Table::new(&["UUID", "PARENT", "TYPE", "AUTOSTART"]);
    for d in foreign {
        t.row(vec![
            d.uuid.clone(),
            d.parent.clone(),
            d.type_id.clone(),
            yes_no(d.autostart),
        ]);
    }
    write!(out, "{}", t.render())?;
    Ok(())
}

fn gpu_table(gpus: &[GpuInfo]) -> Table {
    let mut t = Table::new(&[
        "GPU",
        "VENDOR",
        "MODEL",
        "DRIVER",
        "INSTANCES",
        "TYPES (AVAILABLE)",
    ]);
    for g in gpus {
        let types: Vec<String> = g
            .types
            .iter()
            .map(|t| format!("{} ({})", t.type_id, t.available))
            .collect();
        t.row(vec![
            g.id.clone(),
            g.vendor.clone(),
            g.model.clone(),
            dash(&g.driver),
            g.instances.len().to_string(),
            if types.is_empty() {
                "-".into()
            } else {
                types.join(", ")
            },
        ]);
    }
    t
}

/// A GPU as vgpud names it: `3b:00.0` is `0000:3b:00.0`; a virtual parent's name stays.
fn canonical_gpu(gpu: &str) -> String {
    gpu.parse::<mdev_types::ids::PciAddress>()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| gpu.to_string())
}

fn describe(i: &InstanceInfo) -> String {
    let mut s = format!("{} on {}, {}", i.type_id, i.gpu, i.state);
    if let Some(p) = i.profile() {
        s = format!("profile {p}: {s}");
    }
    if i.defined {
        s.push_str(if i.autostart {
            ", defined, autostart on"
        } else {
            ", defined"
        });
    }
    s
}

impl TargetArgs {
    /// The request these options describe.
    fn request(&self) -> NewInstance {
        let mut req = match (&self.profile, &self.type_id) {
            (Some(p), _) => NewInstance::of_profile(p),
            (None, Some(ty)) => NewInstance::of_type(ty),
            // clap's required group makes this unreachable; an empty profile gets the daemon's message.
            (None, None) => NewInstance::of_profile(""),
        };
        req.gpu = self.gpu.clone();
        req.uuid = self.uuid.clone();
        req.label = self.label.clone();
        req.attrs = self.attrs.clone();
        req
    }
}

/// Runs `cmd` through `client`, writing its output to `out`.
async fn dispatch(
    client: &Client,
    cmd: &DaemonCommand,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match cmd {
        DaemonCommand::Offers { json } => super::offers::run(client, *json, out).await?,
        DaemonCommand::List { json } => {
            // Both lists in flight at once: one round trip.
            let (list, foreign) =
                tokio::join!(client.list_instances(), foreign_definition_list(client));
            let list = list?;
            if *json {
                // Foreign definitions follow the instances, as in the table; one whose UUID runs is
                // that instance's row already.
                let j: Vec<ListRowJson<'_>> = list
                    .iter()
                    .map(|i| ListRowJson::Instance(InstanceJson::from(i)))
                    .chain(
                        foreign
                            .iter()
                            .filter(|d| !list.iter().any(|i| i.uuid == d.uuid))
                            .map(|d| ListRowJson::ForeignDefinition(d.into())),
                    )
                    .collect();
                return write_json(out, &j);
            }
            if list.is_empty() {
                writeln!(
                    out,
                    "no instances (create one with `vgpuctl create --profile NAME`)"
                )?;
            } else {
                write!(out, "{}", instance_table(&list).render())?;
            }
            foreign_definitions(foreign, out)?;
        }
        DaemonCommand::Create { target, json } => {
            // With the type and the GPU named, the request is all the line says (a new instance
            // runs and has no definition): one call, without reading the instance back.
            if !*json
                && let (Some(ty), Some(gpu)) = (&target.type_id, &target.gpu)
                && target.profile.is_none()
            {
                let uuid = client.create_uuid(&target.request()).await?;
                writeln!(
                    out,
                    "created {uuid} ({ty} on {}, running)",
                    canonical_gpu(gpu)
                )?;
                return Ok(());
            }
            let i = client.create(&target.request()).await?;
            if *json {
                return write_json(out, &InstanceJson::from(&i));
            }
            writeln!(out, "created {} ({})", i.uuid, describe(&i))?;
        }
        DaemonCommand::Define {
            target,
            autostart,
            json,
        } => {
            let i = client.define(&target.request(), *autostart).await?;
            if target.type_id.is_some() {
                warn_if_unlisted(client, &i).await;
            }
            if *json {
                return write_json(out, &InstanceJson::from(&i));
            }
            writeln!(out, "defined {} ({})", i.uuid, describe(&i))?;
        }
        DaemonCommand::Destroy { uuid } => {
            client.destroy(uuid).await?;
            writeln!(out, "destroyed {uuid}")?;
        }
        DaemonCommand::Start { uuid } => {
            client.start(uuid).await?;
            writeln!(out, "started {uuid}")?;
        }
        DaemonCommand::Stop { uuid } => {
            client.stop(uuid).await?;
            writeln!(out, "stopped {uuid}")?;
        }
        DaemonCommand::Undefine { uuid } => {
            client.undefine(uuid).await?;
            writeln!(out, "undefined {uuid}")?;
        }
        DaemonCommand::Autostart { uuid, disable } => {
            client.set_autostart(uuid, !*disable).await?;
            writeln!(
                out,
                "autostart {} for {uuid}",
                if *disable { "off" } else { "on" }
            )?;
        }
        DaemonCommand::Status {
            uuid: Some(uuid),
            json,
        } => {
            let i = client.get_instance(uuid).await?;
            if *json {
                return write_json(out, &InstanceJson::from(&i));
            }
            let rows = [
                ("uuid", i.uuid.clone()),
                ("state", i.state.clone()),
                ("gpu", i.gpu.clone()),
                ("parent", i.parent.clone()),
                ("type", i.type_id.clone()),
                ("profile", dash(&i.profile)),
                ("defined", yes_no(i.defined)),
                ("autostart", yes_no(i.autostart)),
                ("owner", i.owner.clone()),
                ("label", dash(&i.label)),
                (
                    "iommu group",
                    i.iommu_group()
                        .map(|g| g.to_string())
                        .unwrap_or_else(|| "-".into()),
                ),
                ("created at", i.created_at.to_string()),
                ("object", i.path().to_string()),
            ];
            for (k, v) in rows {
                writeln!(out, "{:<12} {v}", format!("{k}:"))?;
            }
        }
        DaemonCommand::Status { uuid: None, json } => {
            let version = client.version().await?;
            let gpus = client.list_gpus().await?;
            let instances = client.list_instances().await?;
            let faults = list_faults(client).await?;
            if *json {
                let j = StatusJson {
                    version,
                    gpus: gpus.iter().map(GpuJson::from).collect(),
                    instances: instances.iter().map(InstanceJson::from).collect(),
                    faults: faults.iter().map(FaultJson::from).collect(),
                };
                return write_json(out, &j);
            }
            let running = instances.iter().filter(|i| i.state == "running").count();
            let defined = instances.iter().filter(|i| i.defined).count();
            writeln!(
                out,
                "vgpud {version} on {}: {} GPUs, {} instances ({running} running, {defined} defined)\n",
                client.bus(),
                gpus.len(),
                instances.len()
            )?;
            if gpus.is_empty() {
                writeln!(out, "no GPUs with mdev support")?;
            } else {
                write!(out, "{}", gpu_table(&gpus).render())?;
            }
            write!(out, "{}", render_faults(&faults))?;
        }
    }
    Ok(())
}
