//! Making one VF slot, on the daemon's executor: the slot's record is written before the backend
//! touches the VF, and completed with what the backend did after; a failure undoes the run (the
//! backend's change first, then the record), and while a change cannot be undone its record stays,
//! for the next start to finish or undo (see [`super::vf_slots`]).

use std::fmt;

use tracing::warn;

use super::vf_slots::VfSlots;
use crate::backend::{Backend, Created, NewVgpu};
use crate::daemon::api::CoreError;
use crate::daemon::exec::{self, Effects, Object};
use crate::daemon::store::VfSlotRecord;

/// One change of making a VF slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MakeStep {
    /// Write the slot's record, pending (nothing made yet).
    Record,
    /// Let the backend set up the VF.
    SetUp,
    /// Write the record again with what the backend did.
    Complete,
}

impl fmt::Display for MakeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MakeStep::Record => "record the VF slot",
            MakeStep::SetUp => "set up its VF",
            MakeStep::Complete => "complete its record",
        })
    }
}

/// How a change of making a VF slot is undone.
#[derive(Debug, Clone)]
enum MakeUndo {
    /// Put the slot's record back as it was (`None`: there was none).
    Record(Option<Box<VfSlotRecord>>),
    /// MakeUndo what the backend did.
    Destroy(Created),
}

impl fmt::Display for MakeUndo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MakeUndo::Record(None) => f.write_str("drop the slot's record"),
            MakeUndo::Record(Some(r)) => write!(f, "put back the record of slot {}", r.uuid),
            MakeUndo::Destroy(c) => write!(f, "give back {c:?}"),
        }
    }
}

/// The actions: the record being made, the store and the GPU's backend.
struct MakeVf<'a> {
    core: &'a VfSlots,
    backend: &'a dyn Backend,
    record: VfSlotRecord,
    previous: Option<VfSlotRecord>,
}

impl exec::Actions<MakeStep> for MakeVf<'_> {
    type Undo = MakeUndo;
    type Error = CoreError;

    fn run(
        &mut self,
        step: &MakeStep,
        fx: &mut Effects<MakeUndo, CoreError>,
    ) -> Result<(), CoreError> {
        let object = Object::Instance(self.record.uuid);
        match step {
            MakeStep::Record => {
                self.record.created = None;
                self.core.put_vf_record(&self.record)?;
                fx.done(
                    object,
                    MakeUndo::Record(self.previous.clone().map(Box::new)),
                );
            }
            MakeStep::SetUp => {
                let req = NewVgpu {
                    target: self.record.target(),
                };
                let created = self.backend.create(self.core.host.as_ref(), &req)?;
                self.record.created = Some(created.clone());
                fx.done(object, MakeUndo::Destroy(created));
            }
            // Undone by the record's own undo.
            MakeStep::Complete => self.core.put_vf_record(&self.record)?,
        }
        Ok(())
    }

    fn undo(&mut self, undo: &MakeUndo) -> Result<(), CoreError> {
        match undo {
            MakeUndo::Record(None) => self.core.drop_vf_record(&self.record.uuid),
            MakeUndo::Record(Some(r)) => self.core.put_vf_record(r),
            MakeUndo::Destroy(c) => Ok(self.backend.destroy(self.core.host.as_ref(), c)?),
        }
    }
}

impl VfSlots {
    /// Makes VF slot `record` through `backend`: record, set up, complete, undone as a whole on a
    /// failure. `previous` is the slot's record before (making a recorded slot again), put back
    /// then. Returns the completed record.
    pub(super) fn make_vf_slot(
        &self,
        backend: &dyn Backend,
        record: VfSlotRecord,
        previous: Option<VfSlotRecord>,
    ) -> Result<VfSlotRecord, CoreError> {
        let mut make = MakeVf {
            core: self,
            backend,
            record,
            previous,
        };
        let steps = [MakeStep::Record, MakeStep::SetUp, MakeStep::Complete];
        let report = exec::execute(&mut make, steps.into_iter().enumerate());
        for e in &report.rollback_errors {
            warn!(slot = %make.record.uuid, vf = %make.record.vf, undo = %e.what, error = %e.error, "undoing a failed VF slot is incomplete; its record stays for the next start");
        }
        match report.failure {
            Some(f) => Err(f.error),
            None => Ok(make.record),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::{Path, PathBuf};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use vgpu_host::{Errno, Host, HostError, HostExt};
    use vgpu_sim::SimHost;

    use super::*;
    use crate::daemon::store::StateDir;
    use crate::pool::SlotId;
    use crate::profile::{Catalog, ProfileTarget};

    const GPU: &str = "0000:85:00.0";

    /// The simulated host, with writes of a vGPU type refused (`EIO`, as the NVIDIA driver does when
    /// the type is not creatable now) while `refuse` is set.
    #[derive(Debug)]
    struct Refusing {
        sim: SimHost,
        refuse: AtomicBool,
    }

    impl Host for Refusing {
        fn read(&self, path: &Path) -> Result<String, HostError> {
            self.sim.read(path)
        }
        fn write(&self, path: &Path, value: &str) -> Result<(), HostError> {
            if self.refuse.load(Ordering::SeqCst) && path.ends_with("nvidia/current_vgpu_type") {
                return Err(HostError::write(path, value, Errno::EIO));
            }
            self.sim.write(path, value)
        }
        fn list(&self, path: &Path) -> Result<Vec<String>, HostError> {
            self.sim.list(path)
        }
        fn read_link(&self, path: &Path) -> Result<PathBuf, HostError> {
            self.sim.read_link(path)
        }
        fn canonicalize(&self, path: &Path) -> Result<PathBuf, HostError> {
            self.sim.canonicalize(path)
        }
        fn describe(&self) -> String {
            self.sim.describe()
        }
    }

    /// The demo host, the VF slot service alone on it (a service holds only what it needs: the host
    /// and the store), and the first vdi-2g option of its NVIDIA vendor-VFIO GPU.
    fn setup(dir: &Path) -> (Arc<Refusing>, VfSlots, ProfileTarget) {
        let host = Arc::new(Refusing {
            sim: SimHost::builtin("demo").unwrap(),
            refuse: AtomicBool::new(false),
        });
        let (store, _) = StateDir::open(dir).unwrap();
        let core = VfSlots::new(
            host.clone() as Arc<dyn Host>,
            Arc::new(Mutex::new(crate::daemon::engine::persist::Persist::new(
                store, None,
            ))),
        );
        let inv = vgpu_host::discover::discover(host.as_ref()).unwrap();
        let profile = Catalog::builtin().unwrap().resolve("vdi-2g").unwrap();
        let b = crate::backend::detect_gpu(host.as_ref(), &inv, GPU).unwrap();
        let target = b.options(&profile, &inv)[0].target.clone();
        (host, core, target)
    }

    fn vgpu_type(host: &Refusing, target: &ProfileTarget) -> String {
        let ProfileTarget::NvidiaVendorVfio { vf, .. } = target else {
            panic!("{target}")
        };
        let cur = format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
        host.read_trimmed(Path::new(&cur)).unwrap()
    }

    #[test]
    fn a_refused_set_up_leaves_no_record_and_a_made_slot_is_recorded_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let (host, core, target) = setup(tmp.path());
        let slot = SlotId::new("vdi", "vdi-2g", 0);
        host.refuse.store(true, Ordering::SeqCst);
        let e = core.create_vf_slot(&slot, GPU, &target).unwrap_err();
        assert!(e.to_string().contains("EIO"), "{e}");
        assert_eq!(
            core.vf_record(&slot.uuid),
            None,
            "the pending record is dropped"
        );
        assert!(core.vf_records().is_empty());
        assert_eq!(vgpu_type(&host, &target), "0");
        host.refuse.store(false, Ordering::SeqCst);
        let made = core.create_vf_slot(&slot, GPU, &target).unwrap();
        assert!(made.created.is_some());
        assert_eq!(core.vf_record(&slot.uuid), Some(made));
        assert_ne!(vgpu_type(&host, &target), "0");
    }

    #[test]
    fn making_a_recorded_slot_again_that_fails_puts_its_record_back() {
        let tmp = tempfile::tempdir().unwrap();
        let (host, core, target) = setup(tmp.path());
        let slot = SlotId::new("vdi", "vdi-2g", 0);
        let made = core.create_vf_slot(&slot, GPU, &target).unwrap();
        core.stop_vf_slot(&slot.uuid).unwrap();
        assert_eq!(vgpu_type(&host, &target), "0");
        host.refuse.store(true, Ordering::SeqCst);
        let e = core.recreate_vf_slot(&made).unwrap_err();
        assert!(e.to_string().contains("EIO"), "{e}");
        // The complete record it had is put back, not left pending.
        assert_eq!(core.vf_record(&slot.uuid), Some(made.clone()));
        host.refuse.store(false, Ordering::SeqCst);
        core.recreate_vf_slot(&made).unwrap();
        assert_ne!(vgpu_type(&host, &target), "0");
    }

    /// The VF slot made, then its record put back pending: vgpud stopped after the backend's change
    /// and before the record's completion.
    fn made_then_pending(
        core: &VfSlots,
        slot: &SlotId,
        gpu: &str,
        target: &ProfileTarget,
    ) -> (VfSlotRecord, VfSlotRecord) {
        let made = core.create_vf_slot(slot, gpu, target).unwrap();
        let pending = VfSlotRecord {
            created: None,
            ..made.clone()
        };
        core.put_vf_record(&pending).unwrap();
        assert!(!core.vf_slot_running(&pending));
        (made, pending)
    }

    #[test]
    fn a_pending_record_whose_vgpu_type_is_set_is_completed_not_made_again() {
        let tmp = tempfile::tempdir().unwrap();
        let (host, core, target) = setup(tmp.path());
        let slot = SlotId::new("vdi", "vdi-2g", 0);
        let (made, pending) = made_then_pending(&core, &slot, GPU, &target);
        let set = vgpu_type(&host, &target);
        // Writing the type again would be refused (EPERM: the VF already has a vGPU).
        core.recreate_vf_slot(&pending).unwrap();
        assert_eq!(core.vf_record(&slot.uuid), Some(made.clone()));
        assert!(core.vf_slot_running(&made));
        assert_eq!(vgpu_type(&host, &target), set);
        // The completed record gives the VF back.
        core.release_vf_slot(&slot.uuid).unwrap();
        assert_eq!(vgpu_type(&host, &target), "0");
    }

    #[test]
    fn a_pending_record_whose_vf_has_another_vgpu_type_is_not_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let (host, core, target) = setup(tmp.path());
        let slot = SlotId::new("vdi", "vdi-2g", 0);
        let (_, pending) = made_then_pending(&core, &slot, GPU, &target);
        let ProfileTarget::NvidiaVendorVfio { vf, type_id, .. } = &target else {
            panic!("{target}")
        };
        // Someone else's vGPU of another type on the VF (its type cleared, another set).
        let cur = format!("/sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type");
        host.write(Path::new(&cur), "0").unwrap();
        let creatable = format!("/sys/bus/pci/devices/{vf}/nvidia/creatable_vgpu_types");
        let other = host
            .read(Path::new(&creatable))
            .unwrap()
            .lines()
            .skip(1)
            .filter_map(|l| l.split(':').next()?.trim().parse::<u32>().ok())
            .find(|id| id != type_id)
            .unwrap();
        host.write(Path::new(&cur), &other.to_string()).unwrap();
        let e = core.recreate_vf_slot(&pending).unwrap_err();
        assert!(e.to_string().contains("EPERM"), "{e}");
        assert_eq!(vgpu_type(&host, &target), other.to_string());
        assert_eq!(core.vf_record(&slot.uuid), Some(pending));
    }

    #[test]
    fn a_pending_record_whose_vf_is_on_vfio_pci_is_completed_with_the_driver_it_had() {
        const FLEX: &str = "0000:03:00.0";
        let tmp = tempfile::tempdir().unwrap();
        let (host, core, _) = setup(tmp.path());
        let inv = vgpu_host::discover::discover(host.as_ref()).unwrap();
        let profile = Catalog::builtin().unwrap().resolve("vdi-2g").unwrap();
        let b = crate::backend::detect_gpu(host.as_ref(), &inv, FLEX).unwrap();
        let target = b.options(&profile, &inv)[0].target.clone();
        let ProfileTarget::SriovVf { pf, num_vfs, .. } = &target else {
            panic!("{target}")
        };
        core.enable_vfs_on(FLEX, pf, *num_vfs).unwrap();
        let slot = SlotId::new("vdi", "vdi-2g", 0);
        let (made, pending) = made_then_pending(&core, &slot, FLEX, &target);
        let driver = format!("/sys/bus/pci/devices/{}/driver", made.vf);
        assert_eq!(
            host.link_name(Path::new(&driver)).unwrap().as_deref(),
            Some("vfio-pci")
        );
        core.recreate_vf_slot(&pending).unwrap();
        // Not the vfio-pci binding it finds: binding again would record that as the driver to give
        // the VF back to, and the VF would stay taken after the slot is released.
        assert_eq!(core.vf_record(&slot.uuid), Some(made.clone()));
        core.release_vf_slot(&slot.uuid).unwrap();
        assert_eq!(host.link_name(Path::new(&driver)).unwrap(), None);
    }
}
