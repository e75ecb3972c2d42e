//! Publishing the node's ResourceSlices ([`crate::slices`]) through the API server proxy: list the
//! slices of this driver on this node, and when their content differs from what should be there,
//! write every slice of the pool at a new generation (update the ones that exist, create the
//! missing), then delete the ones left over. Nothing is written when nothing changed.
//!
//! Requests (resource.k8s.io/v1, field names from kubernetes/api `resource/v1/types.go`):
//! `GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>`,
//! `POST /apis/resource.k8s.io/v1/resourceslices`, `PUT` and `DELETE` of
//! `/apis/resource.k8s.io/v1/resourceslices/<name>`. An update carries the resource version the list
//! returned, so a concurrent writer makes it fail with 409 instead of being overwritten; the next
//! publication starts again from a fresh list.

use serde::Deserialize;

use crate::claim::ApiServer;
use crate::slices::{ResourceSlice, content};

const COLLECTION: &str = "/apis/resource.k8s.io/v1/resourceslices";

/// Why a publication failed; the next one starts over.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The proxy could not be reached.
    #[error(
        "cannot reach the API server proxy at {endpoint} to {action}: is the proxy sidecar running?"
    )]
    Connect {
        /// The proxy's address.
        endpoint: String,
        /// What the request was for.
        action: String,
        /// What failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The API server refused the request.
    #[error("the API server answered {status} to {action}: {body}")]
    Status {
        /// What the request was for.
        action: String,
        /// The HTTP status.
        status: u16,
        /// The start of the answer (a `Status` object naming the problem).
        body: String,
    },
    /// The list is not a ResourceSliceList.
    #[error("the API server's answer to {action} is not a resource.k8s.io/v1 ResourceSliceList")]
    Decode {
        /// What the request was for.
        action: String,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
}

/// What one publication did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Published {
    /// The pool's generation now.
    pub generation: i64,
    /// Slices created.
    pub created: usize,
    /// Slices updated.
    pub updated: usize,
    /// Slices deleted.
    pub deleted: usize,
}

impl Published {
    /// Whether anything was written.
    pub fn wrote(&self) -> bool {
        self.created + self.updated + self.deleted > 0
    }
}

/// One slice as listed: its name, version, generation, and content when it parses as ours.
#[derive(Debug, Clone)]
struct Existing {
    name: String,
    resource_version: Option<String>,
    generation: i64,
    slice: Option<ResourceSlice>,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

/// Publishes the slices of driver `driver` on node `node`.
#[derive(Debug, Clone)]
pub struct Publisher {
    api: ApiServer,
    driver: String,
    node: String,
}

impl Publisher {
    /// A publisher through `api`.
    pub fn new(api: ApiServer, driver: &str, node: &str) -> Self {
        Publisher {
            api,
            driver: driver.to_string(),
            node: node.to_string(),
        }
    }

    async fn call(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<Vec<u8>>,
        action: &str,
        ok: &[u16],
    ) -> Result<hyper::body::Bytes, PublishError> {
        let (status, bytes) = self
            .api
            .request(method, path, body)
            .await
            .map_err(|source| PublishError::Connect {
                endpoint: self.api.endpoint().to_string(),
                action: action.to_string(),
                source,
            })?;
        if !ok.contains(&status) {
            return Err(PublishError::Status {
                action: action.to_string(),
                status,
                body: String::from_utf8_lossy(&bytes).chars().take(300).collect(),
            });
        }
        Ok(bytes)
    }

    async fn list(&self) -> Result<Vec<Existing>, PublishError> {
        let action = format!(
            "list the ResourceSlices of {} on node {}",
            self.driver, self.node
        );
        let path = format!(
            "{COLLECTION}?fieldSelector=spec.nodeName%3D{}%2Cspec.driver%3D{}",
            self.node, self.driver
        );
        let bytes = self
            .call(hyper::Method::GET, &path, None, &action, &[200])
            .await?;
        let list: List = serde_json::from_slice(&bytes).map_err(|source| PublishError::Decode {
            action: action.clone(),
            source,
        })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|v| {
                let meta = v.get("metadata")?;
                let name = meta.get("name")?.as_str()?.to_string();
                let resource_version = meta
                    .get("resourceVersion")
                    .and_then(|r| r.as_str())
                    .map(str::to_string);
                let generation = v
                    .pointer("/spec/pool/generation")
                    .and_then(serde_json::Value::as_i64)
                    .unwrap_or(0);
                let slice = serde_json::from_value(v).ok();
                Some(Existing {
                    name,
                    resource_version,
                    generation,
                    slice,
                })
            })
            .collect())
    }

    /// Makes the pool hold the slices `want` (their generation is set here): nothing when the listed
    /// slices already hold that content, else every slice written at the next generation and the
    /// rest deleted.
    pub async fn sync(&self, mut want: Vec<ResourceSlice>) -> Result<Published, PublishError> {
        let existing = self.list().await?;
        let current = existing.iter().map(|e| e.generation).max().unwrap_or(0);
        let listed: Option<Vec<ResourceSlice>> = existing.iter().map(|e| e.slice.clone()).collect();
        let same = listed.is_some_and(|l| content(&l) == content(&want))
            && existing.iter().all(|e| {
                e.slice.as_ref().is_some_and(|s| {
                    s.spec.pool.resource_slice_count == i64::try_from(want.len()).unwrap_or(-1)
                        && s.spec.pool.generation == current
                })
            });
        if same {
            return Ok(Published {
                generation: current,
                ..Published::default()
            });
        }
        let generation = current.saturating_add(1);
        let mut done = Published {
            generation,
            ..Published::default()
        };
        for slice in &mut want {
            slice.spec.pool.generation = generation;
        }
        for mut slice in want.iter().cloned() {
            let name = slice.metadata.name.clone();
            match existing.iter().find(|e| e.name == name) {
                Some(e) => {
                    slice.metadata.resource_version = e.resource_version.clone();
                    let body = serde_json::to_vec(&slice).unwrap_or_default();
                    let action = format!("update ResourceSlice {name}");
                    self.call(
                        hyper::Method::PUT,
                        &format!("{COLLECTION}/{name}"),
                        Some(body),
                        &action,
                        &[200, 201],
                    )
                    .await?;
                    done.updated += 1;
                }
                None => {
                    let body = serde_json::to_vec(&slice).unwrap_or_default();
                    let action = format!("create ResourceSlice {name}");
                    self.call(
                        hyper::Method::POST,
                        COLLECTION,
                        Some(body),
                        &action,
                        &[200, 201, 202],
                    )
                    .await?;
                    done.created += 1;
                }
            }
        }
        let keep: Vec<String> = want.iter().map(|s| s.metadata.name.clone()).collect();
        for e in existing.iter().filter(|e| !keep.contains(&e.name)) {
            let action = format!("delete ResourceSlice {}", e.name);
            self.call(
                hyper::Method::DELETE,
                &format!("{COLLECTION}/{}", e.name),
                None,
                &action,
                &[200, 202, 404],
            )
            .await?;
            done.deleted += 1;
        }
        Ok(done)
    }
}
