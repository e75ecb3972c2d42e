//! Regenerates `fuzz/seeds/<target>/` from what the repository holds: the shipped profiles and pools,
//! the sysfs trees of every builtin simulated host (`vgpu_sim::SimHost::materialize`), the real capture
//! in `tests/fixtures/h200-passthrough`, the mdevctl and libvirt fixtures of `vgpu-manager/tests`, and
//! records written by the store's own encoders. Each file name says where its seed came from; files named
//! `regression-*` are inputs that once failed a check, kept as they are.
//!
//!     cargo run --no-default-features --features sim --bin seeds     (from fuzz/; rewrites seeds/)

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use mdev_types::parse::{TypeDescription, parse_nvidia_vgpu_name, parse_type_description};
use qemu_glue::{DomainSpec, Hostdev, MdevDisplay, PciHostdev, VgpuRequest, VgpuTarget};
use vgpu_host::ops::BindRecord;
use vgpu_manager::backend::Created;
use vgpu_manager::daemon::api::MdevAttr;
use vgpu_manager::daemon::store::codec;
use vgpu_manager::daemon::store::{
    AppliedPool, Definition, LedgerEntry, LedgerOwnership, VfKind, VfSlotRecord,
};
use vgpu_manager::pool::SlotId;
use vgpu_sim::SimHost;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Seeds of one target, deduplicated by content.
struct Seeds {
    dir: PathBuf,
    seen: BTreeSet<Vec<u8>>,
}

impl Seeds {
    fn new(root: &Path, target: &str) -> Res<Seeds> {
        let dir = root.join(target);
        fs::create_dir_all(&dir)?;
        // Inputs that once failed a check (`regression-*`, kept by hand) stay; the rest is made anew.
        for e in fs::read_dir(&dir)? {
            let e = e?;
            if !e.file_name().to_string_lossy().starts_with("regression-") {
                fs::remove_file(e.path())?;
            }
        }
        Ok(Seeds {
            dir,
            seen: BTreeSet::new(),
        })
    }

    /// Adds `data` as `<source>` (made a file name), unless the same bytes are there already.
    fn add(&mut self, source: &str, data: Vec<u8>) -> Res<()> {
        if !self.seen.insert(data.clone()) {
            return Ok(());
        }
        let mut name: String = source
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        name.truncate(120);
        let mut path = self.dir.join(&name);
        let mut n = 1;
        while path.exists() {
            n += 1;
            path = self.dir.join(format!("{name}.{n}"));
        }
        fs::write(path, data)?;
        Ok(())
    }

    /// Adds `text` for parser `k` of a multi-parser target (its first byte).
    fn add_for(&mut self, k: u8, source: &str, text: &str) -> Res<()> {
        let mut data = vec![k];
        data.extend_from_slice(text.as_bytes());
        self.add(&format!("{k}-{source}"), data)
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(meta) = fs::symlink_metadata(&p) else {
                continue;
            };
            if meta.is_dir() {
                todo.push(p);
            } else if meta.is_file() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One sysfs tree: its attribute texts (for `sysfs_attr`) and uevents of its devices (`uevent`).
fn sysfs_tree(label: &str, root: &Path, attrs: &mut Seeds, events: &mut Seeds) -> Res<()> {
    use vgpu_manager_fuzz::sysfs_attr::PARSERS;
    let k = |name: &str| {
        PARSERS
            .iter()
            .position(|p| *p == name)
            .map_or(0, |i| i as u8)
    };
    for path in files(root) {
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let rel = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let src = format!("{label}-{rel}");
        match name_of(&path).as_str() {
            "description" => {
                attrs.add_for(k("type-description"), &src, &text)?;
                let which = match parse_type_description(Some(&text)) {
                    TypeDescription::Nvidia(_) => "nvidia-description",
                    TypeDescription::Gvt(_) => "gvt-description",
                    TypeDescription::SampleVideoMemory { .. }
                    | TypeDescription::SampleFramebuffer { .. } => "sample-descriptions",
                    TypeDescription::Unknown => continue,
                };
                attrs.add_for(k(which), &src, &text)?;
            }
            "creatable_vgpu_types" => attrs.add_for(k("creatable-vgpu-types"), &src, &text)?,
            "name" if parse_nvidia_vgpu_name(&text).is_ok() => {
                attrs.add_for(k("vgpu-name"), &src, &text)?
            }
            "class" => attrs.add_for(k("class"), &src, &text)?,
            "vendor" | "device" | "subsystem_vendor" | "subsystem_device" => {
                attrs.add_for(k("ids"), &src, &text)?
            }
            "available_instances"
            | "numa_node"
            | "sriov_totalvfs"
            | "sriov_numvfs"
            | "max_instance"
            | "enable"
            | "d3cold_allowed" => attrs.add_for(k("numbers"), &src, &text)?,
            "uevent" => {
                // A device's `uevent` file holds the variables its uevents carry (`KEY=VALUE` lines).
                let dir = path.parent().unwrap_or(root);
                let devpath = format!(
                    "/{}",
                    dir.strip_prefix(root)?.strip_prefix("sys")?.display()
                );
                for action in ["add", "bind", "change"] {
                    let mut msg =
                        format!("{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0");
                    for line in text.lines().filter(|l| l.contains('=')) {
                        msg.push_str(line);
                        msg.push('\0');
                    }
                    msg.push_str("SEQNUM=4242\0");
                    events.add(&format!("{src}-{action}"), msg.into_bytes())?;
                }
            }
            _ => {}
        }
    }
    // Device and type directory names are identifiers too: PCI addresses, UUIDs, mdev type ids.
    let mut names = BTreeSet::new();
    for path in files(root) {
        for c in path.strip_prefix(root).unwrap_or(&path).components() {
            names.insert(c.as_os_str().to_string_lossy().into_owned());
        }
    }
    let ids = names
        .iter()
        .filter(|n| n.contains(':') || n.contains('-') && n.len() >= 8);
    for n in ids.take(12) {
        attrs.add_for(k("ids"), &format!("{label}-name-{n}"), n)?;
    }
    // What the kernel broadcasts when an mdev of each type is made and removed below its parent
    // (drivers/vfio/mdev/mdev_core.c registers the device, lib/kobject_uevent.c formats the message),
    // and when a PCI function is bound to its driver.
    let mut n = 0;
    for path in files(root)
        .iter()
        .filter(|p| name_of(p) == "available_instances")
        .take(6)
    {
        let Some(ty_dir) = path.parent() else {
            continue;
        };
        let Some(parent) = ty_dir.parent().and_then(Path::parent) else {
            continue;
        };
        let Ok(rel) = parent.strip_prefix(root.join("sys")) else {
            continue;
        };
        let devpath = format!("/{}/83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", rel.display());
        let ty = name_of(ty_dir);
        for action in ["add", "remove"] {
            n += 1;
            let msg = format!(
                "{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0SUBSYSTEM=mdev\0MDEV_TYPE={ty}\0SEQNUM={n}\0"
            );
            events.add(&format!("{label}-mdev-{ty}-{action}"), msg.into_bytes())?;
        }
    }
    for path in files(root).iter().filter(|p| name_of(p) == "class").take(4) {
        let Some(dev) = path.parent() else { continue };
        let Ok(rel) = dev.strip_prefix(root.join("sys")) else {
            continue;
        };
        let addr = name_of(dev);
        let devpath = format!("/{}", rel.display());
        let driver = fs::read_link(dev.join("driver"))
            .ok()
            .map(|t| name_of(&t))
            .unwrap_or("vfio-pci".into());
        for action in ["bind", "unbind"] {
            n += 1;
            let msg = format!(
                "{action}@{devpath}\0ACTION={action}\0DEVPATH={devpath}\0SUBSYSTEM=pci\0DRIVER={driver}\0PCI_SLOT_NAME={addr}\0SEQNUM={n}\0"
            );
            events.add(&format!("{label}-pci-{addr}-{action}"), msg.into_bytes())?;
        }
    }
    Ok(())
}

fn uuid(s: &str) -> mdev_types::ids::MdevUuid {
    s.parse().expect("a UUID")
}

fn records(repo: &Path, seeds: &mut Seeds) -> Res<()> {
    use vgpu_manager_fuzz::state_record::KINDS;
    let k = |name: &str| KINDS.iter().position(|p| *p == name).map_or(0, |i| i as u8);
    let def = Definition {
        uuid: uuid("4b20d080-1b54-4048-85b3-a6a62d165c01"),
        parent: "0000:3b:00.0".into(),
        gpu: "0000:3b:00.0".into(),
        type_id: "nvidia-231".parse()?,
        profile: Some("vdi-2g".into()),
        autostart: true,
        label: Some("vm-42".into()),
        created_at: 1_767_225_600,
        attrs: vec![MdevAttr::new("assign_adapter", "5")?],
    };
    seeds.add_for(
        k("definition"),
        "store-definition",
        &codec::encode_definition(&def)?,
    )?;
    let bare = Definition {
        profile: None,
        label: None,
        attrs: Vec::new(),
        autostart: false,
        ..def.clone()
    };
    seeds.add_for(
        k("definition"),
        "store-definition-bare",
        &codec::encode_definition(&bare)?,
    )?;
    let entry = |u: &str, ownership, gpu: Option<&str>| LedgerEntry {
        uuid: uuid(u),
        parent: "mbochs".into(),
        type_id: "mbochs-medium".parse().expect("a type id"),
        ownership,
        created_at: 1_767_225_600,
        gpu: gpu.map(str::to_string),
        profile: gpu.map(|_| "sample-display-16m".to_string()),
        label: None,
    };
    let entries = [
        entry(
            "4b20d080-1b54-4048-85b3-a6a62d165c01",
            LedgerOwnership::Daemon,
            Some("mbochs"),
        ),
        entry(
            "9d1c0e52-2a3c-4f0c-a0f7-5a8a4b1c2d3e",
            LedgerOwnership::Adopted,
            None,
        ),
        entry(
            "6c264794-831f-518a-9f46-aed451324919",
            LedgerOwnership::Daemon,
            None,
        ),
    ];
    seeds.add_for(
        k("ledger"),
        "store-ledger-daemon",
        &codec::encode_ledger_entry(&entries[0])?,
    )?;
    seeds.add_for(
        k("ledger"),
        "store-ledger-adopted",
        &codec::encode_ledger_entry(&entries[1])?,
    )?;
    seeds.add_for(
        k("batch"),
        "store-ledger-batch",
        &codec::encode_ledger_batch(&entries)?,
    )?;
    for path in files(&repo.join("data/pools.d")) {
        let text = fs::read_to_string(&path)?;
        let p = codec::decode_applied_pool(&text).map_err(|e| e.to_string())?;
        let p = AppliedPool { applied_at: 0, ..p };
        seeds.add_for(
            k("pool"),
            &format!("data-pools.d-{}", name_of(&path)),
            &codec::encode_applied_pool(&p)?,
        )?;
    }
    let slot = SlotId::new("vdi-floor", "vdi-2g", 3);
    let pf = "0000:03:00.0".parse()?;
    let vf = "0000:03:00.1".parse()?;
    let vf_slot = VfSlotRecord {
        uuid: slot.uuid,
        pool: "vdi-floor".into(),
        profile: "vdi-2g".into(),
        index: 3,
        gpu: "0000:03:00.0".into(),
        pf,
        vf,
        num_vfs: 8,
        holds: VfKind::SriovVf,
        created: Some(Created::Vf {
            pf,
            vf,
            bind: BindRecord {
                addr: vf,
                previous_driver: Some("xe".into()),
                previous_override: None,
            },
        }),
    };
    seeds.add_for(
        k("vf-slot"),
        "store-vf-slot-sriov",
        &codec::encode_vf_slot(&vf_slot)?,
    )?;
    let nvidia = VfSlotRecord {
        holds: VfKind::NvidiaVgpu {
            type_id: 557,
            type_name: "NVIDIA L40S-1Q".into(),
        },
        created: Some(Created::NvidiaVgpu {
            pf,
            vf,
            type_id: 557,
        }),
        ..vf_slot.clone()
    };
    seeds.add_for(
        k("vf-slot"),
        "store-vf-slot-nvidia",
        &codec::encode_vf_slot(&nvidia)?,
    )?;
    let making = VfSlotRecord {
        created: None,
        ..vf_slot
    };
    seeds.add_for(
        k("vf-slot"),
        "store-vf-slot-making",
        &codec::encode_vf_slot(&making)?,
    )?;
    Ok(())
}

fn dbus(seeds: &mut Seeds, pool: &str) -> Res<()> {
    let u = "4b20d080-1b54-4048-85b3-a6a62d165c01";
    let calls: Vec<(&str, Vec<String>)> = vec![
        ("get", vec!["GetInstance".into(), u.into()]),
        ("create-profile", vec!["Create".into(), "profile".into(), "vdi-2g".into(), String::new(), String::new(), "label\u{1}s\u{1}vm-42".into()]),
        ("create-type-attrs", vec!["Create".into(), "type".into(), "nvidia-231".into(), "0000:3b:00.0".into(), u.into(), "attrs\u{1}a(ss)\u{1}assign_adapter\u{1}5\u{1}assign_domain\u{1}0x47".into()]),
        ("define-autostart", vec!["Define".into(), "profile".into(), "vdi-1g".into(), "mbochs".into(), u.into(), "autostart\u{1}b\u{1}true".into(), "label\u{1}s\u{1}libvirt:desk".into()]),
        ("define-bad-type", vec!["Define".into(), "profile".into(), "vdi-1g".into(), String::new(), String::new(), "autostart\u{1}s\u{1}yes".into()]),
        ("destroy", vec!["Destroy".into(), u.into()]),
        ("start", vec!["Start".into(), u.into()]),
        ("stop", vec!["Stop".into(), u.into()]),
        ("undefine", vec!["Undefine".into(), u.into()]),
        ("set-autostart", vec!["SetAutostart".into(), u.into(), "true".into()]),
        ("plan", vec!["Plan".into(), pool.into()]),
        ("apply", vec!["Apply".into(), pool.into()]),
        ("plan-scheduling", vec!["PlanScheduling".into(), "0000:03:00.0".into(), r#"[{"weight":10},{"weight":30,"slot":"vf2","priority":"high","framebuffer_mib":2048,"label":"a"}]"#.into()]),
        ("apply-scheduling", vec!["ApplyScheduling".into(), "0000:03:00.0".into(), String::new()]),
        ("open-device", vec!["OpenDevice".into(), "backend\u{1}s\u{1}iommufd".into(), "bind\u{1}b\u{1}false".into()]),
        ("open-device-variant", vec!["OpenDevice".into(), "backend\u{1}v\u{1}type1".into()]),
    ];
    for (name, fields) in calls {
        seeds.add(&format!("call-{name}"), fields.join("\0").into_bytes())?;
    }
    Ok(())
}

fn main() -> Res<()> {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = fuzz.parent().ok_or("fuzz/ has a parent")?;
    let root = fuzz.join("seeds");
    let mut attrs = Seeds::new(&root, "sysfs_attr")?;
    let mut events = Seeds::new(&root, "uevent")?;
    let tmp = std::env::temp_dir().join(format!("vgpu-fuzz-seeds-{}", std::process::id()));
    for name in SimHost::builtin_names() {
        let dir = tmp.join(name);
        SimHost::builtin(name)?.materialize(&dir)?;
        sysfs_tree(&format!("sim-{name}"), &dir, &mut attrs, &mut events)?;
    }
    let _ = fs::remove_dir_all(&tmp);
    let capture = repo.join("tests/fixtures/h200-passthrough");
    sysfs_tree("capture-h200", &capture, &mut attrs, &mut events)?;
    for (k, text) in [
        (2u8, "1920x1200\n"),
        (2, "5120x2880"),
        (3, "2048M"),
        (3, "128MB\n"),
        (3, "16 MB"),
    ] {
        attrs.add_for(k, &format!("handmade-{text}"), text)?;
    }

    let mut profiles = Seeds::new(&root, "profile_toml")?;
    for path in files(&repo.join("profiles")) {
        profiles.add(&format!("profiles-{}", name_of(&path)), fs::read(&path)?)?;
    }
    let mut pools = Seeds::new(&root, "pool_toml")?;
    for path in files(&repo.join("data/pools.d")) {
        pools.add(
            &format!("data-pools.d-{}", name_of(&path)),
            fs::read(&path)?,
        )?;
    }
    let mut state = Seeds::new(&root, "state_record")?;
    records(repo, &mut state)?;

    let mut mdevctl = Seeds::new(&root, "mdevctl_json")?;
    for path in files(&repo.join("vgpu-manager/tests/fixtures/mdevctl")) {
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let rel = path.strip_prefix(repo)?.display().to_string();
        let k = if rel.contains("/types/") {
            2
        } else if text.trim_start().starts_with('[') {
            1
        } else {
            0
        };
        mdevctl.add_for(k, &rel, &text)?;
    }

    let mut domains = Seeds::new(&root, "domain_xml")?;
    let mut hook = Seeds::new(&root, "libvirt_hook")?;
    let mut xmls = Vec::new();
    for path in files(&repo.join("vgpu-manager/tests/fixtures/libvirt")) {
        if path.extension().is_some_and(|e| e == "xml") {
            xmls.push((
                path.strip_prefix(repo)?.display().to_string(),
                fs::read_to_string(&path)?,
            ));
        }
    }
    let u = uuid("4b20d080-1b54-4048-85b3-a6a62d165c01");
    let mut spec = DomainSpec::desktop(
        "desk-07",
        vec![
            Hostdev::Mdev {
                uuid: u,
                display: MdevDisplay::DESKTOP,
            },
            Hostdev::Pci(PciHostdev {
                address: "0000:c1:00.4".parse()?,
                managed: true,
            }),
        ],
    );
    spec.vgpus = vec![VgpuRequest {
        uuid: u,
        target: VgpuTarget::Profile("vdi-2g".into()),
        gpu: Some("0000:3b:00.0".into()),
    }];
    xmls.push(("qemu-glue-DomainSpec-desktop".into(), spec.to_xml()?));
    for (src, xml) in &xmls {
        domains.add(src, xml.clone().into_bytes())?;
        for (op, behaviour) in [(0u8, 0u8), (0, 7), (1, 0), (1, 0x44), (0, 8)] {
            let mut data = vec![op, behaviour];
            data.extend_from_slice(xml.as_bytes());
            hook.add(&format!("{src}-op{op}-b{behaviour}"), data)?;
        }
    }

    let mut calls = Seeds::new(&root, "dbus_args")?;
    let pool = fs::read_to_string(repo.join("data/pools.d/vdi-floor.toml"))?;
    dbus(&mut calls, &pool)?;

    // Call-out script answers (mdevctl.rst, "CALLOUT SCRIPTS"): byte 0 even is `get capabilities`,
    // odd is `get attributes`.
    let mut answers = Seeds::new(&root, "callout_answer")?;
    for (k, source, text) in [
        (
            0u8,
            "capabilities-v2",
            r#"{"supports":{"version":2,"actions":["start","stop","define","undefine","modify","attributes","capabilities"],"events":["pre","post","notify","get","live"]}}"#,
        ),
        (
            0,
            "capabilities-newer-words",
            "{\"supports\":{\"version\":3,\"actions\":[\"start\",\"future\"],\"events\":[\"pre\",\"later\"]}}\n\0",
        ),
        (0, "capabilities-none", "{\"provides\":{}}"),
        (
            1,
            "attributes-vfio-ap",
            r#"[{"assign_adapter":"5"},{"assign_domain":"0x47"},{"assign_control_domain":"0x47"}]"#,
        ),
        (1, "attributes-empty-object", "[{}]"),
        (1, "attributes-null", "null\n"),
        (1, "attributes-bad-item", r#"[{"a":"1","b":"2"}]"#),
    ] {
        answers.add_for(k, source, text)?;
    }

    // The DRA plugin's inputs (docs/dra.md): byte 0 picks device name, ResourceClaim, API-proxy
    // address or checkpoint.
    let mut dra = Seeds::new(&root, "dra_input")?;
    for (k, source, text) in [
        (0u8, "device-vdi-2g", "gpu-0000-3b-00-0-vdi-2g-0"),
        (0, "device-index-12", "gpu-0000-01-00-0-compute-8g-12"),
        (0, "device-not-ours", "gpu-0000-3b-00-0-vdi-01"),
        (
            1,
            "claim-allocated",
            r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"vm-gpu","namespace":"vms","uid":"u1","annotations":{"resource.kubernetes.io/pod-claim-name":"gpu"}},"status":{"allocation":{"devices":{"results":[{"request":"vgpu","driver":"vgpu.vgpu-manager.io","pool":"node-1","device":"gpu-0000-3b-00-0-vdi-2g-0"},{"request":"nic","driver":"other.example.com","pool":"node-1","device":"nic-0"}]}}}}"#,
        ),
        (
            1,
            "claim-pending",
            r#"{"metadata":{"name":"c","namespace":"vms","uid":"u2"},"status":{}}"#,
        ),
        (2, "proxy-unix", "unix:/run/vgpu-dra/kube-api.sock"),
        (2, "proxy-http", "http://127.0.0.1:8001"),
        (
            3,
            "checkpoint",
            r#"{"version":1,"driver":"vgpu.vgpu-manager.io","claims":{"u1":{"namespace":"vms","name":"vm-gpu","pod_claim_name":"gpu","phase":"completed","devices":[{"request":"vgpu","pool":"node-1","device":"gpu-0000-3b-00-0-vdi-2g-0","gpu":"0000:3b:00.0","profile":"vdi-2g","uuid":"7d3b4a42-5c1e-5f0e-9a6b-0c1d2e3f4a5b","iommu_group":51}]},"u2":{"namespace":"vms","name":"x","phase":"started","devices":[]}}}"#,
        ),
    ] {
        dra.add_for(k, source, text)?;
    }
    Ok(())
}
