//! `org.vgpumanager.Instance1`: one object per instance at
//! `/org/vgpumanager/Manager1/instance/<uuid>`, its properties read from the instance's
//! [`InstanceView`]. The mirror replaces the view on every change and emits one PropertiesChanged with
//! the properties that differ.

use std::collections::HashMap;
use std::sync::Arc;

use vgpu_vfio::VfioBackend;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, ObjectServer, OwnedVariant, Type, Variant, as_variant, interface};

use super::errors::ApiError;
use super::manager::Manager;
use super::pools::json_value;
use super::strict::Strict;
use crate::daemon::api::limits::clip;
use crate::daemon::api::{InstanceView, MigrationInfo, OpenDevice, Preflight};
use vgpu_client::{InstanceInfo, MANAGER_PATH};

/// What `OpenDevice` returns: device fd, IOMMU fd (type1 container or iommufd), backend (`type1` or
/// `iommufd`), IOAS id (0 for type1), IOMMU group.
type OpenDeviceReply = (zbus::OwnedFd, zbus::OwnedFd, String, u32, u32);

/// The options of `OpenDevice`: `backend` (s: auto, type1, iommufd; default auto) and `bind` (b,
/// default true).
pub(super) fn parse_open_options(
    options: &HashMap<String, OwnedVariant>,
) -> Result<(Option<VfioBackend>, bool), ApiError> {
    let known = "backend (s: auto, type1, iommufd), bind (b)";
    let mut backend = None;
    let mut bind = true;
    for (key, value) in options {
        match (key.as_str(), &**value) {
            ("backend", Variant::Str(s)) => {
                backend = match s.as_str() {
                    "auto" | "" => None,
                    other => match other.parse::<VfioBackend>() {
                        Ok(b) => Some(b),
                        Err(_) => {
                            return Err(ApiError::invalid(format!(
                                "OpenDevice: backend '{}' is none of auto, type1, iommufd",
                                clip(other)
                            )));
                        }
                    },
                }
            }
            ("bind", Variant::Bool(b)) => bind = *b,
            _ => {
                return Err(ApiError::invalid(format!(
                    "OpenDevice: unknown option '{}' of type '{}'; known options: {known}",
                    clip(key),
                    clip(&value.value_signature().to_string())
                )));
            }
        }
    }
    Ok((backend, bind))
}

/// Adds `checked_at` (seconds since the Unix epoch) to a preflight report.
fn stamped(mut report: serde_json::Value) -> serde_json::Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    if let Some(o) = report.as_object_mut() {
        o.insert("checked_at".into(), serde_json::Value::from(now));
    }
    report
}

/// The daemon's shared state, from the manager object.
async fn shared_state(server: &ObjectServer) -> Result<Arc<super::Shared>, ApiError> {
    let manager = server
        .interface::<_, Strict<Manager>>(MANAGER_PATH)
        .await
        .map_err(ApiError::internal)?;
    Ok(Arc::clone(&manager.get().await.shared))
}

/// `-1` for no IOMMU group (kernel group ids are `int`: drivers/iommu/iommu.c `struct iommu_group`).
fn iommu_group_wire(g: Option<u32>) -> i32 {
    g.and_then(|g| i32::try_from(g).ok()).unwrap_or(-1)
}

/// The wire form of an instance.
pub(super) fn info(v: &InstanceView) -> InstanceInfo {
    InstanceInfo {
        uuid: v.uuid.to_string(),
        gpu: v.gpu.clone(),
        parent: v.parent.clone(),
        type_id: v.type_id.to_string(),
        profile: v.profile.clone().unwrap_or_default(),
        state: v.state.to_string(),
        defined: v.defined,
        autostart: v.autostart,
        owner: v.ownership.to_string(),
        label: v.label.clone().unwrap_or_default(),
        iommu_group: iommu_group_wire(v.iommu_group),
        created_at: v.created_at,
    }
}

/// The properties whose values differ between `old` and `new`, with their new values.
pub(super) fn changed_properties(
    old: &InstanceView,
    new: &InstanceView,
) -> HashMap<&'static str, Variant<'static>> {
    let (o, n) = (info(old), info(new));
    let mut m = HashMap::new();
    let mut put = |name: &'static str, differs: bool, value: Variant<'static>| {
        if differs {
            m.insert(name, value);
        }
    };
    put("Gpu", o.gpu != n.gpu, Variant::from(n.gpu.clone()));
    put(
        "Parent",
        o.parent != n.parent,
        Variant::from(n.parent.clone()),
    );
    put(
        "Type",
        o.type_id != n.type_id,
        Variant::from(n.type_id.clone()),
    );
    put(
        "Profile",
        o.profile != n.profile,
        Variant::from(n.profile.clone()),
    );
    put("State", o.state != n.state, Variant::from(n.state.clone()));
    put("Defined", o.defined != n.defined, Variant::from(n.defined));
    put(
        "Autostart",
        o.autostart != n.autostart,
        Variant::from(n.autostart),
    );
    put("Owner", o.owner != n.owner, Variant::from(n.owner.clone()));
    put("Label", o.label != n.label, Variant::from(n.label.clone()));
    put(
        "IommuGroup",
        o.iommu_group != n.iommu_group,
        Variant::from(n.iommu_group),
    );
    put(
        "CreatedAt",
        o.created_at != n.created_at,
        Variant::from(n.created_at),
    );
    if old.attrs != new.attrs {
        m.insert("Attributes", Variant::from(attrs_wire(new)));
    }
    m
}

/// The `Attributes` property: (name, value) in write order.
fn attrs_wire(v: &InstanceView) -> Vec<(String, String)> {
    v.attrs
        .iter()
        .map(|a| (a.name().to_string(), a.value().to_string()))
        .collect()
}

/// Every property of a new `Instance1` object, as its `InterfacesAdded` announces them: the same
/// names and values as the interface's `GetAll`, serialized straight from the view as one `a{sv}`
/// instead of through a map of variants built property by property.
#[derive(Debug, serde::Serialize, Type)]
#[zbus(signature = "a{sv}")]
#[serde(rename_all = "PascalCase")]
pub(super) struct AnnouncedInstance<'v> {
    #[serde(with = "as_variant")]
    uuid: String,
    #[serde(with = "as_variant")]
    gpu: &'v str,
    #[serde(with = "as_variant")]
    parent: &'v str,
    #[serde(with = "as_variant", rename = "Type")]
    type_id: &'v str,
    #[serde(with = "as_variant")]
    profile: &'v str,
    #[serde(with = "as_variant")]
    state: &'static str,
    #[serde(with = "as_variant")]
    defined: bool,
    #[serde(with = "as_variant")]
    autostart: bool,
    #[serde(with = "as_variant")]
    owner: &'static str,
    #[serde(with = "as_variant")]
    label: &'v str,
    #[serde(with = "as_variant")]
    iommu_group: i32,
    #[serde(with = "as_variant")]
    created_at: u64,
    #[serde(with = "as_variant")]
    attributes: Vec<(&'v str, &'v str)>,
    /// A new object has had no preflight yet (`Instance1::health`).
    #[serde(with = "as_variant")]
    health: &'static str,
}

impl<'v> AnnouncedInstance<'v> {
    /// The properties of a new object serving `view`.
    pub(super) fn of(view: &'v InstanceView) -> AnnouncedInstance<'v> {
        AnnouncedInstance {
            uuid: view.uuid.to_string(),
            gpu: &view.gpu,
            parent: &view.parent,
            type_id: view.type_id.as_str(),
            profile: view.profile.as_deref().unwrap_or_default(),
            state: view.state.as_str(),
            defined: view.defined,
            autostart: view.autostart,
            owner: view.ownership.as_str(),
            label: view.label.as_deref().unwrap_or_default(),
            iommu_group: iommu_group_wire(view.iommu_group),
            created_at: view.created_at,
            attributes: view.attrs.iter().map(|a| (a.name(), a.value())).collect(),
            health: "",
        }
    }
}

/// The object behind one instance path, as served (see [`Strict`]).
pub(super) type InstanceObject = Strict<Instance1>;

/// The `org.vgpumanager.Instance1` interface of one instance.
#[derive(Debug)]
pub(super) struct Instance1 {
    pub(super) view: InstanceView,
    /// The last preflight report (JSON with `checked_at`), for the `Health` property. It lives and goes
    /// with the object: the mirror updates `view` in place and removes the object with its instance.
    health: String,
}

impl InstanceObject {
    /// The object of a newly listed instance (no preflight yet).
    pub(super) fn new(view: InstanceView) -> InstanceObject {
        Strict::wrap(Instance1 {
            view,
            health: String::new(),
        })
    }
}

/// One mdev instance: running, defined, or made by someone else (Owner `foreign`). Lifecycle methods
/// are on org.vgpumanager.Manager1 and take the Uuid.
#[interface(name = "org.vgpumanager.Instance1")]
impl Instance1 {
    /// The mdev UUID (the device is /sys/bus/mdev/devices/UUID).
    #[zbus(property(emits_changed_signal = "const"))]
    fn uuid(&self) -> String {
        self.view.uuid.to_string()
    }

    /// The GPU it is on (PCI address or parent name, as in ListGpus).
    #[zbus(property)]
    fn gpu(&self) -> String {
        self.view.gpu.clone()
    }

    /// The mdev parent device name.
    #[zbus(property)]
    fn parent(&self) -> String {
        self.view.parent.clone()
    }

    /// The mdev type id.
    #[zbus(property, name = "Type")]
    fn type_id(&self) -> String {
        self.view.type_id.to_string()
    }

    /// The profile it was made from; empty when made from a type or not by vgpu-manager.
    #[zbus(property)]
    fn profile(&self) -> String {
        self.view.profile.clone().unwrap_or_default()
    }

    /// running, stopped or waiting-for-parent.
    #[zbus(property)]
    fn state(&self) -> String {
        self.view.state.to_string()
    }

    /// A persistent definition exists.
    #[zbus(property)]
    fn defined(&self) -> bool {
        self.view.defined
    }

    /// Started whenever the daemon starts or its parent appears.
    #[zbus(property)]
    fn autostart(&self) -> bool {
        self.view.autostart
    }

    /// daemon (created by vgpud), adopted (taken over by a definition or an explicit Stop/Destroy) or
    /// foreign (not vgpud's: automatic actions never touch it; an explicit Stop/Destroy adopts it first).
    #[zbus(property)]
    fn owner(&self) -> String {
        self.view.ownership.to_string()
    }

    /// Free-form label given at creation (a VM name, a pool slot); empty when none.
    #[zbus(property)]
    fn label(&self) -> String {
        self.view.label.clone().unwrap_or_default()
    }

    /// IOMMU group number while running; -1 when none.
    #[zbus(property)]
    fn iommu_group(&self) -> i32 {
        iommu_group_wire(self.view.iommu_group)
    }

    /// When it was created or defined, seconds since the Unix epoch.
    #[zbus(property)]
    fn created_at(&self) -> u64 {
        self.view.created_at
    }

    /// The definition's mdev attributes as (name, value), in the order they are written to
    /// /sys/bus/mdev/devices/UUID/NAME after each create (option attrs of Create/Define); empty for
    /// none, and for transient and foreign instances.
    #[zbus(property)]
    fn attributes(&self) -> Vec<(String, String)> {
        attrs_wire(&self.view)
    }
    /// The last preflight's report as JSON (docs/json.md, `preflight --json`, plus `checked_at`);
    /// empty until `Preflight` ran. Changes are signalled.
    #[zbus(property)]
    fn health(&self) -> String {
        self.health.clone()
    }

    /// Opens the instance through VFIO the way a VMM would — device info, config space, a DMA map and
    /// unmap, the KVM attach check — and returns the report as JSON (also kept in `Health`). A failed
    /// step is in the report, not an error. Needs the same rights as the Manager's changes: it holds the
    /// device for a moment, so a VM starting at that instant could find it busy.
    async fn preflight(
        &mut self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(object_server)] server: &ObjectServer,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
    ) -> Result<String, ApiError> {
        let shared = shared_state(server).await?;
        let uuid = self.view.uuid;
        let report = shared.run(conn, &hdr, Preflight { uuid }).await?;
        let text = stamped(json_value(&report)?).to_string();
        self.health = text.clone();
        shared.served.changed();
        // A lost signal only delays clients until their next read.
        let _ = self.health_changed(&emitter).await;
        Ok(text)
    }

    /// Opens the instance through VFIO the way a VMM would and reads what it supports of the kernel's
    /// VFIO migration uAPI v2 — stop-copy, pre-copy, P2P, device dirty-page logging, the stop-copy data
    /// size — as JSON (docs/json.md, `migration info --json`). Nothing changes; a device without
    /// migration support answers with `migratable` false and the reason. Needs the same rights as the
    /// Manager's changes (it holds the device for a moment, as Preflight).
    async fn migration_info(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> Result<String, ApiError> {
        let shared = shared_state(server).await?;
        let uuid = self.view.uuid;
        let report = shared.run(conn, &hdr, MigrationInfo { uuid }).await?;
        Ok(json_value(&report)?.to_string())
    }

    /// Opens the running instance through VFIO for the caller — a VMM that may not open `/dev/vfio`
    /// itself — and hands over the fds: (device fd, IOMMU fd, backend, IOAS id, IOMMU group). The IOMMU
    /// fd is the type1 container (backend `type1`, IOAS id 0) or the iommufd whose IOAS `ioas_id` the
    /// device is attached to (backend `iommufd`); the caller maps guest memory through it
    /// (VFIO_IOMMU_MAP_DMA or IOMMU_IOAS_MAP). Options: `backend` (s: auto, type1, iommufd) and `bind`
    /// (b, default true): false hands over the device's cdev unbound with a fresh iommufd (IOAS id 0)
    /// for VMMs that bind it themselves, such as QEMU's `-object iommufd,fd=` and
    /// `-device vfio-pci,fd=` (iommufd only). Needs the same rights as the Manager's changes. The device stays open until the caller closes both fds;
    /// meanwhile Preflight and a second OpenDevice find it busy.
    async fn open_device(
        &self,
        options: HashMap<String, OwnedVariant>,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(object_server)] server: &ObjectServer,
    ) -> Result<OpenDeviceReply, ApiError> {
        let (backend, bind) = parse_open_options(&options)?;
        let shared = shared_state(server).await?;
        let uuid = self.view.uuid;
        let opened = shared
            .run(
                conn,
                &hdr,
                OpenDevice {
                    uuid,
                    backend,
                    bind,
                },
            )
            .await?;
        tracing::info!(%uuid, device = %opened, "handing a VFIO device to a client");
        let backend = opened.backend.as_str();
        Ok((
            opened.device.into(),
            opened.iommu.into(),
            backend.to_string(),
            opened.ioas_id.unwrap_or(0),
            opened.iommu_group,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::api::{InstanceState, Ownership};

    fn view() -> InstanceView {
        InstanceView {
            uuid: "4b20d080-1b54-4048-85b3-a6a62d165c01".parse().unwrap(),
            gpu: "0000:3b:00.0".into(),
            parent: "0000:3b:00.0".into(),
            type_id: "nvidia-231".parse().unwrap(),
            profile: Some("vdi-2g".into()),
            state: InstanceState::Running,
            defined: true,
            autostart: false,
            ownership: Ownership::Daemon,
            label: None,
            iommu_group: Some(42),
            created_at: 1_700_000_000,
            attrs: Vec::new(),
        }
    }

    #[test]
    fn wire_form_fills_absent_values_with_sentinels() {
        let mut v = view();
        v.profile = None;
        v.iommu_group = None;
        let i = info(&v);
        assert_eq!(i.profile, "");
        assert_eq!(i.iommu_group, -1);
        assert_eq!(i.iommu_group(), None);
        assert_eq!(
            i.path().as_str(),
            "/org/vgpumanager/Manager1/instance/4b20d080_1b54_4048_85b3_a6a62d165c01"
        );
        assert_eq!(i.state, "running");
        assert_eq!(i.owner, "daemon");
    }

    #[test]
    fn only_differing_properties_are_reported() {
        let old = view();
        assert!(changed_properties(&old, &old).is_empty());
        let mut new = old.clone();
        new.state = InstanceState::Stopped;
        new.iommu_group = None;
        let c = changed_properties(&old, &new);
        let mut keys: Vec<_> = c.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, ["IommuGroup", "State"]);
        assert_eq!(c["State"], Variant::from("stopped"));
        assert_eq!(c["IommuGroup"], Variant::from(-1i32));
    }

    #[test]
    fn health_reports_carry_their_time() {
        let v = stamped(serde_json::json!({"passed": true}));
        assert_eq!(v["passed"], true);
        assert!(v["checked_at"].as_u64().unwrap() > 1_700_000_000);
    }
}
