//! Typed proxies of vgpud's three interfaces. Method and property names match
//! `data/org.vgpumanager.Manager1.xml`; the daemon's introspection is checked against that file.

#![allow(missing_docs)] // The proxy macro generates items (streams, builders, signal args) without docs.

use std::collections::HashMap;

use zbus::{ObjectPath, OwnedObjectPath, Variant, proxy};

use crate::wire::{DefinitionInfo, FaultInfo, GpuInfo, InstanceInfo, TypeSlot};

/// `org.vgpumanager.Manager1` at `/org/vgpumanager/Manager1`: lists, lifecycle and signals.
#[proxy(
    interface = "org.vgpumanager.Manager1",
    default_service = "org.vgpumanager.Manager1",
    default_path = "/org/vgpumanager/Manager1"
)]
pub trait Manager1 {
    /// Every GPU with its mdev types and running instances.
    fn list_gpus(&self) -> zbus::Result<Vec<GpuInfo>>;

    /// Every instance: vgpud's (running or defined) and foreign ones.
    fn list_instances(&self) -> zbus::Result<Vec<InstanceInfo>>;

    /// One instance by UUID.
    fn get_instance(&self, uuid: &str) -> zbus::Result<InstanceInfo>;

    /// Every definition by parent and UUID: vgpud's and the foreign files of `/etc/mdevctl.d`.
    fn list_definitions(&self) -> zbus::Result<Vec<DefinitionInfo>>;

    /// Every device discovery could not read (none on a healthy host).
    fn list_faults(&self) -> zbus::Result<Vec<FaultInfo>>;

    /// Replaces a definition's type, start mode and attributes in place (a running device stays).
    fn redefine(
        &self,
        uuid: &str,
        type_id: &str,
        autostart: bool,
        attrs: Vec<(String, String)>,
    ) -> zbus::Result<()>;

    /// Takes the foreign definition of `uuid` on `parent` into vgpud; returns its instance's path.
    fn adopt_definition(&self, parent: &str, uuid: &str) -> zbus::Result<OwnedObjectPath>;

    /// Creates and starts a transient instance. `target_kind` is `profile` or `type`; `gpu` and
    /// `uuid` may be `""` (daemon's choice). Options: `label` (s).
    fn create(
        &self,
        target_kind: &str,
        target: &str,
        gpu: &str,
        uuid: &str,
        options: HashMap<&str, Variant<'_>>,
    ) -> zbus::Result<OwnedObjectPath>;

    /// Persists a definition without starting it. Options: `label` (s), `autostart` (b).
    fn define(
        &self,
        target_kind: &str,
        target: &str,
        gpu: &str,
        uuid: &str,
        options: HashMap<&str, Variant<'_>>,
    ) -> zbus::Result<OwnedObjectPath>;

    /// Removes an instance entirely: its device and its definition.
    fn destroy(&self, uuid: &str) -> zbus::Result<()>;

    /// Starts a defined instance.
    fn start(&self, uuid: &str) -> zbus::Result<()>;

    /// Starts `uuid`'s one definition (on `parent` unless `""`), vgpud's or foreign, as mdevctl's
    /// `start --uuid` does.
    fn start_definition(&self, uuid: &str, parent: &str) -> zbus::Result<()>;

    /// Stops an instance, keeping its definition.
    fn stop(&self, uuid: &str) -> zbus::Result<()>;

    /// Deletes a definition (a running device stays, as a transient instance).
    fn undefine(&self, uuid: &str) -> zbus::Result<()>;

    /// Sets whether a definition starts automatically.
    fn set_autostart(&self, uuid: &str, autostart: bool) -> zbus::Result<()>;

    /// Converges the host to the desired state now.
    fn reconcile(&self) -> zbus::Result<()>;

    /// Makes the target instance of a live migration from the source's fingerprint (JSON); options
    /// `gpu` (s), `uuid` (s), `timeout` (u). JSON reply (docs/json.md).
    fn prepare_incoming(
        &self,
        fingerprint: &str,
        options: HashMap<&str, Variant<'_>>,
    ) -> zbus::Result<String>;

    /// Releases an incoming migration target.
    fn abort_incoming(&self, uuid: &str) -> zbus::Result<()>;

    /// Turns an incoming migration target into an ordinary instance.
    fn complete_incoming(&self, uuid: &str) -> zbus::Result<()>;

    /// Dry run of a pool (TOML text): JSON of vgpu-manager's `PoolPlan`.
    fn plan(&self, pool_toml: &str) -> zbus::Result<String>;

    /// Applies a pool (TOML text), emitting `PoolProgress`: JSON of a [`crate::PoolSummary`].
    fn apply(&self, pool_toml: &str) -> zbus::Result<String>;

    /// Removes pool `name` (its slots given back): JSON of [`crate::PoolRemoval`].
    fn remove_pool(&self, name: &str) -> zbus::Result<String>;

    /// The applied pools: JSON array of [`crate::PoolStatus`].
    fn pool_status(&self) -> zbus::Result<String>;

    /// What each GPU can give each catalog profile: JSON array of [`crate::GpuOffers`].
    fn list_offers(&self) -> zbus::Result<String>;

    /// Every metric family, as text: `format` `prometheus` (or empty) for the Prometheus text format
    /// 0.0.4, `openmetrics` for OpenMetrics 1.0.
    fn metrics(&self, format: &str) -> zbus::Result<String>;

    /// A GPU's scheduling plan: JSON of vgpu-manager's `SchedPlan`. `requests`: JSON array of
    /// `{"weight": W, …}` or `""` for weight 1 on each existing vGPU.
    fn plan_scheduling(&self, gpu: &str, requests: &str) -> zbus::Result<String>;

    /// Programs a GPU's scheduling plan: JSON of vgpu-manager's `ApplyReport`.
    fn apply_scheduling(&self, gpu: &str, requests: &str) -> zbus::Result<String>;

    /// The daemon's version.
    #[zbus(property)]
    fn version(&self) -> zbus::Result<String>;

    /// An instance appeared (created, defined, or first seen).
    #[zbus(signal)]
    fn instance_added(&self, instance: ObjectPath<'_>, uuid: &str) -> zbus::Result<()>;

    /// An instance is gone entirely.
    #[zbus(signal)]
    fn instance_removed(&self, instance: ObjectPath<'_>, uuid: &str) -> zbus::Result<()>;

    /// An instance's state changed.
    #[zbus(signal)]
    fn instance_state_changed(
        &self,
        instance: ObjectPath<'_>,
        uuid: &str,
        state: &str,
    ) -> zbus::Result<()>;

    /// A step of an `Apply` finished.
    #[zbus(signal)]
    fn pool_progress(&self, pool: &str, done: u32, total: u32, step: &str) -> zbus::Result<()>;
}

/// `org.vgpumanager.Gpu1`: one GPU.
#[proxy(
    interface = "org.vgpumanager.Gpu1",
    default_service = "org.vgpumanager.Manager1"
)]
pub trait Gpu1 {
    /// The GPU id: its PCI address, or the parent device name for a non-PCI parent.
    #[zbus(property)]
    fn id(&self) -> zbus::Result<String>;
    /// The vendor (`nvidia`, `intel`, `amd`, …).
    #[zbus(property)]
    fn vendor(&self) -> zbus::Result<String>;
    /// The model name, as discovery reads it.
    #[zbus(property)]
    fn model(&self) -> zbus::Result<String>;
    /// The bound kernel driver; `""` when none is bound.
    #[zbus(property)]
    fn driver(&self) -> zbus::Result<String>;
    /// The NUMA node; `-1` when the kernel does not know it.
    #[zbus(property)]
    fn numa_node(&self) -> zbus::Result<i32>;
    /// The mdev types the GPU offers and how many more instances of each fit.
    #[zbus(property)]
    fn types(&self) -> zbus::Result<Vec<TypeSlot>>;
    /// The object paths of the instances on the GPU ([`crate::instance_uuid`] reads the UUID back).
    #[zbus(property)]
    fn instances(&self) -> zbus::Result<Vec<OwnedObjectPath>>;
    /// `ok`, or `faulted: ` and why the GPU could not be read (nothing is placed on it then).
    #[zbus(property)]
    fn health(&self) -> zbus::Result<String>;
    /// JSON of a [`crate::SchedulingView`], read from the host on each get.
    #[zbus(property)]
    fn scheduling(&self) -> zbus::Result<String>;
}

/// `org.vgpumanager.Instance1`: one instance.
#[proxy(
    interface = "org.vgpumanager.Instance1",
    default_service = "org.vgpumanager.Manager1"
)]
pub trait Instance1 {
    /// The instance's mdev UUID (its object path ends in it, with `-` as `_`).
    #[zbus(property)]
    fn uuid(&self) -> zbus::Result<String>;
    /// The GPU the instance is on (PCI address or parent name).
    #[zbus(property)]
    fn gpu(&self) -> zbus::Result<String>;
    /// The mdev parent's sysfs device name (e.g. `0000:3b:00.0`).
    #[zbus(property)]
    fn parent(&self) -> zbus::Result<String>;
    /// The mdev type id, e.g. `nvidia-231`.
    #[zbus(property, name = "Type")]
    fn type_id(&self) -> zbus::Result<String>;
    /// The profile it was made from; `""` when made from a type or not by vgpu-manager.
    #[zbus(property)]
    fn profile(&self) -> zbus::Result<String>;
    /// `running`, `stopped` or `waiting-for-parent`.
    #[zbus(property)]
    fn state(&self) -> zbus::Result<String>;
    /// Whether a persistent definition exists.
    #[zbus(property)]
    fn defined(&self) -> zbus::Result<bool>;
    /// Whether the definition starts with the daemon (definitions only).
    #[zbus(property)]
    fn autostart(&self) -> zbus::Result<bool>;
    /// `daemon`, `adopted` or `foreign` (see [`crate::InstanceInfo::owner`]).
    #[zbus(property)]
    fn owner(&self) -> zbus::Result<String>;
    /// The free-form label given at creation; `""` when none.
    #[zbus(property)]
    fn label(&self) -> zbus::Result<String>;
    /// The IOMMU group number while running; `-1` when none.
    #[zbus(property)]
    fn iommu_group(&self) -> zbus::Result<i32>;
    /// When it was created or defined, seconds since the Unix epoch.
    #[zbus(property)]
    fn created_at(&self) -> zbus::Result<u64>;
    /// JSON of the last preflight (empty before the first).
    #[zbus(property)]
    fn health(&self) -> zbus::Result<String>;
    /// The definition's mdev attributes (name, value), in the order they are written at each start.
    #[zbus(property)]
    fn attributes(&self) -> zbus::Result<Vec<(String, String)>>;

    /// Opens the instance through VFIO as a VMM would; JSON of a
    /// `PreflightReport` of the VFIO crate (also kept in `Health`).
    fn preflight(&self) -> zbus::Result<String>;

    /// Reads what the instance supports of VFIO live migration; JSON of a `MigrationSupport` of the
    /// VFIO crate.
    fn migration_info(&self) -> zbus::Result<String>;

    /// Opens the running instance for the caller: (device fd, IOMMU fd, backend, IOAS id, IOMMU group).
    /// Options: `backend` (s: auto, type1, iommufd), `bind` (b). [`crate::Client::open_device`] wraps
    /// it.
    fn open_device(
        &self,
        options: HashMap<&str, Variant<'_>>,
    ) -> zbus::Result<(zbus::OwnedFd, zbus::OwnedFd, String, u32, u32)>;
}
