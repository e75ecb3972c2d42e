//! Preparing and unpreparing claims: the plugin's logic, independent of gRPC. [`Driver::prepare`]
//! reads the claim's allocation, makes one vGPU per allocated device through vgpud, writes the CDI
//! spec and the device-metadata files, and records each step in the [`Checkpoint`];
//! [`Driver::unprepare`] undoes it; [`Driver::recover`] finishes what a crash interrupted.
//!
//! Every vGPU's UUID is a function of the driver name, the claim UID and the device name (UUID v5),
//! so a retry, or a restart after a crash between the two checkpoint phases, finds the vGPU it made
//! instead of making a second one. The plugin destroys only UUIDs its checkpoint lists.
//!
//! A device whose profile vgpud serves with a VF on its GPU (its offers say so) is made as a vgpud
//! pool of one slot instead ([`vf_slot`]); the pool's name, derived from the same UUID, is recorded
//! in phase one, and only pools the checkpoint lists (and, at start, this driver's pools no claim
//! holds) are removed.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;
use uuid::Uuid;
use vgpu_client::{ClientError, InstanceInfo, NewInstance};

use crate::cdi;
use crate::checkpoint::{Checkpoint, ClaimRecord, Phase, PreparedDevice};
use crate::claim::ClaimSource;
use crate::device_name::{DeviceName, canonical_pci};
use crate::files;
use crate::vf_slot;
use crate::vgpud::Vgpud;

mod error;
mod health;

pub use error::DriverError;
pub use health::DeviceHealth;

/// Where the driver writes and what it is called.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The DRA driver name, as in the ResourceSlices and claims (`vgpu.vgpu-manager.io`).
    pub driver_name: String,
    /// The pool this node's devices are published in: the node name.
    pub pool: String,
    /// The CDI spec directory (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    /// The host directory of the device-metadata files.
    pub metadata_dir: PathBuf,
    /// Where a prepare stops for good, for the crash tests; `None` in service.
    pub failpoint: Option<Failpoint>,
}

/// A point inside [`Driver::prepare`] where a test has the plugin stop (wait forever, holding the
/// checkpoint lock) so it can be killed there: set by `VGPU_DRA_FAILPOINT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failpoint {
    /// `after-plan`: phase one is on disk, no vGPU made yet.
    AfterPlan,
    /// `after-create`: the vGPUs exist, the files and phase two do not.
    AfterCreate,
}

impl std::str::FromStr for Failpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "after-plan" => Ok(Failpoint::AfterPlan),
            "after-create" => Ok(Failpoint::AfterCreate),
            _ => Err(format!(
                "unknown failpoint {s:?}: use after-plan or after-create"
            )),
        }
    }
}

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRef {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its UID.
    pub uid: String,
}

/// One prepared device, as the kubelet is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// The claim requests it satisfies.
    pub requests: Vec<String>,
    /// Its pool.
    pub pool: String,
    /// Its device name.
    pub device: String,
    /// Its fully qualified CDI device names.
    pub cdi_ids: Vec<String>,
}

/// The driver: configuration, vgpud, the claim source and the checkpoint (whose lock serializes
/// every prepare and unprepare).
pub struct Driver {
    cfg: DriverConfig,
    vgpud: Arc<dyn Vgpud>,
    claims: Arc<dyn ClaimSource>,
    state: Mutex<Checkpoint>,
    uuid_ns: Uuid,
    /// Woken after every prepare and unprepare: what the node offers has changed.
    changed: std::sync::Arc<tokio::sync::Notify>,
}

/// What the ResourceSlices are built from ([`Driver::slice_inputs`]).
#[derive(Debug, Clone, Default)]
pub struct SliceInputs {
    /// vgpud's offers.
    pub offers: Vec<vgpu_client::GpuOffers>,
    /// Every instance vgpud knows.
    pub instances: Vec<InstanceInfo>,
    /// Every pool vgpud has applied.
    pub pools: Vec<vgpu_client::PoolStatus>,
}

/// What [`Driver::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Recovery {
    /// Claims cut short between the two phases, rolled back.
    pub rolled_back: Vec<String>,
    /// vGPUs destroyed while rolling back.
    pub destroyed: Vec<String>,
    /// Claims still prepared, kept for the kubelet's unprepare.
    pub kept: usize,
    /// VF slot pools of this driver that no claim of the checkpoint holds, removed.
    pub orphans: Vec<String>,
    /// Claims still prepared whose vGPUs were checked and, where gone (a node reboot), made again.
    pub restored: Vec<String>,
    /// Claims still prepared whose vGPUs could not be made again now, each with why; the kubelet's
    /// next prepare of the claim tries again.
    pub unrestored: Vec<(String, String)>,
}

impl Driver {
    /// A driver over `checkpoint`.
    pub fn new(
        cfg: DriverConfig,
        vgpud: Arc<dyn Vgpud>,
        claims: Arc<dyn ClaimSource>,
        checkpoint: Checkpoint,
    ) -> Self {
        let uuid_ns = Uuid::new_v5(&Uuid::NAMESPACE_DNS, cfg.driver_name.as_bytes());
        Driver {
            cfg,
            vgpud,
            claims,
            state: Mutex::new(checkpoint),
            uuid_ns,
            changed: std::sync::Arc::default(),
        }
    }

    /// The driver's configuration.
    pub fn config(&self) -> &DriverConfig {
        &self.cfg
    }

    /// The UUID of the vGPU for `device` of claim `claim_uid`: the same on every call.
    pub fn vgpu_uuid(&self, claim_uid: &str, device: &str) -> String {
        Uuid::new_v5(&self.uuid_ns, format!("{claim_uid}/{device}").as_bytes()).to_string()
    }

    /// Rolls back every claim the checkpoint shows cut short between its phases: destroys the vGPUs
    /// recorded for it (only those), removes its files and forgets it. Claims completed are kept, and
    /// their vGPUs made again where they are gone (after a node reboot: mdevs do not outlive it, and a
    /// VF slot's pool is not started by vgpud alone), as a prepare of the claim would, so a pod that
    /// the kubelet restarts without preparing again finds its devices; one that cannot be made now is
    /// reported and left to the kubelet's next prepare.
    pub async fn recover(&self) -> Result<Recovery, DriverError> {
        let mut ck = self.state.lock().await;
        let mut out = Recovery::default();
        let started: Vec<(String, ClaimRecord)> = ck
            .claims()
            .filter(|(_, r)| r.phase == Phase::Started)
            .map(|(u, r)| (u.clone(), r.clone()))
            .collect();
        out.kept = ck.claims().count() - started.len();
        for (uid, rec) in started {
            tracing::info!(claim = %uid, namespace = %rec.namespace, name = %rec.name, "rolling back a prepare cut short");
            out.destroyed.extend(self.teardown(&uid, &rec).await?);
            ck.remove(&uid)?;
            out.rolled_back.push(uid);
        }
        let keep: std::collections::HashSet<String> = ck
            .claims()
            .flat_map(|(_, r)| r.devices.iter().filter_map(|d| d.vgpud_pool.clone()))
            .collect();
        match vf_slot::remove_orphans(self.vgpud.as_ref(), &self.cfg.driver_name, &keep).await {
            Ok(removed) => out.orphans = removed,
            Err(e) => {
                tracing::warn!(error = %e, "vgpud's pools could not be read to remove orphaned VF slot pools; the next start tries again")
            }
        }
        let completed: Vec<(String, ClaimRecord)> = ck
            .claims()
            .filter(|(_, r)| r.phase == Phase::Completed)
            .map(|(u, r)| (u.clone(), r.clone()))
            .collect();
        for (uid, rec) in completed {
            let c = ClaimRef {
                namespace: rec.namespace.clone(),
                name: rec.name.clone(),
                uid: uid.clone(),
            };
            match self.reprepare(&mut ck, &c, rec).await {
                Ok(_) => out.restored.push(uid),
                Err(e) => {
                    tracing::warn!(claim = %uid, namespace = %c.namespace, name = %c.name, error = %e, "a prepared claim's vGPU could not be made again at start; the kubelet's next prepare of the claim tries again");
                    out.unrestored.push((uid, e.to_string()));
                }
            }
        }
        Ok(out)
    }

    /// Prepares claim `c`; the same claim again gives the same answer without making anything new.
    pub async fn prepare(&self, c: &ClaimRef) -> Result<Vec<Prepared>, DriverError> {
        let r = self.prepare_claim(c).await;
        self.changed.notify_one();
        r
    }

    async fn prepare_claim(&self, c: &ClaimRef) -> Result<Vec<Prepared>, DriverError> {
        let mut ck = self.state.lock().await;
        if let Some(rec) = ck.get(&c.uid).cloned()
            && rec.phase == Phase::Completed
        {
            return self.reprepare(&mut ck, c, rec).await;
        }
        let claim = self.claims.get(&c.namespace, &c.name).await?;
        if claim.metadata.uid != c.uid {
            return Err(DriverError::UidMismatch {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                expected: c.uid.clone(),
                found: claim.metadata.uid,
            });
        }
        if !claim.is_allocated() {
            return Err(DriverError::NotAllocated {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
            });
        }
        let results: Vec<_> = claim.results_of(&self.cfg.driver_name).collect();
        let offers = if results.is_empty() {
            Vec::new()
        } else {
            self.vgpud
                .list_offers()
                .await
                .map_err(|source| DriverError::Offers {
                    claim: format!("{}/{}", c.namespace, c.name),
                    source: Box::new(source),
                })?
        };
        let mut devices = Vec::new();
        for r in results {
            let name: DeviceName = r.device.parse().map_err(|source| DriverError::Device {
                namespace: c.namespace.clone(),
                name: c.name.clone(),
                device: r.device.clone(),
                source,
            })?;
            if r.pool != self.cfg.pool {
                return Err(DriverError::WrongPool {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    device: r.device.clone(),
                    pool: r.pool.clone(),
                    ours: self.cfg.pool.clone(),
                });
            }
            let uuid = self.vgpu_uuid(&c.uid, &r.device);
            let vgpud_pool = vf_slot::is_vf_backed(&offers, &name.gpu, &name.profile)
                .then(|| vf_slot::pool_name(&uuid));
            devices.push(PreparedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                uuid,
                gpu: name.gpu,
                profile: name.profile,
                iommu_group: None,
                vgpud_pool,
                vf: None,
            });
        }
        let mut rec = ClaimRecord {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            pod_claim_name: claim.pod_claim_name().map(str::to_string),
            phase: Phase::Started,
            devices,
        };
        if let Some(old) = ck.get(&c.uid).cloned()
            && old.devices != rec.devices
        {
            // The allocation is immutable, so this is a checkpoint from a different claim object
            // with a reused UID: undo what it made before recording the new plan.
            self.teardown(&c.uid, &old).await?;
        }
        // Phase one: the plan, durable before the first vGPU exists.
        ck.put(&c.uid, rec.clone())?;
        self.failpoint(Failpoint::AfterPlan).await;
        for d in &mut rec.devices {
            let (group, vf) = self.ensure_vgpu(c, d).await?;
            d.iommu_group = Some(group);
            d.vf = vf;
        }
        self.failpoint(Failpoint::AfterCreate).await;
        self.write_files(&c.uid, &rec)?;
        // Phase two: everything exists.
        rec.phase = Phase::Completed;
        ck.put(&c.uid, rec.clone())?;
        tracing::info!(claim = %c.uid, namespace = %c.namespace, name = %c.name, devices = rec.devices.len(), "prepared");
        Ok(self.answer(&c.uid, &rec))
    }

    /// A completed claim asked for again (a kubelet retry or restart, a node reboot): the vGPUs are
    /// checked and made again if they are gone, the files rewritten, the same answer given.
    async fn reprepare(
        &self,
        ck: &mut Checkpoint,
        c: &ClaimRef,
        mut rec: ClaimRecord,
    ) -> Result<Vec<Prepared>, DriverError> {
        let mut changed = false;
        for d in &mut rec.devices {
            let (group, vf) = self.ensure_vgpu(c, d).await?;
            changed |= Some(group) != d.iommu_group || vf != d.vf;
            d.iommu_group = Some(group);
            d.vf = vf;
        }
        self.write_files(&c.uid, &rec)?;
        if changed {
            ck.put(&c.uid, rec.clone())?;
        }
        Ok(self.answer(&c.uid, &rec))
    }

    /// Woken after every prepare and unprepare (whether it succeeded or not: either may have
    /// changed what the GPUs hold), so the ResourceSlices are published again at once.
    pub fn changes(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.changed.clone()
    }

    /// The UUIDs of every vGPU this driver made or is making (every claim of the checkpoint).
    pub async fn vgpu_uuids(&self) -> std::collections::HashSet<String> {
        let ck = self.state.lock().await;
        ck.claims()
            .flat_map(|(_, r)| r.devices.iter().map(|d| d.uuid.clone()))
            .collect()
    }

    /// The vgpud pools of every VF-backed device this driver made or is making.
    pub async fn vgpud_pools(&self) -> std::collections::HashSet<String> {
        let ck = self.state.lock().await;
        ck.claims()
            .flat_map(|(_, r)| r.devices.iter().filter_map(|d| d.vgpud_pool.clone()))
            .collect()
    }

    /// What the ResourceSlices are built from, read from vgpud now: its offers, instances and pools.
    pub async fn slice_inputs(&self) -> Result<SliceInputs, ClientError> {
        Ok(SliceInputs {
            offers: self.vgpud.list_offers().await?,
            instances: self.vgpud.list_instances().await?,
            pools: self.vgpud.pool_status().await?,
        })
    }

    /// Unprepares claim `c`: destroys its vGPUs, removes its files, forgets it. A claim the plugin
    /// never prepared (or already unprepared) is not an error.
    pub async fn unprepare(&self, c: &ClaimRef) -> Result<(), DriverError> {
        let r = self.unprepare_claim(c).await;
        self.changed.notify_one();
        r
    }

    async fn unprepare_claim(&self, c: &ClaimRef) -> Result<(), DriverError> {
        let mut ck = self.state.lock().await;
        let Some(rec) = ck.get(&c.uid).cloned() else {
            tracing::debug!(claim = %c.uid, "unprepare of a claim not prepared here");
            return Ok(());
        };
        self.teardown(&c.uid, &rec).await?;
        ck.remove(&c.uid)?;
        tracing::info!(claim = %c.uid, namespace = %c.namespace, name = %c.name, "unprepared");
        Ok(())
    }

    /// Waits forever at `at` if the configuration says so.
    async fn failpoint(&self, at: Failpoint) {
        if self.cfg.failpoint == Some(at) {
            tracing::warn!(failpoint = ?at, "failpoint reached: waiting to be killed");
            std::future::pending::<()>().await;
        }
    }

    /// The vGPU of `d` running, made if missing; its IOMMU group and, for a VF-backed device, its VF.
    async fn ensure_vgpu(
        &self,
        c: &ClaimRef,
        d: &PreparedDevice,
    ) -> Result<(u32, Option<String>), DriverError> {
        if let Some(pool) = &d.vgpud_pool {
            let claim = (c.namespace.as_str(), c.name.as_str());
            let (vf, group) =
                vf_slot::ensure(self.vgpud.as_ref(), &self.cfg.driver_name, claim, d, pool).await?;
            return Ok((group, Some(vf)));
        }
        let fail = |action, source| DriverError::Vgpud {
            action,
            uuid: d.uuid.clone(),
            profile: d.profile.clone(),
            gpu: d.gpu.clone(),
            claim: format!("{}/{}", c.namespace, c.name),
            source: Box::new(source),
        };
        let inst = match self
            .vgpud
            .find(&d.uuid)
            .await
            .map_err(|e| fail("find", e))?
        {
            Some(i) => {
                check_same(&i, d)?;
                i
            }
            None => {
                let req = NewInstance {
                    gpu: Some(d.gpu.clone()),
                    uuid: Some(d.uuid.clone()),
                    label: Some(format!("dra:{}/{}", c.namespace, c.name)),
                    ..NewInstance::of_profile(&d.profile)
                };
                let i = self
                    .vgpud
                    .create(&req)
                    .await
                    .map_err(|e| fail("create", e))?;
                tracing::info!(uuid = %i.uuid, gpu = %d.gpu, profile = %d.profile, claim = %c.uid, "vGPU created");
                i
            }
        };
        let group = inst.iommu_group().ok_or(DriverError::NoIommuGroup {
            uuid: d.uuid.clone(),
            state: inst.state.clone(),
        })?;
        Ok((group, None))
    }

    /// Destroys the vGPUs `rec` lists and removes the claim's files; the UUIDs it destroyed.
    async fn teardown(&self, uid: &str, rec: &ClaimRecord) -> Result<Vec<String>, DriverError> {
        let mut destroyed = Vec::new();
        for d in &rec.devices {
            if let Some(pool) = &d.vgpud_pool {
                let claim = (rec.namespace.as_str(), rec.name.as_str());
                if vf_slot::remove(self.vgpud.as_ref(), claim, d, pool).await? {
                    tracing::info!(%pool, claim = %uid, "VF slot pool removed");
                    destroyed.push(d.uuid.clone());
                }
                continue;
            }
            let gone = self
                .vgpud
                .destroy(&d.uuid)
                .await
                .map_err(|source| DriverError::Vgpud {
                    action: "destroy",
                    uuid: d.uuid.clone(),
                    profile: d.profile.clone(),
                    gpu: d.gpu.clone(),
                    claim: format!("{}/{}", rec.namespace, rec.name),
                    source: Box::new(source),
                })?;
            if gone {
                tracing::info!(uuid = %d.uuid, claim = %uid, "vGPU destroyed");
                destroyed.push(d.uuid.clone());
            }
        }
        files::remove(&self.cfg, uid)?;
        Ok(destroyed)
    }

    /// Writes the claim's metadata files and CDI spec ([`files::write`]).
    fn write_files(&self, uid: &str, rec: &ClaimRecord) -> Result<(), DriverError> {
        Ok(files::write(&self.cfg, uid, rec)?)
    }

    fn answer(&self, uid: &str, rec: &ClaimRecord) -> Vec<Prepared> {
        rec.devices
            .iter()
            .map(|d| Prepared {
                requests: vec![d.request.clone()],
                pool: d.pool.clone(),
                device: d.device.clone(),
                cdi_ids: vec![cdi::qualified_name(uid, &d.device)],
            })
            .collect()
    }
}

/// An instance found under our UUID must be on our GPU with our profile.
fn check_same(i: &InstanceInfo, d: &PreparedDevice) -> Result<(), DriverError> {
    let on_gpu = [&i.gpu, &i.parent]
        .iter()
        .any(|g| *g == &d.gpu || canonical_pci(g).as_deref() == Some(d.gpu.as_str()));
    if on_gpu && i.profile == d.profile {
        Ok(())
    } else {
        Err(DriverError::Conflict {
            uuid: d.uuid.clone(),
            gpu: d.gpu.clone(),
            profile: d.profile.clone(),
            found_gpu: i.gpu.clone(),
            found_profile: i.profile.clone(),
        })
    }
}
