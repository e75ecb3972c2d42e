//! What a device supports of the kernel's VFIO migration uAPI v2 (include/uapi/linux/vfio.h:
//! `VFIO_DEVICE_FEATURE_MIGRATION` with `VFIO_MIGRATION_STOP_COPY` (mandatory for a migratable
//! device), `_P2P` and `_PRE_COPY`; `VFIO_DEVICE_FEATURE_DMA_LOGGING_START` for dirty-page tracking by
//! the device; `VFIO_DEVICE_FEATURE_MIG_DATA_SIZE` for the size of its stop-copy state), read from the
//! device opened the way a VMM opens it. The features are read with GET or PROBE; where the device
//! offers dirty-page logging, it is also tried once on a single page (START, one REPORT, STOP), since
//! a driver can accept the logging and still fail its report (samples/vfio-mdev/mtty.c: its
//! `log_read_and_clear` returns -EOPNOTSUPP), which QEMU only finds when a migration starts. The
//! started log is stopped again before the device is closed; nothing else changes.

use serde::{Deserialize, Serialize};
use vfio_bindings::bindings::vfio::{
    VFIO_DEVICE_FEATURE_DMA_LOGGING_START, VFIO_MIGRATION_P2P, VFIO_MIGRATION_PRE_COPY,
    VFIO_MIGRATION_STOP_COPY,
};

use mdev_types::vfio_api::{VfioBackend, VfioTarget};
use vgpu_host::Host;

use super::session::Session;
use super::{VfioCheckError, ensure_live, inspect, resolve_backend, sys};

/// The migration features a device reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationCaps {
    /// `VFIO_MIGRATION_STOP_COPY`: the device state can be saved once the device is stopped (the base
    /// of every VFIO migration).
    pub stop_copy: bool,
    /// `VFIO_MIGRATION_PRE_COPY`: part of the state can be sent while the device still runs, which
    /// shortens the downtime.
    pub pre_copy: bool,
    /// `VFIO_MIGRATION_P2P`: the device can be quiesced for peer-to-peer DMA between devices.
    pub p2p: bool,
    /// The device tracks the guest pages it writes (`VFIO_DEVICE_FEATURE_DMA_LOGGING_START`); without
    /// it the VMM relies on the IOMMU's dirty tracking or treats all DMA-mapped memory as dirty.
    pub dirty_logging: bool,
    /// The device's estimate of its stop-copy state in bytes (`VFIO_DEVICE_FEATURE_MIG_DATA_SIZE`),
    /// where the driver reports one.
    pub stop_copy_bytes: Option<u64>,
    /// Whether the device's dirty-page log can be read (`VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT`
    /// after a START on one page): `None` when the device has no logging or it could not be started
    /// here ([`MigrationCaps::dirty_log_detail`] says why).
    #[serde(default)]
    pub dirty_log_reports: Option<bool>,
    /// What the logging probe met, when it did not simply work (the failing step and its error).
    #[serde(default)]
    pub dirty_log_detail: Option<String>,
}

/// Whether a device can be live-migrated, and what it supports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationSupport {
    /// The device.
    pub target: VfioTarget,
    /// The VFIO backend it was opened through.
    pub backend: VfioBackend,
    /// The device can be migrated (it reports `STOP_COPY`).
    pub migratable: bool,
    /// Why not, when it cannot.
    pub reason: Option<String>,
    /// What it reports, when it implements the migration feature at all.
    pub caps: Option<MigrationCaps>,
    /// What a VMM must do differently for this device, or will trip on (see
    /// [`MigrationCaps::dirty_log_reports`]); empty when nothing.
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// QEMU's vfio-pci properties that matter here (hw/vfio/pci.c: `enable-migration`,
/// `x-device-dirty-page-tracking`).
const QEMU_NO_DEVICE_LOG: &str = "enable-migration=on,x-device-dirty-page-tracking=off";

/// The warnings for `caps` (see [`MigrationSupport::warnings`]).
fn warnings(caps: &MigrationCaps) -> Vec<String> {
    let mut w = Vec::new();
    if !caps.stop_copy {
        return w;
    }
    if !caps.dirty_logging {
        w.push(format!(
            "the device has no dirty-page logging: QEMU then relies on the IOMMU's dirty tracking (VFIO type1 containers have it; iommufd only with hardware dirty tracking) and otherwise refuses to migrate unless the device is given `{QEMU_NO_DEVICE_LOG}`, with which all guest memory counts as dirty"
        ));
    } else if caps.dirty_log_reports == Some(false) {
        w.push(format!(
            "the device accepts dirty-page logging but cannot report its log ({}): QEMU uses the device's log by default and the migration then fails at its start (\"Failed to get DMA logging report\"); give the device `{QEMU_NO_DEVICE_LOG}` (libvirt: a <qemu:override> of the hostdev, see docs/migration.md)",
            caps.dirty_log_detail.as_deref().unwrap_or("REPORT failed")
        ));
    }
    w
}

impl Session {
    /// Reads the open device's migration features (GET and PROBE, and the one-page logging probe of
    /// the module docs).
    pub fn migration(&self) -> Result<(Option<MigrationCaps>, Option<String>), VfioCheckError> {
        let dev = self.open_device_fd()?;
        let err = |op: &str, e: nix::errno::Errno| VfioCheckError::Vfio {
            op: op.to_string(),
            target: *self.target(),
            detail: e.desc().to_string(),
        };
        let flags = match sys::migration_flags(dev) {
            Ok(f) => f,
            Err(nix::errno::Errno::ENOTTY) => {
                return Ok((
                    None,
                    Some(
                        "its driver does not implement VFIO migration (VFIO_DEVICE_FEATURE_MIGRATION: ENOTTY); only devices whose driver has migration support can move with a running VM"
                            .to_string(),
                    ),
                ));
            }
            Err(e) => return Err(err("reading VFIO_DEVICE_FEATURE_MIGRATION", e)),
        };
        let has = |bit: u32| flags & u64::from(bit) != 0;
        let dirty_logging = sys::probe_set(dev, VFIO_DEVICE_FEATURE_DMA_LOGGING_START)
            .map_err(|e| err("probing VFIO_DEVICE_FEATURE_DMA_LOGGING_START", e))?;
        let stop_copy_bytes = sys::stop_copy_size(dev).ok();
        let (dirty_log_reports, dirty_log_detail) = if dirty_logging {
            log_probe(sys::probe_dma_log(dev))
        } else {
            (None, None)
        };
        let caps = MigrationCaps {
            stop_copy: has(VFIO_MIGRATION_STOP_COPY),
            pre_copy: has(VFIO_MIGRATION_PRE_COPY),
            p2p: has(VFIO_MIGRATION_P2P),
            dirty_logging,
            stop_copy_bytes,
            dirty_log_reports,
            dirty_log_detail,
        };
        let reason = (!caps.stop_copy).then(|| {
            format!("it reports migration flags {flags:#x} without VFIO_MIGRATION_STOP_COPY, which every VFIO migration needs")
        });
        Ok((Some(caps), reason))
    }
}

/// What [`sys::probe_dma_log`] found, as (`dirty_log_reports`, `dirty_log_detail`).
fn log_probe(p: sys::DmaLogProbe) -> (Option<bool>, Option<String>) {
    match p {
        sys::DmaLogProbe::StartFailed(e) => (
            None,
            Some(format!(
                "VFIO_DEVICE_FEATURE_DMA_LOGGING_START of one page failed: {}",
                e.desc()
            )),
        ),
        sys::DmaLogProbe::Reported(report, stop) => {
            let stop_note = stop.err().map(|e| {
                format!(
                    "; VFIO_DEVICE_FEATURE_DMA_LOGGING_STOP failed: {} (closing the device ends the log)",
                    e.desc()
                )
            });
            match report {
                Ok(()) => (Some(true), stop_note),
                Err(e) => (
                    Some(false),
                    Some(format!(
                        "VFIO_DEVICE_FEATURE_DMA_LOGGING_REPORT: {}{}",
                        e.desc(),
                        stop_note.unwrap_or_default()
                    )),
                ),
            }
        }
    }
}

/// Opens `target` as a VMM would (through `backend`, or the one [`super::choose_backend`] picks),
/// reads its migration features and closes it. A device in use (a VM holds it) cannot be opened: the
/// error says so.
pub fn migration_support(
    host: &dyn Host,
    target: &VfioTarget,
    backend: Option<VfioBackend>,
) -> Result<MigrationSupport, VfioCheckError> {
    let state = inspect(host, target)?;
    ensure_live(host, &state)?;
    let (backend, _) = resolve_backend(host, &state, backend)?;
    let mut session = Session::open_backend(backend, None, target)?;
    session.open_device(&state)?;
    let (caps, reason) = session.migration()?;
    session.close();
    Ok(MigrationSupport {
        target: *target,
        backend,
        migratable: reason.is_none(),
        reason,
        warnings: caps.as_ref().map(warnings).unwrap_or_default(),
        caps,
    })
}
