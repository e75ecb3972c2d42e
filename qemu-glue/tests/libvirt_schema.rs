//! Every XML document qemu-glue emits is checked with libvirt's own schema through `virt-xml-validate`
//! (Debian packages libvirt-clients, and libxml2-utils for the `xmllint` it runs). The tool must be
//! installed: without it this test fails, unless VGPU_SKIP_LIBVIRT_SCHEMA=1 is set, which skips it
//! loudly (for machines where the packages cannot be installed).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use mdev_types::ids::{MdevUuid, PciAddress};
use qemu_glue::{
    DomainSpec, Hostdev, MdevDisplay, PciHostdev, VfBinding, VgpuRequest, VgpuTarget, parse_domain,
};

const TOOL: &str = "virt-xml-validate";
const SKIP_VAR: &str = "VGPU_SKIP_LIBVIRT_SCHEMA";

/// Validates `xml` as a libvirt `domain` document; Err carries the validator's output.
fn validate(name: &str, xml: &str, dir: &std::path::Path) -> Result<(), String> {
    let path: PathBuf = dir.join(format!("{name}.xml"));
    std::fs::write(&path, xml).unwrap();
    let out = match Command::new(TOOL).arg(&path).arg("domain").output() {
        Ok(o) => o,
        Err(e) => panic!(
            "cannot run {TOOL} ({e}): install it with `apt-get install libvirt-clients libxml2-utils` \
             (CI does this in .ci/run), or set {SKIP_VAR}=1 to skip libvirt schema validation"
        ),
    };
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{name}: {TOOL} exit {}\n{}{}\n--- document ---\n{xml}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A minimal domain around one `<hostdev>` fragment, so the fragment is validated in the place libvirt
/// accepts it (the schema has no stand-alone hostdev document type).
fn wrap(hostdev: &str) -> String {
    format!(
        "<domain type='kvm'>\n  <name>schema-check</name>\n  <memory unit='MiB'>128</memory>\n  <os>\n    <type arch='x86_64' machine='q35'>hvm</type>\n  </os>\n  <devices>\n{hostdev}  </devices>\n</domain>\n"
    )
}

fn skip() -> bool {
    if std::env::var(SKIP_VAR).as_deref() == Ok("1") {
        eprintln!(
            "\n!!! {SKIP_VAR}=1: libvirt schema validation SKIPPED — the XML we emit is NOT checked !!!\n"
        );
        return true;
    }
    false
}

fn uuid(n: u8) -> MdevUuid {
    format!("4b20d080-1b54-4048-85b3-a6a62d165c{n:02x}")
        .parse()
        .unwrap()
}

fn vf(f: u8) -> PciAddress {
    PciAddress::new(0, 0xc1, 0, f).unwrap()
}

fn documents() -> Vec<(String, String)> {
    let mut docs = Vec::new();
    let displays = [
        ("plain", MdevDisplay::default()),
        (
            "display",
            MdevDisplay {
                display: true,
                ramfb: false,
            },
        ),
        ("desktop", MdevDisplay::DESKTOP),
    ];
    for (n, d) in displays {
        docs.push((
            format!("hostdev-mdev-{n}"),
            wrap(&qemu_glue::mdev_hostdev_xml(&uuid(1), d)),
        ));
    }
    for (n, b) in [
        ("nvidia-vendor-vfio", VfBinding::NvidiaVendorVfio),
        ("ours", VfBinding::BoundByVgpuManager),
        ("libvirt", VfBinding::Libvirt),
    ] {
        docs.push((
            format!("hostdev-pci-{n}"),
            wrap(&qemu_glue::pci_hostdev_xml(&PciHostdev::new(vf(4), b))),
        ));
    }
    // The example desktop: vGPU with display and metadata, a disk, the default network.
    let mut desk = DomainSpec::desktop(
        "vdi-desk-01",
        vec![Hostdev::Mdev {
            uuid: uuid(1),
            display: MdevDisplay::DESKTOP,
        }],
    );
    desk.disk = Some("/var/lib/libvirt/images/vdi-desk-01.qcow2".into());
    desk.vgpus.push(VgpuRequest {
        uuid: uuid(1),
        target: VgpuTarget::Profile("vdi-2g".into()),
        gpu: None,
    });
    docs.push(("domain-desktop".into(), desk.to_xml().unwrap()));
    // A workstation with two vGPUs by type and a VF, no network, awkward characters in the name.
    let mut ws = DomainSpec::desktop(
        "ws <&> 'quoted' \"name\"",
        vec![
            Hostdev::Mdev {
                uuid: uuid(2),
                display: MdevDisplay::default(),
            },
            Hostdev::Mdev {
                uuid: uuid(3),
                display: MdevDisplay::default(),
            },
            Hostdev::Pci(PciHostdev::new(vf(5), VfBinding::NvidiaVendorVfio)),
        ],
    );
    ws.network = None;
    ws.memory_mib = 16384;
    ws.vcpus = 8;
    for (u, gpu) in [(uuid(2), Some("0000:3b:00.0")), (uuid(3), None)] {
        ws.vgpus.push(VgpuRequest {
            uuid: u,
            target: VgpuTarget::Type("nvidia-231".parse().unwrap()),
            gpu: gpu.map(str::to_string),
        });
    }
    docs.push(("domain-workstation".into(), ws.to_xml().unwrap()));
    // A compute guest: only a VF, nothing else.
    let mut vm = DomainSpec::desktop(
        "compute",
        vec![Hostdev::Pci(PciHostdev::new(vf(6), VfBinding::Libvirt))],
    );
    vm.network = None;
    docs.push(("domain-vf-only".into(), vm.to_xml().unwrap()));
    docs
}

#[test]
fn every_emitted_document_is_valid_libvirt_xml() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let docs = documents();
    let failures: Vec<String> = docs
        .iter()
        .filter_map(|(n, x)| validate(n, x, dir.path()).err())
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert_eq!(docs.len(), 9);
}

#[test]
fn the_validator_rejects_what_libvirt_rejects() {
    // A control: if the tool accepted anything, the test above would prove nothing.
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = qemu_glue::mdev_hostdev_xml(&uuid(1), MdevDisplay::DESKTOP);
    for (n, bad) in [
        ("bad-display", good.replace("display='on'", "display='yes'")),
        ("bad-model", good.replace("vfio-pci", "vfio-gpu")),
        (
            "bad-managed",
            qemu_glue::pci_hostdev_xml(&PciHostdev::new(vf(4), VfBinding::Libvirt))
                .replace("'yes'", "'on'"),
        ),
    ] {
        assert!(
            validate(n, &wrap(&bad), dir.path()).is_err(),
            "{TOOL} accepted an invalid document:\n{bad}"
        );
    }
}

#[test]
fn emitted_domains_parse_back_to_the_same_devices() {
    for (name, xml) in documents().iter().filter(|(n, _)| n.starts_with("domain-")) {
        let d = parse_domain(xml).unwrap_or_else(|e| panic!("{name}: {e}"));
        let spec_mdevs = xml.matches("type='mdev'").count();
        let spec_pci = xml.matches("type='pci' managed").count();
        assert_eq!(
            (d.mdevs.len(), d.pci.len()),
            (spec_mdevs, spec_pci),
            "{name}"
        );
        for m in &d.mdevs {
            assert!(
                d.request_for(&m.uuid).is_some(),
                "{name}: {} has no request",
                m.uuid
            );
        }
    }
    let ws = parse_domain(&documents()[7].1).unwrap();
    assert_eq!(ws.name, "ws <&> 'quoted' \"name\"");
    assert_eq!(ws.pci[0].address, vf(5));
    assert!(!ws.pci[0].managed);
}
