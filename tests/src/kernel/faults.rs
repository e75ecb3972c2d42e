//! Faults while the real `vgpud` runs on the real kernel: a parent's driver unloaded behind its back, and
//! a PF's VFs made to vanish by a `sriov_numvfs` write it did not make. The other GPUs keep working
//! (listed, created on), the daemon keeps answering, and the parent that went is managed again once it
//! is back (its module's uevent: its autostart definition is started, a create on it succeeds).
//!
//! Each test leaves the sample parents and the PF as it found them, even when it fails.

use mdev_types::ids::MdevUuid;
use vgpu_host::{Host, paths};

use super::daemon::{
    EVENT_WITHIN, availability, device_exists, ensure_entry, ensure_restored, listed,
};
use super::daemon_events::module_tool;
use super::guest::{Guest, wait_for};
use super::runner::{Outcome, Test, TestError, TestResult, ensure};
use super::samples::{Mdevs, test_uuid};
use super::sriov::{Pf, PfGuard};
use super::vgpud::{TargetKind, Vgpud, Workdir};

/// The fault tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new(
            "faults_parent_unloaded_others_keep_working",
            parent_unloaded,
        ),
        Test::new("faults_vfs_vanish_behind_vgpud", vfs_vanish),
    ]
}

/// Loads mbochs again when dropped, if its parent is missing, so a failing test leaves the guest whole.
struct MbochsBack<'h>(&'h dyn Host);

impl Drop for MbochsBack<'_> {
    fn drop(&mut self) {
        if !self.0.exists(&paths::mdev_parent("mbochs")) {
            let _ = module_tool("modprobe", &["mbochs"]);
        }
    }
}

fn gpu_ids(d: &Vgpud) -> Result<Vec<String>, TestError> {
    Ok(d.list_gpus()?.into_iter().map(|g| g.id).collect())
}

/// mbochs unloaded while vgpud runs (with an autostart definition on it): mtty keeps working, the
/// definition is kept (waiting for its parent); mbochs loaded again: the definition is started and a
/// create on mbochs succeeds.
fn parent_unloaded(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let _back = MbochsBack(&g.host);
    let work = Workdir::new("faults-parent")?;
    let d = Vgpud::spawn(work.path(), &work.path().join("state"))?;
    let on_mtty = test_uuid("faults_parent_unloaded", 0);
    let waiting = test_uuid("faults_parent_unloaded", 1);
    let after = test_uuid("faults_parent_unloaded", 2);
    let on_mbochs = test_uuid("faults_parent_unloaded", 3);
    mdevs.adopt(on_mtty);
    d.create(TargetKind::Type, "mtty-2", "mtty", Some(&on_mtty))?;
    d.define(TargetKind::Type, "mbochs-small", "mbochs", &waiting, true)?;

    // rmmod, not `modprobe -r` (busybox's removes the module's stack; see daemon_events).
    module_tool("rmmod", &["mbochs"])?;
    wait_for(&g.host, &paths::mdev_parent("mbochs"), false)?;
    d.wait_until("mbochs is no longer listed", EVENT_WITHIN, |d| {
        Ok(!gpu_ids(d)?.iter().any(|i| i == "mbochs"))
    })?;
    // The others keep working.
    mdevs.adopt(after);
    d.create(TargetKind::Type, "mtty-1", "mtty", Some(&after))?;
    ensure(device_exists(g, &after), || {
        format!("{after} not made on mtty after mbochs went")
    })?;
    ensure_entry(&listed(&d, &on_mtty)?, "running", "daemon", false)?;
    // The definition on the parent that went is kept.
    ensure_entry(&listed(&d, &waiting)?, "waiting-for-parent", "daemon", true)?;

    // Recovery: the module's uevent.
    module_tool("modprobe", &["mbochs"])?;
    mdevs.adopt(waiting);
    let took = d.wait_until(
        "the autostart definition runs once mbochs is back",
        EVENT_WITHIN,
        |d| Ok(d.get_instance(&waiting)?.state == "running" && device_exists(g, &waiting)),
    )?;
    println!("  (mbochs managed again {took:?} after modprobe returned)");
    mdevs.adopt(on_mbochs);
    d.create(TargetKind::Type, "mbochs-small", "mbochs", Some(&on_mbochs))?;
    for u in [on_mtty, after, waiting, on_mbochs] {
        d.destroy(&u)?;
        mdevs.forget(&u);
    }
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// The igb PF's VFs enabled and then disabled behind vgpud's back, while a client lists GPUs: every
/// listing succeeds (a VF that vanishes mid-walk is absent, not an error), and a create on mtty works
/// after.
fn vfs_vanish(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let mut mdevs = Mdevs::new(&g.host);
    let pf = PfGuard::new(&g.host, Pf::Igb)?;
    let work = Workdir::new("faults-vfs")?;
    let d = Vgpud::spawn(work.path(), &work.path().join("state"))?;
    let vfs = pf.enable_vfs(7)?;
    d.list_gpus()?;
    // Disable them from another thread while the daemon is asked again and again.
    let numvfs = paths::pci_attr(&pf.addr(), "sriov_numvfs");
    let writer = {
        let root = g.host.root().to_path_buf();
        std::thread::spawn(move || -> Result<(), String> {
            let host = vgpu_host::SysfsHost::new(root).map_err(|e| e.to_string())?;
            for n in [0, 7, 0, 3, 0] {
                host.write(&numvfs, &n.to_string())
                    .map_err(|e| e.to_string())?;
            }
            Ok(())
        })
    };
    let mut listings = 0;
    while !writer.is_finished() {
        d.list_gpus()
            .map_err(|e| TestError::Check(format!("ListGpus while VFs vanish: {e}")))?;
        listings += 1;
    }
    writer
        .join()
        .map_err(|_| TestError::Check("the sriov_numvfs writer panicked".into()))?
        .map_err(TestError::Check)?;
    println!("  ({listings} listings while the VFs came and went)");
    for vf in &vfs {
        ensure(!g.host.exists(&paths::pci_device(vf)), || {
            format!("VF {vf} still there after sriov_numvfs 0")
        })?;
    }
    let u: MdevUuid = test_uuid("faults_vfs_vanish", 0);
    mdevs.adopt(u);
    d.create(TargetKind::Type, "mtty-2", "mtty", Some(&u))?;
    d.destroy(&u)?;
    mdevs.forget(&u);
    d.stop()?;
    drop(pf);
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}
