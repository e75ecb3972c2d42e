//! `vgpuctl`: the admin CLI. Commands render human tables or, with `--json`, the stable JSON documented in
//! `docs/json.md`. Every user error is one line on stderr and exit code 2.

use std::ffi::OsString;
use std::io::Write;

use clap::{Parser, Subcommand};
use thiserror::Error;

mod completions;
mod daemon_cmds;
mod daemon_line;
mod discover;
mod export;
mod host_select;
mod mdevctl;
mod metrics;
mod migration;
mod offers;
mod open_device;
mod pool;
mod preflight;
mod profiles;
mod sched;
mod table;
mod viability;
mod xml;

/// Readers of what mdevctl call-out scripts print: the `get capabilities` answer ([`Capabilities`])
/// and the `get attributes` answer ([`attributes_from_answer`]).
pub use mdevctl::callouts::protocol::{
    AttributesAnswerError, Capabilities, attributes_from_answer,
};

pub use host_select::HostArgs;
pub use table::Table;

/// Exit code for a refused request or bad input.
pub const EXIT_USAGE: i32 = 2;

/// A command's failure, printed as one line.
#[derive(Debug, Error)]
pub enum CliError {
    /// The host could not be opened (unknown simulated host, missing sysfs root).
    #[error("{0}")]
    Host(String),
    /// Discovery failed.
    #[error("discovery failed: {0}")]
    Discover(#[from] vgpu_host::discover::DiscoverError),
    /// A bad argument value.
    #[error("{0}")]
    BadArgument(String),
    /// A profile could not be loaded or is invalid.
    #[error("{0}")]
    Profile(String),
    /// vgpud refused, or could not be reached.
    #[error(transparent)]
    Daemon(#[from] vgpu_client::ClientError),
    /// Writing the output failed (e.g. a closed pipe).
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// An mdevctl call-out script refused the command or could not be run.
    #[error(transparent)]
    Callout(#[from] mdevctl::callouts::CalloutError),
}

/// vgpuctl — manage virtual GPUs on this host.
#[derive(Debug, Parser)]
#[command(name = "vgpuctl", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    host: HostArgs,
    #[command(flatten)]
    bus: daemon_cmds::BusArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Daemon(daemon_cmds::DaemonCommand),
    /// Show every GPU, what it can offer guests, and existing mdev instances.
    Discover {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Show the mdev types each parent offers (or one GPU's with --gpu).
    Types {
        /// Only this GPU or mdev parent (PCI address such as 0000:3b:00.0 or 3b:00.0, or a parent name).
        #[arg(long, value_name = "ADDR")]
        gpu: Option<String>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Match a profile against every GPU: the best option per GPU, or why it cannot serve.
    Match {
        /// A profile name (`vgpuctl profiles list`) or a profile file (`./my.toml`).
        profile: String,
        /// Also load the profiles in this directory (overriding shipped ones with the same name).
        #[arg(long, value_name = "DIR")]
        profiles_dir: Option<std::path::PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// List or check profiles.
    #[command(subcommand)]
    Profiles(ProfilesCommand),
    /// Pools of vGPU slots: `plan FILE` (offline dry run), `apply FILE` and `status` (through vgpud).
    #[command(subcommand)]
    Pool(pool::PoolCommand),
    /// Configuration for fleet engines: the KubeVirt CR fragment or the nova.conf fragment that hands
    /// the pools' slots to their guests.
    #[command(subcommand)]
    Export(export::ExportCommand),
    /// Time-slice scheduling of a GPU: plan, apply, show (weights → the vendor's knob).
    #[command(subcommand)]
    Sched(sched::SchedCommand),
    /// libvirt XML (a <hostdev> or a whole example domain) or QEMU arguments for an instance.
    Xml(xml::XmlArgs),
    /// An mdevctl-compatible front end to vgpud (what libvirt's node-device driver runs as `mdevctl`).
    #[command(subcommand)]
    Mdevctl(mdevctl::MdevctlCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to print the completion script for.
        shell: clap_complete::Shell,
    },
    /// Open an mdev or a device on vfio-pci through VFIO as a VMM would (needs root, live kernel).
    Preflight(preflight::PreflightArgs),
    /// Receive a running instance's VFIO fds from vgpud (as an unprivileged VMM does) and check them,
    /// or run a command (a VMM) with them.
    OpenDevice(open_device::OpenDeviceArgs),
    /// Live migration of an instance: what it supports, its compatibility fingerprint, and whether a
    /// target host can take it.
    #[command(subcommand)]
    Migration(migration::MigrationCommand),
    /// Whether a PCI device may be handed to a guest through VFIO (its IOMMU group); changes nothing.
    Viability {
        /// The PCI address (`0000:01:00.0` or `01:00.0`).
        addr: String,
        /// Print JSON (docs/json.md).
        #[arg(long)]
        json: bool,
    },
    /// Print every metric family vgpud exports once (through vgpud), e.g. for node_exporter's textfile
    /// collector.
    Metrics(metrics::MetricsArgs),
    /// Print the man page, or write one page per command into --dir.
    Manpage {
        /// Write vgpuctl.1 and vgpuctl-COMMAND.1 files here.
        #[arg(long, value_name = "DIR")]
        dir: Option<std::path::PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
enum ProfilesCommand {
    /// List the shipped profiles (and those of --profiles-dir).
    List {
        /// Also load the profiles in this directory.
        #[arg(long, value_name = "DIR")]
        profiles_dir: Option<std::path::PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate profile files; exit code 2 if any is invalid.
    Check {
        /// The profile files to validate.
        #[arg(required = true, value_name = "FILE")]
        files: Vec<std::path::PathBuf>,
        /// Print JSON instead of lines.
        #[arg(long)]
        json: bool,
    },
}

/// Runs vgpuctl with `args` (including the program name), writing to `out` and `err`; returns the exit code.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_with(args, Teardown::Drop, out, err)
}

/// What becomes of clap's command tree after a parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// Freed, as usual.
    Drop,
    /// Left to the process's exit: clap builds the whole tree (every subcommand and option) for each
    /// parse, and freeing it is about a fifth of a one-shot `vgpuctl`'s start-up (callgrind: 240k of
    /// 1.14M instructions for `vgpuctl --version`). Only for a process that parses once.
    Leak,
}

/// Parses `args` as `P`'s command line, then frees or leaks the command tree as `teardown` says.
pub(crate) fn parse_args<P: clap::Parser>(
    args: Vec<OsString>,
    teardown: Teardown,
) -> Result<P, clap::Error> {
    let mut cmd = P::command();
    // As clap's own `try_parse_from`: a matching error comes formatted, a conversion error is
    // formatted with the command.
    let parsed = match cmd.try_get_matches_from_mut(args) {
        Err(e) => Err(e),
        Ok(mut m) => {
            let p = P::from_arg_matches_mut(&mut m).map_err(|e| e.format(&mut cmd));
            if teardown == Teardown::Leak {
                std::mem::forget(m);
            }
            p
        }
    };
    if teardown == Teardown::Leak {
        std::mem::forget(cmd);
    }
    parsed
}

/// [`run`] for a process that runs one command line and exits (the `vgpuctl` binary): clap's command
/// tree is not freed ([`Teardown::Leak`]).
pub fn run_once<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    run_with(args, Teardown::Leak, out, err)
}

fn run_with<I, T>(args: I, teardown: Teardown, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    if let Some(program) = args.first().and_then(|a| mdevctl::Program::of(a)) {
        return mdevctl::run_program(program, args, teardown, out, err);
    }
    let parsed = if daemon_line::is_daemon_line(&args) {
        parse_args::<daemon_line::DaemonCli>(args, teardown).map(|d| Cli {
            host: d.host,
            bus: d.bus,
            command: Command::Daemon(d.command),
        })
    } else {
        parse_args::<Cli>(args, teardown)
    };
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_USAGE } else { 0 };
            let text = e.render().to_string();
            let _ = if e.use_stderr() {
                err.write_all(text.as_bytes())
            } else {
                out.write_all(text.as_bytes())
            };
            return code;
        }
    };
    if let Command::Preflight(a) = &cli.command {
        return match preflight::run(&cli.host, a, out) {
            Ok(true) => 0,
            Ok(false) => preflight::EXIT_FAILED,
            Err(e) => {
                let _ = writeln!(err, "vgpuctl: {e}");
                EXIT_USAGE
            }
        };
    }
    if let Command::Migration(c) = &cli.command {
        return match migration::run(&cli.host, &cli.bus, c, out) {
            Ok(true) => 0,
            Ok(false) => preflight::EXIT_FAILED,
            Err(e) => {
                let _ = writeln!(err, "vgpuctl: {e}");
                EXIT_USAGE
            }
        };
    }
    if let Command::OpenDevice(a) = &cli.command {
        return match open_device::run(&cli.bus, a, out) {
            Ok(true) => 0,
            Ok(false) => preflight::EXIT_FAILED,
            Err(e) => {
                let _ = writeln!(err, "vgpuctl: {e}");
                EXIT_USAGE
            }
        };
    }
    match dispatch(&cli, out) {
        Ok(()) => 0,
        // A reader that went away (`vgpuctl list | head`) is not an error worth a message.
        Err(CliError::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            let _ = writeln!(err, "vgpuctl: {e}");
            EXIT_USAGE
        }
    }
}

fn dispatch(cli: &Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match &cli.command {
        Command::Daemon(c) => daemon_cmds::run(c, &cli.bus, out),
        Command::Discover { json } => discover::discover(&cli.host, *json, out),
        Command::Types { gpu, json } => discover::types(&cli.host, gpu.as_deref(), *json, out),
        Command::Match {
            profile,
            profiles_dir,
            json,
        } => profiles::matching(&cli.host, profile, profiles_dir.as_deref(), *json, out),
        Command::Profiles(ProfilesCommand::List { profiles_dir, json }) => {
            profiles::list(profiles_dir.as_deref(), *json, out)
        }
        Command::Profiles(ProfilesCommand::Check { files, json }) => {
            profiles::check(files, *json, out)
        }
        Command::Pool(c) => pool::run(c, &cli.host, &cli.bus, out),
        Command::Export(c) => export::run(c, &cli.host, &cli.bus, out),
        Command::Sched(c) => sched::run(c, &cli.host, out),
        Command::Xml(a) => xml::run(a, &cli.bus, out),
        Command::Mdevctl(c) => mdevctl::run(c, &cli.bus, &cli.host, out),
        Command::Completions { shell } => completions::completions(*shell, out),
        // Handled in `run` (its exit code depends on the report).
        Command::Preflight(_) | Command::OpenDevice(_) | Command::Migration(_) => Ok(()),
        Command::Viability { addr, json } => viability::viability(&cli.host, addr, *json, out),
        Command::Manpage { dir } => completions::manpage(dir.as_deref(), out),
        Command::Metrics(a) => metrics::run(a, &cli.bus, out),
    }
}

/// Writes `value` as pretty JSON followed by a newline.
fn write_json<T: serde::Serialize>(out: &mut dyn Write, value: &T) -> Result<(), CliError> {
    serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

/// Runs `vgpuctl ARGS…` in-process for tests: exit code, stdout, stderr.
#[cfg(test)]
pub(crate) fn run_for_test(args: &[&str]) -> (i32, String, String) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let code = run(
        std::iter::once("vgpuctl").chain(args.iter().copied()),
        &mut out,
        &mut err,
    );
    (
        code,
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
    )
}
