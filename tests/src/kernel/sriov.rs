//! SR-IOV tests on QEMU's igb and nvme PFs: VF enable/disable with autoprobe off, binding a VF to
//! vfio-pci and back, and every `sriov_numvfs` / bind refusal with the kernel's exact errno.
//!
//! Kernel sources: drivers/pci/iov.c `sriov_numvfs_store` (EINVAL unparsable, ERANGE above
//! `sriov_totalvfs`, no-op for the current value, ENOENT without a PF driver or without
//! `sriov_configure`, EBUSY from non-zero to non-zero); drivers/base/bus.c `bind_store` and
//! `drivers_probe_store` (ENODEV for a device name the bus does not know).

use std::path::Path;

use mdev_types::ids::PciAddress;
use vgpu_host::{Errno, Host, HostError, HostExt, paths};

use super::guest::{Guest, driver_of, one_pci, pci_by_id, vf_address};
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq, expect_errno};

/// QEMU's igb: an Intel 82576 PF 8086:10c9 whose VFs are 8086:10ca (hw/net/igb.c, igb_common.h).
pub const IGB_PF: (u16, u16) = (0x8086, 0x10c9);
/// The 82576 VF id (QEMU hw/net/igbvf.c; Linux drivers/net/ethernet/intel/igbvf).
pub const IGB_VF: (u16, u16) = (0x8086, 0x10ca);
/// QEMU's nvme controller, PF and VFs alike: 1b36:0010 (PCI_DEVICE_ID_REDHAT_NVME, hw/nvme/ctrl.c).
pub const NVME_ID: (u16, u16) = (0x1b36, 0x0010);
/// sriov_max_vfs given to QEMU's nvme in scripts/vm/topologies.sh.
pub const NVME_TOTAL_VFS: u32 = 2;
/// The igb driver caps the 82576's VFs at 7 (drivers/net/ethernet/intel/igb/igb_main.c
/// `igb_probe_vfs` / `pci_sriov_set_totalvfs(pdev, 7)`), below the 8 QEMU's igb offers.
pub const IGB_TOTAL_VFS: u32 = 7;

/// The SR-IOV tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![
        Test::new("sriov_pfs_present", pfs_present),
        Test::new("sriov_enable_disable_igb", |g| enable_disable(g, Pf::Igb)),
        Test::new("sriov_enable_disable_nvme", |g| enable_disable(g, Pf::Nvme)),
        Test::new("sriov_vf_bind_vfio_pci_and_restore_igb", |g| {
            bind_vfio_and_restore(g, Pf::Igb)
        }),
        Test::new("sriov_vf_bind_vfio_pci_and_restore_nvme", |g| {
            bind_vfio_and_restore(g, Pf::Nvme)
        }),
        Test::new("sriov_error_no_pf_driver", no_pf_driver),
        Test::new("sriov_error_above_total", above_total),
        Test::new("sriov_error_nonzero_to_nonzero", nonzero_to_nonzero),
        Test::new("sriov_error_invalid_count", invalid_count),
        Test::new("bind_error_device_gone", bind_device_gone),
    ]
}

/// The two SR-IOV PFs of the default topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pf {
    /// QEMU's igb, driven by igb.
    Igb,
    /// QEMU's nvme, driven by nvme.
    Nvme,
}

impl Pf {
    /// Finds the PF's address.
    pub fn find(self, host: &dyn Host) -> Result<PciAddress, TestError> {
        match self {
            Pf::Igb => one_pci(host, "igb PF", IGB_PF.0, IGB_PF.1),
            Pf::Nvme => {
                // VFs share the PF's id; the PF is the one with sriov_totalvfs.
                let pfs: Vec<PciAddress> = pci_by_id(host, NVME_ID.0, NVME_ID.1)?
                    .into_iter()
                    .filter(|a| host.exists(&paths::pci_attr(a, "sriov_totalvfs")))
                    .collect();
                match pfs.as_slice() {
                    [one] => Ok(*one),
                    other => Err(TestError::Check(format!(
                        "expected one nvme PF with sriov_totalvfs, found {other:?}"
                    ))),
                }
            }
        }
    }

    /// Its PF driver.
    pub fn driver(self) -> &'static str {
        match self {
            Pf::Igb => "igb",
            Pf::Nvme => "nvme",
        }
    }

    /// Its sriov_totalvfs.
    pub fn total_vfs(self) -> u32 {
        match self {
            Pf::Igb => IGB_TOTAL_VFS,
            Pf::Nvme => NVME_TOTAL_VFS,
        }
    }

    /// The VF vendor/device id.
    pub fn vf_id(self) -> (u16, u16) {
        match self {
            Pf::Igb => IGB_VF,
            Pf::Nvme => NVME_ID,
        }
    }
}

/// Reads a decimal attribute.
pub fn read_u32(host: &dyn Host, path: &Path) -> Result<u32, TestError> {
    let text = host.read_trimmed(path)?;
    text.parse()
        .map_err(|_| TestError::Check(format!("{} reads {text:?}, not a number", path.display())))
}

/// Puts a PF back as the suite found it, even when a test fails halfway: PF driver bound, VFs off,
/// autoprobe on.
pub struct PfGuard<'h> {
    host: &'h dyn Host,
    pf: PciAddress,
    driver: &'static str,
}

impl<'h> PfGuard<'h> {
    /// Guards `pf` on `host`, which must be bound to its driver with no VFs now.
    pub fn new(host: &'h dyn Host, pf: Pf) -> Result<Self, TestError> {
        let addr = pf.find(host)?;
        ensure_eq(
            format_args!("driver of the {} PF {addr}", pf.driver()),
            driver_of(host, &addr)?,
            Some(pf.driver().to_string()),
        )?;
        ensure_eq(
            format_args!("{addr}/sriov_numvfs at the start"),
            read_u32(host, &paths::pci_attr(&addr, "sriov_numvfs"))?,
            0,
        )?;
        Ok(Self {
            host,
            pf: addr,
            driver: pf.driver(),
        })
    }

    /// The PF's address.
    pub fn addr(&self) -> PciAddress {
        self.pf
    }

    /// Writes `sriov_numvfs`.
    pub fn set_numvfs(&self, n: u32) -> Result<(), HostError> {
        self.host
            .write(&paths::pci_attr(&self.pf, "sriov_numvfs"), &n.to_string())
    }

    /// Writes `sriov_drivers_autoprobe`.
    pub fn set_autoprobe(&self, on: bool) -> Result<(), HostError> {
        self.host.write(
            &paths::pci_attr(&self.pf, "sriov_drivers_autoprobe"),
            if on { "1" } else { "0" },
        )
    }

    /// Enables `n` VFs with autoprobe off and returns their addresses.
    pub fn enable_vfs(&self, n: u32) -> Result<Vec<PciAddress>, TestError> {
        self.set_autoprobe(false)?;
        self.set_numvfs(n)?;
        (0..n).map(|i| vf_address(self.host, &self.pf, i)).collect()
    }
}

impl Drop for PfGuard<'_> {
    fn drop(&mut self) {
        let h = self.host;
        // Best effort, in dependency order: a VF bound to vfio-pci does not block disabling (the PCI
        // core unbinds it), but the PF needs its driver for sriov_numvfs.
        if h.link_name(&paths::pci_attr(&self.pf, "driver"))
            .ok()
            .flatten()
            .is_none()
        {
            let _ = h.write(
                &paths::pci_driver(self.driver).join("bind"),
                &self.pf.to_string(),
            );
        }
        let _ = self.set_numvfs(0);
        let _ = self.set_autoprobe(true);
    }
}

/// Both PFs are there, bound to their drivers, with the expected sriov_totalvfs and no VFs.
fn pfs_present(g: &Guest) -> TestResult {
    for pf in [Pf::Igb, Pf::Nvme] {
        let addr = pf.find(&g.host)?;
        ensure_eq(
            format_args!("driver of {addr}"),
            g.driver_of(&addr)?,
            Some(pf.driver().to_string()),
        )?;
        ensure_eq(
            format_args!("{addr}/sriov_totalvfs"),
            read_u32(&g.host, &paths::pci_attr(&addr, "sriov_totalvfs"))?,
            pf.total_vfs(),
        )?;
        ensure_eq(
            format_args!("{addr}/sriov_numvfs"),
            read_u32(&g.host, &paths::pci_attr(&addr, "sriov_numvfs"))?,
            0,
        )?;
        ensure_eq(
            format_args!("{addr}/sriov_drivers_autoprobe"),
            read_u32(&g.host, &paths::pci_attr(&addr, "sriov_drivers_autoprobe"))?,
            1,
        )?;
    }
    Ok(Outcome::Passed)
}

/// With autoprobe off, enabling every VF creates virtfnN links to driverless VFs whose physfn points
/// back; disabling removes them.
fn enable_disable(g: &Guest, pf: Pf) -> TestResult {
    let guard = PfGuard::new(&g.host, pf)?;
    let total = pf.total_vfs();
    let vfs = guard.enable_vfs(total)?;
    ensure_eq(
        "sriov_numvfs after enabling",
        read_u32(&g.host, &paths::pci_attr(&guard.addr(), "sriov_numvfs"))?,
        total,
    )?;
    for vf in &vfs {
        ensure_eq(
            format_args!("physfn of VF {vf}"),
            g.host.link_name(&paths::pci_attr(vf, "physfn"))?,
            Some(guard.addr().to_string()),
        )?;
        ensure_eq(format_args!("driver of VF {vf}"), g.driver_of(vf)?, None)?;
        let found = g.pci_by_id(pf.vf_id().0, pf.vf_id().1)?;
        ensure(found.contains(vf), || {
            format!(
                "VF {vf} does not have id {:04x}:{:04x}",
                pf.vf_id().0,
                pf.vf_id().1
            )
        })?;
    }
    guard.set_numvfs(0)?;
    for vf in &vfs {
        g.wait_for(&paths::pci_device(vf), false)?;
    }
    ensure(
        !g.host.exists(&paths::pci_attr(&guard.addr(), "virtfn0")),
        || "virtfn0 is still there after disabling".into(),
    )?;
    Ok(Outcome::Passed)
}

/// A VF binds to vfio-pci through driver_override + drivers_probe (its /dev/vfio/<group> appears),
/// then goes back to no driver once unbound and the override is cleared.
fn bind_vfio_and_restore(g: &Guest, pf: Pf) -> TestResult {
    let guard = PfGuard::new(&g.host, pf)?;
    let vfs = guard.enable_vfs(1)?;
    let vf = vfs[0];
    let h = &g.host;
    ensure_eq(
        format_args!("{vf}/driver_override before"),
        h.read_trimmed(&paths::pci_attr(&vf, "driver_override"))?,
        "(null)".to_string(),
    )?;
    h.write(&paths::pci_attr(&vf, "driver_override"), "vfio-pci")?;
    h.write(Path::new(paths::PCI_DRIVERS_PROBE), &vf.to_string())?;
    ensure_eq(
        format_args!("driver of {vf} after drivers_probe"),
        g.driver_of(&vf)?,
        Some("vfio-pci".to_string()),
    )?;
    let group = g.iommu_group_of(&paths::pci_device(&vf))?;
    let node = format!("/dev/vfio/{group}");
    ensure(h.exists(Path::new(&node)), || {
        format!("{node} is missing with {vf} on vfio-pci")
    })?;
    // Restore: unbind from vfio-pci, clear the override (a lone newline clears it,
    // drivers/base/driver.c driver_set_override).
    h.write(
        &paths::pci_driver("vfio-pci").join("unbind"),
        &vf.to_string(),
    )?;
    h.write(&paths::pci_attr(&vf, "driver_override"), "\n")?;
    ensure_eq(
        format_args!("{vf}/driver_override after clearing"),
        h.read_trimmed(&paths::pci_attr(&vf, "driver_override"))?,
        "(null)".to_string(),
    )?;
    ensure_eq(
        format_args!("driver of {vf} after unbind"),
        g.driver_of(&vf)?,
        None,
    )?;
    g.wait_for(Path::new(&node), false)?;
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}

/// Without a PF driver, changing sriov_numvfs is ENOENT; writing the current value (0) still succeeds
/// because iov.c compares with the current count first.
fn no_pf_driver(g: &Guest) -> TestResult {
    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    let pf = guard.addr();
    g.host
        .write(&paths::pci_driver("igb").join("unbind"), &pf.to_string())?;
    ensure_eq(
        format_args!("driver of {pf} after unbind"),
        g.driver_of(&pf)?,
        None,
    )?;
    expect_errno(
        format_args!("sriov_numvfs=1 on {pf} without a driver"),
        guard.set_numvfs(1),
        Errno::ENOENT,
    )?;
    guard.set_numvfs(0)?;
    g.host
        .write(&paths::pci_driver("igb").join("bind"), &pf.to_string())?;
    ensure_eq(
        format_args!("driver of {pf} after bind"),
        g.driver_of(&pf)?,
        Some("igb".to_string()),
    )?;
    Ok(Outcome::Passed)
}

/// More VFs than sriov_totalvfs: ERANGE, for both PFs.
fn above_total(g: &Guest) -> TestResult {
    for pf in [Pf::Igb, Pf::Nvme] {
        let guard = PfGuard::new(&g.host, pf)?;
        expect_errno(
            format_args!(
                "sriov_numvfs={} on the {} PF",
                pf.total_vfs() + 1,
                pf.driver()
            ),
            guard.set_numvfs(pf.total_vfs() + 1),
            Errno::ERANGE,
        )?;
    }
    Ok(Outcome::Passed)
}

/// From one non-zero count to another: EBUSY, and the count stays.
fn nonzero_to_nonzero(g: &Guest) -> TestResult {
    for pf in [Pf::Igb, Pf::Nvme] {
        let guard = PfGuard::new(&g.host, pf)?;
        guard.enable_vfs(1)?;
        expect_errno(
            format_args!("sriov_numvfs 1 -> 2 on the {} PF", pf.driver()),
            guard.set_numvfs(2),
            Errno::EBUSY,
        )?;
        ensure_eq(
            "sriov_numvfs after the refused change",
            read_u32(&g.host, &paths::pci_attr(&guard.addr(), "sriov_numvfs"))?,
            1,
        )?;
        // Writing the current count again is a no-op, not EBUSY.
        guard.set_numvfs(1)?;
        guard.set_numvfs(0)?;
    }
    Ok(Outcome::Passed)
}

/// A count that is not a number: EINVAL.
fn invalid_count(g: &Guest) -> TestResult {
    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    expect_errno(
        "sriov_numvfs=many",
        g.host
            .write(&paths::pci_attr(&guard.addr(), "sriov_numvfs"), "many"),
        Errno::EINVAL,
    )?;
    Ok(Outcome::Passed)
}

/// Binding a VF that was just disabled: its driver_override is gone (ENOENT) and the bus no longer
/// knows its name (drivers_probe and vfio-pci's bind: ENODEV).
fn bind_device_gone(g: &Guest) -> TestResult {
    let guard = PfGuard::new(&g.host, Pf::Igb)?;
    let vf = guard.enable_vfs(1)?[0];
    guard.set_numvfs(0)?;
    g.wait_for(&paths::pci_device(&vf), false)?;
    expect_errno(
        format_args!("driver_override of the gone VF {vf}"),
        g.host
            .write(&paths::pci_attr(&vf, "driver_override"), "vfio-pci"),
        Errno::ENOENT,
    )?;
    expect_errno(
        format_args!("drivers_probe of the gone VF {vf}"),
        g.host
            .write(Path::new(paths::PCI_DRIVERS_PROBE), &vf.to_string()),
        Errno::ENODEV,
    )?;
    expect_errno(
        format_args!("vfio-pci bind of the gone VF {vf}"),
        g.host
            .write(&paths::pci_driver("vfio-pci").join("bind"), &vf.to_string()),
        Errno::ENODEV,
    )?;
    Ok(Outcome::Passed)
}
