//! `vgpuctl mdevctl …`: an mdevctl-compatible front end to vgpud, so libvirt's node-device driver (which
//! runs `mdevctl`) and scripts written for mdevctl keep working on hosts where vgpud manages the mdevs.
//! Install it as `mdevctl` (a symlink to vgpuctl: invoked under that name, vgpuctl is a program named
//! `mdevctl` with these commands, mdevctl's usage lines, its `Error: …` messages and exit status 1 for a
//! failed command; as `lsmdev`, it is `mdevctl list`). JSON is written without a final newline, as
//! mdevctl writes it. docs/mdevctl.md tracks conformance with mdevctl's own tests.
//!
//! It answers the command lines libvirt issues (libvirt src/node_device/node_device_driver.c):
//! `list --dumpjson [--defined]`, `start --parent=P --jsonfile=/dev/stdin [--uuid=U]` (create),
//! `define --parent=P --jsonfile=/dev/stdin [--uuid=U]`, `start --uuid=U`, `stop --uuid=U`,
//! `undefine --uuid=U`, `modify --uuid U --auto|--manual`, `modify --parent=P --jsonfile=/dev/stdin
//! --uuid=U --defined` and the capability probe `modify --defined --live --jsonfile b --help`; plus
//! `types --dumpjson` (read from the kernel's sysfs, as mdevctl reads it) and mdevctl's own forms (`-u`,
//! `-p`, `-t`, `--type`). Output follows mdevctl's
//! shapes ([`qemu_glue::mdevctl`]). A definition's attributes (`attrs`, `--addattr`, `--delattr`) are
//! vgpud's (written in order after each create). mdevctl's call-out scripts and notifiers run around
//! each command in this process, as mdevctl runs them ([`callouts`]); `modify --live` is theirs.
//!
//! Definitions are mdevctl's, keyed by parent and UUID: vgpud keeps `/etc/mdevctl.d/<parent>/<uuid>`
//! for each of its own and lists the other files there as foreign definitions (`ListDefinitions`); a
//! command that names a foreign one has vgpud adopt it first (`AdoptDefinition`), then acts (see
//! `defined.rs` and docs/mdevctl.md). Two vgpu-manager extensions remain as a migration aid: `export`
//! writes vgpud's definitions as `<dir>/<parent>/<uuid>` files, `import` defines mdevctl's files in
//! vgpud.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args, Parser, Subcommand};
use qemu_glue::mdevctl::{
    CONFIG_DIR, MdevctlConfig, MdevctlDevice, MdevctlType, StartMode, list_json, types_json,
};
use vgpu_client::blocking::{self, ManagerCalls};
use vgpu_client::{BusAddress, InstanceInfo};

use super::daemon_cmds::BusArgs;
use super::{CliError, HostArgs};

pub mod callouts;
mod defined;
mod foreign;
mod live;
mod offline;
mod ops;

/// The `vgpuctl mdevctl` subcommands, named and spelled as mdevctl's.
#[derive(Debug, Subcommand)]
pub enum MdevctlCommand {
    /// List running mdevs (or defined ones with --defined).
    List(ListArgs),
    /// List the mdev types of each parent.
    Types {
        /// Only this parent.
        #[arg(short, long, value_name = "PARENT")]
        parent: Option<String>,
        /// Print mdevctl's JSON.
        #[arg(long)]
        dumpjson: bool,
    },
    /// Define a persistent mdev (prints the UUID when none is given).
    Define(DeviceSpec),
    /// Remove a definition (a running device stays).
    Undefine(UuidSpec),
    /// Start a defined mdev, or create a transient one (prints the UUID when none is given).
    Start(DeviceSpec),
    /// Stop a running mdev.
    Stop(UuidSpec),
    /// Change a definition: --auto/--manual, --type, or a --jsonfile.
    Modify(ModifyArgs),
    /// Start the parent's definitions marked auto (what mdevctl's udev rule runs when a parent appears).
    #[command(hide = true)]
    StartParentMdevs {
        /// The parent device (its sysfs name).
        parent: String,
    },
    /// vgpu-manager extension: write vgpud's definitions as mdevctl definition files.
    Export {
        /// The mdevctl definition directory to write `<parent>/<uuid>` files into.
        #[arg(long, value_name = "DIR", default_value = CONFIG_DIR)]
        dir: PathBuf,
    },
    /// vgpu-manager extension: define mdevctl's definition files in vgpud.
    Import {
        /// The mdevctl definition directory to read `<parent>/<uuid>` files from.
        #[arg(long, value_name = "DIR", default_value = CONFIG_DIR)]
        dir: PathBuf,
        /// Only show what would be defined.
        #[arg(long)]
        dry_run: bool,
    },
}

/// `list` options (mdevctl's).
#[derive(Debug, Args)]
pub struct ListArgs {
    /// List defined devices, running or not.
    #[arg(short, long)]
    defined: bool,
    /// Print mdevctl's JSON.
    #[arg(long)]
    dumpjson: bool,
    /// More detail (a definition's attributes).
    #[arg(short, long)]
    verbose: bool,
    /// Only this device.
    #[arg(short, long, value_name = "UUID")]
    uuid: Option<String>,
    /// Only devices of this parent.
    #[arg(short, long, value_name = "PARENT")]
    parent: Option<String>,
}

/// A device given by UUID, parent, type or JSON file (`define`, `start`).
#[derive(Debug, Args)]
pub struct DeviceSpec {
    /// The device's UUID; without one, a new UUID is made and printed.
    #[arg(short, long, value_name = "UUID")]
    uuid: Option<String>,
    /// The parent device (its sysfs name, e.g. 0000:3b:00.0).
    #[arg(short, long, value_name = "PARENT")]
    parent: Option<String>,
    /// The mdev type id (e.g. nvidia-231).
    #[arg(
        short = 't',
        long = "type",
        value_name = "TYPE",
        conflicts_with = "jsonfile"
    )]
    mdev_type: Option<String>,
    /// Read the configuration from FILE (`/dev/stdin` as libvirt passes it).
    #[arg(long, value_name = "FILE")]
    jsonfile: Option<PathBuf>,
    /// Start automatically when the parent appears (define).
    #[arg(short, long, conflicts_with = "jsonfile")]
    auto: bool,
    /// Go on when a call-out script refuses the command (its `pre` call-out).
    #[arg(short, long)]
    force: bool,
}

/// A device given by UUID (and optionally its parent).
#[derive(Debug, Args)]
pub struct UuidSpec {
    /// The device's mdev UUID.
    #[arg(short, long, value_name = "UUID")]
    uuid: String,
    /// Its parent device (its sysfs name), checked against the device when given.
    #[arg(short, long, value_name = "PARENT")]
    parent: Option<String>,
    /// Go on when a call-out script refuses the command (its `pre` call-out).
    #[arg(short, long)]
    force: bool,
}

/// `modify` options, combined as mdevctl's command line allows (mdevctl src/cli.rs `Modify`: one of
/// --auto, --manual, --addattr, --delattr or --jsonfile is required and they exclude each other; --type
/// goes with --auto/--manual or an attribute change; --live needs --jsonfile).
#[derive(Debug, Args)]
#[command(group(
    ArgGroup::new("change")
        .required(true)
        .args(["auto", "manual", "addattr", "delattr", "jsonfile"])
))]
pub struct ModifyArgs {
    /// The UUID of the definition to change.
    #[arg(short, long, value_name = "UUID")]
    uuid: String,
    /// Its parent device (its sysfs name, e.g. 0000:3b:00.0).
    #[arg(short, long, value_name = "PARENT")]
    parent: Option<String>,
    /// New mdev type.
    #[arg(short = 't', long = "type", value_name = "TYPE")]
    mdev_type: Option<String>,
    /// Start automatically.
    #[arg(short, long, conflicts_with_all = ["index", "value"])]
    auto: bool,
    /// Start only when asked.
    #[arg(short, long, conflicts_with_all = ["index", "value"])]
    manual: bool,
    /// New configuration from FILE.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["mdev_type", "index", "value"])]
    jsonfile: Option<PathBuf>,
    /// Change the definition (the default).
    #[arg(short, long)]
    defined: bool,
    /// Change the running device, through a call-out script that supports the `live` event.
    #[arg(short, long, conflicts_with_all = ["mdev_type", "index", "value"], requires = "jsonfile")]
    live: bool,
    /// Add an attribute NAME (with --value; at --index, else at the end).
    #[arg(long, value_name = "NAME", requires = "value")]
    addattr: Option<String>,
    /// Delete the attribute at --index (else the last).
    #[arg(long)]
    delattr: bool,
    /// Attribute index.
    #[arg(short, long)]
    index: Option<u32>,
    /// Attribute value.
    #[arg(long, conflicts_with = "delattr", requires = "addattr")]
    value: Option<String>,
    /// Go on when a call-out script refuses the command (its `pre` call-out).
    #[arg(short, long)]
    force: bool,
}

/// `mdevctl`: vgpuctl invoked under that name (a symlink), a program of its own whose usage, errors and
/// exit codes are mdevctl's.
#[derive(Debug, Parser)]
#[command(
    name = "mdevctl",
    version,
    about = "Manage mediated devices through vgpud (vgpu-manager's mdevctl-compatible front end)"
)]
struct MdevctlProgram {
    #[command(flatten)]
    bus: BusArgs,
    #[command(subcommand)]
    command: MdevctlCommand,
}

/// `lsmdev`: `mdevctl list` under its own name, as mdevctl installs it.
#[derive(Debug, Parser)]
#[command(
    name = "lsmdev",
    version,
    about = "List mediated devices (vgpu-manager's mdevctl-compatible front end)"
)]
struct LsmdevProgram {
    #[command(flatten)]
    bus: BusArgs,
    #[command(flatten)]
    list: ListArgs,
}

/// The program vgpuctl runs as, from the file name of `argv[0]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Program {
    /// Invoked as `mdevctl`.
    Mdevctl,
    /// Invoked as `lsmdev`.
    Lsmdev,
}

impl Program {
    /// The program `argv0` names, if it is `mdevctl` or `lsmdev` (mdevctl's src/main.rs decides the same
    /// way, by the name it was run under).
    pub fn of(argv0: &OsStr) -> Option<Program> {
        match Path::new(argv0).file_name()?.to_str()? {
            "mdevctl" => Some(Program::Mdevctl),
            "lsmdev" => Some(Program::Lsmdev),
            _ => None,
        }
    }
}

/// mdevctl's exit status for a failed command: its `main` returns an error, which Rust reports with
/// `Error: ` and status 1 (mdevctl src/main.rs). Usage errors keep clap's status 2, as in mdevctl.
pub const EXIT_FAILED: i32 = 1;

/// Runs `args` as `program`: parses them with mdevctl's command line, runs the command against vgpud,
/// and reports a failure as mdevctl does (`Error: …` on `err`, status [`EXIT_FAILED`]). Returns the exit
/// status.
pub fn run_program(
    program: Program,
    args: Vec<OsString>,
    teardown: super::Teardown,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
    let parsed = match program {
        Program::Mdevctl => {
            super::parse_args::<MdevctlProgram>(args, teardown).map(|p| (p.bus, p.command))
        }
        Program::Lsmdev => super::parse_args::<LsmdevProgram>(args, teardown)
            .map(|p| (p.bus, MdevctlCommand::List(p.list))),
    };
    let (bus, command) = match parsed {
        Ok(p) => p,
        Err(e) => {
            let text = e.render().to_string();
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            return if e.use_stderr() { super::EXIT_USAGE } else { 0 };
        }
    };
    // mdevctl reads the live sysfs; VGPU_SYSFS_ROOT points it below another root, as for vgpuctl.
    let host = HostArgs {
        sim: None,
        sim_journal: None,
        sysfs_root: std::env::var_os("VGPU_SYSFS_ROOT").map(PathBuf::from),
    };
    match run(&command, &bus, &host, out) {
        Ok(()) => 0,
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            let _ = writeln!(err, "Error: {e}");
            EXIT_FAILED
        }
    }
}

/// Runs one mdevctl command against vgpud on `bus`. `types` reads the kernel's mdev parents from `host`
/// itself, as mdevctl does, and asks vgpud only when the host shows none.
pub fn run(
    cmd: &MdevctlCommand,
    bus: &BusArgs,
    host: &HostArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if let MdevctlCommand::Types { parent, dumpjson } = cmd
        && let Some(parents) = host_types(host, parent.as_deref())
    {
        return print_types(&parents, *dumpjson, out);
    }
    let bus: BusAddress = bus.bus.parse()?;
    let result = blocking::Client::connect_for_calls(&bus)
        .map_err(CliError::from)
        .and_then(|mut daemon| run_with_callouts(cmd, &mut daemon, &mut host_callouts(host), out));
    match (cmd, result) {
        (MdevctlCommand::List(a), Err(e))
            if a.defined && host.sim.is_none() && offline::daemon_absent(&e) =>
        {
            let root = host
                .sysfs_root
                .clone()
                .unwrap_or_else(|| PathBuf::from("/"));
            offline::list_defined(&root, a, out)
        }
        (_, result) => result,
    }
}

/// The call-out scripts of the host the front end runs on: those below the sysfs root (`/` on the
/// live host, as mdevctl's below its root), none for a simulated host.
fn host_callouts(host: &HostArgs) -> callouts::Callouts {
    match (&host.sim, &host.sysfs_root) {
        (Some(_), _) => callouts::Callouts::none(),
        (None, Some(root)) => callouts::Callouts::below(root),
        (None, None) => callouts::Callouts::below(Path::new("/")),
    }
}

/// Runs one mdevctl command against `daemon`, without call-out scripts.
#[cfg(test)]
pub fn run_with(
    cmd: &MdevctlCommand,
    daemon: &mut dyn ManagerCalls,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    run_with_callouts(cmd, daemon, &mut callouts::Callouts::none(), out)
}

/// Runs one mdevctl command against `daemon`, with the call-out scripts of `co` around it as mdevctl
/// runs them (see [`callouts`]).
pub fn run_with_callouts(
    cmd: &MdevctlCommand,
    daemon: &mut dyn ManagerCalls,
    co: &mut callouts::Callouts,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match cmd {
        MdevctlCommand::List(a) => list(daemon, a, co, out),
        MdevctlCommand::Types { parent, dumpjson } => {
            print_types(&daemon_types(daemon, parent.as_deref())?, *dumpjson, out)
        }
        MdevctlCommand::Define(s) => ops::define(daemon, s, co, out),
        MdevctlCommand::Undefine(s) => ops::undefine(daemon, s, co),
        MdevctlCommand::Start(s) => ops::start(daemon, s, co, out),
        MdevctlCommand::Stop(s) => ops::stop(daemon, s, co),
        MdevctlCommand::Modify(m) if m.live => live::modify(daemon, m, co),
        MdevctlCommand::Modify(m) => ops::modify(daemon, m, co),
        MdevctlCommand::StartParentMdevs { parent } => ops::start_parent_mdevs(daemon, parent, co),
        MdevctlCommand::Export { dir } => ops::export(daemon, dir, out),
        MdevctlCommand::Import { dir, dry_run } => ops::import(daemon, dir, *dry_run, out),
    }
}

fn bad(msg: impl Into<String>) -> CliError {
    CliError::BadArgument(msg.into())
}

/// The mdevctl view of an instance with its definition's attributes; `None` when it has no usable
/// parent or type.
fn as_device(i: &InstanceInfo, attrs: Vec<(String, String)>) -> Option<MdevctlDevice> {
    let parent = if i.parent.is_empty() {
        &i.gpu
    } else {
        &i.parent
    };
    Some(MdevctlDevice {
        parent: parent.clone(),
        uuid: i.uuid.parse().ok()?,
        config: MdevctlConfig {
            mdev_type: i.type_id.parse().ok()?,
            start: StartMode::from_autostart(i.autostart),
            attrs,
        },
    })
}

fn same_uuid(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

fn list(
    daemon: &mut dyn ManagerCalls,
    a: &ListArgs,
    co: &mut callouts::Callouts,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if let Some(u) = &a.uuid {
        u.parse::<mdev_types::ids::MdevUuid>()
            .map_err(|_| bad(format!("'{u}' is not a UUID")))?;
    }
    if a.defined {
        return defined::list(daemon, a, out);
    }
    // A running device is also defined when a definition of its UUID exists on its parent (vgpud's
    // or a foreign file in /etc/mdevctl.d), as mdevctl marks it.
    let definitions = daemon.list_definitions()?;
    let instances = daemon.list_instances()?;
    let chosen: Vec<(MdevctlDevice, &'static str)> = instances
        .iter()
        .filter(|i| i.state == "running")
        .filter(|i| a.uuid.as_deref().is_none_or(|u| same_uuid(u, &i.uuid)))
        .filter_map(|i| as_device(i, Vec::new()))
        .filter(|d| a.parent.as_deref().is_none_or(|p| p == d.parent))
        .map(|d| {
            let is_defined = definitions
                .iter()
                .any(|x| same_uuid(&x.uuid, &d.uuid.to_string()) && x.parent == d.parent);
            (d, if is_defined { " (defined)" } else { "" })
        })
        .collect();
    // A running device's attributes are what its call-out script's `get attributes` reports; an
    // answer that cannot be read is left out (mdevctl src/environment.rs get_active_devices).
    let mut chosen = chosen;
    for (d, _) in &mut chosen {
        match co.attributes(&callouts::protocol::Device::from(&*d)) {
            Ok(Some(attrs)) => d.config.attrs = attrs,
            Ok(None) => {}
            Err(e) => {
                tracing::info!(uuid = %d.uuid, error = %e, "attributes of a running device not shown")
            }
        }
    }
    print_list(chosen, a, out)
}

/// Prints `list` output: each device with the note after its text line (` (defined)` in the active
/// list, ` (active)` in the defined one).
fn print_list(
    chosen: Vec<(MdevctlDevice, &'static str)>,
    a: &ListArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if a.dumpjson {
        // mdevctl prints a single device's bare configuration when filtered by UUID (src/main.rs
        // list_command), so that it can be saved as a definition file.
        let text = match (&a.uuid, chosen.as_slice()) {
            (Some(_), [(d, _)]) => d.config.to_json_pretty(),
            _ => list_json(&chosen.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>()),
        };
        // mdevctl writes its JSON without a final newline.
        write!(out, "{text}")?;
        return Ok(());
    }
    let mut sorted = chosen;
    sorted.sort_by(|(x, _), (y, _)| (&x.parent, x.uuid).cmp(&(&y.parent, y.uuid)));
    for (d, also) in sorted {
        // mdevctl's text form (src/mdev.rs to_text): UUID PARENT TYPE auto|manual, then whether the
        // device is also defined (active list) or also running (defined list).
        writeln!(
            out,
            "{} {} {} {}{also}",
            d.uuid,
            d.parent,
            d.config.mdev_type,
            d.config.start.as_str()
        )?;
        if a.verbose && !d.config.attrs.is_empty() {
            // mdevctl src/mdev.rs to_text, verbose: `  Attrs:`, then `    @{N}: {"name":"value"}`.
            writeln!(out, "  Attrs:")?;
            for (n, (name, value)) in d.config.attrs.iter().enumerate() {
                let one = serde_json::json!({ name.as_str(): value });
                writeln!(out, "    @{{{n}}}: {one}")?;
            }
        }
    }
    Ok(())
}

/// The kernel's mdev parents and their types as mdevctl lists them (mdevctl src/environment.rs
/// `get_supported_types`: every entry of `/sys/class/mdev_bus`, types by name, `name` and `description`
/// trimmed and left out when empty, a description's line breaks shown as ", "). `None` when the host shows
/// no mdev parent at all (vgpud on a simulated host, or the host cannot be read): then vgpud's view serves.
fn host_types(host: &HostArgs, parent: Option<&str>) -> Option<Vec<(String, Vec<MdevctlType>)>> {
    let host = host
        .open()
        .map_err(|e| tracing::debug!(error = %e, "no host to read mdev types from"))
        .ok()?;
    let inventory = vgpu_host::discover::discover(host.as_ref())
        .map_err(|e| tracing::warn!(error = %e, "cannot read the mdev parents; asking vgpud"))
        .ok()?;
    if inventory.mdev_parents.is_empty() {
        return None;
    }
    let text = |t: &Option<String>| {
        t.as_deref()
            .map(|t| t.trim().replace('\n', ", "))
            .filter(|t| !t.is_empty())
    };
    let mut parents: Vec<(String, Vec<MdevctlType>)> = inventory
        .mdev_parents
        .into_iter()
        .filter(|p| parent.is_none_or(|want| want == p.name))
        .map(|p| {
            let mut types: Vec<MdevctlType> = p
                .types
                .iter()
                .map(|t| MdevctlType {
                    type_id: t.id.to_string(),
                    available_instances: t.available_instances,
                    device_api: t.device_api.trim().to_string(),
                    name: text(&t.name),
                    description: text(&t.description),
                })
                .collect();
            types.sort_by(|a, b| a.type_id.cmp(&b.type_id));
            (p.name, types)
        })
        .collect();
    parents.sort_by(|a, b| a.0.cmp(&b.0));
    Some(parents)
}

/// vgpud's view of the mdev types: the parents it treats as GPUs, without names or descriptions.
fn daemon_types(
    daemon: &mut dyn ManagerCalls,
    parent: Option<&str>,
) -> Result<Vec<(String, Vec<MdevctlType>)>, CliError> {
    let mut parents: Vec<(String, Vec<MdevctlType>)> = daemon
        .list_gpus()?
        .into_iter()
        // Only mdev parents have types; ListGpus reports a GPU's types from the parent named like it.
        .filter(|g| !g.types.is_empty() && parent.is_none_or(|p| p == g.id))
        .map(|g| {
            let types = g
                .types
                .into_iter()
                .map(|t| MdevctlType {
                    type_id: t.type_id,
                    available_instances: t.available,
                    // Every GPU mdev type vgpud manages is a PCI device for the guest (NVIDIA, GVT-g and
                    // the sample drivers all report device_api vfio-pci; vfio-mdev ABI
                    // Documentation/driver-api/vfio-mediated-device.rst). vgpud's ListGpus does not carry
                    // the type's name and description, so they are left out as mdevctl does when empty.
                    device_api: "vfio-pci".into(),
                    name: None,
                    description: None,
                })
                .collect();
            (g.id, types)
        })
        .collect();
    parents.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(parents)
}

/// Prints `types` as mdevctl does (src/main.rs types_command).
fn print_types(
    parents: &[(String, Vec<MdevctlType>)],
    dumpjson: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if dumpjson {
        // mdevctl writes its JSON without a final newline.
        write!(out, "{}", types_json(parents))?;
        return Ok(());
    }
    for (p, ts) in parents {
        writeln!(out, "{p}")?;
        for t in ts {
            writeln!(
                out,
                "  {}\n    Available instances: {}\n    Device API: {}",
                t.type_id, t.available_instances, t.device_api
            )?;
            if let Some(n) = &t.name {
                writeln!(out, "    Name: {n}")?;
            }
            if let Some(d) = &t.description {
                writeln!(out, "    Description: {d}")?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod callout_tests;
#[cfg(test)]
mod tests;
