//! The Kubernetes DRA kubelet plugin on the real kernel: the real `vgpu-dra-plugin` (shipped static
//! next to `kernel-tests`) over vgpud on the guest's sysfs, a fake API server (HTTP/1.1 on a Unix
//! socket, as `kubectl proxy --unix-socket` serves it: the claim, and the ResourceSlices the plugin
//! publishes) and a fake kubelet (tonic clients from the plugin's own protos, over its real sockets).
//!
//! The plugin publishes the kernel's `mbochs` sample (a virtual mdev parent) as devices
//! `parent-mbochs-<profile>-<n>` with its counter set; a prepare of one of them makes a real mdev of
//! the profile's type, the CDI spec names the `/dev/vfio` nodes of its real IOMMU group (which exist),
//! the device-metadata file names the mdev; unprepare removes the mdev and the files.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tonic::transport::{Channel, Endpoint, Uri};
use vgpu_dra::pb::{dra_v1, pluginregistration as reg};

use super::daemon::{availability, daemon, ensure_restored};
use super::guest::Guest;
use super::runner::{Outcome, Test, TestError, TestResult, ensure, ensure_eq};

/// The tests.
pub fn tests() -> Vec<Test<Guest>> {
    vec![Test::new(
        "dra_plugin_prepares_a_real_mdev_and_publishes_mbochs",
        prepare_on_mbochs,
    )]
}

const DRIVER: &str = "vgpu.vgpu-manager.io";
const NODE: &str = "guest";
const NS: &str = "vms";
const CLAIM: &str = "vm-a";
const UID: &str = "uid-dra-a";
/// The shipped profile mbochs serves with its `mbochs-small` type (4 MB).
const PROFILE: &str = "sample-display-4m";
const DEVICE: &str = "parent-mbochs-sample-display-4m-0";
/// Only a hang reaches it.
const WITHIN: Duration = Duration::from_secs(60);

fn check(msg: impl Into<String>) -> TestError {
    TestError::Check(msg.into())
}

/// What the fake API server keeps.
#[derive(Default)]
struct ApiState {
    claim: Option<Value>,
    slices: BTreeMap<String, Value>,
    version: u64,
    requests: Vec<String>,
}

/// One HTTP/1.1 request: method, path with query, body.
fn read_request(stream: &mut UnixStream) -> std::io::Result<(String, String, Vec<u8>)> {
    let mut r = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let mut length = 0usize;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 || h == "\r\n" {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().unwrap_or(0);
        }
    }
    let mut body = vec![0; length];
    r.read_exact(&mut body)?;
    Ok((method, path, body))
}

fn answer(state: &Mutex<ApiState>, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
    let mut s = state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    s.requests.push(format!("{method} {path}"));
    let claim_path = format!("/apis/resource.k8s.io/v1/namespaces/{NS}/resourceclaims/{CLAIM}");
    let not_found = json!({"kind": "Status", "code": 404, "reason": "NotFound"});
    let (route, _query) = path.split_once('?').unwrap_or((path, ""));
    match (method, route) {
        ("GET", p) if p == claim_path => match &s.claim {
            Some(c) => (200, c.clone()),
            None => (404, not_found),
        },
        ("GET", SLICES) => (
            200,
            json!({"kind": "ResourceSliceList", "apiVersion": "resource.k8s.io/v1",
                "items": s.slices.values().cloned().collect::<Vec<_>>()}),
        ),
        ("POST", SLICES) | ("PUT", _) => {
            let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
                return (400, json!({"kind": "Status", "code": 400}));
            };
            let name = obj["metadata"]["name"].as_str().unwrap_or("").to_string();
            s.version += 1;
            obj["metadata"]["resourceVersion"] = s.version.to_string().into();
            s.slices.insert(name, obj.clone());
            (if method == "POST" { 201 } else { 200 }, obj)
        }
        ("DELETE", p) => {
            let name = p.rsplit('/').next().unwrap_or("").to_string();
            match s.slices.remove(&name) {
                Some(_) => (200, json!({"kind": "Status", "code": 200})),
                None => (404, not_found),
            }
        }
        _ => (404, not_found),
    }
}

/// Serves the fake API server on `socket` in a thread of its own (one request per connection, as
/// the plugin makes them).
fn serve_api(socket: &Path, state: Arc<Mutex<ApiState>>) -> Result<(), TestError> {
    let listener = UnixListener::bind(socket)
        .map_err(|e| check(format!("cannot bind {}: {e}", socket.display())))?;
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut stream) = conn else { continue };
            let Ok((method, path, body)) = read_request(&mut stream) else {
                continue;
            };
            let (code, v) = answer(&state, &method, &path, &body);
            let text = v.to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    Ok(())
}

/// The plugin process, killed when dropped.
struct Plugin {
    child: Child,
    log: PathBuf,
}

impl Plugin {
    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn fail(&self, what: &str) -> TestError {
        check(format!("{what}\n  plugin log:\n{}", self.log_text()))
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn plugin_binary() -> Result<PathBuf, TestError> {
    let p = super::vgpud::binary()?.with_file_name("vgpu-dra-plugin");
    ensure(p.is_file(), || {
        format!(
            "{} is missing: scripts/vm-test ships the static vgpu-dra-plugin next to kernel-tests",
            p.display()
        )
    })?;
    Ok(p)
}

async fn channel(path: PathBuf) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_static("http://[::]:0")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

fn runtime() -> Result<tokio::runtime::Runtime, TestError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| check(format!("cannot start a tokio runtime: {e}")))
}

/// The slices once one lists `DEVICE`.
fn wait_for_slices(state: &Mutex<ApiState>, plugin: &Plugin) -> Result<Vec<Value>, TestError> {
    let start = Instant::now();
    loop {
        let slices: Vec<Value> = state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .slices
            .values()
            .cloned()
            .collect();
        let has = slices.iter().any(|s| {
            s["spec"]["devices"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["name"] == DEVICE))
        });
        if has {
            return Ok(slices);
        }
        if start.elapsed() > WITHIN {
            return Err(plugin.fail(&format!(
                "the plugin published no device {DEVICE}; slices: {slices:#?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn mdev_dir(uuid: &str) -> PathBuf {
    PathBuf::from("/sys/bus/mdev/devices").join(uuid)
}

fn prepare_on_mbochs(g: &Guest) -> TestResult {
    let before = availability(g)?;
    let (work, d) = daemon("dra")?;
    let w = work.path();
    let state = Arc::new(Mutex::new(ApiState::default()));
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .claim = Some(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": CLAIM, "namespace": NS, "uid": UID},
        "status": {"allocation": {"devices": {"results": [
            {"request": "vgpu", "driver": DRIVER, "pool": NODE, "device": DEVICE}]}}}
    }));
    let api = w.join("api.sock");
    serve_api(&api, state.clone())?;
    let (registry, plugins, cdi) = (w.join("registry"), w.join("plugins"), w.join("cdi"));
    let log = w.join("plugin.log");
    let log_file =
        std::fs::File::create(&log).map_err(|e| check(format!("{}: {e}", log.display())))?;
    let err_file = log_file
        .try_clone()
        .map_err(|e| check(format!("{}: {e}", log.display())))?;
    let child = Command::new(plugin_binary()?)
        .args(["--driver-name", DRIVER, "--node-name", NODE])
        .arg("--registry-dir")
        .arg(&registry)
        .arg("--plugins-dir")
        .arg(&plugins)
        .arg("--cdi-dir")
        .arg(&cdi)
        .args(["--bus", d.bus()])
        .arg("--api-proxy")
        .arg(format!("unix:{}", api.display()))
        .args(["--slice-interval-ms", "500"])
        .env("VGPU_LOG", "debug")
        .stdout(Stdio::from(log_file))
        .stderr(Stdio::from(err_file))
        .spawn()
        .map_err(|e| check(format!("cannot start vgpu-dra-plugin: {e}")))?;
    let mut plugin = Plugin { child, log };

    // The published slices name the mbochs devices, drawing from its counter set.
    let slices = wait_for_slices(&state, &plugin)?;
    let device = slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().cloned().unwrap_or_default())
        .find(|d| d["name"] == DEVICE)
        .ok_or_else(|| check("device vanished"))?;
    ensure_eq(
        "the device's profile attribute",
        device["attributes"]["profile"]["string"].as_str(),
        Some(PROFILE),
    )?;
    ensure_eq(
        "the device's type attribute",
        device["attributes"]["type"]["string"].as_str(),
        Some("mbochs-small"),
    )?;
    ensure_eq(
        "the device's counter set",
        device["consumesCounters"][0]["counterSet"].as_str(),
        Some("parent-mbochs"),
    )?;
    let sets: Vec<String> = slices
        .iter()
        .flat_map(|s| {
            s["spec"]["sharedCounters"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    ensure(sets.iter().any(|n| n == "parent-mbochs"), || {
        format!("no counter set parent-mbochs among {sets:?}")
    })?;
    for s in &slices {
        ensure(
            s["spec"]["devices"].as_array().is_none_or(Vec::is_empty)
                || s["spec"]["sharedCounters"]
                    .as_array()
                    .is_none_or(Vec::is_empty),
            || format!("a slice with devices and counters: {s:#}"),
        )?;
    }

    let rt = runtime()?;
    let dra_sock = plugins.join(DRIVER).join("dra.sock");
    let reg_sock = registry.join(format!("{DRIVER}-reg.sock"));
    let prepared = rt.block_on(async {
        let info = reg::registration_client::RegistrationClient::new(
            channel(reg_sock.clone())
                .await
                .map_err(|e| plugin.fail(&format!("dial {}: {e}", reg_sock.display())))?,
        )
        .get_info(reg::InfoRequest {})
        .await
        .map_err(|e| plugin.fail(&format!("GetInfo: {e}")))?
        .into_inner();
        ensure_eq(
            "the registration's plugin type",
            info.r#type.as_str(),
            "DRAPlugin",
        )?;
        let mut k = dra_v1::dra_plugin_client::DraPluginClient::new(
            channel(dra_sock.clone())
                .await
                .map_err(|e| plugin.fail(&format!("dial {}: {e}", dra_sock.display())))?,
        );
        let claim = dra_v1::Claim {
            namespace: NS.into(),
            uid: UID.into(),
            name: CLAIM.into(),
        };
        let resp = k
            .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                claims: vec![claim],
            })
            .await
            .map_err(|e| plugin.fail(&format!("NodePrepareResources: {e}")))?
            .into_inner();
        Ok::<_, TestError>((k, resp))
    })?;
    let (mut k, resp) = prepared;
    let r = resp
        .claims
        .get(UID)
        .ok_or_else(|| plugin.fail(&format!("no answer for the claim: {resp:?}")))?;
    ensure(r.error.is_empty(), || {
        format!("prepare failed: {}\n{}", r.error, plugin.log_text())
    })?;

    // The real mdev: vgpud made it on mbochs with the profile's type.
    let ours: Vec<_> = d
        .list_instances()?
        .into_iter()
        .filter(|i| i.label == format!("dra:{NS}/{CLAIM}"))
        .collect();
    ensure_eq("vGPUs the plugin made", ours.len(), 1)?;
    let uuid = ours[0].uuid.clone();
    ensure_eq("its parent", ours[0].parent.as_str(), "mbochs")?;
    ensure_eq("its state", ours[0].state.as_str(), "running")?;
    let type_link = std::fs::read_link(mdev_dir(&uuid).join("mdev_type"))
        .map_err(|e| check(format!("{}: {e}", mdev_dir(&uuid).display())))?;
    ensure_eq(
        "the mdev's type in sysfs",
        type_link.file_name().and_then(|n| n.to_str()),
        Some("mbochs-small"),
    )?;
    let group = std::fs::read_link(mdev_dir(&uuid).join("iommu_group"))
        .map_err(|e| check(format!("iommu_group of {uuid}: {e}")))?;
    let group = group
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default()
        .to_string();

    // The CDI spec names the group's device nodes, which exist; the metadata names the mdev.
    let spec_path = cdi.join(format!("vgpu-manager.io-{UID}.json"));
    let spec: Value = serde_json::from_slice(
        &std::fs::read(&spec_path)
            .map_err(|e| plugin.fail(&format!("{}: {e}", spec_path.display())))?,
    )
    .map_err(|e| check(format!("{}: {e}", spec_path.display())))?;
    let nodes: Vec<String> = spec["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n["path"].as_str().map(str::to_string))
        .collect();
    ensure(nodes.contains(&format!("/dev/vfio/{group}")), || {
        format!("the CDI spec's nodes {nodes:?} do not name /dev/vfio/{group}")
    })?;
    for n in &nodes {
        ensure(Path::new(n).exists(), || {
            format!("CDI device node {n} does not exist in the guest")
        })?;
    }
    let cdi_ids: Vec<&String> = r
        .devices
        .iter()
        .flat_map(|d| d.cdi_device_ids.iter())
        .collect();
    ensure(!cdi_ids.is_empty(), || format!("no CDI ids in {r:?}"))?;
    let metadata = find_metadata(&plugins.join(DRIVER).join("metadata"))?;
    ensure(metadata.contains(&uuid), || {
        format!("the device-metadata file does not name mdev {uuid}: {metadata}")
    })?;
    ensure(!metadata.contains("pciBusID"), || {
        format!("a virtual parent has no PCI bus id, yet the metadata gives one: {metadata}")
    })?;

    // Unprepare: the mdev and the files are gone.
    let resp = rt
        .block_on(
            k.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest {
                claims: vec![dra_v1::Claim {
                    namespace: NS.into(),
                    uid: UID.into(),
                    name: CLAIM.into(),
                }],
            }),
        )
        .map_err(|e| plugin.fail(&format!("NodeUnprepareResources: {e}")))?
        .into_inner();
    ensure_eq(
        "unprepare's error",
        resp.claims.get(UID).map(|c| c.error.as_str()),
        Some(""),
    )?;
    ensure(!mdev_dir(&uuid).exists(), || {
        format!("mdev {uuid} is still in sysfs after unprepare")
    })?;
    ensure(!spec_path.exists(), || {
        format!("{} is left after unprepare", spec_path.display())
    })?;
    drop(k);
    drop(rt);
    let _ = plugin.child.kill();
    let _ = plugin.child.wait();
    d.stop()?;
    ensure_restored(g, &before)?;
    Ok(Outcome::Passed)
}

/// The text of every device-metadata file below `dir`.
fn find_metadata(dir: &Path) -> Result<String, TestError> {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).map_err(|e| check(format!("{}: {e}", d.display())))?;
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(t) = std::fs::read_to_string(&p) {
                out.push_str(&t);
            }
        }
    }
    ensure(!out.is_empty(), || {
        format!("no device-metadata file below {}", dir.display())
    })?;
    Ok(out)
}
