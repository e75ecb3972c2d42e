//! Preparing and unpreparing claims: the plugin's logic, independent of gRPC. [`Driver::prepare`]
//! reads the claim's allocation, makes one vGPU per allocated device through vgpud, writes the CDI
//! spec and the device-metadata files, and records each step in the [`Checkpoint`];
//! [`Driver::unprepare`] undoes it; [`Driver::recover`] finishes what a crash interrupted.
//!
//! Every vGPU's UUID is a function of the driver name, the claim UID and the device name (UUID v5),
//! so a retry, or a restart after a crash between the two checkpoint phases, finds the vGPU it made
//! instead of making a second one. The plugin destroys only UUIDs its checkpoint lists.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::Mutex;
use uuid::Uuid;
use vgpu_client::{ClientError, InstanceInfo, NewInstance};

use crate::cdi;
use crate::checkpoint::{Checkpoint, CheckpointError, ClaimRecord, Phase, PreparedDevice};
use crate::claim::{ClaimError, ClaimSource};
use crate::device_name::{DeviceName, DeviceNameError, canonical_pci};
use crate::files;
use crate::fsutil::FsError;
use crate::vgpud::Vgpud;

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

/// Why a claim could not be prepared or unprepared. Sent to the kubelet as the claim's error.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The claim could not be read.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The API server has another claim under that name.
    #[error(
        "claim {namespace}/{name} has UID {found} in the API server, not {expected}: it was deleted and made again; the kubelet will retry with the new one"
    )]
    UidMismatch {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The UID the kubelet gave.
        expected: String,
        /// The UID the API server has.
        found: String,
    },
    /// The claim has no allocation yet.
    #[error(
        "claim {namespace}/{name} is not allocated yet; the kubelet prepares only allocated claims, so retry"
    )]
    NotAllocated {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
    },
    /// An allocated device name is not one of this driver's.
    #[error(
        "claim {namespace}/{name} was allocated device {device:?}, which this driver does not publish"
    )]
    Device {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The device.
        device: String,
        /// Why it does not parse.
        #[source]
        source: DeviceNameError,
    },
    /// The device belongs to another node's pool.
    #[error(
        "claim {namespace}/{name} was allocated device {device} from pool {pool:?}, but this node's pool is {ours:?}"
    )]
    WrongPool {
        /// The namespace.
        namespace: String,
        /// The name.
        name: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node's pool.
        ours: String,
    },
    /// A vgpud call failed.
    #[error("vgpud could not {action} vGPU {uuid} ({profile} on {gpu}) for claim {claim}")]
    Vgpud {
        /// `create` or `destroy`, `find`.
        action: &'static str,
        /// The vGPU's UUID.
        uuid: String,
        /// The profile.
        profile: String,
        /// The GPU.
        gpu: String,
        /// The claim `namespace/name`.
        claim: String,
        /// The daemon's or the bus's error.
        #[source]
        source: Box<ClientError>,
    },
    /// The vGPU with our UUID is not what we would have made.
    #[error(
        "vGPU {uuid} exists on {found_gpu} with profile {found_profile:?}, not {profile} on {gpu}: it was not made for this claim; destroy it (vgpuctl destroy {uuid}) if it is unused"
    )]
    Conflict {
        /// The UUID.
        uuid: String,
        /// The GPU wanted.
        gpu: String,
        /// The profile wanted.
        profile: String,
        /// The GPU it is on.
        found_gpu: String,
        /// Its profile.
        found_profile: String,
    },
    /// The vGPU runs without an IOMMU group, so it has no VFIO device node.
    #[error(
        "vGPU {uuid} is {state} without an IOMMU group, so containers cannot reach it; check vgpuctl show {uuid}"
    )]
    NoIommuGroup {
        /// The UUID.
        uuid: String,
        /// Its state.
        state: String,
    },
    /// The checkpoint could not be written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// A CDI spec or metadata file could not be written or removed.
    #[error(transparent)]
    Fs(#[from] FsError),
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

/// The health of one prepared device, as [`Driver::health`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceHealth {
    /// Its pool.
    pub pool: String,
    /// Its device name.
    pub device: String,
    /// Its vGPU runs and its GPU reads.
    pub healthy: bool,
    /// Why, in words.
    pub message: String,
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
    /// recorded for it (only those), removes its files and forgets it. Claims completed are kept.
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
        let mut devices = Vec::new();
        for r in claim.results_of(&self.cfg.driver_name) {
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
            devices.push(PreparedDevice {
                request: r.request.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
                uuid: self.vgpu_uuid(&c.uid, &r.device),
                gpu: name.gpu,
                profile: name.profile,
                iommu_group: None,
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
            d.iommu_group = Some(self.ensure_vgpu(c, d).await?);
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
            let group = Some(self.ensure_vgpu(c, d).await?);
            changed |= group != d.iommu_group;
            d.iommu_group = group;
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

    /// What the ResourceSlices are built from, read from vgpud now: its offers and instances.
    pub async fn slice_inputs(
        &self,
    ) -> Result<(Vec<vgpu_client::GpuOffers>, Vec<vgpu_client::InstanceInfo>), ClientError> {
        let offers = self.vgpud.list_offers().await?;
        let instances = self.vgpud.list_instances().await?;
        Ok((offers, instances))
    }

    /// The health of every device of every completed claim: healthy while its vGPU runs and vgpud
    /// reads its GPU without fault. Two vgpud calls whatever the number of devices.
    pub async fn health(&self) -> Result<Vec<DeviceHealth>, ClientError> {
        let devices: Vec<PreparedDevice> = {
            let ck = self.state.lock().await;
            ck.claims()
                .filter(|(_, r)| r.phase == Phase::Completed)
                .flat_map(|(_, r)| r.devices.iter().cloned())
                .collect()
        };
        if devices.is_empty() {
            return Ok(Vec::new());
        }
        let instances = self.vgpud.list_instances().await?;
        let faults = self.vgpud.list_faults().await?;
        Ok(devices
            .into_iter()
            .map(|d| {
                let fault = faults.iter().find(|f| {
                    f.device == d.gpu || canonical_pci(&f.device).as_deref() == Some(d.gpu.as_str())
                });
                let (healthy, message) = match (instances.iter().find(|i| i.uuid == d.uuid), fault)
                {
                    (None, _) => (false, format!("vGPU {} is gone", d.uuid)),
                    (Some(i), _) if i.state != "running" => {
                        (false, format!("vGPU {} is {}", d.uuid, i.state))
                    }
                    (Some(_), Some(f)) => (false, format!("GPU {}: {}", d.gpu, f.problem)),
                    (Some(_), None) => (true, format!("vGPU {} runs on {}", d.uuid, d.gpu)),
                };
                DeviceHealth {
                    pool: d.pool,
                    device: d.device,
                    healthy,
                    message,
                }
            })
            .collect())
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

    /// The vGPU of `d` running, made if missing; its IOMMU group.
    async fn ensure_vgpu(&self, c: &ClaimRef, d: &PreparedDevice) -> Result<u32, DriverError> {
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
        inst.iommu_group().ok_or(DriverError::NoIommuGroup {
            uuid: d.uuid.clone(),
            state: inst.state.clone(),
        })
    }

    /// Destroys the vGPUs `rec` lists and removes the claim's files; the UUIDs it destroyed.
    async fn teardown(&self, uid: &str, rec: &ClaimRecord) -> Result<Vec<String>, DriverError> {
        let mut destroyed = Vec::new();
        for d in &rec.devices {
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
