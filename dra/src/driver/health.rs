//! The health of the prepared devices ([`Driver::health`]), which the health stream reports.

use vgpu_client::ClientError;

use super::Driver;
use crate::checkpoint::{Phase, PreparedDevice};
use crate::device_name::canonical_pci;
use crate::vf_slot;

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

impl Driver {
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
        let pools = if devices.iter().any(|d| d.vgpud_pool.is_some()) {
            self.vgpud.pool_status().await?
        } else {
            Vec::new()
        };
        Ok(devices
            .into_iter()
            .map(|d| {
                if let Some(pool) = &d.vgpud_pool {
                    let (healthy, message) = vf_slot::health(&pools, pool);
                    return DeviceHealth {
                        pool: d.pool,
                        device: d.device,
                        healthy,
                        message,
                    };
                }
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
}
