//! Reading a libvirt domain XML (as libvirt hands it to hooks on stdin, or `virsh dumpxml` prints it):
//! the domain's mdev and PCI host devices and vgpu-manager's `<metadata>` requests.

use mdev_types::ids::{MdevTypeId, MdevUuid, PciAddress};
use roxmltree::{Document, Node};
use thiserror::Error;

use crate::hostdev::{MdevDisplay, PciHostdev};
use crate::metadata::{METADATA_MDEV, METADATA_NS, METADATA_ROOT, VgpuRequest, VgpuTarget};

/// Why a domain XML could not be read. Each names the line and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    /// Not well-formed XML.
    #[error("domain XML is not well-formed: {0}")]
    Xml(String),
    /// The root element is not `<domain>`.
    #[error("expected a libvirt <domain> document, found <{0}>")]
    NotADomain(String),
    /// An element lacks an attribute it needs, or has a bad value.
    #[error("domain {domain}, line {line}: <{element}> {problem}")]
    Bad {
        /// The domain name (or `?` before it is known).
        domain: String,
        /// 1-based line.
        line: u32,
        /// The name of the XML element at fault.
        element: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// An mdev `<hostdev>` of a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdevHostdevRef {
    /// The instance UUID (`<source><address uuid=…/>`).
    pub uuid: MdevUuid,
    /// `model` (`vfio-pci`, `vfio-ccw`, `vfio-ap`).
    pub model: String,
    /// `display`/`ramfb`.
    pub display: MdevDisplay,
}

/// What vgpu-manager needs to know about a domain.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainDevices {
    /// `<name>`.
    pub name: String,
    /// `<uuid>`, if present.
    pub uuid: Option<String>,
    /// `<hostdev mode='subsystem' type='mdev'>` elements, in document order.
    pub mdevs: Vec<MdevHostdevRef>,
    /// `<hostdev mode='subsystem' type='pci'>` elements, in document order.
    pub pci: Vec<PciHostdev>,
    /// vgpu-manager metadata requests, in document order.
    pub vgpus: Vec<VgpuRequest>,
}

impl DomainDevices {
    /// The metadata request for mdev `uuid`, if any.
    pub fn request_for(&self, uuid: &MdevUuid) -> Option<&VgpuRequest> {
        self.vgpus.iter().find(|r| r.uuid == *uuid)
    }
}

struct Ctx<'a> {
    doc: &'a Document<'a>,
    domain: String,
}

impl Ctx<'_> {
    fn bad(&self, node: Node<'_, '_>, problem: impl Into<String>) -> ParseError {
        ParseError::Bad {
            domain: self.domain.clone(),
            line: self.doc.text_pos_at(node.range().start).row,
            element: node.tag_name().name().to_string(),
            problem: problem.into(),
        }
    }

    fn attr<'n>(&self, node: Node<'n, '_>, name: &str) -> Result<&'n str, ParseError> {
        node.attribute(name)
            .ok_or_else(|| self.bad(node, format!("has no '{name}' attribute")))
    }
}

fn child<'a, 'i>(node: Node<'a, 'i>, name: &str) -> Option<Node<'a, 'i>> {
    node.children().find(|c| {
        c.is_element() && c.tag_name().name() == name && c.tag_name().namespace().is_none()
    })
}

/// Reads `xml`, a libvirt domain document.
pub fn parse_domain(xml: &str) -> Result<DomainDevices, ParseError> {
    let doc = Document::parse(xml).map_err(|e| ParseError::Xml(e.to_string()))?;
    let root = doc.root_element();
    if root.tag_name().name() != "domain" || root.tag_name().namespace().is_some() {
        return Err(ParseError::NotADomain(root.tag_name().name().to_string()));
    }
    let name = child(root, "name")
        .and_then(|n| n.text())
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    let mut cx = Ctx {
        doc: &doc,
        domain: if name.is_empty() {
            "?".into()
        } else {
            name.clone()
        },
    };
    if name.is_empty() {
        return Err(cx.bad(root, "has no <name>: libvirt domains always have one"));
    }
    cx.domain = name.clone();
    let mut out = DomainDevices {
        name,
        uuid: child(root, "uuid")
            .and_then(|n| n.text())
            .map(|t| t.trim().to_string()),
        ..DomainDevices::default()
    };
    if let Some(devices) = child(root, "devices") {
        for h in devices
            .children()
            .filter(|c| c.is_element() && c.tag_name().name() == "hostdev")
        {
            if h.attribute("mode") != Some("subsystem") {
                continue;
            }
            match h.attribute("type") {
                Some("mdev") => out.mdevs.push(mdev_hostdev(&cx, h)?),
                Some("pci") => out.pci.push(pci_hostdev(&cx, h)?),
                _ => {}
            }
        }
    }
    if let Some(meta) = child(root, "metadata") {
        for set in meta.children().filter(|c| {
            c.is_element()
                && c.tag_name().namespace() == Some(METADATA_NS)
                && c.tag_name().name() == METADATA_ROOT
        }) {
            for m in set.children().filter(|c| c.is_element()) {
                if m.tag_name().namespace() != Some(METADATA_NS)
                    || m.tag_name().name() != METADATA_MDEV
                {
                    return Err(cx.bad(
                        m,
                        format!("is not allowed in <{METADATA_ROOT}>: only <{METADATA_MDEV}> elements of {METADATA_NS}"),
                    ));
                }
                let r = request(&cx, m)?;
                if out.vgpus.iter().any(|o| o.uuid == r.uuid) {
                    return Err(cx.bad(
                        m,
                        format!("requests {} a second time: keep one entry per UUID", r.uuid),
                    ));
                }
                out.vgpus.push(r);
            }
        }
    }
    Ok(out)
}

fn on(cx: &Ctx<'_>, node: Node<'_, '_>, name: &str) -> Result<bool, ParseError> {
    match node.attribute(name) {
        None | Some("off") | Some("no") => Ok(false),
        Some("on") | Some("yes") => Ok(true),
        Some(v) => Err(cx.bad(node, format!("has {name}='{v}': use 'on' or 'off'"))),
    }
}

fn mdev_hostdev(cx: &Ctx<'_>, h: Node<'_, '_>) -> Result<MdevHostdevRef, ParseError> {
    let addr = child(h, "source")
        .and_then(|s| child(s, "address"))
        .ok_or_else(|| cx.bad(h, "of type mdev has no <source><address uuid=…/></source>"))?;
    let text = cx.attr(addr, "uuid")?;
    let uuid = text
        .parse()
        .map_err(|_| cx.bad(addr, format!("has uuid='{text}', which is not a UUID")))?;
    Ok(MdevHostdevRef {
        uuid,
        model: h.attribute("model").unwrap_or("vfio-pci").to_string(),
        display: MdevDisplay {
            display: on(cx, h, "display")?,
            ramfb: on(cx, h, "ramfb")?,
        },
    })
}

/// A number as libvirt reads PCI address parts: C `strtoul` with base 0 (`0x` hex, leading `0` octal,
/// else decimal; libvirt src/conf/device_conf.c reads them with `virXMLPropUInt(..., 0, ...)`).
fn c_number(s: &str) -> Option<u32> {
    let s = s.trim();
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16).ok()
    } else if s.len() > 1 && s.starts_with('0') {
        u32::from_str_radix(&s[1..], 8).ok()
    } else {
        s.parse().ok()
    }
}

fn pci_hostdev(cx: &Ctx<'_>, h: Node<'_, '_>) -> Result<PciHostdev, ParseError> {
    let addr = child(h, "source")
        .and_then(|s| child(s, "address"))
        .ok_or_else(|| cx.bad(h, "of type pci has no <source><address …/></source>"))?;
    let mut parts = [0u32; 4];
    for (i, name) in ["domain", "bus", "slot", "function"].iter().enumerate() {
        // libvirt defaults a missing domain to 0 (single-segment hosts).
        let Some(v) = addr.attribute(*name) else {
            if *name == "domain" {
                continue;
            }
            return Err(cx.bad(addr, format!("has no '{name}' attribute")));
        };
        parts[i] = c_number(v)
            .ok_or_else(|| cx.bad(addr, format!("has {name}='{v}', which is not a number")))?;
    }
    let narrow = |v: u32| u8::try_from(v).ok();
    let address = match (u16::try_from(parts[0]).ok(), narrow(parts[1]), narrow(parts[2]), narrow(parts[3])) {
        (Some(d), Some(b), Some(s), Some(f)) => PciAddress::new(d, b, s, f),
        _ => None,
    }
    .ok_or_else(|| {
        cx.bad(
            addr,
            format!(
                "is not a PCI address (domain {:#x}, bus {:#x}, slot {:#x}, function {:#x}): slot ≤ 0x1f, function ≤ 7",
                parts[0], parts[1], parts[2], parts[3]
            ),
        )
    })?;
    // formatdomain: managed defaults to 'no'.
    let managed = on(cx, h, "managed")?;
    Ok(PciHostdev { address, managed })
}

fn request(cx: &Ctx<'_>, m: Node<'_, '_>) -> Result<VgpuRequest, ParseError> {
    let text = cx.attr(m, "uuid")?;
    let uuid: MdevUuid = text
        .parse()
        .map_err(|_| cx.bad(m, format!("has uuid='{text}', which is not a UUID")))?;
    let target = match (m.attribute("profile"), m.attribute("type")) {
        (Some(p), None) if !p.trim().is_empty() => VgpuTarget::Profile(p.trim().to_string()),
        (None, Some(t)) => VgpuTarget::Type(
            t.parse::<MdevTypeId>()
                .map_err(|_| cx.bad(m, format!("has type='{t}', which is not an mdev type id")))?,
        ),
        _ => {
            return Err(cx.bad(
                m,
                format!("for {uuid} needs exactly one of profile='NAME' or type='MDEV_TYPE'"),
            ));
        }
    };
    let gpu = m
        .attribute("gpu")
        .map(str::trim)
        .filter(|g| !g.is_empty())
        .map(str::to_string);
    Ok(VgpuRequest { uuid, target, gpu })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOMAIN: &str = r#"<domain type='kvm' id='3' xmlns:vgpu2="https://vgpumanager.org/xmlns/libvirt/1">
  <name>desk-07</name>
  <uuid>1f0e6b7c-1111-4222-8333-944455556666</uuid>
  <metadata>
    <other:thing xmlns:other="http://example.org/x"><other:mdev uuid="nope"/></other:thing>
    <vgpu2:vgpus>
      <vgpu2:mdev uuid="4b20d080-1b54-4048-85b3-a6a62d165c01" profile="vdi-2g"/>
      <vgpu2:mdev uuid="9D1C0E52-2A3C-4F0C-A0F7-5A8A4B1C2D3E" type="nvidia-231" gpu="0000:3b:00.0"/>
    </vgpu2:vgpus>
  </metadata>
  <devices>
    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='on' ramfb='on'>
      <source><address uuid='4b20d080-1b54-4048-85b3-a6a62d165c01'/></source>
      <alias name='hostdev0'/>
    </hostdev>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e'/></source>
    </hostdev>
    <hostdev mode='subsystem' type='pci' managed='yes'>
      <source><address domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/></source>
      <address type='pci' domain='0x0000' bus='0x07' slot='0x00' function='0x0'/>
    </hostdev>
    <hostdev mode='subsystem' type='pci'>
      <source><address bus='193' slot='0' function='5'/></source>
    </hostdev>
    <hostdev mode='subsystem' type='usb'><source><vendor id='0x1234'/><product id='0xbeef'/></source></hostdev>
  </devices>
</domain>"#;

    #[test]
    fn reads_hostdevs_and_metadata() {
        let d = parse_domain(DOMAIN).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.name, "desk-07");
        assert_eq!(
            d.uuid.as_deref(),
            Some("1f0e6b7c-1111-4222-8333-944455556666")
        );
        assert_eq!(d.mdevs.len(), 2);
        assert_eq!(d.mdevs[0].display, MdevDisplay::DESKTOP);
        assert_eq!(d.mdevs[1].display, MdevDisplay::default());
        assert_eq!(
            d.pci
                .iter()
                .map(|p| (p.address.to_string(), p.managed))
                .collect::<Vec<_>>(),
            [
                ("0000:c1:00.4".to_string(), true),
                ("0000:c1:00.5".to_string(), false)
            ]
        );
        assert_eq!(d.vgpus.len(), 2);
        assert_eq!(d.vgpus[0].target, VgpuTarget::Profile("vdi-2g".into()));
        // Upper-case UUIDs in metadata still match the hostdev's.
        let second = d
            .request_for(&d.mdevs[1].uuid)
            .unwrap_or_else(|| panic!("no request"));
        assert_eq!(second.gpu.as_deref(), Some("0000:3b:00.0"));
    }

    #[test]
    fn bad_inputs_name_line_and_fix() {
        let e = parse_domain("<domain><name>x</name><devices><hostdev mode='subsystem' type='mdev'>\n<source><address uuid='zz'/></source></hostdev></devices></domain>")
            .unwrap_err()
            .to_string();
        assert!(e.contains("domain x, line 2") && e.contains("'zz'"), "{e}");
        let e = parse_domain("<network/>").unwrap_err();
        assert_eq!(e, ParseError::NotADomain("network".into()));
        assert!(matches!(parse_domain("<domain>"), Err(ParseError::Xml(_))));
        let both = format!(
            "<domain><name>x</name><metadata><v:vgpus xmlns:v='{METADATA_NS}'><v:mdev uuid='4b20d080-1b54-4048-85b3-a6a62d165c01' profile='a' type='b'/></v:vgpus></metadata></domain>"
        );
        let e = parse_domain(&both).unwrap_err().to_string();
        assert!(e.contains("exactly one of profile"), "{e}");
        let pci = "<domain><name>x</name><devices><hostdev mode='subsystem' type='pci'><source><address bus='0x1' slot='0x20' function='0'/></source></hostdev></devices></domain>";
        let e = parse_domain(pci).unwrap_err().to_string();
        assert!(e.contains("slot ≤ 0x1f"), "{e}");
    }

    #[test]
    fn c_numbers_follow_strtoul_base_0() {
        assert_eq!(c_number("0x1f"), Some(31));
        assert_eq!(c_number("010"), Some(8));
        assert_eq!(c_number("0"), Some(0));
        assert_eq!(c_number("19"), Some(19));
        assert_eq!(c_number("0x"), None);
        assert_eq!(c_number("-1"), None);
    }
}
