//! The target side of a live migration through vgpud on `--sim demo`: `PrepareIncoming` from a source
//! instance's fingerprint makes a new instance of its type, held as incoming; `CompleteIncoming`
//! keeps it, `AbortIncoming` releases it, and one nobody completes is released after its timeout —
//! also when vgpud restarted in between (the record outlives the process). A fingerprint this host
//! cannot take is refused with every reason and changes nothing; an unprivileged caller is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;
mod dbus_common;

use std::path::Path;
use std::time::{Duration, Instant};

use core_common::source_fingerprint;
use dbus_common::{Daemon, PATIENCE};
use vgpu_client::{BusAddress, Client, PrepareOptions};
use vgpu_host::ops::create_mdev;
use vgpu_manager::migration::{Fingerprint, fingerprint};
use vgpu_sim::SimHost;

/// A source instance's fingerprint, made on an in-process demo host (the same machine model vgpud
/// simulates): an NVIDIA type with room.
async fn started(dir: &Path) -> (Daemon, Client) {
    let daemon =
        Daemon::embedded_journaled(dir, "demo", &dir.join("sim.journal"), &dir.join("state")).await;
    let c = Client::connect(&daemon.bus.parse::<BusAddress>().unwrap())
        .await
        .unwrap();
    (daemon, c)
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap()
}

async fn gone_within(c: &Client, uuid: &str, what: &str) {
    let deadline = Instant::now() + PATIENCE + Duration::from_secs(5);
    while c.find_instance(uuid).await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "{what}: {uuid} still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn prepare_complete_abort_and_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let fp = source_fingerprint();
    let text = serde_json::to_string(&fp).unwrap();
    let (_daemon, c) = started(tmp.path()).await;

    // Prepared: a new UUID of the source's type, running, with the hostdev and Nova's map.
    let v = json(&c.prepare_incoming(&text, None, None, None).await.unwrap());
    let target = v["uuid"].as_str().unwrap().to_string();
    assert_ne!(target, fp.uuid.to_string());
    assert_eq!(v["source"], fp.uuid.to_string());
    assert_eq!(v["type"], fp.type_id.to_string());
    assert_eq!(v["target_mdevs"][fp.uuid.to_string()], target.as_str());
    let xml = v["hostdev_xml"].as_str().unwrap();
    assert!(
        xml.contains("type='mdev'") && xml.contains(&format!("uuid='{target}'")),
        "{xml}"
    );
    let i = c.get_instance(&target).await.unwrap();
    assert_eq!(
        (i.state.as_str(), i.type_id.as_str()),
        ("running", fp.type_id.as_str())
    );
    assert!(i.label.contains("incoming migration of"), "{i:?}");
    // Completed: an ordinary instance, and no longer incoming.
    c.complete_incoming(&target).await.unwrap();
    let e = c.complete_incoming(&target).await.unwrap_err().to_string();
    assert!(e.contains("is not an incoming migration target"), "{e}");
    assert!(c.find_instance(&target).await.unwrap().is_some());

    // Aborted: released.
    let v = json(&c.prepare_incoming(&text, None, None, None).await.unwrap());
    let aborted = v["uuid"].as_str().unwrap().to_string();
    c.abort_incoming(&aborted).await.unwrap();
    assert!(c.find_instance(&aborted).await.unwrap().is_none());

    // Nobody completes it: released after its timeout.
    let t0 = Instant::now();
    let v = json(
        &c.prepare_incoming(&text, None, None, Some(Duration::from_secs(1)))
            .await
            .unwrap(),
    );
    let lapsed = v["uuid"].as_str().unwrap().to_string();
    assert!(c.find_instance(&lapsed).await.unwrap().is_some());
    gone_within(&c, &lapsed, "after its timeout").await;
    assert!(
        t0.elapsed() >= Duration::from_secs(1),
        "not before its timeout"
    );
    // The completed one stays.
    assert!(c.find_instance(&target).await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lapsed_target_is_released_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let text = serde_json::to_string(&source_fingerprint()).unwrap();
    let lapsed = {
        let (daemon, c) = started(tmp.path()).await;
        let v = json(
            &c.prepare_incoming(&text, None, None, Some(Duration::from_secs(2)))
                .await
                .unwrap(),
        );
        let u = v["uuid"].as_str().unwrap().to_string();
        assert!(daemon.terminate().success());
        u
    };
    let record = tmp
        .path()
        .join("state/incoming")
        .join(format!("{lapsed}.toml"));
    assert!(record.is_file(), "the record outlives vgpud");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_daemon, c) = started(tmp.path()).await;
    gone_within(&c, &lapsed, "past its deadline after a restart").await;
    let deadline = Instant::now() + PATIENCE;
    while record.exists() {
        assert!(Instant::now() < deadline, "the record is removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fingerprint_this_host_cannot_take_is_refused_with_every_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let mut fp = source_fingerprint();
    let (_daemon, c) = started(tmp.path()).await;
    let before = c.list_instances().await.unwrap().len();
    fp.type_id = "nvidia-999".parse().unwrap();
    let e = c
        .prepare_incoming(&serde_json::to_string(&fp).unwrap(), None, None, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("this host cannot take the migrating nvidia-999 instance")
            && e.contains("no mdev parent here offers type nvidia-999"),
        "{e}"
    );
    let e = c
        .prepare_incoming("{ not json", None, None, None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("not the JSON of `vgpuctl migration fingerprint`"),
        "{e}"
    );
    let fp = source_fingerprint();
    let e = c
        .prepare_incoming(
            &serde_json::to_string(&fp).unwrap(),
            Some("0000:ff:00.0"),
            None,
            None,
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("GPU 0000:ff:00.0 does not offer"), "{e}");
    assert_eq!(
        c.list_instances().await.unwrap().len(),
        before,
        "nothing made"
    );
    assert!(
        std::fs::read_dir(tmp.path().join("state/incoming"))
            .unwrap()
            .next()
            .is_none(),
        "no record left"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_migration_prepare_prints_the_hostdev() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("fp.json");
    std::fs::write(&file, serde_json::to_string(&source_fingerprint()).unwrap()).unwrap();
    let (daemon, c) = started(tmp.path()).await;
    let o = dbus_common::vgpuctl(
        &daemon.bus,
        &[
            "migration",
            "prepare",
            "--target",
            file.to_str().unwrap(),
            "--timeout",
            "30",
        ],
    )
    .await;
    let out = dbus_common::ok(&o);
    assert!(
        out.starts_with("incoming ") && out.contains("<hostdev"),
        "{out}"
    );
    let uuid = out.split_whitespace().nth(1).unwrap().to_string();
    assert!(c.find_instance(&uuid).await.unwrap().is_some());
    dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["migration", "abort", &uuid]).await);
    assert!(c.find_instance(&uuid).await.unwrap().is_none());
}

/// The demo host's two T4s: `0000:01:00.0` on NUMA node 0 (empty) and `0000:83:00.0` on node 1 (one
/// `nvidia-231` there already, and T4 vGPUs are homogeneous: it offers only that type, with less
/// room); mdev-types/sims/demo.toml.
const T4_NODE0: &str = "0000:01:00.0";
const T4_NODE1: &str = "0000:83:00.0";
/// The type both T4s offer.
const BOTH_T4S: &str = "nvidia-231";

/// A source instance's fingerprint for an `nvidia-231` on the node-0 T4 of an in-process demo host.
fn fingerprint_for_both_t4s() -> Fingerprint {
    let sim = SimHost::builtin("demo").unwrap();
    let src = "3c2b1a09-8f7e-4d6c-9b5a-4f3e2d1c0b9a".parse().unwrap();
    create_mdev(&sim, T4_NODE0, &BOTH_T4S.parse().unwrap(), &src).unwrap();
    fingerprint(&sim, &src).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_numa_node_asked_for_picks_the_gpu_on_it() {
    let tmp = tempfile::tempdir().unwrap();
    let fp = fingerprint_for_both_t4s();
    assert_eq!(fp.parent, T4_NODE0);
    assert_eq!(
        fp.numa_node,
        Some(0),
        "the fingerprint carries the source's node"
    );
    let text = serde_json::to_string(&fp).unwrap();
    assert!(text.contains("\"numa_node\":0"), "{text}");
    let (_daemon, c) = started(tmp.path()).await;
    let prepare = |numa_node: Option<u32>| {
        let (c, text) = (&c, &text);
        async move {
            let o = PrepareOptions {
                numa_node,
                ..PrepareOptions::default()
            };
            json(&c.prepare_incoming_with(text, &o).await.unwrap())
        }
    };

    // No preference: the GPU with the most room, then by name (as before NUMA was known).
    let v = prepare(None).await;
    assert_eq!(
        (v["parent"].as_str(), v["numa_node"].as_u64()),
        (Some(T4_NODE0), Some(0))
    );
    c.abort_incoming(v["uuid"].as_str().unwrap()).await.unwrap();

    // Node 1 asked for: the T4 there, although the other has more room.
    let v = prepare(Some(1)).await;
    assert_eq!(
        (v["parent"].as_str(), v["numa_node"].as_u64()),
        (Some(T4_NODE1), Some(1))
    );
    assert!(!v["notes"].to_string().contains("NUMA"), "{v}");
    c.abort_incoming(v["uuid"].as_str().unwrap()).await.unwrap();

    // A node without a GPU that fits: the usual choice, with a note saying so.
    let v = prepare(Some(7)).await;
    assert_eq!(v["parent"].as_str(), Some(T4_NODE0));
    let notes = v["notes"].to_string();
    assert!(
        notes.contains("no GPU on NUMA node 7") && notes.contains(T4_NODE0),
        "{notes}"
    );
    c.abort_incoming(v["uuid"].as_str().unwrap()).await.unwrap();

    // `gpu` still narrows the choice first: node 1 asked for on the node-0 GPU gives that GPU.
    let o = PrepareOptions {
        gpu: Some(T4_NODE0),
        numa_node: Some(1),
        ..PrepareOptions::default()
    };
    let v = json(&c.prepare_incoming_with(&text, &o).await.unwrap());
    assert_eq!(v["parent"].as_str(), Some(T4_NODE0));
    assert!(
        v["notes"].to_string().contains("no GPU on NUMA node 1"),
        "{v}"
    );
    c.abort_incoming(v["uuid"].as_str().unwrap()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fingerprint_without_numa_node_is_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let mut v = serde_json::to_value(source_fingerprint()).unwrap();
    // A fingerprint of a version before the field existed.
    v.as_object_mut().unwrap().remove("numa_node").unwrap();
    let fp: Fingerprint = serde_json::from_value(v.clone()).unwrap();
    assert_eq!(fp.numa_node, None);
    let (_daemon, c) = started(tmp.path()).await;
    let r = json(
        &c.prepare_incoming(&v.to_string(), None, None, None)
            .await
            .unwrap(),
    );
    assert_eq!(r["parent"].as_str(), Some(T4_NODE0));
    // And without a node the fingerprint writes no key (older readers see what they knew).
    let mut fp = source_fingerprint();
    fp.numa_node = None;
    assert!(!serde_json::to_string(&fp).unwrap().contains("numa_node"));
}

/// A source domain XML using mdev `uuid` (as `virsh dumpxml --migratable` prints one).
fn source_domain(uuid: &str) -> String {
    format!(
        "<domain type='kvm'>\n  <name>desk-01</name>\n  <devices>\n    <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>\n      <source>\n        <address uuid='{uuid}'/>\n      </source>\n      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>\n    </hostdev>\n  </devices>\n</domain>\n"
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn vgpuctl_migration_prepare_writes_the_target_domain_xml() {
    let tmp = tempfile::tempdir().unwrap();
    let fp = fingerprint_for_both_t4s();
    let file = tmp.path().join("fp.json");
    std::fs::write(&file, serde_json::to_string(&fp).unwrap()).unwrap();
    let src = fp.uuid.to_string();
    let dom = tmp.path().join("src.xml");
    std::fs::write(&dom, source_domain(&src)).unwrap();
    let (daemon, c) = started(tmp.path()).await;
    let (fp_s, dom_s) = (file.to_str().unwrap(), dom.to_str().unwrap());

    // Text: the target domain XML alone on stdout (for `> target.xml`), the summary on stderr.
    let args = [
        "migration",
        "prepare",
        "--target",
        fp_s,
        "--domain-xml",
        dom_s,
        "--numa-node",
        "1",
    ];
    let o = dbus_common::vgpuctl(&daemon.bus, &args).await;
    let out = dbus_common::ok(&o);
    let err = dbus_common::stderr(&o);
    assert!(
        err.starts_with("incoming ") && err.contains("NUMA node 1"),
        "{err}"
    );
    let target = err.split_whitespace().nth(1).unwrap().to_string();
    assert_eq!(out, source_domain(&target), "only the UUID changes");
    let i = c.get_instance(&target).await.unwrap();
    assert_eq!(i.parent, T4_NODE1);
    dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["migration", "abort", &target]).await);

    // JSON: the same as a field.
    let mut args = args.to_vec();
    args.push("--json");
    let v = dbus_common::ok_json(&dbus_common::vgpuctl(&daemon.bus, &args).await);
    let target = v["uuid"].as_str().unwrap();
    assert_eq!(
        v["domain_xml"].as_str(),
        Some(source_domain(target).as_str())
    );
    assert_eq!(v["numa_node"], 1);
    dbus_common::ok(&dbus_common::vgpuctl(&daemon.bus, &["migration", "abort", target]).await);

    // A domain XML without the source's mdev is refused before anything is made.
    let before = c.list_instances().await.unwrap().len();
    std::fs::write(&dom, source_domain("7e6d5c4b-3a29-4187-9654-3210fedcba98")).unwrap();
    let o = dbus_common::vgpuctl(
        &daemon.bus,
        &[
            "migration",
            "prepare",
            "--target",
            fp_s,
            "--domain-xml",
            dom_s,
        ],
    )
    .await;
    assert!(!o.status.success());
    let err = dbus_common::stderr(&o);
    assert!(
        err.contains(&format!("no <hostdev type='mdev'> with UUID {src}")),
        "{err}"
    );
    assert_eq!(
        c.list_instances().await.unwrap().len(),
        before,
        "nothing made"
    );
}
