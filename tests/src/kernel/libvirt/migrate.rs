//! `virsh migrate --live` of a domain with an mtty vGPU between two libvirt daemons in the guest,
//! each in its own [`Stack`] (sysroot, udevd, system bus, vgpud, libvirtd) as two hosts would be: the
//! target's vGPU made by its vgpud with `vgpuctl migration prepare` from the source's fingerprint,
//! and the target domain XML written by `prepare --domain-xml` from the source's `virsh dumpxml
//! --migratable` (the mdev's UUID replaced).
//!
//! What the harness needs, each found out on the guest:
//! - two host UUIDs: the daemons share the guest's SMBIOS UUID, and libvirt refuses a migration
//!   between daemons of one host UUID (src/qemu/qemu_migration_cookie.c); `host_uuid` in each
//!   libvirtd.conf ([`Stack::up_as_host`]);
//! - the target's libvirtd socket, bound into the source's sysroot at `/run/peer-libvirt`; `--p2p`: the
//!   source libvirtd connects to it itself; the migration stream over a Unix socket in the shared
//!   `/tmp` (`--migrateuri unix://…`, libvirt's "Migration using only UNIX sockets");
//! - the device's QEMU properties: mtty accepts dirty-page logging but cannot report its log, so the
//!   hostdev gets `enable-migration=on` and `x-device-dirty-page-tracking=off` through libvirt's
//!   `<qemu:override>` (QEMU namespace, libvirt ≥ 8.2; docs/migration.md). libvirt lets a VFIO
//!   hostdev migrate when QEMU reports no migration blocker (src/qemu/qemu_migration.c,
//!   `qemuMigrationSrcIsAllowed`: with QEMU's `blocked-reasons`, the hostdev list is not consulted).
//!
//! Both domains run paused (see `domain`): the vCPUs never run, and the device state moves with the
//! VM's (VFIO migration uAPI v2 STOP_COPY). mtty implements migration since Linux 6.7; before, the
//! test is skipped with the reason.

use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;

use super::super::daemon::{availability, device_exists, ensure_restored};
use super::super::guest::Guest;
use super::super::migration::kernel_version;
use super::super::runner::{Outcome, TestError, TestResult, ensure};
use super::super::samples::{Mdevs, test_uuid};
use super::super::vgpud::TargetKind;
use super::domain::{domain_xml, qemu_holds, sysfsdev};
use super::stack::Stack;
use super::sysroot::{Libvirt, kernel_lacks_overlay};

/// The source and target daemons' host UUIDs.
const SOURCE_HOST: &str = "7a1c0e52-5b1f-4c5e-9d0a-000000000a0a";
const TARGET_HOST: &str = "7a1c0e52-5b1f-4c5e-9d0a-000000000b0b";
/// Where the target's `/run/libvirt` is bound in the source's sysroot.
const PEER_DIR: &str = "/run/peer-libvirt";
/// The migration stream's socket (in `/tmp`, which both sysroots share).
const STREAM: &str = "/tmp/kernel-tests-libvirt-migrate.sock";
/// How long the migration may take (TCG guest; measured: seconds).
const MIGRATED_WITHIN: Duration = Duration::from_secs(180);

/// The QEMU namespace of libvirt's domain XML (formatdomain, "QEMU command-line passthrough").
const QEMU_NS: &str = "http://libvirt.org/schemas/domain/qemu/1.0";

/// `xml` with the qemu namespace declared and a `<qemu:override>` giving the domain's first hostdev
/// (alias `hostdev0`, libvirt's name for it) `enable-migration=on` and
/// `x-device-dirty-page-tracking=off` (both OnOffAuto properties of vfio-pci: strings).
pub(super) fn with_migration_override(xml: &str) -> Result<String, TestError> {
    let Some(at) = xml.find("<domain ") else {
        return Err(TestError::Check(format!("no <domain> element: {xml}")));
    };
    let mut out = xml.to_string();
    out.insert_str(at + "<domain ".len(), &format!("xmlns:qemu='{QEMU_NS}' "));
    let end = out
        .rfind("</domain>")
        .ok_or_else(|| TestError::Check(format!("no </domain>: {xml}")))?;
    out.insert_str(
        end,
        "  <qemu:override>\n    <qemu:device alias='hostdev0'>\n      <qemu:frontend>\n        <qemu:property name='enable-migration' type='string' value='on'/>\n        <qemu:property name='x-device-dirty-page-tracking' type='string' value='off'/>\n      </qemu:frontend>\n    </qemu:device>\n  </qemu:override>\n",
    );
    Ok(out)
}

/// Why the guest cannot run these tests, if it cannot.
fn cannot_run() -> Option<String> {
    if let Some(reason) = kernel_lacks_overlay() {
        return Some(reason);
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    if kernel_version(release.trim()).is_none_or(|k| k < (6, 7)) {
        return Some(
            "mtty implements VFIO migration only since Linux 6.7 (samples/vfio-mdev/mtty.c)".into(),
        );
    }
    None
}

/// `virsh migrate` arguments of domain `name` to the target daemon with target XML `xml`.
fn migrate_args<'a>(xml: &'a str, stream: &'a str, name: &'a str, dest: &'a str) -> [&'a str; 14] {
    [
        "migrate",
        "--live",
        "--p2p",
        "--persistent",
        "--undefinesource",
        "--xml",
        xml,
        "--persistent-xml",
        xml,
        "--migrateuri",
        stream,
        name,
        dest,
        "--verbose",
    ]
}

/// Without the `<qemu:override>`, QEMU uses mtty's dirty-page log, whose report fails: the
/// migration fails, the source keeps the domain (paused, its vGPU still in QEMU), the target has
/// none, and `vgpuctl migration abort` releases the prepared target.
pub fn fails_without_override(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = cannot_run() {
        return Ok(Outcome::Skipped(reason));
    }
    let before = availability(g)?;
    let mut src = Stack::up_as_host("libvirt-migrate-plain-src", v, SOURCE_HOST)?;
    let dst = Stack::up_as_host("libvirt-migrate-plain-dst", v, TARGET_HOST)?;
    src.root.bind(&dst.root.path("/run/libvirt"), PEER_DIR)?;
    let mut mdevs = Mdevs::new(&g.host);
    let source = test_uuid("libvirt-migrate-plain", 0);
    mdevs.adopt(source);
    src.vgpud()?
        .create(TargetKind::Type, "mtty-1", "mtty", Some(&source))?;
    let name = "vgpu-migrate-plain";
    let file = src.file("plain-domain.xml", &domain_xml(&src, &source, name)?)?;
    src.virsh(&["define", &file])?;
    let mut target: Option<MdevUuid> = None;
    let outcome = (|| -> Result<(), TestError> {
        let t0 = Instant::now();
        src.virsh(&["start", "--paused", name])?;
        qemu_holds(&src, name, &sysfsdev(&source), t0)?;
        let s = source.to_string();
        let fp = src.root.run("vgpuctl", &["migration", "fingerprint", &s])?;
        let fp_file = src.file("plain-fingerprint.json", &fp)?;
        let dumped = src.virsh(&["dumpxml", "--migratable", name])?;
        let src_xml = src.file("plain-source.xml", &dumped)?;
        let prepared = dst.root.run(
            "vgpuctl",
            &[
                "migration",
                "prepare",
                "--target",
                &fp_file,
                "--domain-xml",
                &src_xml,
                "--json",
            ],
        )?;
        let p: serde_json::Value = serde_json::from_str(&prepared)
            .map_err(|e| TestError::Check(format!("migration prepare --json: {e}: {prepared}")))?;
        let made: MdevUuid = p["uuid"]
            .as_str()
            .and_then(|u| u.parse().ok())
            .ok_or_else(|| TestError::Check(format!("migration prepare named no UUID: {p}")))?;
        target = Some(made);
        let dst_xml = src.file("plain-target.xml", p["domain_xml"].as_str().unwrap_or(""))?;
        let dest = format!("qemu+unix:///system?socket={PEER_DIR}/libvirt-sock");
        let stream = format!("unix://{STREAM}");
        let _ = std::fs::remove_file(STREAM);
        let err = src.virsh_fails(&migrate_args(&dst_xml, &stream, name, &dest))?;
        let log =
            std::fs::read_to_string(src.root.path(&format!("/var/log/libvirt/qemu/{name}.log")))
                .unwrap_or_default();
        println!(
            "libvirt: without the override, virsh migrate failed: {}",
            err.trim()
        );
        ensure(
            err.contains("DMA logging") || log.contains("DMA logging"),
            || {
                format!(
                    "the failure names neither in virsh's error nor in the source QEMU's log the device's DMA logging:\n{err}\n{log}"
                )
            },
        )?;
        let state = src.virsh(&["domstate", name])?;
        ensure(state.trim() == "paused", || {
            format!(
                "the source domain is {:?} after the failed migration",
                state.trim()
            )
        })?;
        qemu_holds(&src, name, &sysfsdev(&source), Instant::now())?;
        let there = dst.virsh(&["list", "--all", "--name"])?;
        ensure(there.trim().is_empty(), || {
            format!("the target has domains after the failed migration: {there}")
        })?;
        let m = made.to_string();
        dst.root.run("vgpuctl", &["migration", "abort", &m])?;
        ensure(!device_exists(g, &made), || {
            format!("the aborted target {made} is still in sysfs")
        })?;
        Ok(())
    })();
    for s in [&src, &dst] {
        let _ = s.virsh(&["destroy", name]);
        let _ = s.virsh(&["undefine", "--nvram", name]);
    }
    if let Some(t) = target {
        mdevs.adopt(t);
    }
    outcome?;
    src.vgpud()?.destroy(&source)?;
    mdevs.forget(&source);
    if let Some(t) = target {
        mdevs.forget(&t);
    }
    for (side, s) in [("source", &src), ("target", &dst)] {
        let left = s.vgpud()?.list_instances()?;
        ensure(left.is_empty(), || {
            format!("the {side}'s vgpud still lists {left:?} at the end")
        })?;
    }
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// The test, for libvirt `v`.
pub fn live_migrates_mtty(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(reason) = cannot_run() {
        return Ok(Outcome::Skipped(reason));
    }
    let before = availability(g)?;
    let mut src = Stack::up_as_host("libvirt-migrate-src", v, SOURCE_HOST)?;
    let dst = Stack::up_as_host("libvirt-migrate-dst", v, TARGET_HOST)?;
    src.root.bind(&dst.root.path("/run/libvirt"), PEER_DIR)?;
    let mut mdevs = Mdevs::new(&g.host);
    let source = test_uuid("libvirt-migrate", 0);
    mdevs.adopt(source);
    src.vgpud()?
        .create(TargetKind::Type, "mtty-1", "mtty", Some(&source))?;
    let name = "vgpu-migrate-test";
    let xml = with_migration_override(&domain_xml(&src, &source, name)?)?;
    let file = src.file("migrate-domain.xml", &xml)?;
    src.virsh(&["define", &file])?;
    let mut target: Option<MdevUuid> = None;
    let outcome = migrate(g, &src, &dst, name, &source, &mut target);
    // Whatever happened: no domain, no instance left.
    for s in [&src, &dst] {
        let _ = s.virsh(&["destroy", name]);
        let _ = s.virsh(&["undefine", "--nvram", name]);
    }
    if let Some(t) = target {
        mdevs.adopt(t);
    }
    outcome?;
    let t = target.ok_or_else(|| TestError::Check("no target was made".into()))?;
    // Both "hosts" share one kernel: each vgpud also lists the other's instance, as foreign.
    let left = src.vgpud()?.list_instances()?;
    ensure(
        left.iter()
            .all(|i| i.uuid == t.to_string() && i.owner == "foreign"),
        || {
            format!(
                "the source's vgpud lists {left:?} after the migration, not only the target (foreign to it)"
            )
        },
    )?;
    dst.vgpud()?.destroy(&t)?;
    mdevs.forget(&t);
    mdevs.forget(&source);
    ensure(!device_exists(g, &t), || {
        format!("target {t} is still in sysfs after Destroy")
    })?;
    for (side, s) in [("source", &src), ("target", &dst)] {
        let left = s.vgpud()?.list_instances()?;
        ensure(left.is_empty(), || {
            format!("the {side}'s vgpud still lists {left:?} at the end")
        })?;
    }
    mdevs.remove_all()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// Starts the domain on `src`, makes the target on `dst` (its UUID into `target`), migrates, and
/// checks both sides.
fn migrate(
    g: &Guest,
    src: &Stack,
    dst: &Stack,
    name: &str,
    source: &MdevUuid,
    target: &mut Option<MdevUuid>,
) -> Result<(), TestError> {
    let t0 = Instant::now();
    src.virsh(&["start", "--paused", name])?;
    qemu_holds(src, name, &sysfsdev(source), t0)?;
    let s = source.to_string();

    // Source host: the fingerprint and the domain's migratable XML.
    let fp = src.root.run("vgpuctl", &["migration", "fingerprint", &s])?;
    let fp_file = src.file("migrate-fingerprint.json", &fp)?;
    let dumped = src.virsh(&["dumpxml", "--migratable", name])?;
    ensure(dumped.contains("x-device-dirty-page-tracking"), || {
        format!("libvirt dropped the <qemu:override> from the domain: {dumped}")
    })?;
    let src_xml = src.file("migrate-source.xml", &dumped)?;

    // Target host: the incoming vGPU and the target XML.
    let prepared = dst.root.run(
        "vgpuctl",
        &[
            "migration",
            "prepare",
            "--target",
            &fp_file,
            "--domain-xml",
            &src_xml,
            "--json",
        ],
    )?;
    let p: serde_json::Value = serde_json::from_str(&prepared)
        .map_err(|e| TestError::Check(format!("migration prepare --json: {e}: {prepared}")))?;
    let made: MdevUuid = p["uuid"]
        .as_str()
        .and_then(|u| u.parse().ok())
        .ok_or_else(|| TestError::Check(format!("migration prepare named no UUID: {p}")))?;
    *target = Some(made);
    let m = made.to_string();
    ensure(device_exists(g, &made), || {
        format!("the prepared target {made} is not in sysfs")
    })?;
    ensure(p["target_mdevs"][&s] == m.as_str(), || {
        format!("target_mdevs does not map {s} to {m}: {p}")
    })?;
    let target_xml = p["domain_xml"]
        .as_str()
        .ok_or_else(|| TestError::Check(format!("prepare --domain-xml gave no domain_xml: {p}")))?;
    ensure(target_xml.contains(&m) && !target_xml.contains(&s), || {
        format!("the target XML does not name {m} in place of {s}:\n{target_xml}")
    })?;
    let dst_xml = src.file("migrate-target.xml", target_xml)?;

    // The migration, driven by the source libvirtd (peer to peer).
    let dest_uri = format!("qemu+unix:///system?socket={PEER_DIR}/libvirt-sock");
    let stream = format!("unix://{STREAM}");
    let _ = std::fs::remove_file(STREAM);
    let t = Instant::now();
    let said = src.virsh(&migrate_args(&dst_xml, &stream, name, &dest_uri));
    if let Err(e) = said {
        let log =
            std::fs::read_to_string(dst.root.path(&format!("/var/log/libvirt/qemu/{name}.log")))
                .unwrap_or_default();
        return Err(TestError::Check(format!(
            "{e}\n  the target QEMU's log:\n{log}"
        )));
    }
    let took = t.elapsed();
    ensure(took < MIGRATED_WITHIN, || {
        format!("the migration took {took:?}")
    })?;
    println!("libvirt: virsh migrate --live --p2p completed in {took:?}");

    // The source domain is gone (and its definition: --undefinesource).
    let left = src.virsh(&["list", "--all", "--name"])?;
    ensure(left.trim().is_empty(), || {
        format!("the source still has domains after the migration: {left}")
    })?;
    // The target runs the domain, paused as it was, with the target mdev in QEMU.
    let state = dst.virsh(&["domstate", name])?;
    ensure(state.trim() == "paused", || {
        format!(
            "the migrated domain is {:?} on the target, not paused",
            state.trim()
        )
    })?;
    qemu_holds(dst, name, &sysfsdev(&made), Instant::now())?;
    let qtree = dst.virsh(&["qemu-monitor-command", "--hmp", name, "info qtree"])?;
    ensure(!qtree.contains(&sysfsdev(source)), || {
        format!("the target QEMU names the source mdev {source}:\n{qtree}")
    })?;
    let persistent = dst.virsh(&["dominfo", name])?;
    ensure(
        persistent
            .lines()
            .any(|l| l.starts_with("Persistent:") && l.trim_end().ends_with("yes")),
        || format!("the migrated domain is not persistent on the target:\n{persistent}"),
    )?;
    let inactive = dst.virsh(&["dumpxml", "--inactive", name])?;
    ensure(inactive.contains(&m) && !inactive.contains(&s), || {
        format!("the target's definition does not name {m} alone:\n{inactive}")
    })?;

    // Target host: the incoming vGPU becomes an ordinary instance; a second complete is refused.
    dst.root.run("vgpuctl", &["migration", "complete", &m])?;
    let again = dst
        .root
        .command("vgpuctl")
        .args(["migration", "complete", &m])
        .output()
        .map_err(|e| TestError::Check(format!("cannot run vgpuctl: {e}")))?;
    ensure(
        !again.status.success()
            && String::from_utf8_lossy(&again.stderr).contains("not an incoming migration target"),
        || "a second migration complete is refused: the target is an ordinary instance".to_string(),
    )?;
    ensure(dst.vgpud()?.get_instance(&made)?.state == "running", || {
        format!("{made} is not running after migration complete")
    })?;

    // Source host: the source QEMU has exited, so its vGPU can go (vgpud made it; the hook releases
    // only those it made itself).
    src.vgpud()?.destroy(source)?;
    ensure(!device_exists(g, source), || {
        format!("source {source} is still in sysfs after Destroy")
    })?;
    Ok(())
}
