//! VFIO on the real kernel: the preflight of `vgpu_vfio` (open, device info, config ids, DMA
//! map/unmap through vm-memory, KVM attach) on the sample mdevs and on igb/nvme VFs we bound with
//! `ops::bind_vfio`; the backend choice (iommufd + cdev on the custom kernel, type1 on the stock ones);
//! group viability on the shared-group topology; every device back on its original driver afterwards.
//!
//! Vendor/device ids of the samples (their emulated config space): mtty.c `mtty_create_config_space`
//! stores 0x32534348 at offset 0 (vendor 0x4348, device 0x3253); mdpy-defs.h MDPY_PCI_VENDOR_ID
//! PCI_VENDOR_ID_REDHAT (0x1b36), MDPY_PCI_DEVICE_ID 0x000f; mbochs.c stores 0x1234 / 0x1111.

use mdev_types::ids::{PciAddress, PciId};
use vgpu_host::Host;
use vgpu_host::ops::{BindRecord, VfioBindError, bind_driver, bind_vfio, restore_driver};
use vgpu_host::viability::{MemberState, Problem, check};
use vgpu_vfio::{
    PreflightOptions, PreflightReport, StepOutcome, VfioBackend, VfioTarget, preflight,
};

use super::guest::{Guest, KernelKind, Topology};
use super::iommu::EDU;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};
use super::samples::{Mdevs, test_uuid};
use super::sriov::{Pf, PfGuard};

/// The VFIO tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("vfio_preflight_mtty", |g| {
            preflight_mdev(g, "mtty", "mtty-1", (0x4348, 0x3253))
        }),
        Test::new("vfio_preflight_mdpy", |g| {
            preflight_mdev(g, "mdpy", "mdpy-vga", (0x1b36, 0x000f))
        }),
        Test::new("vfio_preflight_mbochs", |g| {
            preflight_mdev(g, "mbochs", "mbochs-small", (0x1234, 0x1111))
        }),
        Test::new("vfio_preflight_vf_igb", |g| preflight_vf(g, Pf::Igb)),
        Test::new("vfio_preflight_vf_nvme", |g| preflight_vf(g, Pf::Nvme)),
        Test::new("vfio_backends_type1_and_iommufd", both_backends),
        Test::new("vfio_refuses_unbound_device", refuses_unbound),
        Test::new(
            "vfio_shared_group_viable_when_unbound",
            shared_group_unbound,
        ),
        Test::new(
            "vfio_shared_group_refusal_names_member",
            shared_group_refusal,
        ),
        Test::new("vfio_dbus_instance_preflight_and_health", dbus_preflight),
        Test::new("vfio_vgpuctl_preflight_and_viability", vgpuctl_cli),
    ]
}

/// A library error as a check failure.
pub(super) fn check_err(e: impl std::fmt::Display) -> TestError {
    TestError::Check(e.to_string())
}

/// The backend the automatic choice must make on this kernel: iommufd where the kernel has IOMMUFD
/// and the vfio device cdev (the custom kernel: CONFIG_IOMMUFD=m, CONFIG_VFIO_DEVICE_CDEV=y), type1 on
/// Debian's kernels (CONFIG_IOMMUFD unset).
pub(super) fn expected_backend(g: &Guest) -> VfioBackend {
    match g.kernel {
        KernelKind::Custom => VfioBackend::Iommufd,
        KernelKind::Stock612 | KernelKind::Stock61 => VfioBackend::Type1,
    }
}

/// Every step passed (KVM included: the guest has /dev/kvm through nested SVM, so the attach check must
/// pass here), the backend is the expected one, and the config ids are `ids`.
fn ensure_passed(
    g: &Guest,
    r: &PreflightReport,
    backend: VfioBackend,
    ids: (u16, u16),
) -> Result<(), TestError> {
    let summary = || serde_json::to_string(r).unwrap_or_default();
    ensure(r.passed, || {
        format!("preflight of {} failed: {}", r.target, summary())
    })?;
    ensure_eq(format_args!("backend of {}", r.target), r.backend, backend)?;
    let names: Vec<&str> = r.steps.iter().map(|s| s.name.as_str()).collect();
    ensure_eq(
        "preflight steps",
        names,
        vec![
            "open-backend",
            "open-device",
            "device-info",
            "config-read",
            "dma-map",
            "dma-unmap",
            "close",
            "kvm-attach",
        ],
    )?;
    for s in &r.steps {
        ensure(matches!(s.outcome, StepOutcome::Passed(_)), || {
            format!(
                "step {} of {} did not pass on {:?}: {:?}",
                s.name, r.target, g.kernel, s.outcome
            )
        })?;
    }
    let dev = r
        .device
        .as_ref()
        .ok_or_else(|| TestError::Check(format!("no device info in {}", summary())))?;
    ensure_eq(
        format_args!("vendor/device of {} from its config region", r.target),
        (dev.vendor, dev.device),
        (Some(PciId(ids.0)), Some(PciId(ids.1))),
    )?;
    ensure(dev.flag_names.iter().any(|f| f == "pci"), || {
        format!(
            "{} lacks VFIO_DEVICE_FLAGS_PCI: {:?}",
            r.target, dev.flag_names
        )
    })?;
    ensure(dev.config_region().is_some(), || {
        format!("{} reports no config region: {:?}", r.target, dev.regions)
    })?;
    Ok(())
}

/// Creates one mdev of `ty`, preflights it, removes it.
fn preflight_mdev(g: &Guest, parent: &str, ty: &str, ids: (u16, u16)) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid(&format!("vfio_preflight_{parent}"), 0);
    mdevs.create(parent, ty, uuid)?;
    let r = preflight(
        &g.host,
        &VfioTarget::Mdev(uuid),
        &PreflightOptions::default(),
    )
    .map_err(check_err)?;
    ensure_passed(g, &r, expected_backend(g), ids)?;
    ensure_eq(
        format_args!("IOMMU group of mdev {uuid}"),
        Some(r.iommu_group),
        g.iommu_group_of(&vgpu_host::paths::mdev_device(&uuid)).ok(),
    )?;
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// Puts a device back on its driver even when the test fails halfway.
pub(super) struct Restore<'h> {
    pub(super) host: &'h dyn Host,
    pub(super) record: Option<BindRecord>,
}

impl Restore<'_> {
    /// Restores now, reporting a failure.
    pub(super) fn finish(mut self) -> Result<(), TestError> {
        match self.record.take() {
            Some(r) => Ok(restore_driver(self.host, &r)?),
            None => Ok(()),
        }
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.record.take() {
            // Best effort: the test already failed.
            let _ = restore_driver(self.host, &r);
        }
    }
}

/// Enables one VF, binds it with `bind_vfio`, preflights it, restores it: back without a driver (the
/// guard enables VFs with autoprobe off, and the guest has no igbvf driver anyway).
fn preflight_vf(g: &Guest, pf: Pf) -> TestResult {
    let guard = PfGuard::new(&g.host, pf)?;
    let vf = guard.enable_vfs(1)?[0];
    let before = g.driver_of(&vf)?;
    let v = check(&g.host, &vf).map_err(check_err)?;
    ensure(v.is_viable(), || format!("VF {vf} is not viable: {v}"))?;
    let restore = Restore {
        host: &g.host,
        record: Some(bind_vfio(&g.host, &vf).map_err(check_err)?),
    };
    ensure_eq(
        format_args!("driver of {vf} after bind_vfio"),
        g.driver_of(&vf)?,
        Some("vfio-pci".to_string()),
    )?;
    let r = preflight(&g.host, &VfioTarget::Pci(vf), &PreflightOptions::default())
        .map_err(check_err)?;
    ensure_passed(g, &r, expected_backend(g), pf.vf_id())?;
    restore.finish()?;
    ensure_eq(
        format_args!("driver of {vf} after restore_driver"),
        g.driver_of(&vf)?,
        before,
    )?;
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}

/// On the custom kernel both backends pass when forced; on the stock kernels type1 passes and forcing
/// iommufd is refused with the reason.
fn both_backends(g: &Guest) -> TestResult {
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("vfio_backends", 0);
    mdevs.create("mtty", "mtty-2", uuid)?;
    let t = VfioTarget::Mdev(uuid);
    let opts = |b| PreflightOptions {
        backend: Some(b),
        ..PreflightOptions::default()
    };
    let r = preflight(&g.host, &t, &opts(VfioBackend::Type1)).map_err(check_err)?;
    ensure_passed(g, &r, VfioBackend::Type1, (0x4348, 0x3253))?;
    match (
        g.kernel,
        preflight(&g.host, &t, &opts(VfioBackend::Iommufd)),
    ) {
        (KernelKind::Custom, Ok(r)) => {
            ensure_passed(g, &r, VfioBackend::Iommufd, (0x4348, 0x3253))?
        }
        (KernelKind::Custom, Err(e)) => {
            return Err(TestError::Check(format!(
                "iommufd preflight on the custom kernel: {e}"
            )));
        }
        (_, Ok(r)) => {
            return Err(TestError::Check(format!(
                "forcing iommufd on a kernel without IOMMUFD ran: {r:?}"
            )));
        }
        (_, Err(e)) => ensure(e.to_string().contains("/dev/iommu"), || {
            format!("refusal of iommufd does not name /dev/iommu: {e}")
        })?,
    }
    mdevs.remove_all()?;
    Ok(Outcome::Passed)
}

/// A PCI device not on vfio-pci is refused before anything is opened, naming its driver.
fn refuses_unbound(g: &Guest) -> TestResult {
    let pf = Pf::Igb.find(&g.host)?;
    let e = preflight(&g.host, &VfioTarget::Pci(pf), &PreflightOptions::default())
        .err()
        .ok_or_else(|| TestError::Check(format!("preflight of the igb PF {pf} ran")))?;
    let msg = e.to_string();
    ensure(msg.contains("igb") && msg.contains("vfio-pci"), || {
        format!("refusal does not name igb and vfio-pci: {msg}")
    })?;
    Ok(Outcome::Passed)
}

/// The two edu devices (and their bridge) of the shared-group topology; `None` in the default one.
fn edus(g: &Guest) -> Result<Option<(PciAddress, PciAddress)>, TestError> {
    let found = g.pci_by_id(EDU.0, EDU.1)?;
    match (g.topology, found.as_slice()) {
        (Topology::Default, []) => Ok(None),
        (Topology::SharedGroup, [a, b]) => Ok(Some((*a, *b))),
        (t, other) => Err(TestError::Check(format!(
            "{t:?} topology has edu devices {other:?}"
        ))),
    }
}

/// With the other edu device unbound, the group is viable (bridge and unbound members are fine), the
/// first edu device binds, passes the preflight (the kernel agrees the group is viable) and goes back.
fn shared_group_unbound(g: &Guest) -> TestResult {
    let Some((a, b)) = edus(g)? else {
        return Ok(Outcome::Passed);
    };
    let v = check(&g.host, &a).map_err(check_err)?;
    ensure(v.is_viable(), || {
        format!("{a} with {b} unbound is not viable: {v}")
    })?;
    let states: Vec<(PciAddress, MemberState)> =
        v.members.iter().map(|m| (m.address, m.state)).collect();
    ensure(states.contains(&(b, MemberState::Unbound)), || {
        format!("{b} is not an unbound member of {a}'s group: {states:?}")
    })?;
    ensure(
        states.iter().any(|(_, s)| *s == MemberState::Bridge),
        || format!("no bridge in {a}'s group: {states:?}"),
    )?;
    let before = g.driver_of(&a)?;
    let restore = Restore {
        host: &g.host,
        record: Some(bind_vfio(&g.host, &a).map_err(check_err)?),
    };
    let r =
        preflight(&g.host, &VfioTarget::Pci(a), &PreflightOptions::default()).map_err(check_err)?;
    ensure_passed(g, &r, expected_backend(g), EDU)?;
    restore.finish()?;
    ensure_eq(
        format_args!("driver of {a} after release"),
        g.driver_of(&a)?,
        before,
    )?;
    Ok(Outcome::Passed)
}

/// With the other edu device on a host driver (uio_pci_generic, which does not set driver_managed_dma),
/// the viability check refuses naming it, bind_vfio changes nothing, and the kernel agrees: a device
/// forced onto vfio-pci anyway cannot be opened (its group is not viable).
fn shared_group_refusal(g: &Guest) -> TestResult {
    let Some((a, b)) = edus(g)? else {
        return Ok(Outcome::Passed);
    };
    if !g
        .host
        .exists(&vgpu_host::paths::pci_driver("uio_pci_generic"))
    {
        return Ok(Outcome::Skipped(
            "kernel has no uio_pci_generic (CONFIG_UIO unset), the only host driver that takes an edu device"
                .into(),
        ));
    }
    let b_restore = Restore {
        host: &g.host,
        record: Some(bind_driver(&g.host, &b, "uio_pci_generic")?),
    };
    let v = check(&g.host, &a).map_err(check_err)?;
    ensure_eq(
        format_args!("problems of {a}"),
        v.problems.clone(),
        vec![Problem::MemberInUse {
            address: b,
            driver: "uio_pci_generic".into(),
        }],
    )?;
    let before = g.driver_of(&a)?;
    match bind_vfio(&g.host, &a) {
        Err(e @ VfioBindError::Refused { .. }) => {
            let msg = e.to_string();
            ensure(
                msg.contains(&b.to_string()) && msg.contains("uio_pci_generic"),
                || format!("refusal does not name {b} and its driver: {msg}"),
            )?;
            ensure(msg.contains("IOMMU group"), || {
                format!("refusal does not name the group: {msg}")
            })?;
        }
        other => {
            return Err(TestError::Check(format!(
                "bind_vfio({a}) was not refused: {other:?}"
            )));
        }
    }
    ensure_eq(
        format_args!("driver of {a} after the refusal"),
        g.driver_of(&a)?,
        before.clone(),
    )?;
    // Bypass the check: the kernel refuses to open the group.
    let forced = Restore {
        host: &g.host,
        record: Some(bind_driver(&g.host, &a, "vfio-pci")?),
    };
    let opts = PreflightOptions {
        kvm: false,
        ..PreflightOptions::default()
    };
    let r = preflight(&g.host, &VfioTarget::Pci(a), &opts).map_err(check_err)?;
    ensure(!r.passed, || {
        format!("preflight of {a} passed in a non-viable group: {r:?}")
    })?;
    forced.finish()?;
    b_restore.finish()?;
    ensure_eq(
        format_args!("driver of {a} after release"),
        g.driver_of(&a)?,
        before,
    )?;
    ensure_eq(
        format_args!("driver of {b} after release"),
        g.driver_of(&b)?,
        None,
    )?;
    Ok(Outcome::Passed)
}

/// `Instance1.Preflight()` on the real vgpud: the reply is a passing report for the instance, and the
/// `Health` property then holds it (with `checked_at`).
fn dbus_preflight(g: &Guest) -> TestResult {
    use super::vgpud::{TargetKind, Vgpud, Workdir};
    use vgpu_client::{BusAddress, SERVICE, connect, instance_path};

    let work = Workdir::new("vfio_dbus")?;
    let d = Vgpud::spawn(work.path(), &work.path().join("state"))?;
    let uuid = test_uuid("vfio_dbus_preflight", 0);
    d.create(TargetKind::Type, "mtty-1", "mtty", Some(&uuid))
        .map_err(check_err)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(check_err)?;
    let path = instance_path(&uuid.to_string());
    let (reply, health) = rt
        .block_on(async {
            let conn = connect(&BusAddress::Address(d.bus().to_string())).await?;
            let proxy =
                zbus::Proxy::new(&conn, SERVICE, path.as_str(), "org.vgpumanager.Instance1")
                    .await?;
            let reply: String = proxy.call("Preflight", &()).await?;
            let health: String = proxy.get_property("Health").await?;
            Ok::<_, Box<dyn std::error::Error>>((reply, health))
        })
        .map_err(|e| d.failure(&format!("Instance1.Preflight on {path}: {e}")))?;
    let r: serde_json::Value = serde_json::from_str(&reply).map_err(check_err)?;
    ensure_eq(
        "passed in the D-Bus reply",
        &r["passed"],
        &serde_json::Value::Bool(true),
    )
    .map_err(|e| TestError::Check(format!("{e}: {reply}")))?;
    ensure_eq(
        "target id",
        &r["target"]["id"],
        &serde_json::Value::from(uuid.to_string()),
    )?;
    let backend = match expected_backend(g) {
        VfioBackend::Type1 => "type1",
        VfioBackend::Iommufd => "iommufd",
    };
    ensure_eq("backend", &r["backend"], &serde_json::Value::from(backend))?;
    ensure(r["checked_at"].as_u64().is_some_and(|t| t > 0), || {
        format!("no checked_at in {reply}")
    })?;
    ensure_eq("Health after Preflight", health, reply)?;
    d.destroy(&uuid).map_err(check_err)?;
    d.stop()?;
    Ok(Outcome::Passed)
}

/// The shipped `vgpuctl` (next to kernel-tests, like vgpud): `preflight UUID --json` exits 0 with a
/// passing report, `viability ADDR --json` reports the igb PF alone in its group.
fn vgpuctl_cli(g: &Guest) -> TestResult {
    let exe = std::env::current_exe().map_err(check_err)?;
    let bin = exe.with_file_name("vgpuctl");
    ensure(bin.is_file(), || {
        format!(
            "{} is missing: scripts/vm-test ships it next to kernel-tests",
            bin.display()
        )
    })?;
    let run = |args: &[&str]| -> Result<(i32, serde_json::Value), TestError> {
        let out = std::process::Command::new(&bin)
            .args(args)
            .env_remove("VGPU_SYSFS_ROOT")
            .output()
            .map_err(check_err)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v = serde_json::from_str(&text).map_err(|e| {
            TestError::Check(format!(
                "vgpuctl {args:?}: {e}; stdout {text:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            ))
        })?;
        Ok((out.status.code().unwrap_or(-1), v))
    };
    let mut mdevs = Mdevs::new(&g.host);
    let uuid = test_uuid("vfio_vgpuctl", 0);
    mdevs.create("mdpy", "mdpy-xga", uuid)?;
    let (code, v) = run(&["preflight", &uuid.to_string(), "--json"])?;
    ensure_eq("vgpuctl preflight exit code", code, 0)?;
    ensure_eq("passed", &v["passed"], &serde_json::Value::Bool(true))?;
    ensure_eq(
        "config vendor",
        &v["device"]["vendor"],
        &serde_json::Value::from("0x1b36"),
    )?;
    mdevs.remove_all()?;
    let pf = Pf::Igb.find(&g.host)?;
    let (code, v) = run(&["viability", &pf.to_string(), "--json"])?;
    ensure_eq("vgpuctl viability exit code", code, 0)?;
    ensure_eq("viable", &v["viable"], &serde_json::Value::Bool(true))?;
    ensure_eq("driver", &v["driver"], &serde_json::Value::from("igb"))?;
    Ok(Outcome::Passed)
}
