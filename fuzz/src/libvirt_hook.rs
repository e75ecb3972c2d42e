//! The libvirt hook (`vgpu_manager::hook::run`): its arguments and the domain XML libvirt writes to
//! its stdin, against a daemon stand-in whose answers the input chooses. Input: byte 0 picks the call
//! (`prepare begin`, `release end` or another the hook ignores), byte 1 the stand-in's behaviour
//! (unreachable, which instances exist and how, which calls fail), the rest is the XML. Beyond "no
//! panic": an ignored call or a domain without mdevs never reaches the daemon; a successful prepare
//! accounts for every mdev and a failed one leaves nothing it made running (all undone, or each
//! failed undo named); release never touches a foreign instance nor an autostart definition.

use std::cell::RefCell;
use std::collections::BTreeSet;

use mdev_types::ids::MdevUuid;
use qemu_glue::parse_domain;
use vgpu_client::blocking::ManagerCalls;
use vgpu_client::{ClientError, GpuInfo, InstanceInfo, NewInstance};
use vgpu_manager::hook::{HookError, Invocation, label_for, run};

const DOMAIN: &str = "fuzz-vm";

/// What the stand-in was asked to do.
#[derive(Debug, Default)]
struct Log {
    created: Vec<String>,
    started: Vec<String>,
    stopped: Vec<String>,
    destroyed: Vec<String>,
}

struct Daemon<'a> {
    behaviour: u8,
    log: &'a RefCell<Log>,
}

fn refused(what: &str) -> ClientError {
    ClientError::Daemon {
        kind: "Kernel".into(),
        message: format!("{what} refused by the stand-in"),
    }
}

impl Daemon<'_> {
    fn pick(&self, uuid: &str) -> u8 {
        pick(self.behaviour, uuid)
    }

    fn fails(&self, bit: u8) -> bool {
        self.behaviour & bit != 0
    }
}

/// The stand-in's `GetInstance` answer for `uuid` (`Err` for a failed call).
fn answer(behaviour: u8, uuid: &str) -> Result<Option<InstanceInfo>, ()> {
    let h = pick(behaviour, uuid);
    if h % 8 == 7 {
        return Err(());
    }
    if h % 3 == 0 {
        return Ok(None);
    }
    Ok(Some(InstanceInfo {
        uuid: uuid.to_string(),
        gpu: "0000:01:00.0".into(),
        parent: "0000:01:00.0".into(),
        type_id: if h & 16 != 0 {
            "nvidia-231"
        } else {
            "mbochs-medium"
        }
        .into(),
        profile: String::new(),
        state: if h & 32 != 0 { "running" } else { "stopped" }.into(),
        defined: h & 64 != 0,
        autostart: h & 128 != 0,
        owner: ["daemon", "adopted", "foreign"][usize::from((h >> 2) % 3)].into(),
        label: if h & 8 != 0 {
            label_for(DOMAIN)
        } else {
            String::new()
        },
        iommu_group: -1,
        created_at: 1,
    }))
}

/// A number from the UUID and the behaviour byte, so each instance gets its own answer.
fn pick(behaviour: u8, uuid: &str) -> u8 {
    uuid.bytes().fold(behaviour, |h, b| h.rotate_left(3) ^ b)
}

impl ManagerCalls for Daemon<'_> {
    fn list_instances(&mut self) -> Result<Vec<InstanceInfo>, ClientError> {
        Ok(Vec::new())
    }
    fn list_gpus(&mut self) -> Result<Vec<GpuInfo>, ClientError> {
        Ok(Vec::new())
    }
    fn get_instance(&mut self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        answer(self.behaviour, uuid).map_err(|()| refused("GetInstance"))
    }
    fn create(&mut self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        let uuid = req.uuid.clone().unwrap_or_default();
        if self.fails(1) && self.pick(&uuid) & 1 != 0 {
            return Err(refused("Create"));
        }
        self.log.borrow_mut().created.push(uuid.clone());
        Ok(InstanceInfo {
            uuid,
            gpu: String::new(),
            parent: String::new(),
            type_id: req.target.clone(),
            profile: String::new(),
            state: "running".into(),
            defined: false,
            autostart: false,
            owner: "daemon".into(),
            label: req.label.clone().unwrap_or_default(),
            iommu_group: -1,
            created_at: 1,
        })
    }
    fn define(&mut self, _: &NewInstance, _: bool) -> Result<InstanceInfo, ClientError> {
        panic!("the hook never defines");
    }
    fn start(&mut self, uuid: &str) -> Result<(), ClientError> {
        if self.fails(2) && self.pick(uuid) & 2 != 0 {
            return Err(refused("Start"));
        }
        self.log.borrow_mut().started.push(uuid.to_string());
        Ok(())
    }
    fn stop(&mut self, uuid: &str) -> Result<(), ClientError> {
        if self.fails(4) {
            return Err(refused("Stop"));
        }
        self.log.borrow_mut().stopped.push(uuid.to_string());
        Ok(())
    }
    fn destroy(&mut self, uuid: &str) -> Result<(), ClientError> {
        if self.fails(4) {
            return Err(refused("Destroy"));
        }
        self.log.borrow_mut().destroyed.push(uuid.to_string());
        Ok(())
    }
    fn undefine(&mut self, _: &str) -> Result<(), ClientError> {
        panic!("the hook never undefines");
    }
    fn set_autostart(&mut self, _: &str, _: bool) -> Result<(), ClientError> {
        panic!("the hook never changes autostart");
    }
    fn instance_attrs(&mut self, _: &str) -> Result<Vec<(String, String)>, ClientError> {
        Ok(Vec::new())
    }
}

/// The fuzz target's body.
pub fn check(data: &[u8]) {
    let [op, behaviour, rest @ ..] = data else {
        return;
    };
    let Ok(xml) = std::str::from_utf8(rest) else {
        return;
    };
    let (op, subop) = match op % 3 {
        0 => ("prepare", "begin"),
        1 => ("release", "end"),
        _ => ("started", "begin"),
    };
    let inv = Invocation::from_args(&[DOMAIN, op, subop, "-"]).expect("four arguments");
    let log = RefCell::new(Log::default());
    let connected = RefCell::new(false);
    let unreachable = behaviour & 8 != 0;
    let result = run(
        &inv,
        || Ok(xml.to_string()),
        || {
            *connected.borrow_mut() = true;
            if unreachable {
                Err(ClientError::NotRunning { bus: "fuzz".into() })
            } else {
                Ok(Daemon {
                    behaviour: *behaviour,
                    log: &log,
                })
            }
        },
        |u: &MdevUuid| u.as_uuid().as_bytes()[0] & 1 == 0,
    );
    let devices = parse_domain(xml).ok();
    let mdevs: Vec<String> = devices
        .iter()
        .flat_map(|d| d.mdevs.iter().map(|m| m.uuid.to_string()))
        .collect();
    if op == "started" || mdevs.is_empty() {
        assert!(
            !*connected.borrow(),
            "{op}: the daemon was contacted for nothing"
        );
    }
    if op == "started" {
        assert!(matches!(result, Ok(ref a) if a.is_empty()), "{result:?}");
        return;
    }
    if devices.is_none() {
        assert!(matches!(result, Err(HookError::Parse { .. })), "{result:?}");
        return;
    }
    let log = log.into_inner();
    match (op, &result) {
        ("prepare", Ok(actions)) => {
            assert_eq!(actions.len(), mdevs.len(), "{actions:?}");
            assert!(
                log.stopped.is_empty() && log.destroyed.is_empty(),
                "{log:?}"
            );
        }
        ("prepare", Err(HookError::Devices { failures, .. })) => {
            let undone: BTreeSet<&String> = log.destroyed.iter().chain(&log.stopped).collect();
            for u in log.created.iter().chain(&log.started) {
                assert!(
                    undone.contains(u) || failures.iter().any(|f| f.contains(u.as_str())),
                    "prepare failed but left {u} made and unnamed: {log:?} {failures:?}"
                );
            }
        }
        ("release", _) => {
            assert!(log.created.is_empty() && log.started.is_empty(), "{log:?}");
            for u in log.destroyed.iter().chain(&log.stopped) {
                let i = answer(*behaviour, u)
                    .ok()
                    .flatten()
                    .expect("touched only what exists");
                assert!(i.owner != "foreign", "release touched foreign {u}");
                assert!(
                    !(i.defined && i.autostart),
                    "release touched autostart definition {u}"
                );
                assert!(
                    i.state == "running",
                    "release touched {u}, which is not running"
                );
            }
        }
        _ => {}
    }
    if let Err(e) = &result {
        assert!(!e.to_string().is_empty());
    }
}
