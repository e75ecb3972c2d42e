//! An in-memory [`ManagerCalls`] for unit tests: instances in a map, every mutating call logged, failures
//! injectable per UUID. It mimics the daemon's refusals that the glue depends on (unknown UUID, UUID taken,
//! start of a running or transient instance, foreign instances).

use std::collections::{BTreeMap, BTreeSet};

use vgpu_client::blocking::ManagerCalls;
use vgpu_client::{ClientError, GpuInfo, InstanceInfo, NewInstance, TargetKind, TypeSlot};

pub(crate) struct FakeDaemon {
    pub instances: BTreeMap<String, InstanceInfo>,
    pub gpus: Vec<GpuInfo>,
    /// Mutating calls, e.g. `create 4b20… type nvidia-231 gpu - label libvirt:x`.
    pub log: Vec<String>,
    /// UUIDs whose create/start fails.
    pub fail: BTreeSet<String>,
    /// The mdev attributes of each definition (as the daemon's `Attributes` shows them).
    pub attrs: BTreeMap<String, Vec<(String, String)>>,
    next: u32,
}

fn refuse(kind: &str, message: String) -> ClientError {
    ClientError::Daemon {
        kind: kind.into(),
        message,
    }
}

pub(crate) fn instance(
    uuid: &str,
    type_id: &str,
    state: &str,
    defined: bool,
    owner: &str,
) -> InstanceInfo {
    InstanceInfo {
        uuid: uuid.into(),
        gpu: "0000:01:00.0".into(),
        parent: "0000:01:00.0".into(),
        type_id: type_id.into(),
        profile: String::new(),
        state: state.into(),
        defined,
        autostart: false,
        owner: owner.into(),
        label: String::new(),
        iommu_group: -1,
        created_at: 1,
    }
}

impl FakeDaemon {
    pub fn new() -> Self {
        FakeDaemon {
            instances: BTreeMap::new(),
            attrs: BTreeMap::new(),
            gpus: vec![GpuInfo {
                path: vgpu_client::gpu_path("0000:01:00.0"),
                id: "0000:01:00.0".into(),
                vendor: "nvidia".into(),
                model: "NVIDIA T4".into(),
                driver: "nvidia".into(),
                numa_node: 0,
                types: vec![
                    TypeSlot {
                        type_id: "nvidia-222".into(),
                        available: 16,
                    },
                    TypeSlot {
                        type_id: "nvidia-231".into(),
                        available: 8,
                    },
                ],
                instances: vec![],
            }],
            log: Vec::new(),
            fail: BTreeSet::new(),
            next: 0,
        }
    }

    pub fn with(mut self, i: InstanceInfo) -> Self {
        self.instances.insert(i.uuid.clone(), i);
        self
    }

    fn existing(&self, uuid: &str) -> Result<&InstanceInfo, ClientError> {
        self.instances
            .get(uuid)
            .ok_or_else(|| refuse("NotFound", format!("no instance {uuid}")))
    }

    /// Start's refusals and effect, unlogged.
    fn start_defined(&mut self, uuid: &str) -> Result<(), ClientError> {
        let i = self.owned(uuid)?;
        if !i.defined || i.state == "running" {
            return Err(refuse(
                "State",
                format!("instance {uuid} cannot be started"),
            ));
        }
        if self.fail.contains(uuid) {
            return Err(refuse("Kernel", format!("start of {uuid} failed")));
        }
        if let Some(i) = self.instances.get_mut(uuid) {
            i.state = "running".into();
        }
        Ok(())
    }

    fn owned(&self, uuid: &str) -> Result<&InstanceInfo, ClientError> {
        let i = self.existing(uuid)?;
        if i.owner == "foreign" {
            return Err(refuse("Foreign", format!("instance {uuid} is foreign")));
        }
        Ok(i)
    }

    fn add(
        &mut self,
        req: &NewInstance,
        defined: bool,
        autostart: bool,
    ) -> Result<InstanceInfo, ClientError> {
        let uuid = match &req.uuid {
            Some(u) => u.clone(),
            None => {
                self.next += 1;
                format!("00000000-0000-4000-8000-{:012x}", self.next)
            }
        };
        if self.fail.contains(&uuid) {
            return Err(refuse("TypeFull", format!("no room for {uuid}")));
        }
        if let Some(i) = self.instances.get_mut(&uuid) {
            // The daemon adopts a foreign device when a definition with its UUID, parent and type
            // arrives (daemon/engine/lifecycle.rs `adopt`); anything else is a taken UUID.
            let same = req.target == i.type_id && req.gpu.as_deref().is_none_or(|g| g == i.parent);
            if defined && i.owner == "foreign" && same {
                i.owner = "adopted".into();
                i.defined = true;
                i.autostart = autostart;
                return Ok(i.clone());
            }
            return Err(refuse("Exists", format!("instance {uuid} already exists")));
        }
        let (type_id, profile) = if req.kind == TargetKind::Profile {
            ("nvidia-223".to_string(), req.target.clone())
        } else {
            (req.target.clone(), String::new())
        };
        let gpu = req.gpu.clone().unwrap_or_else(|| "0000:01:00.0".into());
        let mut i = instance(
            &uuid,
            &type_id,
            if defined { "stopped" } else { "running" },
            defined,
            "daemon",
        );
        i.gpu = gpu.clone();
        i.parent = gpu;
        i.profile = profile;
        i.autostart = autostart;
        i.label = req.label.clone().unwrap_or_default();
        if defined {
            self.attrs.insert(uuid.clone(), req.attrs.clone());
        }
        self.instances.insert(uuid, i.clone());
        Ok(i)
    }
}

fn or_dash(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or("-")
}

impl ManagerCalls for FakeDaemon {
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError> {
        Ok(self.instances.values().cloned().collect())
    }

    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError> {
        Ok(self.gpus.clone())
    }

    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        Ok(self.instances.get(uuid).cloned())
    }

    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        self.log.push(format!(
            "create {} {} {} gpu {} label {}",
            or_dash(&req.uuid),
            req.kind,
            req.target,
            or_dash(&req.gpu),
            or_dash(&req.label)
        ));
        self.add(req, false, false)
    }

    fn define(&mut self, req: &NewInstance, autostart: bool) -> Result<InstanceInfo, ClientError> {
        self.log.push(format!(
            "define {} {} {} gpu {} autostart {autostart}",
            or_dash(&req.uuid),
            req.kind,
            req.target,
            or_dash(&req.gpu)
        ));
        self.add(req, true, autostart)
    }

    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.log.push(format!("start {uuid}"));
        self.start_defined(uuid)
    }

    fn start_definition(&mut self, uuid: &str, parent: Option<&str>) -> Result<(), ClientError> {
        self.log
            .push(format!("start-definition {uuid} {}", parent.unwrap_or("-")));
        let i = self.existing(uuid)?;
        if !i.defined || parent.is_some_and(|p| p != i.parent) {
            return Err(refuse("State", format!("mdev {uuid} has no definition")));
        }
        self.start_defined(uuid)
    }

    fn stop(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.log.push(format!("stop {uuid}"));
        let i = self.owned(uuid)?.clone();
        if i.state != "running" {
            return Err(refuse(
                "State",
                format!("cannot stop {uuid}: it is not running"),
            ));
        }
        if i.defined {
            if let Some(i) = self.instances.get_mut(uuid) {
                i.state = "stopped".into();
            }
        } else {
            self.instances.remove(uuid);
        }
        Ok(())
    }

    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.log.push(format!("destroy {uuid}"));
        self.owned(uuid)?;
        self.instances.remove(uuid);
        self.attrs.remove(uuid);
        Ok(())
    }

    fn undefine(&mut self, uuid: &str) -> Result<(), ClientError> {
        self.log.push(format!("undefine {uuid}"));
        let i = self.owned(uuid)?.clone();
        if !i.defined {
            return Err(refuse("State", format!("instance {uuid} is not defined")));
        }
        self.attrs.remove(uuid);
        if i.state == "running" {
            if let Some(i) = self.instances.get_mut(uuid) {
                i.defined = false;
                i.autostart = false;
            }
        } else {
            self.instances.remove(uuid);
        }
        Ok(())
    }

    fn set_autostart(&mut self, uuid: &str, autostart: bool) -> Result<(), ClientError> {
        self.log.push(format!("autostart {uuid} {autostart}"));
        let i = self.owned(uuid)?;
        if !i.defined {
            return Err(refuse("State", format!("instance {uuid} is transient")));
        }
        if let Some(i) = self.instances.get_mut(uuid) {
            i.autostart = autostart;
        }
        Ok(())
    }

    fn instance_attrs(&mut self, uuid: &str) -> Result<Vec<(String, String)>, ClientError> {
        Ok(self.attrs.get(uuid).cloned().unwrap_or_default())
    }
}
