//! The target domain XML of a libvirt migration: the source domain's XML (`virsh dumpxml
//! --migratable`) with the source mdev's UUID replaced by the target's, for `virsh migrate --xml` (and
//! `--persistent-xml`).
//!
//! Only the UUID changes. Everything else must stay as it is: libvirt checks that the XML it is given
//! keeps the source's guest ABI (src/conf/domain_conf.c, `virDomainDefCheckABIStability`: among others
//! every hostdev's mode, type and guest PCI address), so the `<hostdev>` keeps the guest `<address>`
//! libvirt gave it on the source, its alias and any `<qemu:override>` of it. The UUID is replaced
//! wherever it occurs (the hostdev's `<source><address uuid=…/>` and vgpu-manager's `<metadata>` entry
//! for it), as KubeVirt rewrites the target XML of a VM with a vGPU.

use thiserror::Error;

use mdev_types::ids::MdevUuid;
use qemu_glue::parse::{ParseError, parse_domain};

/// Why a domain XML cannot be turned into the target's.
#[derive(Debug, Error)]
pub enum DomainXmlError {
    /// The XML is not a libvirt domain.
    #[error(
        "the source domain XML cannot be read: {0} (give the output of `virsh dumpxml --migratable DOMAIN`)"
    )]
    Parse(#[from] ParseError),
    /// The domain has no mdev hostdev with the source UUID.
    #[error(
        "domain {domain} has no <hostdev type='mdev'> with UUID {source_uuid} (its mdevs: {found}): give the XML of the domain that uses the fingerprinted instance"
    )]
    NoSuchMdev {
        /// The domain's name.
        domain: String,
        /// The source instance.
        source_uuid: MdevUuid,
        /// The mdev UUIDs the domain has.
        found: String,
    },
    /// The domain already names the target UUID.
    #[error(
        "domain {domain} already names the target instance {target}: the XML given is not the source's"
    )]
    AlreadyTarget {
        /// The domain's name.
        domain: String,
        /// The target instance.
        target: MdevUuid,
    },
}

/// `xml` with mdev `source` replaced by `target` (see the module docs).
pub fn retarget_domain_xml(
    xml: &str,
    source: &MdevUuid,
    target: &MdevUuid,
) -> Result<String, DomainXmlError> {
    let devices = parse_domain(xml)?;
    if !devices.mdevs.iter().any(|m| m.uuid == *source) {
        let found: Vec<String> = devices.mdevs.iter().map(|m| m.uuid.to_string()).collect();
        return Err(DomainXmlError::NoSuchMdev {
            domain: devices.name,
            source_uuid: *source,
            found: if found.is_empty() {
                "none".into()
            } else {
                found.join(", ")
            },
        });
    }
    if devices.mdevs.iter().any(|m| m.uuid == *target) {
        return Err(DomainXmlError::AlreadyTarget {
            domain: devices.name,
            target: *target,
        });
    }
    let from = source.to_string();
    let to = target.to_string();
    // libvirt prints UUIDs in lower case; a hand-written XML may not.
    let mut out = xml.replace(&from, &to);
    let upper = from.to_ascii_uppercase();
    if upper != from {
        out = out.replace(&upper, &to);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const SRC: &str = "5f9a1c2e-3b4d-4e6f-8a7b-9c0d1e2f3a4b";
    const DST: &str = "0a1b2c3d-4e5f-4a6b-8c7d-8e9f0a1b2c3d";

    fn domain(uuid: &str) -> String {
        format!(
            "<domain type='kvm' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>\n  <name>desk</name>\n  <uuid>1c6d5b2a-0000-4000-8000-000000000001</uuid>\n  <devices>\n    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>\n      <source>\n        <address uuid='{uuid}'/>\n      </source>\n      <alias name='hostdev0'/>\n      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>\n    </hostdev>\n  </devices>\n  <qemu:override>\n    <qemu:device alias='hostdev0'>\n      <qemu:frontend>\n        <qemu:property name='x-device-dirty-page-tracking' type='string' value='off'/>\n      </qemu:frontend>\n    </qemu:device>\n  </qemu:override>\n</domain>\n"
        )
    }

    #[test]
    fn only_the_uuid_changes() {
        let (s, d): (MdevUuid, MdevUuid) = (SRC.parse().unwrap(), DST.parse().unwrap());
        let out = retarget_domain_xml(&domain(SRC), &s, &d).unwrap();
        assert_eq!(out, domain(DST));
        let parsed = parse_domain(&out).unwrap();
        assert_eq!(parsed.mdevs[0].uuid, d);
    }

    #[test]
    fn an_upper_case_uuid_is_replaced_too() {
        let (s, d): (MdevUuid, MdevUuid) = (SRC.parse().unwrap(), DST.parse().unwrap());
        let out = retarget_domain_xml(&domain(&SRC.to_ascii_uppercase()), &s, &d).unwrap();
        assert_eq!(out, domain(DST));
    }

    #[test]
    fn a_domain_without_the_source_mdev_is_refused() {
        let (s, d): (MdevUuid, MdevUuid) = (SRC.parse().unwrap(), DST.parse().unwrap());
        let other = "7e6d5c4b-3a29-4187-9654-3210fedcba98";
        let e = retarget_domain_xml(&domain(other), &s, &d).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(SRC) && text.contains(other), "{text}");
        let e = retarget_domain_xml(&domain(DST), &d, &d).unwrap_err();
        assert!(matches!(e, DomainXmlError::AlreadyTarget { .. }), "{e}");
        let e = retarget_domain_xml("<domain", &s, &d).unwrap_err();
        assert!(matches!(e, DomainXmlError::Parse(_)), "{e}");
    }
}
