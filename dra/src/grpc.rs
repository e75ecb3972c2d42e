//! The gRPC services the kubelet calls: `pluginregistration.Registration` on the registration socket
//! and `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin` (and its v1beta1 twin, for kubelets before 1.34)
//! on the plugin socket, beside the health stream ([`crate::health`]). They translate between the wire messages and [`Driver`]; per-claim failures
//! travel in each claim's `error` field, as the DRA API defines, never as a gRPC error.

use std::sync::Arc;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::driver::{ClaimRef, Driver, Prepared};
use crate::health::HealthService;
use crate::pb::{
    dra_health_v1, dra_health_v1alpha1, dra_v1, dra_v1beta1, pluginregistration as reg,
};

/// `type` of a DRA driver in `PluginInfo` (kubernetes/kubelet `pkg/apis/pluginregistration/v1/constants.go`).
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The supported-version string of the v1 DRA service (kubernetes/kubelet `pkg/apis/dra/v1/types.go`
/// `DRAPluginService`); the kubelet picks the first of its own list it finds here.
pub const SERVICE_V1: &str = "v1.DRAPlugin";
/// The same for v1beta1 (`pkg/apis/dra/v1beta1/types.go`).
pub const SERVICE_V1BETA1: &str = "v1beta1.DRAPlugin";

/// The kubelet's last word on our registration: `None` until it calls `NotifyRegistrationStatus`.
pub type RegistrationState = watch::Receiver<Option<reg::RegistrationStatus>>;

/// `pluginregistration.Registration`: tells the kubelet who we are and where the DRA service is.
pub struct RegistrationService {
    info: reg::PluginInfo,
    status: watch::Sender<Option<reg::RegistrationStatus>>,
}

impl RegistrationService {
    /// The service for driver `name` served at `endpoint`, and a receiver of the kubelet's verdicts.
    pub fn new(name: &str, endpoint: &str) -> (Self, RegistrationState) {
        let (status, rx) = watch::channel(None);
        let info = reg::PluginInfo {
            r#type: PLUGIN_TYPE.to_string(),
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            supported_versions: vec![SERVICE_V1.to_string(), SERVICE_V1BETA1.to_string()],
        };
        (RegistrationService { info, status }, rx)
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        tracing::debug!("the kubelet asked for the plugin's registration info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!(driver = %self.info.name, "registered with the kubelet");
        } else {
            tracing::error!(driver = %self.info.name, error = %s.error, "the kubelet refused the registration");
        }
        self.status.send_replace(Some(s));
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The DRA service over a [`Driver`], for both API versions.
#[derive(Clone)]
pub struct DraService {
    driver: Arc<Driver>,
}

impl DraService {
    /// The service of `driver`.
    pub fn new(driver: Arc<Driver>) -> Self {
        DraService { driver }
    }

    async fn prepare(&self, claims: Vec<dra_v1::Claim>) -> dra_v1::NodePrepareResourcesResponse {
        let mut out = dra_v1::NodePrepareResourcesResponse::default();
        for c in claims {
            let r = claim_ref(&c);
            let resp = match self.driver.prepare(&r).await {
                Ok(devices) => dra_v1::NodePrepareResourceResponse {
                    devices: devices.into_iter().map(device_v1).collect(),
                    error: String::new(),
                },
                Err(e) => {
                    let error = chain(&e);
                    tracing::warn!(claim = %r.uid, namespace = %r.namespace, name = %r.name, %error, "prepare failed");
                    dra_v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error,
                    }
                }
            };
            out.claims.insert(c.uid, resp);
        }
        out
    }

    async fn unprepare(
        &self,
        claims: Vec<dra_v1::Claim>,
    ) -> dra_v1::NodeUnprepareResourcesResponse {
        let mut out = dra_v1::NodeUnprepareResourcesResponse::default();
        for c in claims {
            let r = claim_ref(&c);
            let error = match self.driver.unprepare(&r).await {
                Ok(()) => String::new(),
                Err(e) => {
                    let error = chain(&e);
                    tracing::warn!(claim = %r.uid, %error, "unprepare failed");
                    error
                }
            };
            out.claims
                .insert(c.uid, dra_v1::NodeUnprepareResourceResponse { error });
        }
        out
    }
}

/// An error and its sources as one line, for the kubelet's events.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(cause) = src {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        src = cause.source();
    }
    s
}

fn claim_ref(c: &dra_v1::Claim) -> ClaimRef {
    ClaimRef {
        namespace: c.namespace.clone(),
        name: c.name.clone(),
        uid: c.uid.clone(),
    }
}

fn device_v1(p: Prepared) -> dra_v1::Device {
    dra_v1::Device {
        request_names: p.requests,
        pool_name: p.pool,
        device_name: p.device,
        cdi_device_ids: p.cdi_ids,
        share_id: None,
    }
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.prepare(req.into_inner().claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.unprepare(req.into_inner().claims).await))
    }
}

fn claims_from_v1beta1(claims: Vec<dra_v1beta1::Claim>) -> Vec<dra_v1::Claim> {
    claims
        .into_iter()
        .map(|c| dra_v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodePrepareResourcesResponse>, Status> {
        let v1 = self
            .prepare(claims_from_v1beta1(req.into_inner().claims))
            .await;
        let claims = v1
            .claims
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| dra_v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                let resp = dra_v1beta1::NodePrepareResourceResponse {
                    devices,
                    error: r.error,
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra_v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let v1 = self
            .unprepare(claims_from_v1beta1(req.into_inner().claims))
            .await;
        let claims = v1
            .claims
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    dra_v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(dra_v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

type V1Server = dra_v1::dra_plugin_server::DraPluginServer<DraService>;
type V1beta1Server = dra_v1beta1::dra_plugin_server::DraPluginServer<DraService>;
type HealthV1alpha1Server =
    dra_health_v1alpha1::dra_resource_health_server::DraResourceHealthServer<HealthService>;
type HealthV1Server =
    dra_health_v1::dra_resource_health_server::DraResourceHealthServer<HealthService>;

/// The services of the DRA socket, dispatched by the gRPC path's service name (tonic's own router
/// would link axum for four routes): the DRA service v1 and v1beta1, the health stream v1alpha1 and v1.
#[derive(Clone)]
pub struct DraRouter {
    v1: V1Server,
    v1beta1: V1beta1Server,
    health_v1alpha1: HealthV1alpha1Server,
    health_v1: HealthV1Server,
}

impl DraRouter {
    /// Serves `svc` as v1 and v1beta1 and `health` as v1alpha1 and v1.
    pub fn new(svc: DraService, health: HealthService) -> Self {
        DraRouter {
            v1: V1Server::new(svc.clone()),
            v1beta1: V1beta1Server::new(svc),
            health_v1alpha1: HealthV1alpha1Server::new(health.clone()),
            health_v1: HealthV1Server::new(health),
        }
    }
}

/// True if `path` (`/<package>.<Service>/<Method>`) calls service `name`.
fn calls(path: &str, name: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(name))
        .is_some_and(|rest| rest.starts_with('/'))
}

impl tonic::codegen::Service<tonic::codegen::http::Request<tonic::body::Body>> for DraRouter {
    type Response = tonic::codegen::http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = tonic::codegen::BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        // The generated servers are always ready.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::codegen::http::Request<tonic::body::Body>) -> Self::Future {
        use tonic::server::NamedService;
        let path = req.uri().path();
        if calls(path, V1Server::NAME) {
            let mut s = self.v1.clone();
            Box::pin(async move { s.call(req).await })
        } else if calls(path, V1beta1Server::NAME) {
            let mut s = self.v1beta1.clone();
            Box::pin(async move { s.call(req).await })
        } else if calls(path, HealthV1alpha1Server::NAME) {
            let mut s = self.health_v1alpha1.clone();
            Box::pin(async move { s.call(req).await })
        } else if calls(path, HealthV1Server::NAME) {
            let mut s = self.health_v1.clone();
            Box::pin(async move { s.call(req).await })
        } else {
            let status = Status::unimplemented(format!("{path} is not served on this socket"));
            Box::pin(async move { Ok(status.into_http()) })
        }
    }
}
