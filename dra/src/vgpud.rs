//! The calls the plugin makes to vgpud, as a trait so the driver logic is independent of the bus;
//! implemented by [`vgpu_client::Client`], the project's client of vgpud's D-Bus API.

use vgpu_client::{
    ClientError, FaultInfo, GpuOffers, InstanceInfo, NewInstance, PoolRemoval, PoolStatus,
    PoolSummary,
};

/// A pool of one slot of `profile` pinned to GPU `gpu`, not started with vgpud (`autostart =
/// false`): how the plugin has vgpud make a VF-backed vGPU (vgpud makes those only as pool slots).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPool {
    /// The pool's name (1-64 of `a-z`, `0-9`, `-`).
    pub name: String,
    /// Its description (printable text on one line, no `"` or `\`).
    pub description: String,
    /// The profile of its one slot.
    pub profile: String,
    /// The GPU it is pinned to (a canonical PCI address).
    pub gpu: String,
}

impl SlotPool {
    /// The pool file's text vgpud's `Apply` takes.
    pub fn toml(&self) -> String {
        format!(
            "name = \"{}\"\ndescription = \"{}\"\nautostart = false\n\n[profiles]\n\"{}\" = 1\n\n[select]\ngpus = [\"{}\"]\n",
            self.name, self.description, self.profile, self.gpu
        )
    }
}

/// What the plugin asks of vgpud.
#[async_trait::async_trait]
pub trait Vgpud: Send + Sync {
    /// Instance `uuid`, or `None` if vgpud knows none.
    async fn find(&self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError>;
    /// Creates and starts a transient instance and returns it.
    async fn create(&self, req: &NewInstance) -> Result<InstanceInfo, ClientError>;
    /// Destroys instance `uuid`; `Ok(false)` if vgpud knows none.
    async fn destroy(&self, uuid: &str) -> Result<bool, ClientError>;
    /// Every instance vgpud knows.
    async fn list_instances(&self) -> Result<Vec<InstanceInfo>, ClientError>;
    /// Every device discovery could not read (a faulted GPU is one).
    async fn list_faults(&self) -> Result<Vec<FaultInfo>, ClientError>;
    /// What each GPU can give each profile when it has room (`ListOffers`).
    async fn list_offers(&self) -> Result<Vec<GpuOffers>, ClientError>;
    /// Applies `pool` (`Apply`); applying it again changes nothing.
    async fn apply_pool(&self, pool: &SlotPool) -> Result<PoolSummary, ClientError>;
    /// Removes pool `name`, giving back its slots (`RemovePool`); no error when vgpud has none.
    async fn remove_pool(&self, name: &str) -> Result<PoolRemoval, ClientError>;
    /// Every pool vgpud has applied (`PoolStatus`).
    async fn pool_status(&self) -> Result<Vec<PoolStatus>, ClientError>;
}

#[async_trait::async_trait]
impl Vgpud for vgpu_client::Client {
    async fn find(&self, uuid: &str) -> Result<Option<InstanceInfo>, ClientError> {
        self.find_instance(uuid).await
    }

    async fn create(&self, req: &NewInstance) -> Result<InstanceInfo, ClientError> {
        vgpu_client::Client::create(self, req).await
    }

    async fn destroy(&self, uuid: &str) -> Result<bool, ClientError> {
        match vgpu_client::Client::destroy(self, uuid).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == Some("NotFound") => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn list_instances(&self) -> Result<Vec<InstanceInfo>, ClientError> {
        vgpu_client::Client::list_instances(self).await
    }

    async fn list_faults(&self) -> Result<Vec<FaultInfo>, ClientError> {
        vgpu_client::Client::list_faults(self).await
    }

    async fn list_offers(&self) -> Result<Vec<GpuOffers>, ClientError> {
        vgpu_client::Client::list_offers(self).await
    }

    async fn apply_pool(&self, pool: &SlotPool) -> Result<PoolSummary, ClientError> {
        vgpu_client::Client::apply_pool(self, &pool.toml(), |_| Ok::<(), ClientError>(())).await
    }

    async fn remove_pool(&self, name: &str) -> Result<PoolRemoval, ClientError> {
        vgpu_client::Client::remove_pool(self, name).await
    }

    async fn pool_status(&self) -> Result<Vec<PoolStatus>, ClientError> {
        vgpu_client::Client::pool_status(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_pool_is_one_slot_pinned_to_its_gpu() {
        let p = SlotPool {
            name: "dra-0123".into(),
            description: "vgpu-dra-plugin vgpu.vgpu-manager.io: claim vms/desk".into(),
            profile: "vdi-2g".into(),
            gpu: "0000:85:00.0".into(),
        };
        assert_eq!(
            p.toml(),
            "name = \"dra-0123\"\ndescription = \"vgpu-dra-plugin vgpu.vgpu-manager.io: claim vms/desk\"\nautostart = false\n\n[profiles]\n\"vdi-2g\" = 1\n\n[select]\ngpus = [\"0000:85:00.0\"]\n"
        );
    }
}
