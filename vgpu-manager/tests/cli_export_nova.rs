//! `vgpuctl export nova` on the demo host with the shipped VDI floor applied through the real vgpud, read
//! back by Nova's own option definitions: `tests/data/nova/check_nova_conf.py` registers
//! `nova.conf.devices` and `nova.conf.pci` (Nova 34.0.0 from PyPI, in the test virtualenv of
//! `scripts/nova-venv`) on an oslo.config `ConfigOpts`, parses the fragment with `--config-file`,
//! registers the dynamic `[mdev_<type>]` groups, refuses any option Nova does not define, parses each
//! `device_spec` and `alias` with Nova's parsers, and prints what Nova read; the test compares that with
//! the slots vgpud reports. The fragment is a golden file:
//! `VGPU_BLESS=1 cargo test -p vgpu-manager --test cli_export_nova` regenerates it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod dbus_common;
mod export_common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use dbus_common::{ok, ok_json, vgpuctl};
use export_common::{floor_daemon, golden, repo, test_python};
use serde_json::Value;
use vgpu_client::PoolStatus;

/// What Nova reads from `conf` (the checker's JSON), or `None` when the test virtualenv is missing and
/// `VGPU_TESTS_ALLOW_SKIP=1` allows the skip.
fn nova_reads(test: &str, dir: &Path, conf: &str) -> Option<Value> {
    let python = test_python(test)?;
    let f = dir.join("nova-fragment.conf");
    std::fs::write(&f, conf).unwrap();
    let o = std::process::Command::new(python)
        .arg(repo().join("vgpu-manager/tests/data/nova/check_nova_conf.py"))
        .arg(&f)
        // eventlet, which nova.pci imports, warns that it is deprecated.
        .env("PYTHONWARNINGS", "ignore")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "Nova refused the fragment: {}\n{conf}",
        String::from_utf8_lossy(&o.stderr)
    );
    Some(serde_json::from_slice(&o.stdout).unwrap())
}

/// mdev type → (parents, slots) and VF address → PCI id, from vgpud's status.
type Wanted = (
    BTreeMap<String, (BTreeSet<String>, u64)>,
    BTreeMap<String, String>,
);

fn wanted(status: &[PoolStatus]) -> Wanted {
    let (mut mdev, mut vfs) = (BTreeMap::new(), BTreeMap::new());
    for s in status
        .iter()
        .flat_map(|p| &p.slots)
        .filter(|s| s.gpu.is_some())
    {
        match (&s.vf, &s.parent) {
            (Some(vf), _) => {
                vfs.insert(vf.clone(), s.pci_id.clone().unwrap());
            }
            (None, Some(parent)) => {
                let e: &mut (BTreeSet<String>, u64) =
                    mdev.entry(s.type_id.clone().unwrap()).or_default();
                e.0.insert(parent.clone());
                e.1 += 1;
            }
            (None, None) => panic!("slot without parent or VF: {s:?}"),
        }
    }
    (mdev, vfs)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nova_reads_the_applied_slots_from_the_fragment() {
    let test = "nova_reads_the_applied_slots_from_the_fragment";
    let dir = tempfile::tempdir().unwrap();
    let d = floor_daemon(dir.path()).await;
    let status: Vec<PoolStatus> = serde_json::from_value(ok_json(
        &vgpuctl(&d.bus, &["pool", "status", "--json"]).await,
    ))
    .unwrap();
    let (mdev, vfs) = wanted(&status);
    assert_eq!(mdev.len(), 3, "{mdev:?}");
    assert_eq!(vfs.len(), 32);

    let conf = ok(&vgpuctl(&d.bus, &["--sim", "demo", "export", "nova", "vdi-floor"]).await);
    golden("export-nova.conf", &conf);
    let Some(nova) = nova_reads(test, dir.path(), &conf) else {
        return;
    };

    // [devices] and one [mdev_<type>] per type: its parents, a class of its own, a cap of its slots.
    let types: BTreeSet<String> = strings(&nova["enabled_mdev_types"]).into_iter().collect();
    assert_eq!(types, mdev.keys().cloned().collect());
    let mut classes = BTreeSet::new();
    for (ty, (parents, slots)) in &mdev {
        let g = &nova["mdev"][ty];
        let addrs: BTreeSet<String> = strings(&g["device_addresses"]).into_iter().collect();
        assert_eq!(&addrs, parents, "{ty}");
        assert_eq!(g["max_instances"].as_u64(), Some(*slots), "{ty}");
        let class = g["mdev_class"].as_str().unwrap();
        assert!(class.starts_with("CUSTOM_"), "{ty}: {class}");
        classes.insert(class.to_string());
    }
    assert_eq!(
        classes.len(),
        mdev.len(),
        "each type has its own class: {classes:?}"
    );
    assert_eq!(
        nova["mdev"]["nvidia-232"]["mdev_class"],
        "CUSTOM_GRID_T4_4Q"
    );

    // [pci] device_spec: every VF slot by address with its ids, managed "no" as Nova reads the tag.
    let specs = nova["device_spec"].as_array().unwrap();
    let got: BTreeMap<String, String> = specs
        .iter()
        .map(|s| {
            let spec = &s["spec"];
            (
                spec["address"].as_str().unwrap().to_string(),
                format!(
                    "{}:{}",
                    spec["vendor_id"].as_str().unwrap(),
                    spec["product_id"].as_str().unwrap()
                ),
            )
        })
        .collect();
    assert_eq!(got, vfs);
    for s in specs {
        assert_eq!(s["tags"]["managed"], "false", "{s}");
        // Not asked through VFIO on a simulated host: no tag, which Nova takes as "no".
        assert!(s["tags"].get("live_migratable").is_none(), "{s}");
    }
    assert!(
        conf.contains("a simulated or captured host cannot be asked through VFIO"),
        "{conf}"
    );

    // [pci] alias: one per VF id, for VFs.
    let aliases: BTreeMap<String, String> = nova["alias"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(a["device_type"], "type-VF");
            (
                format!(
                    "{}:{}",
                    a["vendor_id"].as_str().unwrap(),
                    a["product_id"].as_str().unwrap()
                ),
                a["name"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        aliases,
        BTreeMap::from([
            ("10de:26b9".to_string(), "nvidia-l40s-2b".to_string()),
            (
                "8086:56c0".to_string(),
                "intel-data-center-gpu-flex-170-vf".to_string()
            ),
        ])
    );

    // Said for every VF: Nova reads live_migratable on each spec, and the alias asks for it.
    let yes = ok(&vgpuctl(
        &d.bus,
        &[
            "--sim",
            "demo",
            "export",
            "nova",
            "--live-migratable",
            "yes",
        ],
    )
    .await);
    let nova = nova_reads(test, dir.path(), &yes).unwrap();
    for s in nova["device_spec"].as_array().unwrap() {
        assert_eq!(s["tags"]["live_migratable"], "true", "{s}");
    }
    assert!(
        nova["alias"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["live_migratable"] == "yes")
    );
    let no = ok(&vgpuctl(
        &d.bus,
        &["--sim", "demo", "export", "nova", "--live-migratable", "no"],
    )
    .await);
    let nova = nova_reads(test, dir.path(), &no).unwrap();
    for s in nova["device_spec"].as_array().unwrap() {
        assert_eq!(s["tags"]["live_migratable"], "false", "{s}");
    }
    assert!(
        nova["alias"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a.get("live_migratable").is_none())
    );
    drop(d);
}

/// One mdev type needs no class of its own: Nova reads its default `VGPU`.
#[test]
fn one_type_keeps_novas_default_class() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("t4-desks.toml");
    std::fs::write(
        &pool,
        "name = \"t4-desks\"\n[profiles]\nvdi-2g = 3\n[select]\ngpus = [\"0000:83:00.0\"]\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(["--sim", "demo", "export", "nova", "--pool-file"])
        .arg(&pool)
        .env_remove("VGPU_BUS")
        .output()
        .unwrap();
    let conf = ok(&o);
    assert!(!conf.contains("mdev_class"), "{conf}");
    assert!(!conf.contains("\n[pci]\n"), "{conf}");
    let Some(nova) = nova_reads("one_type_keeps_novas_default_class", dir.path(), &conf) else {
        return;
    };
    assert_eq!(strings(&nova["enabled_mdev_types"]), ["nvidia-231"]);
    let g = &nova["mdev"]["nvidia-231"];
    assert_eq!(g["mdev_class"], "VGPU");
    assert_eq!(g["max_instances"], 3);
    assert_eq!(strings(&g["device_addresses"]), ["0000:83:00.0"]);
}

/// An A10 whose VFs are its mdev parents (NVIDIA classic vGPU on Ampere, the `ampere` host): each slot
/// is on a VF of its own, so Nova is given those VFs, and `max_instances` caps it at the slots although
/// every free VF shows one available.
#[test]
fn slots_on_vfs_give_nova_their_vfs() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("a10-desks.toml");
    std::fs::write(
        &pool,
        "name = \"a10-desks\"\n[profiles]\nvdi-2g = 3\n[select]\nmodels = [\"NVIDIA A10\"]\n",
    )
    .unwrap();
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args(["--sim", "ampere", "export", "nova", "--pool-file"])
        .arg(&pool)
        .env_remove("VGPU_BUS")
        .output()
        .unwrap();
    let conf = ok(&o);
    let Some(nova) = nova_reads("slots_on_vfs_give_nova_their_vfs", dir.path(), &conf) else {
        return;
    };
    let types = strings(&nova["enabled_mdev_types"]);
    assert_eq!(types.len(), 1, "{conf}");
    let g = &nova["mdev"][&types[0]];
    assert_eq!(g["max_instances"], 3, "{conf}");
    assert_eq!(
        strings(&g["device_addresses"]),
        ["0000:41:00.4", "0000:41:00.5", "0000:41:00.6"],
        "{conf}"
    );
}
