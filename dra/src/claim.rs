//! Reading a ResourceClaim's allocation. The kubelet's `NodePrepareResources` names a claim
//! (namespace, name, UID) but does not carry its allocation, so the plugin reads the claim from the
//! API server: `GET /apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}`, of which
//! it decodes only the fields below (field names from kubernetes/api `resource/v1/types.go`).
//!
//! [`ApiServer`] speaks plain HTTP/1.1 to a local proxy (`kubectl proxy` as a sidecar, on a Unix
//! socket or a loopback port), which holds the service-account credentials and the TLS to the API
//! server; the plugin itself links no TLS.

use std::collections::BTreeMap;
use std::path::PathBuf;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;

/// The annotation the ResourceClaim controller puts on claims it generates from a pod's
/// `resourceClaimTemplateName`: the pod's claim name (`pod.spec.resourceClaims[].name`).
pub const POD_CLAIM_NAME_ANNOTATION: &str = "resource.kubernetes.io/pod-claim-name";

/// The largest ResourceClaim body read (the API server's own request limit is 3 MiB).
const MAX_BODY: usize = 4 << 20;

/// The part of a `resource.k8s.io/v1` ResourceClaim the plugin reads; other fields are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ResourceClaim {
    /// Its object metadata.
    pub metadata: ClaimMeta,
    /// Its status; absent before the scheduler allocates it.
    #[serde(default)]
    pub status: Option<ClaimStatus>,
}

/// `metadata` of a ResourceClaim.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ClaimMeta {
    /// The claim's name.
    pub name: String,
    /// The claim's namespace.
    #[serde(default)]
    pub namespace: String,
    /// The claim's UID.
    pub uid: String,
    /// Its annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// `status` of a ResourceClaim.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ClaimStatus {
    /// The scheduler's allocation.
    #[serde(default)]
    pub allocation: Option<Allocation>,
}

/// `status.allocation`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Allocation {
    /// `status.allocation.devices`.
    #[serde(default)]
    pub devices: Option<DeviceAllocation>,
}

/// `status.allocation.devices`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct DeviceAllocation {
    /// One result per allocated device, of every driver.
    #[serde(default)]
    pub results: Vec<AllocationResult>,
}

/// One `DeviceRequestAllocationResult`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct AllocationResult {
    /// The request it satisfies: `<request>` or `<request>/<subrequest>`.
    pub request: String,
    /// The driver of the device.
    pub driver: String,
    /// The pool of the device.
    pub pool: String,
    /// The device's name within the pool.
    pub device: String,
}

impl ResourceClaim {
    /// The results of `driver`, in allocation order.
    pub fn results_of<'a>(&'a self, driver: &'a str) -> impl Iterator<Item = &'a AllocationResult> {
        self.status
            .iter()
            .filter_map(|s| s.allocation.as_ref())
            .filter_map(|a| a.devices.as_ref())
            .flat_map(|d| d.results.iter())
            .filter(move |r| r.driver == driver)
    }

    /// True once the scheduler has allocated it.
    pub fn is_allocated(&self) -> bool {
        self.status.as_ref().is_some_and(|s| s.allocation.is_some())
    }

    /// The pod's claim name for a claim generated from a template; `None` for a claim made directly.
    pub fn pod_claim_name(&self) -> Option<&str> {
        self.metadata
            .annotations
            .get(POD_CLAIM_NAME_ANNOTATION)
            .map(String::as_str)
    }
}

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The namespace or name has a character Kubernetes names cannot contain.
    #[error("claim {namespace}/{name} is not a valid Kubernetes object name")]
    BadName {
        /// The namespace given.
        namespace: String,
        /// The name given.
        name: String,
    },
    /// Connecting to or talking with the API server proxy failed.
    #[error(
        "cannot reach the API server proxy at {endpoint} to read claim {namespace}/{name}: is the proxy sidecar running?"
    )]
    Connect {
        /// The proxy's address.
        endpoint: String,
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server answered with an error status.
    #[error("the API server answered {status} for claim {namespace}/{name}: {body}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The start of the answer.
        body: String,
    },
    /// The answer is not a ResourceClaim.
    #[error(
        "the API server's answer for claim {namespace}/{name} is not a resource.k8s.io/v1 ResourceClaim"
    )]
    Decode {
        /// The claim's namespace.
        namespace: String,
        /// The claim's name.
        name: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// Where the plugin reads claims from: the API server ([`ApiServer`]) or, in tests, a fake.
#[async_trait::async_trait]
pub trait ClaimSource: Send + Sync {
    /// The claim `namespace/name` as the API server has it now.
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError>;
}

/// How to reach the API server proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyEndpoint {
    /// `unix:/path`: a Unix socket (`kubectl proxy --unix-socket=/path`).
    Unix(PathBuf),
    /// `http://host:port`: a TCP address, normally on the loopback.
    Tcp(String),
}

impl std::str::FromStr for ProxyEndpoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.starts_with('/') {
                return Ok(ProxyEndpoint::Unix(PathBuf::from(p)));
            }
        } else if let Some(hp) = s.strip_prefix("http://") {
            let hp = hp.trim_end_matches('/');
            if !hp.is_empty() && !hp.contains('/') {
                return Ok(ProxyEndpoint::Tcp(hp.to_string()));
            }
        }
        Err(format!(
            "{s:?} is not an API server proxy address: use unix:/absolute/path or http://host:port"
        ))
    }
}

impl std::fmt::Display for ProxyEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProxyEndpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            ProxyEndpoint::Tcp(hp) => write!(f, "http://{hp}"),
        }
    }
}

/// Reads claims through an HTTP proxy of the API server, one connection per read (a claim is read
/// once per prepare).
#[derive(Debug, Clone)]
pub struct ApiServer {
    endpoint: ProxyEndpoint,
}

impl ApiServer {
    /// A reader through the proxy at `endpoint`.
    pub fn new(endpoint: ProxyEndpoint) -> Self {
        ApiServer { endpoint }
    }

    async fn fetch(
        &self,
        path: &str,
    ) -> Result<(u16, Bytes), Box<dyn std::error::Error + Send + Sync>> {
        self.request(hyper::Method::GET, path, None).await
    }

    /// One HTTP request to the proxy (`body`: JSON), on a connection of its own: the status and up
    /// to 4 MiB of the answer.
    pub async fn request(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<(u16, Bytes), Box<dyn std::error::Error + Send + Sync>> {
        let host = match &self.endpoint {
            ProxyEndpoint::Unix(_) => "localhost".to_string(),
            ProxyEndpoint::Tcp(hp) => hp.clone(),
        };
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, host)
            .header(hyper::header::ACCEPT, "application/json");
        if body.is_some() {
            req = req.header(hyper::header::CONTENT_TYPE, "application/json");
        }
        let req = req.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = match &self.endpoint {
            ProxyEndpoint::Unix(p) => {
                let io = TokioIo::new(tokio::net::UnixStream::connect(p).await?);
                send(io, req).await?
            }
            ProxyEndpoint::Tcp(hp) => {
                let io = TokioIo::new(tokio::net::TcpStream::connect(hp.as_str()).await?);
                send(io, req).await?
            }
        };
        let status = resp.status().as_u16();
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await?
            .to_bytes();
        Ok((status, body))
    }

    /// The proxy's address.
    pub fn endpoint(&self) -> &ProxyEndpoint {
        &self.endpoint
    }
}

async fn send<T>(
    io: TokioIo<T>,
    req: hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper::Error>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
    let driver = tokio::spawn(conn);
    let resp = sender.send_request(req).await;
    drop(sender);
    // The connection task ends once the body is read and the sender is gone.
    drop(driver);
    resp
}

#[async_trait::async_trait]
impl ClaimSource for ApiServer {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        if !k8s_name(namespace) || !k8s_name(name) {
            return Err(ClaimError::BadName {
                namespace: namespace.to_string(),
                name: name.to_string(),
            });
        }
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}");
        let (status, body) = self
            .fetch(&path)
            .await
            .map_err(|source| ClaimError::Connect {
                endpoint: self.endpoint.to_string(),
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            })?;
        if status != 200 {
            let text = String::from_utf8_lossy(&body);
            return Err(ClaimError::Status {
                status,
                namespace: namespace.to_string(),
                name: name.to_string(),
                body: text.chars().take(200).collect(),
            });
        }
        serde_json::from_slice(&body).map_err(|source| ClaimError::Decode {
            namespace: namespace.to_string(),
            name: name.to_string(),
            source,
        })
    }
}

/// A DNS subdomain (RFC 1123), which claim names and namespaces are: lowercase letters, digits, `-`
/// and `.`, at most 253 characters, starting and ending with a letter or digit.
fn k8s_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(alnum)
        && s.bytes().last().is_some_and(alnum)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn decodes_the_allocation_of_a_claim() {
        let json = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim",
          "metadata":{"name":"vm-gpu","namespace":"vms","uid":"u-1",
            "annotations":{"resource.kubernetes.io/pod-claim-name":"gpu"}},
          "spec":{"devices":{"requests":[{"name":"vgpu","exactly":{"deviceClassName":"vgpu"}}]}},
          "status":{"allocation":{"devices":{"results":[
            {"request":"vgpu","driver":"vgpu.vgpu-manager.io","pool":"node-1","device":"gpu-0000-3b-00-0-vdi-2g-0"},
            {"request":"nic","driver":"other.example.com","pool":"node-1","device":"nic-0"}]}}}}"#;
        let c: ResourceClaim = serde_json::from_str(json).unwrap();
        assert!(c.is_allocated());
        assert_eq!(c.pod_claim_name(), Some("gpu"));
        let ours: Vec<_> = c.results_of("vgpu.vgpu-manager.io").collect();
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].device, "gpu-0000-3b-00-0-vdi-2g-0");
    }

    #[test]
    fn parses_proxy_addresses() {
        assert_eq!(
            "unix:/run/kp.sock".parse::<ProxyEndpoint>().unwrap(),
            ProxyEndpoint::Unix("/run/kp.sock".into())
        );
        assert_eq!(
            "http://127.0.0.1:8001/".parse::<ProxyEndpoint>().unwrap(),
            ProxyEndpoint::Tcp("127.0.0.1:8001".into())
        );
        for bad in ["https://x", "unix:rel", "http://", "http://a/b"] {
            assert!(bad.parse::<ProxyEndpoint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_checked_before_they_reach_a_url() {
        assert!(k8s_name("vm-gpu.1"));
        for bad in ["", "a/b", "A", "-a", "a-", "a?b", "..%2f"] {
            assert!(!k8s_name(bad), "{bad}");
        }
    }
}
