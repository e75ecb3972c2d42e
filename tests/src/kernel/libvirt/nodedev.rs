//! `virsh nodedev-*` on libvirt's node-device driver, with our `vgpuctl` as its `mdevctl`, on the mtty
//! sample parent; every step checked against sysfs, `/etc/mdevctl.d` and vgpud's own view (D-Bus).
//!
//! Facts used (libvirt 9.0, src/node_device/node_device_udev.c and node_device_driver.c): an mdev's
//! node device is named `mdev_<uuid with _>_<parent>` (`mtty` for the mtty sample's parent
//! `/sys/devices/virtual/mtty/mtty`, node device `mtty_mtty`); defined devices come from `mdevctl
//! list --defined --dumpjson`, re-read when `/etc/mdevctl.d` changes; active ones from udev events.

use std::path::Path;
use std::time::{Duration, Instant};

use mdev_types::ids::MdevUuid;

use super::super::guest::Guest;
use super::super::runner::{Outcome, TestError, TestResult, ensure};
use super::super::samples::{Mdevs, SAMPLE_TYPES, available, test_uuid};
use super::super::vgpud::{TargetKind, find};
use super::stack::Stack;
use super::sysroot::{Libvirt, kernel_lacks_overlay};

/// How long libvirt may take to show a change (the target is well under a second; the bound only
/// catches a change it never sees).
const SEEN_WITHIN: Duration = Duration::from_secs(20);
/// `nodedev-create` must return well before libvirt's 60 s wait for udev (node_device_driver.c,
/// nodeDeviceFindNewMediatedDevice) would have expired.
const CREATE_WITHIN: Duration = Duration::from_secs(30);

/// libvirt's node-device name of an mdev on the mtty parent.
pub fn mdev_node(uuid: &MdevUuid) -> String {
    format!("mdev_{}_mtty", uuid.to_string().replace('-', "_"))
}

/// The names `virsh nodedev-list args…` prints.
pub fn nodedev_list(s: &Stack, args: &[&str]) -> Result<Vec<String>, TestError> {
    let mut a = vec!["nodedev-list"];
    a.extend_from_slice(args);
    Ok(s.virsh(&a)?
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

/// Whether `virsh nodedev-list args…` names `node`.
pub fn listed(s: &Stack, args: &[&str], node: &str) -> Result<bool, TestError> {
    Ok(nodedev_list(s, args)?.iter().any(|n| n == node))
}

/// `virsh nodedev-info NAME` as (key, value) pairs (`Active`, `Persistent`, `Autostart`, …).
fn nodedev_info(s: &Stack, node: &str) -> Result<Vec<(String, String)>, TestError> {
    Ok(s.virsh(&["nodedev-info", node])?
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect())
}

fn ensure_info(s: &Stack, node: &str, key: &str, want: &str) -> Result<(), TestError> {
    let info = nodedev_info(s, node)?;
    let got = info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    ensure(got == Some(want), || {
        format!("virsh nodedev-info {node}: {key} is {got:?}, expected {want:?} (all: {info:?})")
    })
}

/// vgpud's definition file for `uuid` under the mtty parent in the sysroot, parsed.
fn mdevctl_file(s: &Stack, uuid: &MdevUuid) -> Result<Option<serde_json::Value>, TestError> {
    let p = s.root.path(&format!("/etc/mdevctl.d/mtty/{uuid}"));
    match std::fs::read_to_string(&p) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| TestError::Check(format!("{} is not JSON ({e}): {text}", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TestError::Check(format!(
            "cannot read {}: {e}",
            p.display()
        ))),
    }
}

fn in_sysfs(uuid: &MdevUuid) -> bool {
    Path::new("/sys/bus/mdev/devices")
        .join(uuid.to_string())
        .exists()
}

/// The whole state of one device, as each party sees it.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    sysfs: bool,
    /// (type, start) of its mdevctl file.
    file: Option<(String, String)>,
    /// (state, defined, autostart) in vgpud's ListInstances.
    vgpud: Option<(String, bool, bool)>,
}

fn seen(s: &Stack, uuid: &MdevUuid) -> Result<Seen, TestError> {
    let file = mdevctl_file(s, uuid)?.map(|v| {
        (
            v["mdev_type"].as_str().unwrap_or("?").to_string(),
            v["start"].as_str().unwrap_or("?").to_string(),
        )
    });
    let list = s.vgpud()?.list_instances()?;
    let vgpud = find(&list, uuid).map(|i| (i.state.clone(), i.defined, i.autostart));
    Ok(Seen {
        sysfs: in_sysfs(uuid),
        file,
        vgpud,
    })
}

fn ensure_seen(s: &Stack, uuid: &MdevUuid, step: &str, want: Seen) -> Result<(), TestError> {
    let got = seen(s, uuid)?;
    if got == want {
        Ok(())
    } else {
        Err(s.failure(&format!(
            "after {step}: {uuid} is {got:?}, expected {want:?}"
        )))
    }
}

fn defined(ty: &str, start: &str, state: &str, autostart: bool) -> Seen {
    Seen {
        sysfs: state == "running",
        file: Some((ty.into(), start.into())),
        vgpud: Some((state.into(), true, autostart)),
    }
}

const GONE: Seen = Seen {
    sysfs: false,
    file: None,
    vgpud: None,
};

fn skip_reason() -> Option<Outcome> {
    kernel_lacks_overlay().map(Outcome::Skipped)
}

/// Step 1: the parents libvirt lists, the mtty parent's types against sysfs, no mdevs yet.
pub fn lists_mdev_parents(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(o) = skip_reason() {
        return Ok(o);
    }
    let s = Stack::up("libvirt-parents", v)?;
    let parents = nodedev_list(&s, &["--cap", "mdev_types"])?;
    // What libvirt makes of the three sample parents (none is a PCI device): printed, as the answer
    // to "which of them does libvirt manage".
    println!("libvirt: node devices with mdev_types: {parents:?}");
    ensure(parents.iter().any(|p| p == "mtty_mtty"), || {
        format!("libvirt lists no mtty_mtty among the mdev parents: {parents:?}")
    })?;
    let xml = s.virsh(&["nodedev-dumpxml", "mtty_mtty"])?;
    let doc = roxmltree::Document::parse(&xml).map_err(|e| {
        TestError::Check(format!("nodedev-dumpxml mtty_mtty is not XML ({e}): {xml}"))
    })?;
    let path = doc
        .descendants()
        .find(|n| n.has_tag_name("path"))
        .and_then(|n| n.text())
        .unwrap_or_default();
    ensure(path == "/sys/devices/virtual/mtty/mtty", || {
        format!("mtty_mtty's <path> is {path:?}: {xml}")
    })?;
    let mut types = Vec::new();
    for t in doc.descendants().filter(|n| n.has_tag_name("type")) {
        let child = |tag: &str| {
            t.children()
                .find(|c| c.has_tag_name(tag))
                .and_then(|c| c.text())
                .unwrap_or_default()
                .to_string()
        };
        types.push((
            t.attribute("id").unwrap_or_default().to_string(),
            child("name"),
            child("deviceAPI"),
            child("availableInstances"),
        ));
    }
    types.sort();
    let mut want = Vec::new();
    for t in SAMPLE_TYPES.iter().filter(|t| t.parent == "mtty") {
        want.push((
            t.id.to_string(),
            t.name.to_string(),
            "vfio-pci".to_string(),
            available(&g.host, "mtty", t.id)?.to_string(),
        ));
    }
    ensure(types == want, || {
        format!("mtty_mtty's types in libvirt {types:?}, in sysfs {want:?}")
    })?;
    let mdevs = nodedev_list(&s, &["--cap", "mdev", "--all"])?;
    let ours = s.vgpud()?.list_instances()?;
    ensure(mdevs.is_empty() && ours.is_empty(), || {
        format!("before any mdev: libvirt lists {mdevs:?}, vgpud {ours:?}")
    })?;
    Ok(Outcome::Passed)
}

fn device_xml(ty: &str, uuid: &MdevUuid, attr: Option<(&str, &str)>) -> String {
    let attr = attr
        .map(|(n, v)| format!("<attr name='{n}' value='{v}'/>"))
        .unwrap_or_default();
    format!(
        "<device><parent>mtty_mtty</parent><capability type='mdev'><type id='{ty}'/>\
         <uuid>{uuid}</uuid>{attr}</capability></device>\n"
    )
}

/// Step 2, persistent devices: define (with an attribute, then without), start, autostart, destroy,
/// undefine.
pub fn define_start_destroy_undefine(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(o) = skip_reason() {
        return Ok(o);
    }
    let s = Stack::up("libvirt-define", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("libvirt-define", 0);
    let node = mdev_node(&u);
    mdevs.adopt(u);

    // A definition with an attribute: stored by vgpud, shown by libvirt; mtty's mdevs have no
    // writable attribute, so starting it fails and leaves nothing behind.
    let with_attr = s.file(
        "attr.xml",
        &device_xml("mtty-1", &u, Some(("sample_attr", "1"))),
    )?;
    s.virsh(&["nodedev-define", &with_attr])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-define with <attr>",
        defined("mtty-1", "manual", "stopped", false),
    )?;
    let attrs = mdevctl_file(&s, &u)?.map(|v| v["attrs"].clone());
    ensure(
        attrs
            .as_ref()
            .is_some_and(|a| a.to_string().contains("sample_attr")),
        || format!("the definition file's attrs are {attrs:?}, expected sample_attr"),
    )?;
    s.wait_until("libvirt lists the defined device", SEEN_WITHIN, |s| {
        listed(s, &["--cap", "mdev", "--inactive"], &node)
    })?;
    let xml = s
        .virsh(&["nodedev-dumpxml", "--inactive", &node])
        .or_else(|_| s.virsh(&["nodedev-dumpxml", &node]))?;
    ensure(
        xml.contains("sample_attr") && xml.contains("mtty-1"),
        || format!("nodedev-dumpxml {node} lacks the type or the attribute: {xml}"),
    )?;
    let err = s.virsh_fails(&["nodedev-start", &node])?;
    ensure(err.contains("sample_attr"), || {
        format!(
            "nodedev-start of a device with an unwritable attribute failed without naming it: {err}"
        )
    })?;
    ensure_seen(
        &s,
        &u,
        "a failed nodedev-start",
        defined("mtty-1", "manual", "stopped", false),
    )?;
    s.virsh(&["nodedev-undefine", &node])?;
    ensure_seen(&s, &u, "nodedev-undefine", GONE)?;
    s.wait_until("libvirt drops the undefined device", SEEN_WITHIN, |s| {
        Ok(!listed(s, &["--cap", "mdev", "--all"], &node)?)
    })?;

    let before = available(&g.host, "mtty", "mtty-2")?;
    let plain = s.file("plain.xml", &device_xml("mtty-2", &u, None))?;
    s.virsh(&["nodedev-define", &plain])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-define",
        defined("mtty-2", "manual", "stopped", false),
    )?;
    s.wait_until("libvirt lists the definition", SEEN_WITHIN, |s| {
        listed(s, &["--cap", "mdev", "--inactive"], &node)
    })?;
    s.virsh(&["nodedev-start", &node])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-start",
        defined("mtty-2", "manual", "running", false),
    )?;
    ensure(available(&g.host, "mtty", "mtty-2")? + 1 == before, || {
        "mtty-2's available_instances did not drop by one".to_string()
    })?;
    s.wait_until(
        "libvirt shows the started device active",
        SEEN_WITHIN,
        |s| listed(s, &["--cap", "mdev"], &node),
    )?;
    ensure_info(&s, &node, "Active", "yes")?;
    s.virsh(&["nodedev-autostart", &node])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-autostart",
        defined("mtty-2", "auto", "running", true),
    )?;
    s.wait_until("libvirt shows autostart", SEEN_WITHIN, |s| {
        Ok(nodedev_info(s, &node)?.contains(&("Autostart".into(), "yes".into())))
    })?;
    s.virsh(&["nodedev-destroy", &node])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-destroy",
        defined("mtty-2", "auto", "stopped", true),
    )?;
    s.wait_until(
        "libvirt shows the destroyed device inactive",
        SEEN_WITHIN,
        |s| {
            Ok(!listed(s, &["--cap", "mdev"], &node)?
                && listed(s, &["--cap", "mdev", "--inactive"], &node)?)
        },
    )?;
    s.virsh(&["nodedev-autostart", "--disable", &node])?;
    ensure_seen(
        &s,
        &u,
        "nodedev-autostart --disable",
        defined("mtty-2", "manual", "stopped", false),
    )?;
    s.virsh(&["nodedev-undefine", &node])?;
    ensure_seen(&s, &u, "nodedev-undefine", GONE)?;
    s.wait_until("libvirt drops the undefined device", SEEN_WITHIN, |s| {
        Ok(!listed(s, &["--cap", "mdev", "--all"], &node)?)
    })?;
    ensure(available(&g.host, "mtty", "mtty-2")? == before, || {
        "mtty-2's available_instances did not come back".to_string()
    })?;
    mdevs.forget(&u);
    Ok(Outcome::Passed)
}

/// Step 2, transient devices: `nodedev-create` returns promptly (udev tells libvirt of the device) and
/// `nodedev-destroy` removes it.
pub fn create_destroy(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(o) = skip_reason() {
        return Ok(o);
    }
    let s = Stack::up("libvirt-create", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("libvirt-create", 0);
    let node = mdev_node(&u);
    mdevs.adopt(u);
    let xml = s.file("create.xml", &device_xml("mtty-1", &u, None))?;
    let t = Instant::now();
    s.virsh(&["nodedev-create", &xml])?;
    let took = t.elapsed();
    println!("libvirt: nodedev-create returned in {took:?}");
    ensure(took < CREATE_WITHIN, || {
        format!("nodedev-create took {took:?} (libvirt waited for a udev event?)")
    })?;
    ensure_seen(
        &s,
        &u,
        "nodedev-create",
        Seen {
            sysfs: true,
            file: None,
            vgpud: Some(("running".into(), false, false)),
        },
    )?;
    ensure(listed(&s, &["--cap", "mdev"], &node)?, || {
        format!("{node} not listed after create")
    })?;
    let xml = s.virsh(&["nodedev-dumpxml", &node])?;
    ensure(
        xml.contains("<type id='mtty-1'/>") && xml.contains(&u.to_string()),
        || format!("nodedev-dumpxml {node}: {xml}"),
    )?;
    let t = Instant::now();
    s.virsh(&["nodedev-destroy", &node])?;
    println!("libvirt: nodedev-destroy returned in {:?}", t.elapsed());
    ensure_seen(&s, &u, "nodedev-destroy", GONE)?;
    s.wait_until("libvirt drops the destroyed device", SEEN_WITHIN, |s| {
        Ok(!listed(s, &["--cap", "mdev", "--all"], &node)?)
    })?;
    mdevs.forget(&u);
    Ok(Outcome::Passed)
}

/// Step 3: changes made through vgpud (D-Bus) show in libvirt promptly, and a libvirtd started
/// before vgpud lists everything once vgpud is up.
pub fn view_follows_vgpud(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(o) = skip_reason() {
        return Ok(o);
    }
    let mut s = Stack::up("libvirt-view", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let (a, b) = (test_uuid("libvirt-view", 0), test_uuid("libvirt-view", 1));
    mdevs.adopt(a);
    mdevs.adopt(b);
    let (na, nb) = (mdev_node(&a), mdev_node(&b));

    s.vgpud()?
        .create(TargetKind::Type, "mtty-1", "mtty", Some(&a))?;
    let created = s.wait_until(
        "libvirt lists a device created over D-Bus",
        SEEN_WITHIN,
        |s| listed(s, &["--cap", "mdev"], &na),
    )?;
    s.vgpud()?
        .define(TargetKind::Type, "mtty-1", "mtty", &b, false)?;
    let defined = s.wait_until(
        "libvirt lists a device defined over D-Bus",
        SEEN_WITHIN,
        |s| listed(s, &["--cap", "mdev", "--inactive"], &nb),
    )?;
    s.vgpud()?.destroy(&a)?;
    let removed = s.wait_until(
        "libvirt drops a device destroyed over D-Bus",
        SEEN_WITHIN,
        |s| Ok(!listed(s, &["--cap", "mdev", "--all"], &na)?),
    )?;
    let t = Instant::now();
    nodedev_list(&s, &["--cap", "mdev"])?;
    let one_virsh = t.elapsed();
    println!(
        "libvirt: one virsh nodedev-list run takes {one_virsh:?}; latency to virsh (poll every 20 ms, each virsh run included): create {created:?}, define {defined:?}, destroy {removed:?}"
    );
    for (what, d) in [
        ("create", created),
        ("define", defined),
        ("destroy", removed),
    ] {
        if d > Duration::from_secs(1) {
            println!("libvirt: NOTE {what} took {d:?} to show, over the 1 s target");
        }
    }

    // A running device and a definition, then libvirtd restarted while vgpud is down.
    s.vgpud()?
        .create(TargetKind::Type, "mtty-1", "mtty", Some(&a))?;
    s.stop_libvirtd();
    s.stop_vgpud()?;
    s.start_libvirtd()?;
    s.start_vgpud()?;
    let late = s.wait_until(
        "libvirt (started first) lists both devices once vgpud is up",
        SEEN_WITHIN,
        |s| {
            Ok(listed(s, &["--cap", "mdev"], &na)?
                && listed(s, &["--cap", "mdev", "--inactive"], &nb)?)
        },
    )?;
    println!(
        "libvirt: libvirtd started before vgpud lists both devices {late:?} after vgpud is up"
    );
    s.vgpud()?.destroy(&a)?;
    s.vgpud()?.destroy(&b)?;
    ensure_seen(&s, &a, "destroy", GONE)?;
    ensure_seen(&s, &b, "destroy", GONE)?;
    mdevs.forget(&a);
    mdevs.forget(&b);
    Ok(Outcome::Passed)
}

/// `virsh nodedev-update` (libvirt ≥ 10.1; run on 11.3): an attribute added to a defined, inactive
/// mtty device with `--config` reaches vgpud's definition and its file in /etc/mdevctl.d (libvirt
/// runs `mdevctl modify --defined --jsonfile`), and libvirt shows it; the device stays stopped.
pub fn update_defined(g: &Guest, v: Libvirt) -> TestResult {
    if let Some(o) = skip_reason() {
        return Ok(o);
    }
    let s = Stack::up("libvirt-update", v)?;
    let mut mdevs = Mdevs::new(&g.host);
    let u = test_uuid("libvirt-update", 0);
    let node = mdev_node(&u);
    mdevs.adopt(u);
    let plain = s.file("plain.xml", &device_xml("mtty-1", &u, None))?;
    s.virsh(&["nodedev-define", &plain])?;
    s.wait_until("libvirt lists the defined device", SEEN_WITHIN, |s| {
        listed(s, &["--cap", "mdev", "--inactive"], &node)
    })?;
    // What a user edits: libvirt's own XML of the device, with an attribute added.
    let current = s.virsh(&["nodedev-dumpxml", "--inactive", &node])?;
    let Some(at) = current.rfind("</capability>") else {
        return Err(TestError::Check(format!(
            "nodedev-dumpxml --inactive {node} has no capability: {current}"
        )));
    };
    let mut edited = current.clone();
    edited.insert_str(at, "<attr name='sample_attr' value='2'/>\n");
    let with_attr = s.file("update.xml", &edited)?;
    s.virsh(&["nodedev-update", &node, &with_attr, "--config"])?;
    let attrs = mdevctl_file(&s, &u)?.map(|v| v["attrs"].clone());
    ensure(
        attrs
            .as_ref()
            .is_some_and(|a| a.to_string().contains("sample_attr")),
        || format!("after nodedev-update the definition file's attrs are {attrs:?}"),
    )?;
    ensure_seen(
        &s,
        &u,
        "nodedev-update --config",
        defined("mtty-1", "manual", "stopped", false),
    )?;
    s.wait_until("libvirt shows the updated attribute", SEEN_WITHIN, |s| {
        Ok(s.virsh(&["nodedev-dumpxml", "--inactive", &node])?
            .contains("sample_attr"))
    })?;
    s.virsh(&["nodedev-undefine", &node])?;
    ensure_seen(&s, &u, "nodedev-undefine", GONE)?;
    mdevs.forget(&u);
    Ok(Outcome::Passed)
}
