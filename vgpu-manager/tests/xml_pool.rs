//! `vgpuctl xml POOL` through the real `vgpud` on `--sim demo`: after applying the vdi-mixed fixture
//! pool, every slot's `<hostdev>`, example domain and QEMU arguments come out, the domains pass libvirt's
//! own schema (`virt-xml-validate`), and an unknown pool is refused with the applied ones named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::PathBuf;
use std::process::Command;

use dbus_common::{Daemon, assert_refused, ok, vgpuctl};
use vgpu_manager::client::PoolStatus;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pools")
        .join(name)
}

/// Runs `virt-xml-validate FILE domain` on `xml`, unless the schema check is explicitly skipped.
fn validate_domain(dir: &std::path::Path, n: usize, xml: &str) {
    if std::env::var("VGPU_SKIP_LIBVIRT_SCHEMA").as_deref() == Ok("1") {
        eprintln!(
            "\n!!! VGPU_SKIP_LIBVIRT_SCHEMA=1: `vgpuctl xml POOL --domain` output NOT checked against libvirt's schema !!!\n"
        );
        return;
    }
    let f = dir.join(format!("domain-{n}.xml"));
    std::fs::write(&f, xml).unwrap();
    let v = Command::new("virt-xml-validate")
        .arg(&f)
        .arg("domain")
        .output()
        .unwrap_or_else(|e| panic!("cannot run virt-xml-validate ({e}): apt-get install libvirt-clients libxml2-utils, or set VGPU_SKIP_LIBVIRT_SCHEMA=1"));
    assert!(
        v.status.success(),
        "{}{}\n{xml}",
        String::from_utf8_lossy(&v.stdout),
        String::from_utf8_lossy(&v.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn xml_for_a_pool_covers_every_slot_and_validates() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let daemon = Daemon::embedded(tmp.path(), &state).await;
    let bus = daemon.bus.clone();

    // Before any apply: refused, naming that no pool is applied.
    assert_refused(
        &vgpuctl(&bus, &["xml", "vdi-mixed"]).await,
        &["'vdi-mixed'", "applied pools: none"],
    );

    let file = fixture("vdi-mixed.toml");
    ok(&vgpuctl(&bus, &["pool", "apply", file.to_str().unwrap(), "--json"]).await);
    let status: Vec<PoolStatus> =
        serde_json::from_str(&ok(&vgpuctl(&bus, &["pool", "status", "--json"]).await)).unwrap();
    let slots = &status
        .iter()
        .find(|p| p.pool == "vdi-mixed")
        .expect("vdi-mixed applied")
        .slots;
    assert_eq!(slots.len(), 12);
    assert!(slots.iter().all(|s| s.gpu.is_some()), "{slots:?}");

    // <hostdev>: one per slot, each naming its slot's UUID once.
    let hostdevs = ok(&vgpuctl(&bus, &["xml", "vdi-mixed"]).await);
    assert_eq!(hostdevs.matches("<hostdev ").count(), 12, "{hostdevs}");
    for s in slots {
        assert_eq!(
            hostdevs
                .matches(&format!("<address uuid='{}'/>", s.uuid))
                .count(),
            1,
            "slot {}/{} ({}) not once in:\n{hostdevs}",
            s.profile,
            s.index,
            s.uuid
        );
    }

    // QEMU: one -device per slot.
    let qemu = ok(&vgpuctl(&bus, &["xml", "vdi-mixed", "--qemu"]).await);
    for s in slots {
        let want = format!("-device vfio-pci,sysfsdev=/sys/bus/mdev/devices/{}", s.uuid);
        assert_eq!(
            qemu.lines().filter(|l| *l == want).count(),
            1,
            "{want} not once in:\n{qemu}"
        );
    }

    // Domains: one per slot, named after it, requesting its profile, and valid for libvirt.
    let domains = ok(&vgpuctl(
        &bus,
        &["xml", "vdi-mixed", "--domain", "--display", "--ramfb"],
    )
    .await);
    let docs: Vec<String> = domains
        .split_inclusive("</domain>\n")
        .map(str::to_string)
        .filter(|d| d.contains("<domain "))
        .collect();
    assert_eq!(docs.len(), 12, "{domains}");
    for (n, s) in slots.iter().enumerate() {
        let doc = docs
            .iter()
            .find(|d| d.contains(&format!("<address uuid='{}'/>", s.uuid)))
            .unwrap_or_else(|| panic!("no domain for slot {}", s.uuid));
        assert!(
            doc.contains(&format!("<name>vdi-mixed-{}-{}</name>", s.profile, s.index)),
            "{doc}"
        );
        let parsed = qemu_glue::parse_domain(doc).unwrap();
        assert_eq!(
            parsed
                .request_for(&s.uuid.parse().unwrap())
                .map(|r| r.target.clone()),
            Some(qemu_glue::VgpuTarget::Profile(s.profile.clone()))
        );
        validate_domain(tmp.path(), n, doc);
    }

    // An unknown pool: one line, exit 2, the applied pool named; nothing on stdout.
    let out = vgpuctl(&bus, &["xml", "vdi-mixd"]).await;
    assert_refused(&out, &["'vdi-mixd'", "applied pools: vdi-mixed"]);
    assert!(out.stdout.is_empty());
    drop(daemon);
}
