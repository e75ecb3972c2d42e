//! The driver's crash and ownership rules as properties, over random sequences of prepares,
//! unprepares, vgpud failures mid-prepare, vGPUs vanishing and plugin restarts, against an in-memory
//! vgpud (with a foreign instance and a per-GPU capacity) and an in-memory API server:
//!
//! - an instance the plugin did not make is never destroyed;
//! - every vGPU the plugin made is listed in its checkpoint on disk (nothing leaks, even when a
//!   prepare fails half-way or the plugin restarts);
//! - a prepared claim answers the same on every retry and its vGPUs exist;
//! - an unprepared claim leaves no vGPU and no record; a restart leaves no half-done claim, and makes
//!   again the vGPUs of prepared claims that vanished (or reports why it could not);
//! - at the end, unpreparing everything leaves only the foreign instance.
//!
//! One GPU (`0000:85:00.0`) is VF-backed: its devices are made as vgpud pools of one slot. The same
//! rules hold for those pools; pools the plugin did not make (an operator's, another driver's with a
//! look-alike name) are never removed, and a pool of this driver the checkpoint does not hold (an
//! orphan) is gone after a restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

use proptest::prelude::*;
use vgpu_client::{
    ClientError, FaultInfo, GpuOffers, InstanceInfo, NewInstance, PoolRemoval, PoolStatus,
    PoolSummary, ProfileOffer, SlotRow, VfOffers,
};
use vgpu_dra::checkpoint::{Checkpoint, Phase};
use vgpu_dra::claim::{ClaimError, ClaimSource, ResourceClaim};
use vgpu_dra::driver::{ClaimRef, Driver, DriverConfig};
use vgpu_dra::vgpud::{SlotPool, Vgpud};

const DRIVER: &str = "vgpu.vgpu-manager.io";
const FOREIGN: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";
/// The VF-backed GPU.
const VF_GPU: &str = "0000:85:00.0";
/// An operator's pool and another driver's pool with a name like ours: never removed.
const FOREIGN_POOLS: [&str; 2] = ["floor", "dra-00000000000000000000000000000000"];
/// Instances one GPU holds.
const CAPACITY: usize = 2;

#[derive(Default)]
struct State {
    instances: BTreeMap<String, InstanceInfo>,
    /// Applied pools: name → (description, profile, GPU, IOMMU group of its VF).
    pools: BTreeMap<String, (String, String, String, i32)>,
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
        let mut s = v.0.lock().unwrap();
        s.instances.insert(
            FOREIGN.into(),
            instance(FOREIGN, "0000:01:00.0", "", "", 50),
        );
        for (name, description) in FOREIGN_POOLS.iter().zip([
            "desktops",
            "vgpu-dra-plugin other.example.com: claim x/y device z",
        ]) {
            s.pools.insert(
                name.to_string(),
                (description.into(), "vdi-2g".into(), VF_GPU.into(), 70),
            );
        }
        drop(s);
        v
    }
}

impl State {
    /// Counts a create; `Err` if it is the injected failure.
    fn creating(&mut self) -> Result<(), ClientError> {
        match self.fail_after {
            Some(0) => {
                self.fail_after = None;
                Err(refused("Failed", "the simulated create failed"))
            }
            Some(n) => {
                self.fail_after = Some(n - 1);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn status(&self, name: &str) -> Option<PoolStatus> {
        let (description, profile, gpu, group) = self.pools.get(name)?;
        Some(PoolStatus {
            pool: name.into(),
            description: description.clone(),
            policy: "consolidate".into(),
            autostart: false,
            applied_at: 0,
            wanted: BTreeMap::from([(profile.clone(), 1)]),
            in_sync: true,
            slots: vec![SlotRow {
                profile: profile.clone(),
                index: 0,
                uuid: format!("slot-{name}"),
                gpu: Some(gpu.clone()),
                numa_node: None,
                type_id: None,
                parent: None,
                type_name: None,
                state: "running".into(),
                vf: Some(format!("0000:85:{:02x}.{}", group / 8, group % 8)),
                pci_id: None,
                iommu_group: u32::try_from(*group).ok(),
                fault: None,
            }],
            gpus: Vec::new(),
        })
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
        s.creating()?;
        let gpu = req.gpu.clone().expect("the plugin names the GPU");
        if gpu == VF_GPU {
            return Err(refused("NotSupported", "VF-backed: use a pool"));
        }
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

    async fn list_offers(&self) -> Result<Vec<GpuOffers>, ClientError> {
        Ok(vec![GpuOffers {
            gpu: VF_GPU.into(),
            pci: Some(VF_GPU.into()),
            vendor: "nvidia".into(),
            model: "NVIDIA L40S".into(),
            numa_node: None,
            health: "ok".into(),
            homogeneous: true,
            options: vec![ProfileOffer {
                profile: "vdi-2g".into(),
                backend: "nvidia-vendor-vfio".into(),
                type_id: "1146".into(),
                type_name: Some("NVIDIA L40S-2B".into()),
                framebuffer_mib: Some(2048),
                available: 2,
                in_use: 0,
                max_instances: 2,
            }],
            vfs: Some(VfOffers {
                enabled: 4,
                total: 4,
                free: 2,
            }),
        }])
    }

    async fn apply_pool(&self, pool: &SlotPool) -> Result<PoolSummary, ClientError> {
        let mut s = self.0.lock().unwrap();
        if !s.pools.contains_key(&pool.name) {
            s.creating()?;
            let on_gpu = s.pools.values().filter(|p| p.2 == pool.gpu).count();
            if on_gpu >= CAPACITY + FOREIGN_POOLS.len() {
                return Err(refused("Shortfall", "no free VF"));
            }
            s.next_group += 1;
            let group = 100 + s.next_group;
            s.pools.insert(
                pool.name.clone(),
                (
                    pool.description.clone(),
                    pool.profile.clone(),
                    pool.gpu.clone(),
                    group,
                ),
            );
        }
        let st = s.status(&pool.name).unwrap();
        Ok(PoolSummary {
            pool: pool.name.clone(),
            host: "fake".into(),
            changed: true,
            steps: 1,
            created: vec!["vdi-2g/0".into()],
            removed: Vec::new(),
            kept: 0,
            slots: st.slots,
            gpus: Vec::new(),
        })
    }

    async fn remove_pool(&self, name: &str) -> Result<PoolRemoval, ClientError> {
        let mut s = self.0.lock().unwrap();
        s.destroyed.push(name.to_string());
        let applied = s.pools.remove(name).is_some();
        Ok(PoolRemoval {
            pool: name.into(),
            applied,
            removed: if applied {
                vec!["vdi-2g/0".into()]
            } else {
                Vec::new()
            },
        })
    }

    async fn pool_status(&self) -> Result<Vec<PoolStatus>, ClientError> {
        let s = self.0.lock().unwrap();
        Ok(s.pools.keys().filter_map(|n| s.status(n)).collect())
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
    (
        "c3",
        "u3",
        &["gpu-0000-85-00-0-vdi-2g-0", "gpu-0000-01-00-0-vdi-2g-3"],
    ),
    ("c4", "u4", &["gpu-0000-85-00-0-vdi-2g-1"]),
    ("c5", "u5", &["gpu-0000-85-00-0-vdi-2g-2"]),
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
    /// A pool of this driver appears that no claim holds (an unprepare the plugin did not see
    /// through).
    PlantOrphan(u8),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..CLAIMS.len()).prop_map(Op::Prepare),
        3 => (0..CLAIMS.len()).prop_map(Op::Unprepare),
        1 => (0..2u32).prop_map(Op::FailCreate),
        1 => (0..6usize).prop_map(Op::VanishOne),
        1 => any::<u8>().prop_map(Op::PlantOrphan),
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

/// The vGPU of `device` of claim `uid` exists: an instance, or for the VF-backed GPU its pool.
fn made(d: &Driver, s: &State, uid: &str, device: &str) -> bool {
    let uuid = d.vgpu_uuid(uid, device);
    if device.starts_with("gpu-0000-85-") {
        s.pools.contains_key(&vgpu_dra::vf_slot::pool_name(&uuid))
    } else {
        s.instances.contains_key(&uuid)
    }
}

/// The pools the checkpoint on disk lists.
fn pools_on_disk(dir: &Path) -> BTreeSet<String> {
    let ck = Checkpoint::load(&dir.join("checkpoint.json"), DRIVER).unwrap();
    ck.claims()
        .flat_map(|(_, r)| r.devices.iter().filter_map(|d| d.vgpud_pool.clone()))
        .collect()
}

fn check_ownership(
    dir: &Path,
    vgpud: &FakeVgpud,
    orphans: &BTreeSet<String>,
) -> Result<(), TestCaseError> {
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
    for p in FOREIGN_POOLS {
        prop_assert!(s.pools.contains_key(p), "pool {p} is gone");
        prop_assert!(!s.destroyed.iter().any(|u| u == p), "pool {p} was removed");
    }
    let pools = pools_on_disk(dir);
    for p in s.pools.keys() {
        let ours = !FOREIGN_POOLS.contains(&p.as_str()) && !orphans.contains(p);
        prop_assert!(
            !ours || pools.contains(p),
            "pool {p} is not in the checkpoint"
        );
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
        let mut orphans = BTreeSet::new();
        for op in ops {
            match op {
                Op::Prepare(i) => {
                    if let Ok(first) = rt.block_on(d.prepare(&claim_ref(i))) {
                        prop_assert_eq!(first.len(), CLAIMS[i].2.len());
                        let again = rt.block_on(d.prepare(&claim_ref(i))).unwrap();
                        prop_assert_eq!(&again, &first);
                        let s = vgpud.0.lock().unwrap();
                        for dev in CLAIMS[i].2 {
                            prop_assert!(made(&d, &s, CLAIMS[i].1, dev), "{} has no vGPU", dev);
                        }
                    }
                }
                Op::Unprepare(i) => {
                    rt.block_on(d.unprepare(&claim_ref(i))).unwrap();
                    let s = vgpud.0.lock().unwrap();
                    for dev in CLAIMS[i].2 {
                        prop_assert!(!made(&d, &s, CLAIMS[i].1, dev), "{} is left", dev);
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
                    let pool = s
                        .pools
                        .keys()
                        .filter(|p| !FOREIGN_POOLS.contains(&p.as_str()))
                        .nth(k)
                        .cloned();
                    if let Some(p) = pool {
                        s.pools.remove(&p);
                        orphans.remove(&p);
                    }
                }
                Op::PlantOrphan(n) => {
                    let name = vgpu_dra::vf_slot::pool_name(&format!("{n:032x}"));
                    let desc = vgpu_dra::vf_slot::description(DRIVER, "vms", "gone", "gpu-0000-85-00-0-vdi-2g-9");
                    let mut s = vgpud.0.lock().unwrap();
                    if !s.pools.contains_key(&name) {
                        s.pools.insert(name.clone(), (desc, "vdi-2g".into(), VF_GPU.into(), 90));
                        orphans.insert(name);
                    }
                }
                Op::Restart => {
                    drop(d);
                    d = driver(dir, &vgpud, &api);
                    let rec = rt.block_on(d.recover()).unwrap();
                    prop_assert!(!on_disk(dir).1, "a half-done claim survived the restart");
                    let s = vgpud.0.lock().unwrap();
                    // Every claim still prepared has its vGPUs again (those that vanished are remade),
                    // unless vgpud refused one, which is reported.
                    let kept = Checkpoint::load(&dir.join("checkpoint.json"), DRIVER).unwrap();
                    for (uid, _) in kept.claims() {
                        let refused = rec.unrestored.iter().any(|(u, _)| u == uid);
                        prop_assert!(refused || rec.restored.contains(uid), "claim {} was not checked", uid);
                        let (_, _, devs) = CLAIMS.iter().find(|c| c.1 == uid).unwrap();
                        for dev in devs.iter().filter(|_| !refused) {
                            prop_assert!(made(&d, &s, uid, dev), "{} has no vGPU after the restart", dev);
                        }
                    }
                    for o in &orphans {
                        prop_assert!(!s.pools.contains_key(o), "orphan pool {o} survived the restart");
                    }
                    orphans.clear();
                }
            }
            check_ownership(dir, &vgpud, &orphans)?;
        }
        vgpud.0.lock().unwrap().fail_after = None;
        for i in 0..CLAIMS.len() {
            rt.block_on(d.unprepare(&claim_ref(i))).unwrap();
        }
        let left: Vec<String> = vgpud.0.lock().unwrap().instances.keys().cloned().collect();
        prop_assert_eq!(left, vec![FOREIGN.to_string()]);
        prop_assert!(on_disk(dir).0.is_empty());
        let pools: BTreeSet<String> = vgpud.0.lock().unwrap().pools.keys().cloned().collect();
        let expected: BTreeSet<String> = FOREIGN_POOLS.iter().map(|p| p.to_string()).chain(orphans).collect();
        prop_assert_eq!(pools, expected);
    }
}
