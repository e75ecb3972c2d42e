//! The world around the plugin in the integration tests: the real `vgpud` on its embedded bus with
//! the simulated `demo` host, a fake API server that serves ResourceClaims on a Unix socket (as
//! `kubectl proxy --unix-socket` would), the real `vgpu-dra-plugin` binary, and a fake kubelet made of
//! tonic clients generated from the same protos, dialing the plugin's real Unix sockets.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};
use vgpu_client::BusAddress;
use vgpu_dra::pb::{
    dra_health_v1, dra_health_v1alpha1, dra_v1, dra_v1beta1, pluginregistration as reg,
};

pub mod openapi;

/// How long to wait for what normally takes milliseconds; only a hang reaches it.
pub const PATIENCE: Duration = Duration::from_secs(60);
/// The driver name the tests run the plugin under.
pub const DRIVER: &str = "vgpu.vgpu-manager.io";
/// The node (pool) name.
pub const NODE: &str = "node-1";
/// A GPU of the `demo` host that serves `vdi-2g` as an mdev (NVIDIA T4, `nvidia-223`).
pub const GPU: &str = "0000:01:00.0";
/// The instance the `demo` host starts with, made outside vgpud (foreign).
pub const FOREIGN_UUID: &str = "8f0c2a43-6d1e-4b7a-9c55-0e4b1d2f7a61";

/// Where the `vgpud` binary is: `$VGPUD`, else next to the test binary's directory (`target/debug`).
fn vgpud_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("VGPUD") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let path = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("vgpud");
    assert!(
        path.is_file(),
        "{} is missing: build it first (cargo build -p vgpu-manager --bin vgpud; cargo test --workspace does) or set VGPUD",
        path.display()
    );
    path
}

/// A child process killed (SIGKILL, by pid) when dropped.
pub struct Proc {
    child: Option<Child>,
    pub log: PathBuf,
}

impl Proc {
    fn spawn(cmd: &mut Command, log: PathBuf) -> Proc {
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        Proc {
            child: Some(child),
            log,
        }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9`, then reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            let status = c.wait().unwrap();
            assert!(!status.success(), "killed by SIGKILL");
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(c.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
            let status = c.wait().unwrap();
            assert!(
                status.success(),
                "exit on SIGTERM: {status}\n{}",
                self.log()
            );
        }
    }

    /// Panics with its log if it has exited.
    pub fn assert_running(&mut self, what: &str) {
        if let Some(c) = self.child.as_mut()
            && let Some(st) = c.try_wait().unwrap()
        {
            panic!("{what} exited ({st}):\n{}", self.log());
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `vgpud --listen unix:path=<dir>/bus.sock --sim demo --state-dir <dir>/vgpud-state`, connected.
pub struct Vgpud {
    pub proc: Proc,
    pub bus: String,
    pub client: vgpu_client::Client,
}

impl Vgpud {
    pub async fn start(dir: &Path) -> Vgpud {
        Vgpud::start_with(dir, "demo", &[]).await
    }

    /// On the simulated host `sim` (a builtin name) instead of `demo`.
    pub async fn start_on(dir: &Path, sim: &str) -> Vgpud {
        Vgpud::start_with(dir, sim, &[]).await
    }

    /// With the simulated kernel kept in `<dir>/sim-journal`, which [`Vgpud::sysfs`] reads back.
    pub async fn start_journaled(dir: &Path) -> Vgpud {
        let journal = dir.join("sim-journal").display().to_string();
        Vgpud::start_with(dir, "demo", &["--sim-journal", &journal]).await
    }

    /// The simulated kernel as vgpud's journal (`start_journaled`) describes it now.
    pub fn sysfs(dir: &Path) -> vgpu_sim::SimHost {
        vgpu_sim::SimHost::builtin("demo")
            .unwrap()
            .replayed(&dir.join("sim-journal"))
            .unwrap()
    }

    async fn start_with(dir: &Path, sim: &str, extra: &[&str]) -> Vgpud {
        let bus = format!("unix:path={}", dir.join("bus.sock").display());
        let mut proc = Proc::spawn(
            Command::new(vgpud_binary())
                .args(["--listen", &bus, "--sim", sim, "--state-dir"])
                .arg(dir.join("vgpud-state"))
                .args(extra)
                .env("VGPU_LOG", "info"),
            dir.join("vgpud.log"),
        );
        let addr: BusAddress = bus.parse().unwrap();
        let start = Instant::now();
        let client = loop {
            if let Ok(c) = vgpu_client::Client::connect(&addr).await {
                break c;
            }
            proc.assert_running("vgpud");
            assert!(
                start.elapsed() < PATIENCE,
                "vgpud did not come up:\n{}",
                proc.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        Vgpud { proc, bus, client }
    }

    /// Every instance vgpud lists.
    pub async fn instances(&self) -> Vec<vgpu_client::InstanceInfo> {
        self.client.list_instances().await.unwrap()
    }

    /// The instances vgpud has for the plugin (labelled `dra:`), by UUID.
    pub async fn dra_instances(&self) -> Vec<vgpu_client::InstanceInfo> {
        let mut v: Vec<_> = self
            .instances()
            .await
            .into_iter()
            .filter(|i| i.label.starts_with("dra:"))
            .collect();
        v.sort_by(|a, b| a.uuid.cmp(&b.uuid));
        v
    }
}

/// A fake API server on a Unix socket, as `kubectl proxy --unix-socket` would be: answers
/// `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}` from a map (404 otherwise),
/// and keeps `resource.k8s.io/v1` ResourceSlices as the API server does (list with a field selector
/// on `spec.nodeName` and `spec.driver`, create, update with a resource-version check, delete).
/// Every slice written is checked against Kubernetes' OpenAPI schema and the rules its descriptions
/// state ([`openapi`]); a slice that fails is refused with 422, as the API server would, and
/// recorded in [`FakeApi::rejected`].
#[derive(Clone)]
pub struct FakeApi {
    pub socket: PathBuf,
    claims: Arc<Mutex<HashMap<String, serde_json::Value>>>,
    reads: Arc<Mutex<usize>>,
    slices: Arc<Mutex<SliceStore>>,
}

/// The ResourceSlices the fake API server holds.
#[derive(Default)]
pub struct SliceStore {
    /// By name.
    pub objects: std::collections::BTreeMap<String, serde_json::Value>,
    /// The last resource version given out.
    pub version: u64,
    /// Creates, updates and deletes answered with success.
    pub writes: usize,
    /// Every refused write: (method and name, why).
    pub rejected: Vec<(String, String)>,
}

const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";

fn json_answer(status: u16, body: String) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn status_answer(code: u16, reason: &str, message: &str) -> hyper::Response<Full<Bytes>> {
    json_answer(
        code,
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "reason": reason, "message": message, "code": code})
        .to_string(),
    )
}

impl FakeApi {
    pub fn start(dir: &Path) -> FakeApi {
        let socket = dir.join("api.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let api = FakeApi {
            socket,
            claims: Arc::default(),
            reads: Arc::default(),
            slices: Arc::default(),
        };
        let served = api.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let api = served.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let api = api.clone();
                        async move { Ok::<_, std::convert::Infallible>(api.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        api
    }

    async fn answer(
        &self,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> hyper::Response<Full<Bytes>> {
        use http_body_util::BodyExt;
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = req.uri().query().unwrap_or("").to_string();
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        if path == SLICES || path.starts_with(&format!("{SLICES}/")) {
            return self.slice_answer(&method, &path, &query, &body);
        }
        *self.reads.lock().unwrap() += 1;
        let found = self.claims.lock().unwrap().get(&path).cloned();
        match found {
            Some(v) if method == hyper::Method::GET => json_answer(200, v.to_string()),
            _ => status_answer(404, "NotFound", "not found"),
        }
    }

    fn slice_answer(
        &self,
        method: &hyper::Method,
        path: &str,
        query: &str,
        body: &[u8],
    ) -> hyper::Response<Full<Bytes>> {
        let mut store = self.slices.lock().unwrap();
        let name = path.strip_prefix(&format!("{SLICES}/")).map(str::to_string);
        match (method.as_str(), name) {
            ("GET", None) => {
                let query = query.replace("%3D", "=").replace("%2C", ",");
                let selector: Vec<(String, String)> = query
                    .split('&')
                    .filter_map(|kv| kv.strip_prefix("fieldSelector="))
                    .flat_map(|s| s.split(','))
                    .filter_map(|t| t.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let items: Vec<&serde_json::Value> = store
                    .objects
                    .values()
                    .filter(|o| {
                        selector.iter().all(|(k, v)| match k.as_str() {
                            "spec.nodeName" => o["spec"]["nodeName"] == v.as_str(),
                            "spec.driver" => o["spec"]["driver"] == v.as_str(),
                            _ => false,
                        })
                    })
                    .collect();
                let list = serde_json::json!({"apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSliceList",
                    "metadata": {"resourceVersion": store.version.to_string()},
                    "items": items});
                json_answer(200, list.to_string())
            }
            ("POST", None) | ("PUT", Some(_)) => {
                let what = format!("{method} {path}");
                let mut obj: serde_json::Value = match serde_json::from_slice(body) {
                    Ok(v) => v,
                    Err(e) => {
                        store.rejected.push((what, e.to_string()));
                        return status_answer(400, "BadRequest", &e.to_string());
                    }
                };
                let mut errors = openapi::validate("io.k8s.api.resource.v1.ResourceSlice", &obj);
                errors.extend(openapi::resource_slice_rules(&obj));
                if obj["apiVersion"] != "resource.k8s.io/v1" || obj["kind"] != "ResourceSlice" {
                    errors.push("apiVersion/kind is not resource.k8s.io/v1 ResourceSlice".into());
                }
                let obj_name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
                if let Some(n) = path.strip_prefix(&format!("{SLICES}/"))
                    && n != obj_name
                {
                    errors.push(format!("metadata.name {obj_name:?} is not the URL's {n:?}"));
                }
                if !errors.is_empty() {
                    let why = errors.join("; ");
                    store.rejected.push((what, why.clone()));
                    return status_answer(422, "Invalid", &why);
                }
                let existing = store.objects.get(&obj_name).cloned();
                match (method.as_str(), existing) {
                    ("POST", Some(_)) => {
                        return status_answer(409, "AlreadyExists", &obj_name);
                    }
                    ("PUT", None) => return status_answer(404, "NotFound", &obj_name),
                    ("PUT", Some(old)) => {
                        if obj["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"]
                        {
                            return status_answer(409, "Conflict", "the object has been modified");
                        }
                        obj["metadata"]["uid"] = old["metadata"]["uid"].clone();
                    }
                    _ => obj["metadata"]["uid"] = format!("uid-{obj_name}").into(),
                }
                store.version += 1;
                obj["metadata"]["resourceVersion"] = store.version.to_string().into();
                store.objects.insert(obj_name, obj.clone());
                store.writes += 1;
                json_answer(
                    if method == hyper::Method::POST {
                        201
                    } else {
                        200
                    },
                    obj.to_string(),
                )
            }
            ("DELETE", Some(n)) => match store.objects.remove(&n) {
                Some(_) => {
                    store.writes += 1;
                    status_answer(200, "", "deleted")
                }
                None => status_answer(404, "NotFound", &n),
            },
            _ => status_answer(405, "MethodNotAllowed", path),
        }
    }

    /// Serves `claim` (a ResourceClaim object) at its path.
    pub fn put(&self, claim: serde_json::Value) {
        let ns = claim["metadata"]["namespace"].as_str().unwrap();
        let name = claim["metadata"]["name"].as_str().unwrap();
        let path = format!("/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}");
        self.claims.lock().unwrap().insert(path, claim);
    }

    /// Stops serving every claim.
    pub fn clear(&self) {
        self.claims.lock().unwrap().clear();
    }

    /// How many requests for claims it answered (the slice requests are not counted).
    pub fn reads(&self) -> usize {
        *self.reads.lock().unwrap()
    }

    /// The ResourceSlices it holds now, by name.
    pub fn slices(&self) -> Vec<serde_json::Value> {
        self.slices
            .lock()
            .unwrap()
            .objects
            .values()
            .cloned()
            .collect()
    }

    /// How many slice writes succeeded so far.
    pub fn slice_writes(&self) -> usize {
        self.slices.lock().unwrap().writes
    }

    /// Every slice write it refused, with why.
    pub fn rejected(&self) -> Vec<(String, String)> {
        self.slices.lock().unwrap().rejected.clone()
    }

    /// Stores `obj` as a slice some other writer made (no checks), e.g. a leftover of an older
    /// plugin.
    pub fn insert_slice(&self, mut obj: serde_json::Value) {
        let mut store = self.slices.lock().unwrap();
        store.version += 1;
        obj["metadata"]["resourceVersion"] = store.version.to_string().into();
        let name = obj["metadata"]["name"].as_str().unwrap().to_string();
        store.objects.insert(name, obj);
    }
}

/// An allocated ResourceClaim: `devices` are (request, pool, device) of our driver.
pub fn claim(ns: &str, name: &str, uid: &str, devices: &[(&str, &str, &str)]) -> serde_json::Value {
    let results: Vec<_> = devices
        .iter()
        .map(|(request, pool, device)| {
            serde_json::json!({"request": request, "driver": DRIVER, "pool": pool, "device": device})
        })
        .collect();
    serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "vgpu", "exactly": {"deviceClassName": "vgpu.vgpu-manager.io"}}]}},
        "status": {"allocation": {"devices": {"results": results}}}
    })
}

/// The plugin's directories and process.
pub struct Plugin {
    pub dir: PathBuf,
    pub proc: Proc,
    starts: usize,
}

impl Plugin {
    pub fn registry_dir(dir: &Path) -> PathBuf {
        dir.join("plugins_registry")
    }
    pub fn plugins_dir(dir: &Path) -> PathBuf {
        dir.join("plugins")
    }
    pub fn cdi_dir(dir: &Path) -> PathBuf {
        dir.join("cdi")
    }
    pub fn registration_socket(&self) -> PathBuf {
        Plugin::registry_dir(&self.dir).join(format!("{DRIVER}-reg.sock"))
    }
    pub fn dra_socket(&self) -> PathBuf {
        Plugin::plugins_dir(&self.dir).join(DRIVER).join("dra.sock")
    }
    pub fn checkpoint(&self) -> serde_json::Value {
        let p = Plugin::plugins_dir(&self.dir)
            .join(DRIVER)
            .join("checkpoint.json");
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }
    pub fn cdi_spec(&self, claim_uid: &str) -> PathBuf {
        Plugin::cdi_dir(&self.dir).join(format!("vgpu-manager.io-{claim_uid}.json"))
    }
    pub fn metadata_file(&self, claim_uid: &str, request: &str) -> PathBuf {
        Plugin::plugins_dir(&self.dir)
            .join(DRIVER)
            .join("metadata")
            .join(claim_uid)
            .join(request)
            .join(format!("{DRIVER}-metadata.json"))
    }

    /// Starts the plugin against `vgpud` and `api` and waits until its registration socket answers.
    pub async fn start(
        dir: &Path,
        vgpud: &Vgpud,
        api: &FakeApi,
        failpoint: Option<&str>,
    ) -> Plugin {
        let proc = Plugin::launch(dir, vgpud, api, failpoint, 1).await;
        Plugin {
            dir: dir.to_path_buf(),
            proc,
            starts: 1,
        }
    }

    /// Starts the plugin again (after [`Proc::kill9`] or [`Proc::terminate`]).
    pub async fn restart(&mut self, vgpud: &Vgpud, api: &FakeApi, failpoint: Option<&str>) {
        self.starts += 1;
        self.proc = Plugin::launch(&self.dir, vgpud, api, failpoint, self.starts).await;
    }

    async fn launch(
        dir: &Path,
        vgpud: &Vgpud,
        api: &FakeApi,
        failpoint: Option<&str>,
        n: usize,
    ) -> Proc {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vgpu-dra-plugin"));
        cmd.arg("--driver-name")
            .arg(DRIVER)
            .arg("--node-name")
            .arg(NODE)
            .arg("--registry-dir")
            .arg(Plugin::registry_dir(dir))
            .arg("--plugins-dir")
            .arg(Plugin::plugins_dir(dir))
            .arg("--cdi-dir")
            .arg(Plugin::cdi_dir(dir))
            .arg("--bus")
            .arg(&vgpud.bus)
            .arg("--api-proxy")
            .arg(format!("unix:{}", api.socket.display()))
            .arg("--health-interval-ms")
            .arg("200")
            .arg("--slice-interval-ms")
            .arg("300")
            .env("VGPU_LOG", "debug")
            .env_remove("VGPU_DRA_FAILPOINT");
        if let Some(f) = failpoint {
            cmd.env("VGPU_DRA_FAILPOINT", f);
        }
        let mut proc = Proc::spawn(&mut cmd, dir.join(format!("plugin-{n}.log")));
        let socket = Plugin::registry_dir(dir).join(format!("{DRIVER}-reg.sock"));
        let start = Instant::now();
        loop {
            if let Ok(mut k) = Kubelet::registration(&socket).await
                && k.get_info(reg::InfoRequest {}).await.is_ok()
            {
                return proc;
            }
            proc.assert_running("vgpu-dra-plugin");
            assert!(
                start.elapsed() < PATIENCE,
                "the plugin did not come up:\n{}",
                proc.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The fake kubelet's clients.
pub struct Kubelet;

/// A gRPC channel over the Unix socket at `path` (the URI is required by tonic and ignored).
async fn channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_path_buf();
    Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
        }))
        .await
}

impl Kubelet {
    pub async fn registration(
        path: &Path,
    ) -> Result<reg::registration_client::RegistrationClient<Channel>, tonic::transport::Error>
    {
        Ok(reg::registration_client::RegistrationClient::new(
            channel(path).await?,
        ))
    }

    pub async fn v1(path: &Path) -> dra_v1::dra_plugin_client::DraPluginClient<Channel> {
        dra_v1::dra_plugin_client::DraPluginClient::new(channel(path).await.unwrap())
    }

    pub async fn health_v1alpha1(
        path: &Path,
    ) -> dra_health_v1alpha1::dra_resource_health_client::DraResourceHealthClient<Channel> {
        dra_health_v1alpha1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(path).await.unwrap(),
        )
    }

    pub async fn health_v1(
        path: &Path,
    ) -> dra_health_v1::dra_resource_health_client::DraResourceHealthClient<Channel> {
        dra_health_v1::dra_resource_health_client::DraResourceHealthClient::new(
            channel(path).await.unwrap(),
        )
    }

    pub async fn v1beta1(path: &Path) -> dra_v1beta1::dra_plugin_client::DraPluginClient<Channel> {
        dra_v1beta1::dra_plugin_client::DraPluginClient::new(channel(path).await.unwrap())
    }
}

/// The kubelet's claim reference.
pub fn claim_ref(ns: &str, name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim {
        namespace: ns.into(),
        uid: uid.into(),
        name: name.into(),
    }
}

/// Waits until `f` holds.
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
