//! The routing table: which method of the core serves each [`Command`](crate::daemon::api::Command).

use super::{Core, ReconcileScope};
use crate::daemon::api::*;

/// One `Handle` impl per command: `route!(Command, |core, cmd| body)`.
macro_rules! route {
    ($cmd:ty, |$core:ident, $c:pat_param| $body:expr) => {
        impl Handle<$cmd> for Core {
            fn handle(&self, cmd: $cmd) -> Result<<$cmd as Command>::Reply, CoreError> {
                let started = std::time::Instant::now();
                let $core = self;
                let $c = cmd;
                let result = $body;
                self.record::<$cmd, _>(started, &result);
                result
            }
        }
    };
}

route!(GetMetrics, |core, GetMetrics { format }| Ok(core
    .metrics_text(
        format,
        crate::daemon::metrics::Freshness::Current
    )));
route!(ListGpus, |core, ListGpus| core.instances.list_gpus());
route!(ListOffers, |core, ListOffers| {
    let held: Vec<_> = core.vf_slots.vf_records().iter().map(|r| r.vf).collect();
    core.instances.offers(&held)
});
route!(GetGpuCapacity, |core, GetGpuCapacity { id }| Ok(core
    .instances
    .gpu_capacity(&id)));
route!(ListInstances, |core, ListInstances| Ok(core
    .instances
    .list()));
route!(GetInstance, |core, GetInstance { uuid }| core
    .instances
    .get(&uuid));
route!(CreateInstance, |core, CreateInstance(spec)| core
    .instances
    .create(spec));
route!(DefineInstance, |core, DefineInstance(spec)| core
    .instances
    .define(spec));
route!(StartInstance, |core, StartInstance { uuid }| core
    .instances
    .start(uuid));
route!(StopInstance, |core, StopInstance { uuid }| core
    .instances
    .stop_named(uuid));
route!(DestroyInstance, |core, DestroyInstance { uuid }| core
    .instances
    .destroy_named(uuid));
route!(UndefineInstance, |core, UndefineInstance { uuid }| core
    .instances
    .undefine(uuid));
route!(SetAutostart, |core, SetAutostart { uuid, autostart }| core
    .instances
    .set_autostart(uuid, autostart));
route!(ListDefinitions, |core, ListDefinitions| Ok(core
    .instances
    .list_definitions()));
route!(ListFaults, |core, ListFaults| core.instances.list_faults());
route!(AdoptDefinition, |core, AdoptDefinition { parent, uuid }| {
    core.instances.adopt_definition(parent, uuid)
});
route!(StartDefinition, |core, StartDefinition { uuid, parent }| {
    core.instances.start_definition(uuid, parent)
});
route!(RedefineInstance, |core, change| core
    .instances
    .redefine(change));
route!(Reconcile, |core, Reconcile| core
    .instances
    .reconcile(ReconcileScope::Startup)
    .map(|_| ()));
route!(PlanPool, |core, PlanPool { toml }| core.pools.plan(&toml));
route!(ApplyPool, |core, ApplyPool { toml }| core
    .pools
    .apply(&toml));
route!(GetPoolStatus, |core, GetPoolStatus| core.pools.status());
route!(RemovePool, |core, RemovePool { name }| core
    .pools
    .remove(&name));
route!(GetScheduling, |core, GetScheduling { gpu }| core
    .scheduling
    .get(&gpu));
route!(PlanScheduling, |core, PlanScheduling { gpu, requests }| {
    core.scheduling.plan(&gpu, &requests)
});
route!(
    ApplyScheduling,
    |core, ApplyScheduling { gpu, requests }| core.scheduling.apply(&gpu, &requests)
);
route!(Preflight, |core, Preflight { uuid }| core
    .vfio
    .preflight(uuid));
route!(MigrationInfo, |core, MigrationInfo { uuid }| core
    .vfio
    .migration_info(uuid));
route!(PrepareIncoming, |core, req| core
    .instances
    .prepare_incoming(req));
route!(AbortIncoming, |core, AbortIncoming { uuid }| core
    .instances
    .abort_incoming(uuid));
route!(CompleteIncoming, |core, CompleteIncoming { uuid }| core
    .instances
    .complete_incoming(uuid));
route!(OpenDevice, |core,
                    OpenDevice {
                        uuid,
                        backend,
                        bind,
                    }| core
    .vfio
    .open_device(uuid, backend, bind));
