//! A libvirt domain that boots with our vGPU (and one with an SR-IOV VF): the domain XML `vgpuctl xml --domain` makes for an mdev
//! that vgpud created, defined and started by libvirtd (QEMU started by libvirt), the device checked in
//! QEMU's own `info qtree`, and `virsh destroy` releasing it (vgpud can remove it afterwards).

use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;

use qemu_glue::{DomainSpec, Hostdev, PciHostdev};

use super::super::daemon::device_exists;
use super::super::guest::{Guest, driver_of};
use super::super::runner::{Outcome, TestError, TestResult, ensure};
use super::super::samples::{Mdevs, test_uuid};
use super::super::sriov::{Pf, PfGuard};
use super::super::vgpud::TargetKind;
use super::stack::Stack;
use super::sysroot::{Libvirt, kernel_lacks_overlay};

/// How long QEMU may take to answer its monitor after `virsh start` (nested KVM in the TCG guest; the
/// first start also probes QEMU's capabilities).
const RUNNING_WITHIN: Duration = Duration::from_secs(120);

/// Polls QEMU's `info qtree` (through `virsh qemu-monitor-command --hmp`) until it shows a `vfio-pci`
/// device and `property` (its `sysfsdev` path for an mdev, `host = "ADDR"` for a PCI function): QEMU realized
/// it, which opens the device through VFIO. The domain runs paused (`virsh start --paused`): its
/// vCPUs never run, because nested KVM executing a guest inside the TCG guest aborts the outer QEMU
/// (bookworm-backports' 10.0.2: "tcg_handle_interrupt: assertion failed: (bql_locked())", measured),
/// and a paused QEMU already holds every device; `info pci` would wait for firmware to number the
/// PCIe root port's bus.
pub(super) fn qemu_holds(
    s: &Stack,
    name: &str,
    property: &str,
    t: Instant,
) -> Result<(), TestError> {
    loop {
        match s.virsh(&["qemu-monitor-command", "--hmp", name, "info qtree"]) {
            Ok(out) if out.contains("dev: vfio-pci") && out.contains(property) => return Ok(()),
            Ok(out) if t.elapsed() > RUNNING_WITHIN => {
                return Err(s.failure(&format!(
                    "QEMU's info qtree shows no vfio-pci device with {property}:\n{out}"
                )));
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            Err(e) if t.elapsed() > RUNNING_WITHIN => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

/// What `info qtree` shows of a vfio-pci device attaching mdev `u`: its `sysfsdev` path.
pub(super) fn sysfsdev(u: &MdevUuid) -> String {
    format!("/sys/bus/mdev/devices/{u}")
}

/// What accelerator the domain gets: KVM when the guest has /dev/kvm (`kvm_amd` nested in TCG).
fn domain_type() -> &'static str {
    if std::path::Path::new("/dev/kvm").exists() {
        "kvm"
    } else {
        "qemu"
    }
}

/// Step 4: `virsh define` + `start` of `vgpuctl xml --domain`'s domain with an mbochs mdev.
pub fn boots_with_mdev(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let s = Stack::up("libvirt-domain", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("libvirt-domain", 0);
    mdevs.adopt(u);
    s.vgpud()?
        .create(TargetKind::Type, "mbochs-small", "mbochs", Some(&u))?;
    let name = "vgpu-libvirt-test";
    let xml = domain_xml(&s, &u, name)?;
    let ty = domain_type();
    println!(
        "libvirt: domain type {ty} (/dev/kvm {})",
        if ty == "kvm" {
            "present"
        } else {
            "absent: TCG"
        }
    );
    ensure(
        xml.contains("type='mdev'") && xml.contains(&u.to_string()),
        || format!("vgpuctl xml --domain made no mdev hostdev for {u}: {xml}"),
    )?;
    let file = s.file("domain.xml", &xml)?;
    s.virsh(&["define", &file])?;
    let t = Instant::now();
    let started = s.virsh(&["start", "--paused", name]);
    if let Err(e) = started {
        let _ = s.virsh(&["undefine", "--nvram", name]);
        return Err(e);
    }
    let result = (|| -> Result<(), TestError> {
        qemu_holds(&s, name, &sysfsdev(&u), t)?;
        println!(
            "libvirt: domain started (paused) and QEMU holds the vGPU {:?} after virsh start",
            t.elapsed()
        );
        Ok(())
    })();
    let destroyed = s.virsh(&["destroy", name]);
    let undefined = s.virsh(&["undefine", "--nvram", name]);
    result?;
    destroyed?;
    undefined?;
    // Released: vgpud removes the device, which the kernel refuses while QEMU holds it open.
    s.vgpud()?.destroy(&u)?;
    ensure(!device_exists(g, &u), || {
        format!("mdev {u} is still in sysfs after virsh destroy and vgpud Destroy")
    })?;
    mdevs.forget(&u);
    let left = s.virsh(&["list", "--all", "--name"])?;
    ensure(left.trim().is_empty(), || format!("domains left: {left}"))
        .map_err(|e| TestError::Check(e.to_string()))?;
    Ok(Outcome::Passed)
}

/// `vgpuctl xml --domain` for instance `u`, named `name`, small enough for the guest.
pub(super) fn domain_xml(s: &Stack, u: &MdevUuid, name: &str) -> Result<String, TestError> {
    let xml = s.root.run(
        "vgpuctl",
        &[
            "xml",
            "--domain",
            "--name",
            name,
            "--memory",
            "128",
            "--vcpus",
            "1",
            &u.to_string(),
        ],
    )?;
    Ok(fit_for_guest(&xml))
}

/// A domain XML made for a host, as the guest can run it: the harness's QEMU (bookworm-backports'
/// qemu-system-x86) is installed without Debian's spice module (package qemu-system-modules-spice),
/// so libvirt refuses a SPICE display: the same display over VNC, which QEMU has built in. A network
/// interface names libvirt's `default` network, which libvirt-daemon-system defines (with dnsmasq);
/// the guest has neither, and the tests need no network: the interface goes. Without /dev/kvm the
/// domain type is `qemu` (TCG). Nothing else changes.
fn fit_for_guest(xml: &str) -> String {
    let mut xml = xml.replacen("<graphics type='spice'", "<graphics type='vnc'", 1);
    if let (Some(a), Some(b)) = (xml.find("<interface "), xml.find("</interface>")) {
        xml.replace_range(a..b + "</interface>".len(), "");
    }
    if domain_type() == "kvm" {
        xml
    } else {
        xml.replacen("type='kvm'", "type='qemu'", 1)
    }
}

/// Step 5: with vgpu-libvirt-hook installed as libvirt's qemu hook, a domain whose metadata names
/// its vGPU gets it created at start and removed at stop; a full parent makes the start fail with the
/// hook's message and leaves nothing behind.
pub fn hook_creates_and_removes(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let s = Stack::up("libvirt-hook", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("libvirt-hook", 0);
    mdevs.adopt(u);
    // The XML (with vgpu-manager's metadata for the device) is made while the instance exists, then
    // the instance goes: the hook must bring it back.
    s.vgpud()?
        .create(TargetKind::Type, "mbochs-small", "mbochs", Some(&u))?;
    let name = "vgpu-hook-test";
    let xml = domain_xml(&s, &u, name)?;
    ensure(xml.contains("vgpu:vgpus"), || {
        format!("vgpuctl xml --domain wrote no vgpu-manager metadata: {xml}")
    })?;
    s.vgpud()?.destroy(&u)?;
    ensure(!device_exists(g, &u), || {
        format!("{u} still exists after Destroy")
    })?;
    let file = s.file("hook-domain.xml", &xml)?;
    s.virsh(&["define", &file])?;
    let outcome = (|| -> Result<(), TestError> {
        s.virsh(&["start", "--paused", name])?;
        ensure(device_exists(g, &u), || {
            format!("the hook did not create {u} at start")
        })?;
        let info = s.vgpud()?.get_instance(&u)?;
        ensure(info.label == format!("libvirt:{name}"), || {
            format!(
                "the hook's instance is labelled {:?}, expected libvirt:{name}",
                info.label
            )
        })?;
        qemu_holds(&s, name, &sysfsdev(&u), Instant::now())?;
        s.virsh(&["destroy", name])?;
        s.wait_until(
            "the hook removes the vGPU at stop",
            Duration::from_secs(30),
            |_| Ok(!device_exists(g, &u)),
        )?;
        let left = s.vgpud()?.list_instances()?;
        ensure(left.is_empty(), || {
            format!("vgpud still lists {left:?} after the domain stopped")
        })?;

        // A full parent: mbochs-large takes the whole 256 MB pool (4 x 64 MB), so mbochs-small has room
        // for none.
        let fillers: Vec<MdevUuid> = (1..=4).map(|n| test_uuid("libvirt-hook", n)).collect();
        for f in &fillers {
            s.vgpud()?
                .create(TargetKind::Type, "mbochs-large", "mbochs", Some(f))?;
            mdevs.adopt(*f);
        }
        let err = s.virsh_fails(&["start", "--paused", name])?;
        println!("libvirt: start on a full parent refused: {}", err.trim());
        ensure(err.contains("vgpu-manager") || err.contains("hook"), || {
            format!("the failed start does not show the hook's message: {err}")
        })?;
        ensure(!device_exists(g, &u), || {
            format!("{u} was left behind by the failed start")
        })?;
        let state = s.virsh(&["domstate", name])?;
        ensure(state.trim() == "shut off", || {
            format!("domain is {state:?} after a failed start")
        })?;
        for f in &fillers {
            s.vgpud()?.destroy(f)?;
            mdevs.forget(f);
        }
        let left = s.vgpud()?.list_instances()?;
        ensure(left.is_empty(), || {
            format!("vgpud lists {left:?} after the failed start")
        })?;
        Ok(())
    })();
    let _ = s.virsh(&["destroy", name]);
    let undefined = s.virsh(&["undefine", "--nvram", name]);
    outcome?;
    undefined?;
    mdevs.forget(&u);
    Ok(Outcome::Passed)
}

/// A domain with an SR-IOV VF: an igb VF (the guest's stand-in for a GPU's VF) as `<hostdev
/// type='pci' managed='yes'>` in the XML qemu-glue's `DomainSpec` writes (what `vgpuctl xml --domain`
/// prints for a VF pool slot); libvirt detaches it to vfio-pci at start, QEMU holds it, and `virsh
/// destroy` gives it back to the driver it had.
pub fn boots_with_vf(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = kernel_lacks_overlay() {
        return Ok(Outcome::Skipped(reason));
    }
    let s = Stack::up("libvirt-vf", v)?;
    let h: &dyn vgpu_host::Host = &g.host;
    let guard = PfGuard::new(h, Pf::Igb)?;
    let vf = guard.enable_vfs(1)?[0];
    let original = driver_of(h, &vf)?;
    let name = "vgpu-libvirt-vf";
    let mut spec = DomainSpec::desktop(
        name,
        vec![Hostdev::Pci(PciHostdev {
            address: vf,
            managed: true,
        })],
    );
    spec.memory_mib = 128;
    spec.vcpus = 1;
    spec.network = None;
    let xml = spec
        .to_xml()
        .map_err(|e| TestError::Check(format!("DomainSpec::to_xml: {e}")))?;
    let xml = fit_for_guest(&xml);
    ensure(xml.contains("type='pci'"), || {
        format!("DomainSpec wrote no PCI hostdev for {vf}: {xml}")
    })?;
    let file = s.file("vf-domain.xml", &xml)?;
    s.virsh(&["define", &file])?;
    let t = Instant::now();
    let result = (|| -> Result<(), TestError> {
        s.virsh(&["start", "--paused", name])?;
        qemu_holds(&s, name, &format!("host = \"{vf}\""), t)?;
        ensure(driver_of(h, &vf)?.as_deref() == Some("vfio-pci"), || {
            format!("{vf} is not bound to vfio-pci while the domain runs")
        })?;
        println!(
            "libvirt: domain with VF {vf} started (paused), QEMU holds it {:?} after virsh start",
            t.elapsed()
        );
        Ok(())
    })();
    let destroyed = s.virsh(&["destroy", name]);
    let undefined = s.virsh(&["undefine", "--nvram", name]);
    result?;
    destroyed?;
    undefined?;
    s.wait_until(
        "libvirt gives the VF back to its driver after virsh destroy",
        Duration::from_secs(20),
        |_| Ok(driver_of(h, &vf)? == original),
    )?;
    guard.set_numvfs(0)?;
    Ok(Outcome::Passed)
}
