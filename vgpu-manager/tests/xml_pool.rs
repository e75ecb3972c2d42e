//! `vgpuctl xml POOL` through the real `vgpud` on `--sim demo`: after applying the vdi-mixed fixture
//! pool, every slot's `<hostdev>`, example domain and QEMU arguments come out, the domains pass libvirt's
//! own schema (`virt-xml-validate`), and an unknown pool is refused with the applied ones named.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;

use std::path::PathBuf;

use dbus_common::{Daemon, assert_refused, ok, validate_domain_file, vgpuctl};
use vgpu_client::PoolStatus;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pools")
        .join(name)
}

/// Writes `xml` to a file in `dir` and checks it against libvirt's schema.
fn validate_domain(dir: &std::path::Path, n: usize, xml: &str) {
    let f = dir.join(format!("domain-{n}.xml"));
    std::fs::write(&f, xml).unwrap();
    validate_domain_file(&f, "`vgpuctl xml POOL --domain` output");
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

/// The shipped VDI floor has VF slots: they come out as `<hostdev type='pci' managed='no'>` (a slot's
/// UUID works as well as the pool's name), `host=` QEMU arguments, and domains libvirt accepts.
#[tokio::test(flavor = "multi_thread")]
async fn xml_for_vf_slots_is_a_pci_hostdev_and_validates() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = Daemon::embedded(tmp.path(), &tmp.path().join("state")).await;
    let bus = daemon.bus.clone();
    let floor = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../data/pools.d/vdi-floor.toml");
    ok(&vgpuctl(&bus, &["pool", "apply", floor.to_str().unwrap(), "--json"]).await);
    let status: Vec<PoolStatus> =
        serde_json::from_str(&ok(&vgpuctl(&bus, &["pool", "status", "--json"]).await)).unwrap();
    let vf_slots: Vec<_> = status[0].slots.iter().filter(|s| s.vf.is_some()).collect();
    assert_eq!(vf_slots.len(), 32);

    let domains = ok(&vgpuctl(&bus, &["xml", "vdi-floor", "--domain"]).await);
    let docs: Vec<&str> = domains
        .split_inclusive("</domain>\n")
        .filter(|d| d.contains("<domain "))
        .collect();
    assert_eq!(docs.len(), 44, "{domains}");
    // The 12 mdev slots' domains do carry their request (so the check below has teeth).
    assert_eq!(
        docs.iter().filter(|d| d.contains("<vgpu:mdev ")).count(),
        12,
        "{domains}"
    );
    for (n, s) in vf_slots.iter().enumerate() {
        let vf: mdev_types::ids::PciAddress = s.vf.as_deref().unwrap().parse().unwrap();
        let address = format!(
            "<address domain='0x{:04x}' bus='0x{:02x}' slot='0x{:02x}' function='0x{:x}'/>",
            vf.domain, vf.bus, vf.device, vf.function
        );
        let doc = docs
            .iter()
            .find(|d| d.contains(&address))
            .unwrap_or_else(|| panic!("no domain with VF {vf}"));
        assert!(
            doc.contains("<hostdev mode='subsystem' type='pci' managed='no'>")
                && doc.contains(&format!("<name>vdi-floor-{}-{}</name>", s.profile, s.index)),
            "{doc}"
        );
        // Pool VF slots are kept by the pool, not made by the hook: no vGPU request in the metadata.
        assert!(!doc.contains("<vgpu:mdev "), "{doc}");
        if n < 4 {
            validate_domain(tmp.path(), n, doc);
        }
    }

    // One slot by its UUID: the same hostdev, and a domain named as asked.
    let one = vf_slots[0];
    let alone = ok(&vgpuctl(&bus, &["xml", &one.uuid]).await);
    assert!(
        alone.contains("type='pci' managed='no'") && alone.contains(one.vf.as_deref().unwrap()),
        "{alone}"
    );
    let doc = ok(&vgpuctl(&bus, &["xml", &one.uuid, "--domain", "--name", "cad-7"]).await);
    assert!(doc.contains("<name>cad-7</name>"), "{doc}");
    validate_domain(tmp.path(), 99, &doc);
    let qemu = ok(&vgpuctl(&bus, &["xml", &one.uuid, "--qemu"]).await);
    assert!(
        qemu.contains(&format!(
            "-device vfio-pci,host={}",
            one.vf.as_deref().unwrap()
        )),
        "{qemu}"
    );
    drop(daemon);
}
