//! The driver's crash and ownership rules as properties, over random sequences of prepares,
//! unprepares, vgpud failures mid-prepare, vGPUs vanishing and plugin restarts, against an in-memory
//! vgpud (with a foreign instance and a per-GPU capacity) and an in-memory API server:
//!
//! - an instance the plugin did not make is never destroyed;
//! - every vGPU the plugin made is listed in its checkpoint on disk (nothing leaks, even when a
//!   prepare fails half-way or the plugin restarts);
//! - a prepared claim answers the same on every retry and its vGPUs exist;
//! - an unprepared claim leaves no vGPU and no record; a restart leaves no half-done claim;
//! - at the end, unpreparing everything leaves only the foreign instance.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use vgpu_client::{ClientError, FaultInfo, InstanceInfo, NewInstance};
use vgpu_dra::checkpoint::{Checkpoint, Phase};
use vgpu_dra::claim::{ClaimError, ClaimSource, ResourceClaim};
use vgpu_dra::driver::{ClaimRef, Driver, DriverConfig};
use vgpu_dra::vgpud::Vgpud;

const DRIVER: &str = "vgpu.vgpu-manager.io";
const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";
/// Instances one GPU holds.
const CAPACITY: usize = 2;

#[derive(Default)]
struct State {
    instances: BTreeMap<String, InstanceInfo>,
    /// Creates that succeed before one fails; `None`: none fails.
    fail_after: Option<u32>,
    destroyed: Vec<String>,
    next_group: i32,
}

#[derive(Default)]
struct FakeVgpud(Mutex<State>);

fn refused(kind: &str, message: &str) -> ClientError {
    ClientError::Daemon {
        kind: kind.into(),
        message: message.into(),
    }
}

impl FakeVgpud {
    fn with_foreign() -> Self {
        let v = FakeVgpud::default();
        v.0.lock().unwrap().instances.insert(
            FOREIGN.into(),
            instance(FOREIGN, "0000:01:00.0", "", "", 50),
        );
        v
    }
}

fn instance(uuid: &str, gpu: &str, profile: &str, label: &str, group: i32) -> InstanceInfo {
    InstanceInfo {
        uuid: uuid.into(),
        gpu: gpu.into(),
        parent: gpu.into(),
        type_id: "nvidia-223".into(),
        profile: profile.into(),
        state: "running".into(),
        defined: false,
        autostart: false,
        owner: if profile.is_empty() {
            "foreign"
        } else {
            "daemon"
        }
        .into(),
        label: label.into(),
        iommu_group: group,
        created_at: 0,
    }
}

#[async_trait::async_trait]
impl Vgpud for FakeVgpud {
    async fn find(&self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        Ok(self.0.lock().unwrap().instances.get(uuid).cloned())
    }

    async fn create(&self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        let mut s = self.0.lock().unwrap();
        match s.fail_after {
            Some(0) => {
                s.fail_after = None;
                return Err(refused("Failed", "the simulated create failed"));
            }
            Some(n) => s.fail_after = Some(n - 1),
            None => {}
        }
        let gpu = req.gpu.clone().expect("the plugin names the GPU");
        let uuid = req.uuid.clone().expect("the plugin names the UUID");
        if s.instances.contains_key(&uuid) {
            return Err(refused("Exists", "UUID in use"));
        }
        if s.instances.values().filter(|i| i.gpu == gpu).count() >= CAPACITY {
            return Err(refused("TypeFull", "no room"));
        }
        s.next_group += 1;
        let i = instance(
            &uuid,
            &gpu,
            &req.target,
            req.label.as_deref().unwrap_or(""),
            s.next_group,
        );
        s.instances.insert(uuid, i.clone());
        Ok(i)
    }

    async fn destroy(&self, uuid: &str) -> Result<bool, ClientError> {
        let mut s = self.0.lock().unwrap();
        s.destroyed.push(uuid.to_string());
        Ok(s.instances.remove(uuid).is_some())
    }

    async fn list_instances(&self) -> Result<Vec<InstanceInfo>, ClientError> {
        Ok(self.0.lock().unwrap().instances.values().cloned().collect())
    }

    async fn list_faults(&self) -> Result<Vec<FaultInfo>, ClientError> {
        Ok(Vec::new())
    }

    async fn list_offers(&self) -> Result<Vec<vgpu_client::GpuOffers>, ClientError> {
        Ok(Vec::new())
    }
}

struct FakeApi(BTreeMap<String, ResourceClaim>);

#[async_trait::async_trait]
impl ClaimSource for FakeApi {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        self.0.get(name).cloned().ok_or_else(|| ClaimError::Status {
            status: 404,
            namespace: namespace.into(),
            name: name.into(),
            body: String::new(),
        })
    }
}

/// The claims: (name, UID, devices). Claims 0 and 2 share GPU A (`0000:01:00.0`) with the second
/// device of claim 1, so claim 1 can fail half-way for want of room.
const CLAIMS: &[(&str, &str, &[&str])] = &[
    ("c0", "u0", &["gpu-0000-01-00-0-vdi-2g-0"]),
    (
        "c1",
        "u1",
        &["gpu-0000-3b-00-0-vdi-2g-0", "gpu-0000-01-00-0-vdi-2g-1"],
    ),
    ("c2", "u2", &["gpu-0000-01-00-0-vdi-2g-2"]),
];

fn api() -> FakeApi {
    let mut m = BTreeMap::new();
    for (name, uid, devices) in CLAIMS {
        let results: Vec<_> = devices
            .iter()
            .map(|d| serde_json::json!({"request": "vgpu", "driver": DRIVER, "pool": "node-1", "device": d}))
            .collect();
        let c = serde_json::json!({
            "metadata": {"name": name, "namespace": "vms", "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}}
        });
        m.insert(name.to_string(), serde_json::from_value(c).unwrap());
    }
    FakeApi(m)
}

fn claim_ref(i: usize) -> ClaimRef {
    ClaimRef {
        namespace: "vms".into(),
        name: CLAIMS[i].0.into(),
        uid: CLAIMS[i].1.into(),
    }
}

#[derive(Debug, Clone)]
enum Op {
    Prepare(usize),
    Unprepare(usize),
    /// The create after this many successful ones fails.
    FailCreate(u32),
    VanishOne(usize),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CLAIMS.len()).prop_map(Op::Prepare),
        3 => (0..CLAIMS.len()).prop_map(Op::Unprepare),
        1 => (0..2u32).prop_map(Op::FailCreate),
        1 => (0..4usize).prop_map(Op::VanishOne),
        2 => Just(Op::Restart),
    ]
}

fn driver(dir: &Path, vgpud: &Arc<FakeVgpud>, api: &Arc<FakeApi>) -> Driver {
    let cfg = DriverConfig {
        driver_name: DRIVER.into(),
        pool: "node-1".into(),
        cdi_dir: dir.join("cdi"),
        metadata_dir: dir.join("metadata"),
        failpoint: None,
    };
    let ck = Checkpoint::load(&dir.join("checkpoint.json"), DRIVER).unwrap();
    Driver::new(cfg, vgpud.clone(), api.clone(), ck)
}

/// The UUIDs the checkpoint on disk lists, and whether any claim is half-done.
fn on_disk(dir: &Path) -> (BTreeSet<String>, bool) {
    let ck = Checkpoint::load(&dir.join("checkpoint.json"), DRIVER).unwrap();
    let uuids = ck
        .claims()
        .flat_map(|(_, r)| r.devices.iter().map(|d| d.uuid.clone()))
        .collect();
    let started = ck.claims().any(|(_, r)| r.phase == Phase::Started);
    (uuids, started)
}

fn check_ownership(dir: &Path, vgpud: &FakeVgpud) -> Result<(), TestCaseError> {
    let s = vgpud.0.lock().unwrap();
    prop_assert!(
        s.instances.contains_key(FOREIGN),
        "the foreign instance is gone"
    );
    prop_assert!(
        !s.destroyed.iter().any(|u| u == FOREIGN),
        "the foreign instance was destroyed"
    );
    let (recorded, _) = on_disk(dir);
    for u in s.instances.keys().filter(|u| *u != FOREIGN) {
        prop_assert!(recorded.contains(u), "vGPU {u} is not in the checkpoint");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_plugin_owns_exactly_what_its_checkpoint_lists(ops in proptest::collection::vec(op(), 1..24)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let vgpud = Arc::new(FakeVgpud::with_foreign());
        let api = Arc::new(api());
        let mut d = driver(dir, &vgpud, &api);
        rt.block_on(d.recover()).unwrap();
        for op in ops {
            match op {
                Op::Prepare(i) => {
                    if let Ok(first) = rt.block_on(d.prepare(&claim_ref(i))) {
                        prop_assert_eq!(first.len(), CLAIMS[i].2.len());
                        let again = rt.block_on(d.prepare(&claim_ref(i))).unwrap();
                        prop_assert_eq!(&again, &first);
                        let s = vgpud.0.lock().unwrap();
                        for dev in CLAIMS[i].2 {
                            let uuid = d.vgpu_uuid(CLAIMS[i].1, dev);
                            prop_assert!(s.instances.contains_key(&uuid), "{} has no vGPU", dev);
                        }
                    }
                }
                Op::Unprepare(i) => {
                    rt.block_on(d.unprepare(&claim_ref(i))).unwrap();
                    let s = vgpud.0.lock().unwrap();
                    for dev in CLAIMS[i].2 {
                        let uuid = d.vgpu_uuid(CLAIMS[i].1, dev);
                        prop_assert!(!s.instances.contains_key(&uuid));
                    }
                    let ck = Checkpoint::load(&dir.join("checkpoint.json"), DRIVER).unwrap();
                    prop_assert!(ck.get(CLAIMS[i].1).is_none());
                    let spec = dir.join(format!("cdi/vgpu-manager.io-{}.json", CLAIMS[i].1));
                    prop_assert!(!spec.exists(), "{} is left", spec.display());
                }
                Op::FailCreate(n) => vgpud.0.lock().unwrap().fail_after = Some(n),
                Op::VanishOne(k) => {
                    let mut s = vgpud.0.lock().unwrap();
                    let victim = s.instances.keys().filter(|u| *u != FOREIGN).nth(k).cloned();
                    if let Some(u) = victim {
                        s.instances.remove(&u);
                    }
                }
                Op::Restart => {
                    drop(d);
                    d = driver(dir, &vgpud, &api);
                    rt.block_on(d.recover()).unwrap();
                    prop_assert!(!on_disk(dir).1, "a half-done claim survived the restart");
                }
            }
            check_ownership(dir, &vgpud)?;
        }
        vgpud.0.lock().unwrap().fail_after = None;
        for i in 0..CLAIMS.len() {
            rt.block_on(d.unprepare(&claim_ref(i))).unwrap();
        }
        let left: Vec<String> = vgpud.0.lock().unwrap().instances.keys().cloned().collect();
        prop_assert_eq!(left, vec![FOREIGN.to_string()]);
        prop_assert!(on_disk(dir).0.is_empty());
    }
}
