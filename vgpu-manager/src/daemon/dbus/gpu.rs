//! `org.vgpumanager.Gpu1`: one object per GPU at `/org/vgpumanager/Manager1/gpu/<escaped id>`, its
//! properties read from the GPU's [`GpuView`]. GPUs are refreshed after instance changes (capacity
//! moves with them) and on reconcile, coalesced in one background task.

use std::collections::HashMap;
use std::sync::Arc;

use zbus::message::Header;
use zbus::{BoxDBusError, Connection, OwnedObjectPath, Variant, interface};

use super::admission::{self, Admission};
use super::errors::ApiError;
use super::pools::json_text;
use super::strict::Strict;
use super::{Authorizer, Executor, QueryError, admit_call, call, on_worker};
use crate::daemon::api::{GetScheduling, GpuView};
use vgpu_client::{GpuInfo, TypeSlot, gpu_path, instance_path};

fn numa_wire(n: Option<u32>) -> i32 {
    n.and_then(|n| i32::try_from(n).ok()).unwrap_or(-1)
}

fn slots(v: &GpuView) -> Vec<TypeSlot> {
    v.types
        .iter()
        .map(|(t, n)| TypeSlot {
            type_id: t.to_string(),
            available: *n,
        })
        .collect()
}

fn instance_paths(v: &GpuView) -> Vec<OwnedObjectPath> {
    v.instances
        .iter()
        .map(|u| instance_path(&u.to_string()))
        .collect()
}

/// The wire form of a GPU.
pub(super) fn info(v: &GpuView) -> GpuInfo {
    GpuInfo {
        path: gpu_path(&v.id),
        id: v.id.clone(),
        vendor: v.vendor.clone(),
        model: v.model.clone(),
        driver: v.driver.clone().unwrap_or_default(),
        numa_node: numa_wire(v.numa_node),
        types: slots(v),
        instances: v.instances.iter().map(ToString::to_string).collect(),
    }
}

/// The properties whose values differ between `old` and `new`, with their new values.
pub(super) fn changed_properties(
    old: &GpuView,
    new: &GpuView,
) -> HashMap<&'static str, Variant<'static>> {
    let mut m = HashMap::new();
    if old.vendor != new.vendor {
        m.insert("Vendor", Variant::from(new.vendor.clone()));
    }
    if old.model != new.model {
        m.insert("Model", Variant::from(new.model.clone()));
    }
    if old.driver != new.driver {
        m.insert(
            "Driver",
            Variant::from(new.driver.clone().unwrap_or_default()),
        );
    }
    if old.numa_node != new.numa_node {
        m.insert("NumaNode", Variant::from(numa_wire(new.numa_node)));
    }
    if old.types != new.types {
        m.insert("Types", Variant::from(slots(new)));
    }
    if old.instances != new.instances {
        m.insert("Instances", Variant::from(instance_paths(new)));
    }
    if old.health != new.health {
        m.insert("Health", Variant::from(new.health.clone()));
    }
    m
}

/// The object behind one GPU path, as served (see [`Strict`]).
pub(super) type GpuObject = Strict<Gpu1>;

/// The `org.vgpumanager.Gpu1` interface of one GPU.
pub(super) struct Gpu1 {
    pub(super) view: GpuView,
    /// For the properties read from the host on demand (`Scheduling`).
    exec: Arc<dyn Executor>,
    /// Admits the clients' reads of those properties, as it admits the methods' calls.
    admission: Arc<Admission>,
    /// Tells the readers' shares.
    auth: Authorizer,
}

impl std::fmt::Debug for Gpu1 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu1")
            .field("view", &self.view)
            .finish_non_exhaustive()
    }
}

impl GpuObject {
    /// The object of the GPU `view` shows.
    pub(super) fn new(
        view: GpuView,
        exec: Arc<dyn Executor>,
        admission: Arc<Admission>,
        auth: Authorizer,
    ) -> GpuObject {
        Strict::wrap(Gpu1 {
            view,
            exec,
            admission,
            auth,
        })
    }
}

impl Gpu1 {
    /// The GPU's scheduling read back now. A client's read (`hdr` is its call's header) goes through
    /// admission: at most [`MAX_PENDING`](super::MAX_PENDING) of one client pending, refused beyond
    /// with `Error.LimitsExceeded`, run on the workers in turn with everyone's calls, dropped when
    /// the client has gone. vgpud's own reads (`None`: an object manager's answer, InterfacesAdded)
    /// run at once.
    async fn read_scheduling(
        &self,
        conn: &Connection,
        hdr: Option<&Header<'_>>,
    ) -> Result<String, BoxDBusError> {
        let cmd = GetScheduling {
            gpu: self.view.id.clone(),
        };
        let read = match hdr {
            None => call(&self.exec, cmd).await,
            Some(hdr) => {
                const WHAT: &str = "Get of Gpu1.Scheduling";
                let ticket = admit_call(&self.auth, &self.admission, conn, hdr, WHAT)
                    .await
                    .map_err(|e| Box::new(e) as BoxDBusError)?;
                match on_worker(&self.exec, &ticket, cmd).await {
                    Ok(r) => r,
                    Err(admission::Gone) => {
                        return Err(Box::new(admission::gone_error(&ticket, WHAT)));
                    }
                }
            }
        };
        let failed = |m: String| -> BoxDBusError { Box::new(zbus::fdo::Error::Failed(m)) };
        match read {
            Ok(view) => json_text(&view).map_err(|e| failed(e.message().to_string())),
            Err(QueryError::Core(e)) => Err(failed(e.to_string())),
            Err(e) => Err(failed(ApiError::from(e).to_string())),
        }
    }
}

/// A GPU that can host mdev instances.
#[interface(name = "org.vgpumanager.Gpu1")]
impl Gpu1 {
    /// GPU id: its PCI address, or the mdev parent name.
    #[zbus(property(emits_changed_signal = "const"))]
    fn id(&self) -> String {
        self.view.id.clone()
    }

    /// Vendor (nvidia, intel, ...).
    #[zbus(property)]
    fn vendor(&self) -> String {
        self.view.vendor.clone()
    }

    /// Model name.
    #[zbus(property)]
    fn model(&self) -> String {
        self.view.model.clone()
    }

    /// The bound driver; empty when none.
    #[zbus(property)]
    fn driver(&self) -> String {
        self.view.driver.clone().unwrap_or_default()
    }

    /// NUMA node; -1 when unknown.
    #[zbus(property)]
    fn numa_node(&self) -> i32 {
        numa_wire(self.view.numa_node)
    }

    /// The mdev types it offers, each with the number of instances that still fit.
    #[zbus(property)]
    fn types(&self) -> Vec<TypeSlot> {
        slots(&self.view)
    }

    /// The instances running on it.
    #[zbus(property)]
    fn instances(&self) -> Vec<OwnedObjectPath> {
        instance_paths(&self.view)
    }

    /// `ok`, or `faulted: ` and the fault (the path, the errno or text, the fix) when the GPU could not
    /// be read: nothing is placed on it until it reads again; its instances and definitions are kept.
    #[zbus(property)]
    fn health(&self) -> String {
        self.view.health.clone()
    }

    /// Its time-slice scheduling as programmed now, read back through its vendor backend when the
    /// property is read (no change signal): JSON {gpu, backend, state, reason} as docs/json.md shows.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn scheduling(
        &self,
        #[zbus(header)] hdr: Option<Header<'_>>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BoxDBusError> {
        self.read_scheduling(conn, hdr.as_ref()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> GpuView {
        GpuView {
            id: "0000:3b:00.0".into(),
            vendor: "nvidia".into(),
            model: "Tesla T4".into(),
            driver: Some("nvidia".into()),
            numa_node: None,
            types: vec![("nvidia-231".parse().unwrap(), 4)],
            instances: vec![],
            health: "ok".into(),
        }
    }

    #[test]
    fn capacity_changes_are_reported() {
        let old = view();
        assert!(changed_properties(&old, &old).is_empty());
        let mut new = old.clone();
        new.types[0].1 = 3;
        new.instances
            .push("4b20d080-1b54-4048-85b3-a6a62d165c01".parse().unwrap());
        let mut keys: Vec<_> = changed_properties(&old, &new).into_keys().collect();
        keys.sort();
        assert_eq!(keys, ["Instances", "Types"]);
        let i = info(&new);
        assert_eq!(i.numa_node, -1);
        assert_eq!(i.types[0].available, 3);
        assert_eq!(
            i.path.as_str(),
            "/org/vgpumanager/Manager1/gpu/0000_3a3b_3a00_2e0"
        );
    }
}
