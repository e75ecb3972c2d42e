//! The calls the plugin makes to vgpud, as a trait so the driver logic is independent of the bus;
//! implemented by [`vgpu_client::Client`], the project's client of vgpud's D-Bus API.

use vgpu_client::{ClientError, FaultInfo, GpuOffers, InstanceInfo, NewInstance};

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
}
