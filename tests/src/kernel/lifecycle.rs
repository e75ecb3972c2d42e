//! Typed lifecycle errors (`vgpu_host::ops`) on the real kernel.
//!
//! Each [`Scenario`] runs over any [`Host`]: it sets up, provokes exactly one refusal through our ops
//! layer, checks that the typed [`LifecycleError`] is the expected variant with the expected fields,
//! cleans up, and returns the error. Every `ops_error_*` test runs its scenario on the guest's sysfs
//! AND on the simulated host that mirrors the guest (`SimHost::builtin("samples")`) and requires the
//! two errors to be equal (parity); the unit tests run every scenario on the simulated host alone.

use mdev_types::ids::{MdevUuid, PciAddress};
use vgpu_host::ops::{
    LifecycleError, bind_driver, create_mdev, remove_mdev, restore_driver, set_sriov_autoprobe,
    set_sriov_numvfs,
};
use vgpu_host::{Host, HostExt, paths};
use vgpu_sim::SimHost;

use super::guest::{Guest, driver_of, wait_for};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, available, sample, test_uuid, type_id};
use super::sriov::{IGB_TOTAL_VFS, Pf, PfGuard, read_u32};

/// A scenario over any host, returning the typed error it provoked (already checked).
pub type Scenario = fn(&dyn Host) -> Result<LifecycleError, TestError>;

/// Every scenario that ends in a refusal, by name.
pub const SCENARIOS: &[(&str, Scenario)] = &[
    ("duplicate_uuid", duplicate_uuid),
    ("type_full_mtty", |h| type_full(h, "mtty-2")),
    ("type_full_mdpy", |h| type_full(h, "mdpy-xga")),
    ("type_full_mbochs", |h| type_full(h, "mbochs-medium")),
    ("unknown_type", unknown_type),
    ("unknown_parent", unknown_parent),
    ("double_remove", double_remove),
    ("no_pf_driver", no_pf_driver),
    ("above_total_vfs", above_total_vfs),
    ("vfs_already_enabled", vfs_already_enabled),
    ("bind_device_gone", bind_device_gone),
];

/// The lifecycle tests: each scenario on the real kernel, plus the operations' success paths.
pub fn tests() -> Vec<Test<Guest>> {
    let mut tests = vec![
        Test::new("ops_create_remove_mdev", ops_create_remove),
        Test::new("ops_sriov_enable_bind_restore", ops_sriov_bind_restore),
    ];
    // Test needs a `fn` pointer per name, so the scenarios are listed again here (a test asserts the
    // two lists agree).
    tests.extend([
        Test::new("ops_error_duplicate_uuid", |g: &Guest| {
            on_guest(g, "duplicate_uuid")
        }),
        Test::new("ops_error_type_full_mtty", |g: &Guest| {
            on_guest(g, "type_full_mtty")
        }),
        Test::new("ops_error_type_full_mdpy", |g: &Guest| {
            on_guest(g, "type_full_mdpy")
        }),
        Test::new("ops_error_type_full_mbochs", |g: &Guest| {
            on_guest(g, "type_full_mbochs")
        }),
        Test::new("ops_error_unknown_type", |g: &Guest| {
            on_guest(g, "unknown_type")
        }),
        Test::new("ops_error_unknown_parent", |g: &Guest| {
            on_guest(g, "unknown_parent")
        }),
        Test::new("ops_error_double_remove", |g: &Guest| {
            on_guest(g, "double_remove")
        }),
        Test::new("ops_error_no_pf_driver", |g: &Guest| {
            on_guest(g, "no_pf_driver")
        }),
        Test::new("ops_error_above_total_vfs", |g: &Guest| {
            on_guest(g, "above_total_vfs")
        }),
        Test::new("ops_error_vfs_already_enabled", |g: &Guest| {
            on_guest(g, "vfs_already_enabled")
        }),
        Test::new("ops_error_bind_device_gone", |g: &Guest| {
            on_guest(g, "bind_device_gone")
        }),
    ]);
    tests
}

/// The scenario named `name`.
pub fn scenario(name: &str) -> Result<Scenario, TestError> {
    SCENARIOS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, s)| *s)
        .ok_or_else(|| TestError::Check(format!("no lifecycle scenario named {name}")))
}

/// The simulated host that mirrors the guest (mdev-types/sims/samples.toml).
pub fn simulated_guest() -> Result<SimHost, TestError> {
    SimHost::builtin("samples")
        .map_err(|e| TestError::Check(format!("cannot build the simulated host 'samples': {e}")))
}

/// Runs scenario `name` on the real kernel and on the simulated host; both must give the expected
/// error, and the same one.
fn on_guest(g: &Guest, name: &str) -> TestResult {
    let run = scenario(name)?;
    let real = run(&g.host)?;
    let sim = run(&simulated_guest()?)
        .map_err(|e| TestError::Check(format!("on the simulated host: {e}")))?;
    ensure_eq("typed error, simulated host vs real kernel", sim, real)?;
    Ok(Outcome::Passed)
}

/// Fails unless `err` equals `expected`.
fn expect(err: LifecycleError, expected: LifecycleError) -> Result<LifecycleError, TestError> {
    ensure(err == expected, || {
        format!("expected {expected:?}, got {err:?} ({err})")
    })?;
    Ok(err)
}

/// Runs `op`, which must fail, returning its error.
fn refused(what: &str, op: Result<(), LifecycleError>) -> Result<LifecycleError, TestError> {
    match op {
        Err(e) => Ok(e),
        Ok(()) => Err(TestError::Check(format!(
            "{what} succeeded but must be refused"
        ))),
    }
}

fn duplicate_uuid(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let mut mdevs = Mdevs::new(h);
    let uuid = test_uuid("ops_duplicate_uuid", 0);
    let small = type_id("mbochs-small")?;
    create_mdev(h, "mbochs", &small, &uuid)?;
    mdevs.adopt(uuid);
    let err = refused(
        "creating a duplicate UUID",
        create_mdev(h, "mtty", &type_id("mtty-1")?, &uuid),
    )?;
    mdevs.remove_all()?;
    expect(err, LifecycleError::DuplicateUuid { uuid })
}

fn type_full(h: &dyn Host, ty: &str) -> Result<LifecycleError, TestError> {
    let t = sample(ty)?;
    let id = type_id(ty)?;
    let mut mdevs = Mdevs::new(h);
    for n in 0..t.initial {
        let uuid = test_uuid(&format!("ops_full_{ty}"), n);
        create_mdev(h, t.parent, &id, &uuid)?;
        mdevs.adopt(uuid);
    }
    let err = refused(
        &format!("creating one {ty} too many"),
        create_mdev(
            h,
            t.parent,
            &id,
            &test_uuid(&format!("ops_full_{ty}"), t.initial),
        ),
    )?;
    mdevs.remove_all()?;
    ensure_eq(
        format_args!("{ty}/available_instances after removing all"),
        available(h, t.parent, ty)?,
        t.initial,
    )?;
    expect(
        err,
        LifecycleError::TypeFull {
            parent: t.parent.to_string(),
            type_id: id,
            errno: t.full_errno,
        },
    )
}

fn unknown_type(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let id = type_id("mbochs-huge")?;
    let err = refused(
        "creating an unknown type",
        create_mdev(h, "mbochs", &id, &test_uuid("ops_unknown_type", 0)),
    )?;
    expect(
        err,
        LifecycleError::UnknownType {
            parent: "mbochs".into(),
            type_id: id,
        },
    )
}

fn unknown_parent(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let err = refused(
        "creating on an unregistered parent",
        create_mdev(
            h,
            "0000:00:1f.7",
            &type_id("mbochs-small")?,
            &test_uuid("ops_unknown_parent", 0),
        ),
    )?;
    expect(
        err,
        LifecycleError::UnknownParent {
            parent: "0000:00:1f.7".into(),
        },
    )
}

fn double_remove(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let uuid = test_uuid("ops_double_remove", 0);
    let mut mdevs = Mdevs::new(h);
    create_mdev(h, "mtty", &type_id("mtty-1")?, &uuid)?;
    mdevs.adopt(uuid);
    remove_mdev(h, &uuid)?;
    mdevs.forget(&uuid);
    let err = refused("removing twice", remove_mdev(h, &uuid))?;
    expect(err, LifecycleError::NoSuchInstance { uuid })
}

fn no_pf_driver(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let guard = PfGuard::new(h, Pf::Igb)?;
    let pf = guard.addr();
    h.write(&paths::pci_driver("igb").join("unbind"), &pf.to_string())?;
    let err = refused(
        "enabling VFs without a PF driver",
        set_sriov_numvfs(h, &pf, 1),
    );
    // Rebind before judging, so a wrong answer does not leave the PF without its driver.
    h.write(&paths::pci_driver("igb").join("bind"), &pf.to_string())?;
    expect(err?, LifecycleError::NoPfDriver { pf, driver: None })
}

fn above_total_vfs(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let guard = PfGuard::new(h, Pf::Igb)?;
    let pf = guard.addr();
    let requested = IGB_TOTAL_VFS + 1;
    let err = refused(
        "enabling more VFs than sriov_totalvfs",
        set_sriov_numvfs(h, &pf, requested),
    )?;
    expect(
        err,
        LifecycleError::AboveTotalVfs {
            pf,
            requested,
            total: IGB_TOTAL_VFS,
        },
    )
}

fn vfs_already_enabled(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let guard = PfGuard::new(h, Pf::Nvme)?;
    let pf = guard.addr();
    set_sriov_autoprobe(h, &pf, false)?;
    set_sriov_numvfs(h, &pf, 1)?;
    let err = refused("changing 1 VF to 2", set_sriov_numvfs(h, &pf, 2))?;
    ensure_eq(
        "sriov_numvfs after the refusal",
        read_u32(h, &paths::pci_attr(&pf, "sriov_numvfs"))?,
        1,
    )?;
    set_sriov_numvfs(h, &pf, 0)?;
    expect(
        err,
        LifecycleError::VfsAlreadyEnabled {
            pf,
            current: 1,
            requested: 2,
        },
    )
}

fn bind_device_gone(h: &dyn Host) -> Result<LifecycleError, TestError> {
    let guard = PfGuard::new(h, Pf::Igb)?;
    let vf = guard.enable_vfs(1)?[0];
    set_sriov_numvfs(h, &guard.addr(), 0)?;
    wait_for(h, &paths::pci_device(&vf), false)?;
    let err = match bind_driver(h, &vf, "vfio-pci") {
        Err(e) => e,
        Ok(record) => {
            return Err(TestError::Check(format!(
                "binding the removed VF {vf} succeeded: {record:?}"
            )));
        }
    };
    expect(err, LifecycleError::DeviceGone { addr: vf })
}

/// create_mdev / remove_mdev succeed and move available_instances; the instance shows up in between.
fn ops_create_remove(g: &Guest) -> TestResult {
    let h: &dyn Host = &g.host;
    let uuid: MdevUuid = test_uuid("ops_create_remove", 0);
    let mut mdevs = Mdevs::new(h);
    create_mdev(h, "mdpy", &type_id("mdpy-hd")?, &uuid)?;
    mdevs.adopt(uuid);
    ensure(h.exists(&paths::mdev_device(&uuid)), || {
        format!("{uuid} is missing after create_mdev")
    })?;
    ensure_eq("mdpy-vga available", available(h, "mdpy", "mdpy-vga")?, 3)?;
    remove_mdev(h, &uuid)?;
    mdevs.forget(&uuid);
    ensure_eq(
        "mdpy-vga available after remove",
        available(h, "mdpy", "mdpy-vga")?,
        4,
    )?;
    Ok(Outcome::Passed)
}

/// set_sriov_autoprobe + set_sriov_numvfs enable a driverless VF; bind_driver moves it to vfio-pci and
/// restore_driver puts it back (no driver, no override).
fn ops_sriov_bind_restore(g: &Guest) -> TestResult {
    let h: &dyn Host = &g.host;
    let guard = PfGuard::new(h, Pf::Igb)?;
    let pf: PciAddress = guard.addr();
    set_sriov_autoprobe(h, &pf, false)?;
    set_sriov_numvfs(h, &pf, 2)?;
    let vf = super::guest::vf_address(h, &pf, 1)?;
    ensure_eq(format_args!("driver of {vf}"), driver_of(h, &vf)?, None)?;
    let record = bind_driver(h, &vf, "vfio-pci")?;
    ensure_eq(
        "BindRecord.previous_driver",
        record.previous_driver.clone(),
        None,
    )?;
    ensure_eq(
        format_args!("driver of {vf} after bind_driver"),
        driver_of(h, &vf)?,
        Some("vfio-pci".to_string()),
    )?;
    restore_driver(h, &record)?;
    ensure_eq(
        format_args!("driver of {vf} after restore_driver"),
        driver_of(h, &vf)?,
        None,
    )?;
    ensure_eq(
        format_args!("{vf}/driver_override after restore_driver"),
        h.read_trimmed(&paths::pci_attr(&vf, "driver_override"))?,
        "(null)".to_string(),
    )?;
    set_sriov_numvfs(h, &pf, 0)?;
    set_sriov_autoprobe(h, &pf, true)?;
    Ok(Outcome::Passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_scenario_has_a_guest_test() {
        let names: Vec<&str> = tests().iter().map(|t| t.name).collect();
        for (s, _) in SCENARIOS {
            let want = format!("ops_error_{s}");
            assert!(names.contains(&want.as_str()), "no test {want}");
        }
        assert_eq!(names.len(), SCENARIOS.len() + 2);
    }

    /// The simulated half of the parity: every scenario holds on the simulated guest, so a kernel
    /// model change that breaks parity fails here, without a VM.
    #[test]
    fn every_scenario_holds_on_the_simulated_host() {
        for (name, run) in SCENARIOS {
            let sim = simulated_guest().unwrap();
            if let Err(e) = run(&sim) {
                panic!("scenario {name} on the simulated host: {e}");
            }
        }
    }
}
