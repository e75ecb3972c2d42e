//! The routing table: which method of the core serves each [`Command`](crate::daemon::api::Command).

use super::{Core, ReconcileScope, lock};
use crate::daemon::api::*;

/// One `Handle` impl per command: `route!(Command, |core, cmd| body)`.
macro_rules! route {
    ($cmd:ty, |$core:ident, $c:pat_param| $body:expr) => {
        impl Handle<$cmd> for Core {
            fn handle(&self, cmd: $cmd) -> Result<<$cmd as Command>::Reply, CoreError> {
                let $core = self;
                let $c = cmd;
                $body
            }
        }
    };
}

route!(ListGpus, |core, ListGpus| core.list_gpus());
route!(GetGpuCapacity, |core, GetGpuCapacity { id }| Ok(
    core.gpu_capacity(&id)
));
route!(ListInstances, |core, ListInstances| Ok(lock(&core.views)
    .values()
    .cloned()
    .collect()));
route!(GetInstance, |core, GetInstance { uuid }| lock(&core.views)
    .get(&uuid)
    .cloned()
    .ok_or(CoreError::NotFound { uuid }));
route!(CreateInstance, |core, CreateInstance(spec)| core
    .create(spec));
route!(DefineInstance, |core, DefineInstance(spec)| core
    .define(spec));
route!(StartInstance, |core, StartInstance { uuid }| core
    .start(uuid));
route!(StopInstance, |core, StopInstance { uuid }| core.stop(uuid));
route!(DestroyInstance, |core, DestroyInstance { uuid }| core
    .destroy(uuid));
route!(UndefineInstance, |core, UndefineInstance { uuid }| core
    .undefine(uuid));
route!(SetAutostart, |core, SetAutostart { uuid, autostart }| core
    .set_autostart(uuid, autostart));
route!(Reconcile, |core, Reconcile| core
    .reconcile(ReconcileScope::Startup)
    .map(|_| ()));
route!(PlanPool, |core, PlanPool { toml }| core.pool_plan(&toml));
route!(ApplyPool, |core, ApplyPool { toml }| core.pool_apply(&toml));
route!(GetPoolStatus, |core, GetPoolStatus| core.pool_status());
route!(GetScheduling, |core, GetScheduling { gpu }| core
    .get_scheduling(&gpu));
route!(PlanScheduling, |core, PlanScheduling { gpu, requests }| {
    core.plan_scheduling(&gpu, &requests)
});
route!(
    ApplyScheduling,
    |core, ApplyScheduling { gpu, requests }| core.apply_scheduling(&gpu, &requests)
);
route!(Preflight, |core, Preflight { uuid }| core.preflight(uuid));
route!(OpenDevice, |core,
                    OpenDevice {
                        uuid,
                        backend,
                        bind,
                    }| core
    .open_device(uuid, backend, bind));
