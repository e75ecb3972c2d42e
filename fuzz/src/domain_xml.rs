//! libvirt domain XML (`qemu_glue::parse_domain`, what the hook reads on stdin and `virsh dumpxml`
//! prints). Beyond "no panic": a domain that reads has a name, and a domain written by
//! `qemu_glue::DomainSpec` from what was read (its name, host devices and vgpu-manager metadata) reads
//! back as the same devices and requests.

use qemu_glue::{DomainError, DomainSpec, Hostdev, MdevDisplay, parse_domain};

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(d) = parse_domain(text) else {
        return;
    };
    assert!(!d.name.is_empty(), "{d:?}");
    // `ramfb` means something only with `display` (formatdomain), and is written only then.
    let display = |m: MdevDisplay| MdevDisplay {
        display: m.display,
        ramfb: m.display && m.ramfb,
    };
    let mut hostdevs: Vec<Hostdev> = d
        .mdevs
        .iter()
        .map(|m| Hostdev::Mdev {
            uuid: m.uuid,
            display: display(m.display),
        })
        .collect();
    hostdevs.extend(d.pci.iter().copied().map(Hostdev::Pci));
    let mut spec = DomainSpec::desktop(&d.name, hostdevs);
    spec.vgpus = d.vgpus.clone();
    let xml = match spec.to_xml() {
        Ok(xml) => xml,
        // What the reader accepts and the writer refuses: a request without its hostdev, a name
        // libvirt could not use as a file name.
        Err(DomainError::OrphanRequest { .. } | DomainError::BadName(_)) => return,
        Err(e) => panic!("{d:?} cannot be written: {e}"),
    };
    let again = parse_domain(&xml)
        .unwrap_or_else(|e| panic!("{d:?} written as\n{xml}\ndoes not read: {e}"));
    assert_eq!(again.name, d.name, "{xml}");
    let mdevs: Vec<_> = d
        .mdevs
        .iter()
        .map(|m| (m.uuid, display(m.display)))
        .collect();
    let mdevs_again: Vec<_> = again.mdevs.iter().map(|m| (m.uuid, m.display)).collect();
    assert_eq!(mdevs_again, mdevs, "{xml}");
    assert_eq!(again.pci, d.pci, "{xml}");
    assert_eq!(again.vgpus, d.vgpus, "{xml}");
}
