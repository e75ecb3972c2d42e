//! The device-health stream the kubelet watches (`DRAResourceHealth.NodeWatchResources`, v1alpha1
//! and v1, kubernetes/kubelet `pkg/apis/dra-health/`): every interval, the health of each prepared
//! device ([`Driver::health`]), all of them each time, with a timeout of three intervals, so a plugin
//! that stops reporting turns its devices `UNKNOWN` in the kubelet rather than leave them healthy.
//! When vgpud cannot be asked, nothing is sent that round (the kubelet's timeout says the rest).
//! Streams end when the plugin stops.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::driver::{DeviceHealth, Driver};
use crate::pb::{dra_health_v1, dra_health_v1alpha1};

/// One round of reports, stamped.
struct Round {
    devices: Vec<DeviceHealth>,
    at: i64,
    timeout: i64,
}

/// The health service of a [`Driver`], for both API versions.
#[derive(Clone)]
pub struct HealthService {
    driver: Arc<Driver>,
    interval: Duration,
    stop: watch::Receiver<bool>,
}

impl HealthService {
    /// Reports every `interval` until `stop` turns true.
    pub fn new(driver: Arc<Driver>, interval: Duration, stop: watch::Receiver<bool>) -> Self {
        HealthService {
            driver,
            interval,
            stop,
        }
    }

    fn rounds(&self) -> ReceiverStream<Round> {
        let (tx, rx) = mpsc::channel(1);
        let driver = self.driver.clone();
        let interval = self.interval;
        let timeout =
            i64::try_from(interval.as_secs().saturating_mul(3).max(1)).unwrap_or(i64::MAX);
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                match driver.health().await {
                    Ok(devices) => {
                        let at = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
                        if tx
                            .send(Round {
                                devices,
                                at,
                                timeout,
                            })
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot ask vgpud for the devices' health")
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tx.closed() => break,
                }
            }
            tracing::debug!("health stream ended");
        });
        ReceiverStream::new(rx)
    }
}

/// A message at most 1024 characters long, as the API allows.
fn bounded(m: &str) -> String {
    m.chars().take(1024).collect()
}

type Stream1<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

macro_rules! health_version {
    ($pb:ident) => {
        #[tonic::async_trait]
        impl $pb::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Stream1<$pb::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _: Request<$pb::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                tracing::debug!(
                    api = stringify!($pb),
                    "the kubelet watches the devices' health"
                );
                let s = self.rounds().map(|r| {
                    let devices = r
                        .devices
                        .into_iter()
                        .map(|d| $pb::DeviceHealth {
                            device: Some($pb::DeviceIdentifier {
                                pool_name: d.pool,
                                device_name: d.device,
                            }),
                            health: if d.healthy {
                                $pb::HealthStatus::Healthy
                            } else {
                                $pb::HealthStatus::Unhealthy
                            } as i32,
                            last_updated_time: r.at,
                            health_check_timeout_seconds: r.timeout,
                            message: bounded(&d.message),
                        })
                        .collect();
                    Ok($pb::NodeWatchResourcesResponse { devices })
                });
                Ok(Response::new(Box::pin(s)))
            }
        }
    };
}

health_version!(dra_health_v1alpha1);
health_version!(dra_health_v1);
