//! `vgpuctl export kubevirt` on the demo host with the shipped VDI floor applied through the real vgpud:
//! the CR fragment conforms to KubeVirt's own CRD schema (`tests/data/kubevirt/`, fact files from
//! kubevirt/kubevirt's generated CRD, their source in each file), names one resource per mdev type name
//! and per VF PCI id with the slots vgpud reports, gives virt-launcher's variables, turns KubeVirt's mdev
//! handling off in the way of each KubeVirt release, and reads the same as YAML and as JSON. The YAML is
//! a golden file: `VGPU_BLESS=1 cargo test -p vgpu-manager --test cli_export_kubevirt` regenerates it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "export_common/crd_schema.rs"]
mod crd_schema;
mod dbus_common;
mod export_common;

use std::collections::{BTreeMap, BTreeSet};

use dbus_common::{assert_refused, ok, ok_json, vgpuctl};
use export_common::{floor_daemon, golden, pool_file, repo, test_python};
use serde_json::Value;
use vgpu_client::PoolStatus;

/// The stored schema of KubeVirt release `tag` (`v1.9.0`, `v1.7.4`).
fn schema(tag: &str) -> Value {
    let p = repo().join(format!(
        "vgpu-manager/tests/data/kubevirt/kubevirt-{tag}.json"
    ));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    assert!(
        v["source"]["commit"]
            .as_str()
            .is_some_and(|c| c.len() == 40),
        "{}",
        p.display()
    );
    v["schema"].clone()
}

fn conforms(tag: &str, patch: &Value) {
    let problems = crd_schema::check(&schema(tag), patch);
    assert!(
        problems.is_empty(),
        "not a valid KubeVirt {tag} CR: {problems:#?}\n{patch:#}"
    );
}

/// What vgpud's status says the resources must be: mdev type name → slots, VF PCI id → slots.
fn expected(status: &[PoolStatus]) -> (BTreeMap<String, u32>, BTreeMap<String, u32>) {
    let (mut mdev, mut pci) = (BTreeMap::new(), BTreeMap::new());
    for s in status
        .iter()
        .flat_map(|p| &p.slots)
        .filter(|s| s.gpu.is_some())
    {
        match &s.pci_id {
            Some(id) => *pci.entry(id.to_uppercase()).or_insert(0) += 1,
            None => *mdev.entry(s.type_name.clone().unwrap()).or_insert(0) += 1,
        }
    }
    (mdev, pci)
}

fn resources_of(report: &Value, kind: &str) -> BTreeMap<String, u32> {
    report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["kind"] == kind)
        .map(|r| {
            (
                r["selector"].as_str().unwrap().to_string(),
                r["slots"].as_u64().unwrap() as u32,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fragment_is_a_valid_kubevirt_cr_for_the_applied_slots() {
    let dir = tempfile::tempdir().unwrap();
    let d = floor_daemon(dir.path()).await;
    let status: Vec<PoolStatus> = serde_json::from_value(ok_json(
        &vgpuctl(&d.bus, &["pool", "status", "--json"]).await,
    ))
    .unwrap();

    let report = ok_json(&vgpuctl(&d.bus, &["export", "kubevirt", "vdi-floor", "--json"]).await);
    let patch = &report["patch"];
    conforms("v1.9.0", patch);
    let conf = &patch["spec"]["configuration"];
    assert_eq!(conf["mediatedDevicesConfiguration"]["enabled"], false);
    assert!(conf.get("developerConfiguration").is_none(), "{conf:#}");

    // One resource per mdev type name and per VF PCI id, with every slot that has an instance.
    let (mdev, pci) = expected(&status);
    assert_eq!(resources_of(&report, "mdev"), mdev);
    assert_eq!(resources_of(&report, "pci"), pci);
    assert_eq!(mdev.values().chain(pci.values()).sum::<u32>(), 44);
    let permitted = &conf["permittedHostDevices"];
    let selectors: BTreeSet<&str> = permitted["mediatedDevices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mdevNameSelector"].as_str().unwrap())
        .collect();
    assert_eq!(selectors, mdev.keys().map(String::as_str).collect());
    let vendors: BTreeSet<&str> = permitted["pciHostDevices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["pciVendorSelector"].as_str().unwrap())
        .collect();
    assert_eq!(vendors, BTreeSet::from(["10DE:26B9", "8086:56C0"]));

    // virt-launcher's variables (pkg/util/util.go ResourceNameToEnvVar), spelled out.
    let env: BTreeMap<&str, &str> = report["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["resource_name"].as_str().unwrap(),
                r["env"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        env["nvidia.com/GRID_T4-4Q"],
        "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-4Q"
    );
    assert_eq!(
        env["nvidia.com/NVIDIA_L40S-2B"],
        "PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-2B"
    );
    assert_eq!(
        env["intel.com/Intel_Data_Center_GPU_Flex_170_VF"],
        "PCI_RESOURCE_INTEL_COM_INTEL_DATA_CENTER_GPU_FLEX_170_VF"
    );

    // The YAML is the same document, with comments (a golden file), and parses as YAML to the JSON.
    let yaml = ok(&vgpuctl(&d.bus, &["export", "kubevirt", "--yaml"]).await);
    golden("export-kubevirt.yaml", &yaml);
    assert!(
        yaml.contains("# virt-launcher reads PCI_RESOURCE_NVIDIA_COM_NVIDIA_L40S-2B"),
        "{yaml}"
    );
    if let Some(python) = test_python("the_fragment_is_a_valid_kubevirt_cr_for_the_applied_slots") {
        let f = dir.path().join("kubevirt.yaml");
        std::fs::write(&f, &yaml).unwrap();
        let o = std::process::Command::new(python)
            .args([
                "-c",
                "import json, sys, yaml; print(json.dumps(yaml.safe_load(open(sys.argv[1]))))",
            ])
            .arg(&f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let parsed: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(&parsed, patch);
    }

    // The default output is a table of the same resources.
    let table = ok(&vgpuctl(&d.bus, &["export", "kubevirt"]).await);
    assert!(table.starts_with("RESOURCE"), "{table}");
    assert!(
        table.contains("MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-2Q"),
        "{table}"
    );
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubevirt_before_1_8_gets_the_feature_gate_and_the_schema_tells_them_apart() {
    let dir = tempfile::tempdir().unwrap();
    let d = floor_daemon(dir.path()).await;
    let old = ok_json(
        &vgpuctl(
            &d.bus,
            &[
                "export",
                "kubevirt",
                "--kubevirt-version",
                "v1.7.4",
                "--json",
            ],
        )
        .await,
    );
    let patch = &old["patch"];
    conforms("v1.7.4", patch);
    conforms("v1.9.0", patch);
    let conf = &patch["spec"]["configuration"];
    assert_eq!(
        conf["developerConfiguration"]["featureGates"],
        serde_json::json!(["DisableMDEVConfiguration"])
    );
    assert!(conf.get("mediatedDevicesConfiguration").is_none());

    // KubeVirt 1.7's CRD has no `enabled`: the default fragment would be refused there.
    let new = ok_json(&vgpuctl(&d.bus, &["export", "kubevirt", "--json"]).await);
    let problems = crd_schema::check(&schema("v1.7.4"), &new["patch"]);
    assert_eq!(
        problems,
        [".spec.configuration.mediatedDevicesConfiguration.enabled: unknown field"]
    );

    // A domain of one's own, checked as a DNS subdomain.
    let own = ok_json(
        &vgpuctl(
            &d.bus,
            &[
                "export",
                "kubevirt",
                "--resource-domain",
                "gpu.example.com",
                "--json",
            ],
        )
        .await,
    );
    assert!(own["resources"].as_array().unwrap().iter().all(|r| {
        r["resource_name"]
            .as_str()
            .unwrap()
            .starts_with("gpu.example.com/")
    }));
    assert_refused(
        &vgpuctl(
            &d.bus,
            &["export", "kubevirt", "--resource-domain", "Not_A.Domain"],
        )
        .await,
        &["--resource-domain Not_A.Domain", "DNS subdomain"],
    );
    assert_refused(
        &vgpuctl(&d.bus, &["export", "kubevirt", "cad-node1"]).await,
        &["pool 'cad-node1' is not applied (applied pools: vdi-floor)"],
    );
    drop(d);
}

/// Planned from the pool file on the simulated host, without vgpud, the floor gives the same resources
/// as once applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planned_pool_file_gives_the_resources_of_the_applied_pool() {
    let dir = tempfile::tempdir().unwrap();
    let d = floor_daemon(dir.path()).await;
    let applied = ok_json(&vgpuctl(&d.bus, &["export", "kubevirt", "--json"]).await);
    drop(d);
    let floor = pool_file("vdi-floor.toml");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
        .args([
            "--sim",
            "demo",
            "export",
            "kubevirt",
            "--pool-file",
            &floor,
            "--json",
        ])
        .env_remove("VGPU_BUS")
        .output()
        .unwrap();
    let planned = ok_json(&o);
    conforms("v1.9.0", &planned["patch"]);
    assert_eq!(planned["patch"], applied["patch"]);
    assert_eq!(planned["resources"], applied["resources"]);
}

#[test]
fn the_checker_finds_each_kind_of_problem() {
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
            "b": {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}},
            "m": {"type": "object"},
        }
    });
    let good = serde_json::json!({"a": ["x", "y"], "b": {"n": 1}, "m": {"anything": true}});
    assert!(crd_schema::check(&schema, &good).is_empty());
    let bad = serde_json::json!({"a": ["x", "x", 3], "b": {"z": 1}, "c": 1});
    let p = crd_schema::check(&schema, &bad);
    for needle in [
        ".a[2]: expected string",
        ".a[1]: duplicate",
        ".b.z: unknown field",
        ".b: required field n",
        ".c: unknown field",
    ] {
        assert!(
            p.iter().any(|x| x.starts_with(needle)),
            "{needle} not in {p:?}"
        );
    }
}
