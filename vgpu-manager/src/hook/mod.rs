//! The libvirt hook that gives domains their vGPUs on demand.
//!
//! Installed as `/etc/libvirt/hooks/qemu.d/vgpu-manager` (libvirt runs every executable there, and
//! `/etc/libvirt/hooks/qemu`, with the arguments `<domain> <operation> <sub-operation> <extra>` and the
//! domain XML on stdin; libvirt "Hooks for specific system management", QEMU guest section). It acts on
//! two of them and exits 0 at once for every other, without reading stdin or touching D-Bus:
//!
//! - `prepare begin` (before the domain's resources are set up, also for restore and incoming
//!   migration; a non-zero exit stops the start): for each `<hostdev type='mdev'>` of the domain,
//!   - running already → nothing (a type named in the metadata must match);
//!   - defined but stopped → `Start`;
//!   - unknown → `Create` with the hostdev's UUID, of the profile or type that vgpu-manager's
//!     `<metadata>` element gives for it (see [`qemu_glue::metadata`]), labelled `libvirt:<domain>`;
//!     without such an entry the start fails with a message saying what to add.
//!
//!   If one fails, what this run created is destroyed and what it started is stopped again.
//! - `release end` (after the domain's resources are released): for each mdev hostdev,
//!   - a transient instance this hook created (owner `daemon`, label `libvirt:<domain>`) → `Destroy`;
//!   - a definition with autostart off (an on-demand vGPU) → `Stop`;
//!   - anything else (autostart definitions, other transient instances, foreign devices) stays.
//!
//! A domain without mdev hostdevs never contacts the daemon, so guests without vGPUs do not depend on
//! vgpud; nor does a guest whose mdevs all exist already (made by mdevctl, say) when vgpud cannot be
//! reached: `prepare` then lets it start with a warning. The bus is `VGPU_BUS` (default: the system
//! bus).

#[cfg(test)]
pub(crate) mod fake;
#[cfg(test)]
mod tests;

use std::fmt;

use mdev_types::ids::MdevUuid;
use qemu_glue::metadata::{METADATA_NS, VgpuTarget};
use qemu_glue::parse::{DomainDevices, ParseError, parse_domain};
use thiserror::Error;
use vgpu_client::blocking::ManagerCalls;
use vgpu_client::{ClientError, NewInstance};

/// The file name the hook is installed under in `/etc/libvirt/hooks/qemu.d/`.
pub const HOOK_NAME: &str = "vgpu-manager";

/// The label of instances the hook creates for `domain`.
pub fn label_for(domain: &str) -> String {
    format!("libvirt:{domain}")
}

/// Why the hook failed. Each says which domain and device, and what to do.
#[derive(Debug, Error)]
pub enum HookError {
    /// Not called the way libvirt calls hooks.
    #[error(
        "expected the 4 arguments libvirt passes (<domain> <operation> <sub-operation> <extra>), got {0}: this program is run by libvirtd from /etc/libvirt/hooks/qemu.d/"
    )]
    Usage(usize),
    /// stdin could not be read.
    #[error("domain {domain}: cannot read the domain XML from stdin: {source}")]
    Stdin {
        /// The libvirt domain name the hook was called for.
        domain: String,
        /// The I/O error from reading stdin.
        source: std::io::Error,
    },
    /// The domain XML is not usable.
    #[error("domain {domain}: {source}")]
    Parse {
        /// The domain (from the arguments).
        domain: String,
        /// What is wrong with the XML.
        source: ParseError,
    },
    /// vgpud could not be reached.
    #[error("domain {domain}: {source}")]
    Connect {
        /// The libvirt domain name the hook was called for.
        domain: String,
        /// The client's error.
        source: ClientError,
    },
    /// One or more devices could not be handled; each entry names the UUID and the reason.
    #[error("domain {domain}, {op}: {}", .failures.join("; "))]
    Devices {
        /// The libvirt domain name the hook was called for.
        domain: String,
        /// `prepare` or `release`.
        op: String,
        /// One line per failed device (and failed rollback).
        failures: Vec<String>,
    },
}

/// One libvirt hook call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The libvirt domain name, the hook's first argument.
    pub domain: String,
    /// The operation (`prepare`, `start`, `started`, `stopped`, `release`, `migrate`, `restore`,
    /// `reconnect`, `attach`).
    pub op: String,
    /// The sub-operation (`begin`, `end`, `-`).
    pub subop: String,
    /// The extra argument (`-` for most).
    pub extra: String,
}

impl Invocation {
    /// From the program's arguments (without the program name).
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Self, HookError> {
        match args {
            [d, o, s, e] => Ok(Invocation {
                domain: d.as_ref().to_string(),
                op: o.as_ref().to_string(),
                subop: s.as_ref().to_string(),
                extra: e.as_ref().to_string(),
            }),
            _ => Err(HookError::Usage(args.len())),
        }
    }

    fn phase(&self) -> Option<Phase> {
        match (self.op.as_str(), self.subop.as_str()) {
            ("prepare", "begin") => Some(Phase::Prepare),
            ("release", "end") => Some(Phase::Release),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Prepare,
    Release,
}

/// What the hook did with one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookAction {
    /// Created with this target.
    Created(String, String),
    /// Started (a stopped definition).
    Started(String),
    /// Already running; nothing done.
    AlreadyRunning(String),
    /// Destroyed (a transient instance the hook created).
    Destroyed(String),
    /// Stopped (an on-demand definition).
    Stopped(String),
    /// Left alone, with the reason.
    Left(String, &'static str),
}

impl fmt::Display for HookAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HookAction::Created(u, t) => write!(f, "created {u} ({t})"),
            HookAction::Started(u) => write!(f, "started {u}"),
            HookAction::AlreadyRunning(u) => write!(f, "{u} already running"),
            HookAction::Destroyed(u) => write!(f, "destroyed {u}"),
            HookAction::Stopped(u) => write!(f, "stopped {u}"),
            HookAction::Left(u, why) => write!(f, "left {u} ({why})"),
        }
    }
}

/// Runs one hook call. `read_stdin` and `connect` are called only when needed: not for operations the
/// hook ignores, and `connect` not for domains without mdev hostdevs. `exists` tells whether an mdev
/// device exists on the host; it is asked only when vgpud cannot be reached.
pub fn run<D, R, C, E>(
    inv: &Invocation,
    read_stdin: R,
    connect: C,
    exists: E,
) -> Result<Vec<HookAction>, HookError>
where
    D: ManagerCalls,
    R: FnOnce() -> std::io::Result<String>,
    C: FnOnce() -> Result<D, ClientError>,
    E: Fn(&MdevUuid) -> bool,
{
    let Some(phase) = inv.phase() else {
        return Ok(Vec::new());
    };
    let domain = inv.domain.clone();
    let xml = read_stdin().map_err(|source| HookError::Stdin {
        domain: domain.clone(),
        source,
    })?;
    let devices = parse_domain(&xml).map_err(|source| HookError::Parse {
        domain: domain.clone(),
        source,
    })?;
    if devices.mdevs.is_empty() {
        return Ok(Vec::new());
    }
    let mut daemon = match connect() {
        Ok(d) => d,
        // Devices someone else made need nothing from vgpud to be used; only missing ones do.
        Err(_) if phase == Phase::Prepare && devices.mdevs.iter().all(|m| exists(&m.uuid)) => {
            return Ok(devices
                .mdevs
                .iter()
                .map(|m| HookAction::Left(m.uuid.to_string(), "vgpud unreachable, device exists"))
                .collect());
        }
        Err(source) => return Err(HookError::Connect { domain, source }),
    };
    match phase {
        Phase::Prepare => prepare(&mut daemon, &inv.domain, &devices),
        Phase::Release => release(&mut daemon, &inv.domain, &devices),
    }
}

fn target_text(t: &VgpuTarget) -> String {
    match t {
        VgpuTarget::Profile(p) => format!("profile {p}"),
        VgpuTarget::Type(t) => format!("type {t}"),
    }
}

fn prepare_one<D: ManagerCalls>(
    d: &mut D,
    domain: &str,
    devices: &DomainDevices,
    uuid: &str,
) -> Result<HookAction, String> {
    let request = devices
        .mdevs
        .iter()
        .find(|m| m.uuid.to_string() == uuid)
        .and_then(|m| devices.request_for(&m.uuid));
    let info = d.get_instance(uuid).map_err(|e| format!("{uuid}: {e}"))?;
    if let Some(i) = info {
        if let Some(VgpuTarget::Type(t)) = request.map(|r| &r.target)
            && t.as_str() != i.type_id
        {
            return Err(format!(
                "{uuid} exists as type {} but the domain's metadata asks for {t}: destroy it (`vgpuctl destroy {uuid}`) or fix the metadata",
                i.type_id
            ));
        }
        if i.state == "running" {
            return Ok(HookAction::AlreadyRunning(uuid.to_string()));
        }
        d.start(uuid).map_err(|e| format!("{uuid}: {e}"))?;
        return Ok(HookAction::Started(uuid.to_string()));
    }
    let Some(r) = request else {
        return Err(format!(
            "mdev {uuid} does not exist and the domain does not say what to create: add <vgpu:mdev uuid='{uuid}' profile='NAME'/> inside <vgpu:vgpus xmlns:vgpu='{METADATA_NS}'> under <metadata> (`virsh metadata`), or define it with `vgpuctl define --uuid {uuid} --profile NAME`"
        ));
    };
    let mut new = match &r.target {
        VgpuTarget::Profile(p) => NewInstance::of_profile(p),
        VgpuTarget::Type(t) => NewInstance::of_type(t.as_str()),
    };
    new.gpu = r.gpu.clone();
    new.uuid = Some(uuid.to_string());
    new.label = Some(label_for(domain));
    d.create(&new).map_err(|e| format!("{uuid}: {e}"))?;
    Ok(HookAction::Created(
        uuid.to_string(),
        target_text(&r.target),
    ))
}

fn prepare<D: ManagerCalls>(
    d: &mut D,
    domain: &str,
    devices: &DomainDevices,
) -> Result<Vec<HookAction>, HookError> {
    let mut done = Vec::new();
    for m in &devices.mdevs {
        let uuid = m.uuid.to_string();
        match prepare_one(d, domain, devices, &uuid) {
            Ok(step) => done.push(step),
            Err(why) => {
                let mut failures = vec![why];
                // Undo this run's work, newest first, so a failed start leaves nothing behind.
                for step in done.iter().rev() {
                    let undo = match step {
                        HookAction::Created(u, _) => d.destroy(u).map_err(|e| (u, e)),
                        HookAction::Started(u) => d.stop(u).map_err(|e| (u, e)),
                        _ => Ok(()),
                    };
                    if let Err((u, e)) = undo {
                        failures.push(format!("rolling back {u} failed: {e}"));
                    }
                }
                return Err(HookError::Devices {
                    domain: domain.to_string(),
                    op: "prepare".into(),
                    failures,
                });
            }
        }
    }
    Ok(done)
}

fn release<D: ManagerCalls>(
    d: &mut D,
    domain: &str,
    devices: &DomainDevices,
) -> Result<Vec<HookAction>, HookError> {
    let label = label_for(domain);
    let mut done = Vec::new();
    let mut failures = Vec::new();
    for m in &devices.mdevs {
        let uuid = m.uuid.to_string();
        let step = match d.get_instance(&uuid) {
            Err(e) => Err(e),
            Ok(None) => Ok(HookAction::Left(uuid.clone(), "already gone")),
            Ok(Some(i)) if i.state != "running" => {
                Ok(HookAction::Left(uuid.clone(), "not running"))
            }
            Ok(Some(i)) if i.owner == "foreign" => Ok(HookAction::Left(
                uuid.clone(),
                "not created by vgpu-manager",
            )),
            Ok(Some(i)) if !i.defined && i.owner == "daemon" && i.label == label => d
                .destroy(&uuid)
                .map(|()| HookAction::Destroyed(uuid.clone())),
            Ok(Some(i)) if i.defined && !i.autostart => {
                d.stop(&uuid).map(|()| HookAction::Stopped(uuid.clone()))
            }
            Ok(Some(i)) if i.defined => Ok(HookAction::Left(uuid.clone(), "autostart definition")),
            Ok(Some(_)) => Ok(HookAction::Left(
                uuid.clone(),
                "transient, not created for this domain",
            )),
        };
        match step {
            Ok(s) => done.push(s),
            Err(e) => failures.push(format!("{uuid}: {e}")),
        }
    }
    if failures.is_empty() {
        Ok(done)
    } else {
        Err(HookError::Devices {
            domain: domain.to_string(),
            op: "release".into(),
            failures,
        })
    }
}
