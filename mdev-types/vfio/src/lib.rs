//! VFIO preflight: proves a device (an mdev instance, an SR-IOV VF or a whole GPU on vfio-pci) can be
//! opened and given DMA access the way a VMM would, through vfio-ioctls.
//!
//! [`preflight`] opens the device through the type1 container/group API or through iommufd and the
//! device's vfio cdev (chosen by [`choose_backend`], or forced), reads the device info (flags, regions,
//! IRQs) and vendor/device from the PCI config region, maps a DMA buffer backed by vm-memory's
//! `GuestMemoryMmap` through the IOMMU, unmaps it and closes everything; then, unless told not to, the
//! KVM attach check ([`kvm`]) proves a KVM guest could take the device. Each step's outcome and time is
//! in the [`PreflightReport`].
//!
//! Sysfs is read through [`Host`]; the device nodes are opened directly (vfio-ioctls works on the live
//! `/dev` and `/sys`), so a preflight is meaningful only on the live kernel.
//!
//! This is the one crate of vgpu-manager with `unsafe` code: the ioctls of [`sys`] and the DMA map of
//! [`OpenedDeviceExt::map`], each block with its `// SAFETY:` reasoning.
#![deny(missing_docs)]

use std::time::Instant;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use mdev_types::ids::{PciAddress, PciId};
use vgpu_host::{Host, HostError};

mod handoff;
mod info;
pub mod kvm;
mod migration;
mod session;
pub mod sys;
mod target;

pub use handoff::OpenedDeviceExt;
pub use info::{DeviceInfo, IrqInfo, RegionInfo};
pub use mdev_types::vfio_api::{BadTarget, OpenedDevice, VfioBackend, VfioTarget};
pub use migration::{MigrationCaps, MigrationSupport, migration_support};
use session::read_config_ids;
pub use session::{DmaBuffer, RawMapError, Session};
pub use target::{TargetState, choose_backend, inspect};

/// The DMA buffer a preflight maps: 2 MiB, one huge-page-sized chunk, at IOVA 0 (below every reserved
/// region the Intel and AMD IOMMUs report in `/sys/kernel/iommu_groups/*/reserved_regions`).
pub const DEFAULT_DMA_SIZE: usize = 2 << 20;

/// Why a preflight could not start, or a VFIO, memory or KVM operation failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum VfioCheckError {
    /// The argument is neither an mdev UUID nor a PCI address.
    #[error(transparent)]
    BadTarget(#[from] BadTarget),
    /// The target is not in sysfs.
    #[error("{0} does not exist: `vgpuctl discover` lists devices and instances")]
    NoSuchTarget(VfioTarget),
    /// A PCI target is not bound to vfio-pci, so VFIO cannot open it.
    #[error("PCI device {addr} is bound to {}, not vfio-pci: VFIO can open it only once it is bound to vfio-pci (the daemon binds it when it assigns the device; `vgpuctl viability {addr}` says whether it may be)",
        driver.as_deref().unwrap_or("no driver"))]
    NotOnVfioPci {
        /// The PCI address of the device that is not on vfio-pci.
        addr: PciAddress,
        /// The driver it is bound to instead, or `None` when none is bound.
        driver: Option<String>,
    },
    /// The target has no IOMMU group.
    #[error(
        "{0} has no IOMMU group: the kernel runs without an IOMMU (boot with intel_iommu=on or amd_iommu=on)"
    )]
    NoIommuGroup(VfioTarget),
    /// A forced backend is not available for this target.
    #[error("the {backend} backend is not available for {target}: {reason}")]
    BackendUnavailable {
        /// The VFIO backend that was forced (type1 container or iommufd).
        backend: VfioBackend,
        /// The mdev instance or PCI device it was forced for.
        target: VfioTarget,
        /// Why not.
        reason: String,
    },
    /// A VFIO operation failed.
    #[error("{op} for {target} failed: {detail}")]
    Vfio {
        /// What was attempted (`opening the device`, `mapping 2 MiB for DMA`, …).
        op: String,
        /// The mdev instance or PCI device the operation was for.
        target: VfioTarget,
        /// The error chain from vfio-ioctls or the kernel, with the hint when one is known.
        detail: String,
    },
    /// Allocating the DMA buffer failed.
    #[error(
        "allocating a {size}-byte DMA buffer failed: {detail} (check RLIMIT_MEMLOCK and free memory)"
    )]
    Memory {
        /// Bytes asked for.
        size: usize,
        /// The allocator's error text.
        detail: String,
    },
    /// The host is not the live kernel (a simulated host or a sysfs tree below another root), so there is
    /// nothing VFIO could open.
    #[error(
        "preflight needs the live kernel, but {host} is not it ({target} is not in the live /sys with the same IOMMU group)"
    )]
    NotLive {
        /// The host's description.
        host: String,
        /// The mdev instance or PCI device missing from the live `/sys`.
        target: VfioTarget,
    },
    /// Reading sysfs failed.
    #[error(transparent)]
    Host(#[from] HostError),
}

/// How one step ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "detail", rename_all = "kebab-case")]
pub enum StepOutcome {
    /// It worked; the text says what was found.
    Passed(String),
    /// It failed; the text names the operation, the error and the fix.
    Failed(String),
    /// It was not attempted, for this reason (e.g. `/dev/kvm` missing, or an earlier step failed).
    Skipped(String),
}

impl StepOutcome {
    /// True for [`StepOutcome::Failed`].
    pub fn is_failed(&self) -> bool {
        matches!(self, StepOutcome::Failed(_))
    }
}

/// One step of a preflight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightStep {
    /// Its name: `open-backend`, `open-device`, `device-info`, `config-read`, `dma-map`, `dma-unmap`,
    /// `close`, `kvm-attach`.
    pub name: String,
    /// How it ended.
    #[serde(flatten)]
    pub outcome: StepOutcome,
    /// Wall time in microseconds.
    pub micros: u64,
}

/// What [`preflight`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreflightOptions {
    /// Use this backend instead of choosing.
    pub backend: Option<VfioBackend>,
    /// Size of the DMA buffer mapped (bytes; rounded up to the page size by the kernel's rules, so give
    /// a multiple of 4096).
    pub dma_size: usize,
    /// Run the KVM attach check.
    pub kvm: bool,
}

impl Default for PreflightOptions {
    fn default() -> Self {
        Self {
            backend: None,
            dma_size: DEFAULT_DMA_SIZE,
            kvm: true,
        }
    }
}

/// The structured result of a preflight (`vgpuctl preflight --json`, D-Bus `Instance1.Health`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreflightReport {
    /// What was checked.
    pub target: VfioTarget,
    /// The number of its IOMMU group (`/sys/kernel/iommu_groups/<n>`).
    pub iommu_group: u32,
    /// The VFIO backend the checks ran with (type1 container or iommufd).
    pub backend: VfioBackend,
    /// Why that backend (chosen automatically, or forced).
    pub backend_reason: String,
    /// True when no step failed (skipped steps do not fail a preflight).
    pub passed: bool,
    /// Every step in order.
    pub steps: Vec<PreflightStep>,
    /// What the device reported, when it could be opened.
    pub device: Option<DeviceInfo>,
    /// Total wall time in microseconds.
    pub total_micros: u64,
}

impl PreflightReport {
    /// The step named `name`.
    pub fn step(&self, name: &str) -> Option<&PreflightStep> {
        self.steps.iter().find(|s| s.name == name)
    }

    /// The first failed step.
    pub fn first_failure(&self) -> Option<&PreflightStep> {
        self.steps.iter().find(|s| s.outcome.is_failed())
    }
}

/// Records steps with their times.
struct Steps(Vec<PreflightStep>);

impl Steps {
    fn run<T>(
        &mut self,
        name: &str,
        f: impl FnOnce() -> Result<(T, String), VfioCheckError>,
    ) -> Option<T> {
        let start = Instant::now();
        let r = f();
        let micros = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
        let (value, outcome) = match r {
            Ok((v, text)) => (Some(v), StepOutcome::Passed(text)),
            Err(e) => (None, StepOutcome::Failed(e.to_string())),
        };
        self.0.push(PreflightStep {
            name: name.to_string(),
            outcome,
            micros,
        });
        value
    }

    fn skip(&mut self, name: &str, why: &str) {
        self.0.push(PreflightStep {
            name: name.to_string(),
            outcome: StepOutcome::Skipped(why.to_string()),
            micros: 0,
        });
    }
}

/// Resolves the backend: the forced one if it is available for this target, else the automatic choice.
fn resolve_backend(
    host: &dyn Host,
    state: &TargetState,
    forced: Option<VfioBackend>,
) -> Result<(VfioBackend, String), VfioCheckError> {
    let (auto, why) = choose_backend(host, state);
    match forced {
        None => Ok((auto, format!("chosen automatically: {why}"))),
        Some(b) if b == auto => Ok((b, format!("forced; also the automatic choice: {why}"))),
        Some(VfioBackend::Type1) => Ok((VfioBackend::Type1, "forced".to_string())),
        Some(VfioBackend::Iommufd) => Err(VfioCheckError::BackendUnavailable {
            backend: VfioBackend::Iommufd,
            target: state.target,
            reason: why,
        }),
    }
}

/// Runs the preflight of `target` (see the module docs). Errors only when it cannot start; a failing
/// step is recorded in the report, and every later step that needed it is skipped.
pub fn preflight(
    host: &dyn Host,
    target: &VfioTarget,
    opts: &PreflightOptions,
) -> Result<PreflightReport, VfioCheckError> {
    let start = Instant::now();
    let state = inspect(host, target)?;
    ensure_live(host, &state)?;
    let (backend, backend_reason) = resolve_backend(host, &state, opts.backend)?;
    let mut steps = Steps(Vec::new());
    let mut device = None;
    let after = "an earlier step failed";

    let session = steps.run("open-backend", || {
        Session::open_backend(backend, None, target).map(|s| (s, format!("{backend} open")))
    });
    if let Some(mut session) = session {
        let opened = steps.run("open-device", || {
            session
                .open_device(&state)
                .map(|()| ((), "device fd open".to_string()))
        });
        if opened.is_some() {
            device = steps.run("device-info", || {
                let i = session.device_info()?;
                let text = i.summary();
                Ok((i, text))
            });
            let ids = steps.run("config-read", || {
                let (v, d) = session.config_ids()?;
                Ok(((v, d), format!("vendor {v}, device {d}")))
            });
            if let (Some(info), Some((v, d))) = (device.as_mut(), ids) {
                info.vendor = Some(v);
                info.device = Some(d);
            }
            dma_steps(&mut steps, &session, opts.dma_size);
        } else {
            for s in ["device-info", "config-read", "dma-map", "dma-unmap"] {
                steps.skip(s, after);
            }
        }
        steps.run("close", || {
            session.close();
            Ok(((), "device, group and container closed".to_string()))
        });
    } else {
        for s in [
            "open-device",
            "device-info",
            "config-read",
            "dma-map",
            "dma-unmap",
            "close",
        ] {
            steps.skip(s, after);
        }
    }
    if opts.kvm {
        let t = Instant::now();
        let outcome = kvm::attach_check(&state, backend, opts.dma_size);
        steps.0.push(PreflightStep {
            name: "kvm-attach".to_string(),
            outcome,
            micros: u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX),
        });
    }
    let steps = steps.0;
    Ok(PreflightReport {
        target: *target,
        iommu_group: state.iommu_group,
        backend,
        backend_reason,
        passed: !steps.iter().any(|s| s.outcome.is_failed()),
        steps,
        device,
        total_micros: u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX),
    })
}

/// vfio-ioctls opens the live `/dev` and `/sys`, so the target as `host` sees it must be the live one.
fn ensure_live(host: &dyn Host, state: &TargetState) -> Result<(), VfioCheckError> {
    let live_group =
        std::fs::read_link(vgpu_host::paths::vfio_target(&state.target).join("iommu_group"))
            .ok()
            .and_then(|p| p.file_name()?.to_str()?.parse::<u32>().ok());
    if live_group == Some(state.iommu_group) {
        Ok(())
    } else {
        Err(VfioCheckError::NotLive {
            host: host.describe(),
            target: state.target,
        })
    }
}

/// Allocates, maps and unmaps the DMA buffer.
fn dma_steps(steps: &mut Steps, session: &Session, size: usize) {
    let buffer = match DmaBuffer::new(size) {
        Ok(b) => b,
        Err(e) => {
            steps.0.push(PreflightStep {
                name: "dma-map".to_string(),
                outcome: StepOutcome::Failed(e.to_string()),
                micros: 0,
            });
            steps.skip("dma-unmap", "the DMA buffer could not be allocated");
            return;
        }
    };
    let mapped = steps.run("dma-map", || {
        session.map(&buffer).map(|()| {
            (
                (),
                format!("{} bytes at IOVA 0x{:x}", buffer.size(), buffer.iova()),
            )
        })
    });
    if mapped.is_some() {
        steps.run("dma-unmap", || {
            session
                .unmap(&buffer)
                .map(|()| ((), format!("{} bytes unmapped", buffer.size())))
        });
    } else {
        steps.skip("dma-unmap", "dma-map failed");
    }
}

/// Formats an error and its sources as one line.
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let text = c.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        src = c.source();
    }
    s
}

/// Reads vendor and device (the first 4 bytes of config space, little endian: PCI Local Bus spec 6.1)
/// from a raw buffer.
pub(crate) fn ids_from_config(buf: [u8; 4]) -> (PciId, PciId) {
    (
        PciId(u16::from_le_bytes([buf[0], buf[1]])),
        PciId(u16::from_le_bytes([buf[2], buf[3]])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_host::ops::bind_driver;
    use vgpu_sim::SimHost;

    #[test]
    fn a_simulated_host_is_refused_before_anything_is_opened() {
        let h = SimHost::builtin("demo").unwrap();
        let addr: PciAddress = "0000:01:00.0".parse().unwrap();
        bind_driver(&h, &addr, "vfio-pci").unwrap();
        let e = preflight(&h, &VfioTarget::Pci(addr), &PreflightOptions::default()).unwrap_err();
        assert!(matches!(e, VfioCheckError::NotLive { .. }), "{e}");
        assert!(e.to_string().contains("live kernel"), "{e}");
    }

    #[test]
    fn config_ids_are_little_endian() {
        let (v, d) = ids_from_config([0x86, 0x80, 0xca, 0x10]);
        assert_eq!((v, d), (PciId(0x8086), PciId(0x10ca)));
    }

    #[test]
    fn forcing_iommufd_without_it_names_the_reason() {
        let h = SimHost::builtin("demo").unwrap();
        let addr: PciAddress = "0000:01:00.0".parse().unwrap();
        bind_driver(&h, &addr, "vfio-pci").unwrap();
        let state = inspect(&h, &VfioTarget::Pci(addr)).unwrap();
        let e = resolve_backend(&h, &state, Some(VfioBackend::Iommufd)).unwrap_err();
        assert!(
            matches!(e, VfioCheckError::BackendUnavailable { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("0000:01:00.0"), "{e}");
        let (b, why) = resolve_backend(&h, &state, None).unwrap();
        assert_eq!(b, VfioBackend::Type1);
        assert!(why.starts_with("chosen automatically"), "{why}");
    }

    #[test]
    fn error_chains_are_one_line() {
        let inner = std::io::Error::from_raw_os_error(16);
        let e = vfio_ioctls::VfioError::OpenGroup(inner, "7".into());
        let s = chain(&e);
        assert!(s.contains("/dev/vfio/7") && s.contains("busy"), "{s}");
        assert!(!s.contains('\n'));
    }

    #[test]
    fn report_json_shape() {
        let r = PreflightReport {
            target: VfioTarget::Pci("0000:01:00.0".parse().unwrap()),
            iommu_group: 2,
            backend: VfioBackend::Iommufd,
            backend_reason: "x".into(),
            passed: false,
            steps: vec![
                PreflightStep {
                    name: "dma-map".into(),
                    outcome: StepOutcome::Failed("boom".into()),
                    micros: 5,
                },
                PreflightStep {
                    name: "kvm-attach".into(),
                    outcome: StepOutcome::Skipped("no /dev/kvm".into()),
                    micros: 0,
                },
            ],
            device: None,
            total_micros: 9,
        };
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["backend"], "iommufd");
        assert_eq!(v["target"]["kind"], "pci");
        assert_eq!(v["target"]["id"], "0000:01:00.0");
        assert_eq!(v["steps"][0]["outcome"], "failed");
        assert_eq!(v["steps"][0]["detail"], "boom");
        assert_eq!(v["steps"][1]["outcome"], "skipped");
        let back: PreflightReport = serde_json::from_value(v).unwrap();
        assert_eq!(back, r);
        assert_eq!(
            back.first_failure().map(|s| s.name.as_str()),
            Some("dma-map")
        );
    }
}
