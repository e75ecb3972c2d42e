//! NVIDIA classic vGPU on Ampere and later GPUs with SR-IOV (vGPU software 13–16): every VF of the
//! GPU is an mdev parent of its own and holds one vGPU, and all VFs share the GPU's framebuffer and
//! its homogeneous rule. Driven on the simulated `ampere` host (an A10 with 32 VFs, and a T4 whose
//! parent is the PF itself): discovery, matching and offers count the GPU, not its VFs; creates that
//! name the GPU or a profile each take a free VF, also when they race; pools hand each slot its own
//! VF, shrink, and come back after a reboot.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod core_common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use mdev_types::ids::MdevTypeId;
use mdev_types::model::{Capability, Inventory};
use vgpu_client::ProfileOffer;
use vgpu_host::discover::discover;
use vgpu_host::{Host, HostExt, paths};
use vgpu_manager::backend::{BackendKind, detect_gpu};
use vgpu_manager::daemon::api::{
    ApplyPool, CoreError, CreateInstance, InstanceSpec, InstanceState, InstanceTarget,
    InstanceView, ListGpus, ListInstances, ListOffers, RequestError,
};
use vgpu_manager::daemon::engine::Core;
use vgpu_manager::profile::Catalog;
use vgpu_sim::SimHost;

use core_common::{SlowWrites, open};

/// The A10's physical function.
const A10: &str = "0000:41:00.0";
/// Its first VFs (offset 4, stride 1).
const VF0: &str = "0000:41:00.4";
const VF1: &str = "0000:41:00.5";

/// The type id the host gives the vGPU type named `name` (the driver numbers them per release).
fn type_named(host: &dyn Host, name: &str) -> MdevTypeId {
    let inv = discover(host).unwrap();
    inv.mdev_parents
        .iter()
        .flat_map(|p| &p.types)
        .find(|t| t.name.as_deref() == Some(name))
        .map(|t| t.id.clone())
        .unwrap_or_else(|| panic!("no type named {name}"))
}

fn on_gpu(type_id: &MdevTypeId, gpu: &str) -> InstanceSpec {
    InstanceSpec {
        target: InstanceTarget::Type(type_id.clone()),
        gpu: Some(gpu.to_string()),
        uuid: None,
        autostart: false,
        label: None,
        attrs: Vec::new(),
    }
}

/// What vgpud offers profile `vdi-2g` on the A10.
fn vdi_offer(core: &Core) -> ProfileOffer {
    core.execute(ListOffers)
        .unwrap()
        .into_iter()
        .find(|g| g.gpu == A10)
        .and_then(|g| g.options.into_iter().find(|o| o.profile == "vdi-2g"))
        .expect("the A10 offers vdi-2g")
}

fn create(core: &Core, spec: InstanceSpec) -> Result<InstanceView, CoreError> {
    core.execute(CreateInstance(spec))
}

fn pool(n: u32) -> String {
    format!(
        "name = \"desk\"\nautostart = true\n\n[profiles]\nvdi-2g = {n}\n\n[select]\nmodels = [\"NVIDIA A10\"]\n"
    )
}

/// Parents of the running instances of the A10.
fn a10_parents(core: &Core) -> Vec<String> {
    core.execute(ListInstances)
        .unwrap()
        .into_iter()
        .filter(|v| v.state == InstanceState::Running)
        .inspect(|v| assert_eq!(v.gpu, A10, "an instance on a VF belongs to its GPU: {v:?}"))
        .map(|v| v.parent)
        .collect()
}

#[test]
fn discovery_gives_the_gpu_its_vf_parents_and_detects_classic_vgpu() {
    let host = SimHost::builtin("ampere").unwrap();
    let inv = discover(&host).unwrap();
    let a10 = inv.gpus.iter().find(|g| g.id == A10).unwrap();
    assert!(
        a10.capabilities
            .contains(&Capability::MdevOnVfs { vfs: 32, types: 8 }),
        "{:?}",
        a10.capabilities
    );
    assert!(Inventory::mdev_on_vfs(a10));
    // The VFs are no GPUs of their own; each one's parent belongs to the A10.
    assert_eq!(inv.gpus.len(), 2, "{:?}", inv.gpus);
    let parents = inv.gpu_parents(a10);
    assert_eq!(parents.len(), 32);
    assert_eq!(parents[0].name, VF0);
    assert_eq!(inv.gpu_of_parent(VF1).map(|g| g.id.as_str()), Some(A10));
    // The T4's parent is its own PCI function.
    let t4 = inv.gpus.iter().find(|g| g.id == "0000:5e:00.0").unwrap();
    assert!(!Inventory::mdev_on_vfs(t4));
    assert_eq!(inv.gpu_parents(t4).len(), 1);

    let backend = detect_gpu(&host, &inv, A10).unwrap();
    assert_eq!(backend.kind(), BackendKind::NvidiaMdev);
    let caps = backend.capabilities();
    assert!(caps.slots.is_empty(), "{caps:?}");
    // Every free VF shows one A10-1Q, the most of any type.
    assert_eq!(caps.max_slots, 32, "{caps:?}");
    assert!(
        caps.interface.contains("the 32 SR-IOV VFs of 0000:41:00.0"),
        "{}",
        caps.interface
    );
}

#[test]
fn creates_naming_the_gpu_take_free_vfs_until_its_framebuffer_is_used() {
    let host = Arc::new(SimHost::builtin("ampere").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let q4 = type_named(host.as_ref(), "NVIDIA A10-4Q");

    let first = create(&core, on_gpu(&q4, "41:00.0")).unwrap();
    assert_eq!((first.parent.as_str(), first.gpu.as_str()), (VF0, A10));
    let second = create(&core, on_gpu(&q4, A10)).unwrap();
    assert_eq!(second.parent, VF1);
    // A request naming a VF gets that VF.
    let named = create(&core, on_gpu(&q4, "0000:41:01.0")).unwrap();
    assert_eq!(
        (named.parent.as_str(), named.gpu.as_str()),
        ("0000:41:01.0", A10)
    );
    // A VF that holds a vGPU takes no second one.
    let err = create(&core, on_gpu(&q4, VF0)).unwrap_err();
    assert!(
        matches!(err, CoreError::Invalid(RequestError::TypeFull { .. })),
        "{err:?}"
    );

    // 24 GB hold six A10-4Q.
    for _ in 0..3 {
        create(&core, on_gpu(&q4, A10)).unwrap();
    }
    let parents: BTreeSet<String> = a10_parents(&core).into_iter().collect();
    assert_eq!(
        parents.len(),
        6,
        "each vGPU on a VF of its own: {parents:?}"
    );
    let full = create(&core, on_gpu(&q4, A10)).unwrap_err();
    assert!(
        matches!(&full, CoreError::Invalid(RequestError::VfsFull { gpu, .. }) if gpu == A10),
        "{full:?}"
    );
    assert!(
        full.to_string().contains("each VF holds one vGPU"),
        "{full}"
    );
    // Nothing was left behind by the refusal.
    assert_eq!(a10_parents(&core).len(), 6);
}

#[test]
fn another_type_is_refused_while_the_gpu_holds_one_and_taken_once_it_is_empty() {
    let host = Arc::new(SimHost::builtin("ampere").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let q4 = type_named(host.as_ref(), "NVIDIA A10-4Q");
    let q2 = type_named(host.as_ref(), "NVIDIA A10-2Q");

    let v = create(&core, on_gpu(&q4, A10)).unwrap();
    let err = create(&core, on_gpu(&q2, A10)).unwrap_err();
    assert!(
        matches!(err, CoreError::Invalid(RequestError::VfsFull { .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("of one type"), "{err}");
    core.execute(vgpu_manager::daemon::api::DestroyInstance { uuid: v.uuid })
        .unwrap();
    let v2 = create(&core, on_gpu(&q2, A10)).unwrap();
    assert_eq!(v2.parent, VF0, "the freed VF is the first free one again");
}

#[test]
fn creates_racing_on_one_gpu_each_get_a_vf_of_their_own() {
    let sim = Arc::new(SimHost::builtin("ampere").unwrap());
    let q4 = type_named(sim.as_ref(), "NVIDIA A10-4Q");
    // Each kernel create takes a while: every request is placed before the first one is made.
    let host: Arc<dyn Host> = Arc::new(SlowWrites {
        sim: sim.clone(),
        file: "create",
        before: Duration::from_millis(30),
        after: Duration::from_millis(0),
    });
    let dir = tempfile::tempdir().unwrap();
    let core = Arc::new(Core::open(host, dir.path(), Catalog::builtin().unwrap()).unwrap());
    let threads: Vec<_> = (0..6)
        .map(|_| {
            let core = core.clone();
            let spec = on_gpu(&q4, A10);
            std::thread::spawn(move || create(&core, spec))
        })
        .collect();
    let made: Vec<InstanceView> = threads
        .into_iter()
        .map(|t| t.join().unwrap().unwrap())
        .collect();
    let parents: BTreeSet<&str> = made.iter().map(|v| v.parent.as_str()).collect();
    assert_eq!(parents.len(), 6, "{made:?}");
    assert!(made.iter().all(|v| v.gpu == A10));
}

#[test]
fn profile_creates_and_offers_count_the_gpu_not_its_vfs() {
    let host = Arc::new(SimHost::builtin("ampere").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let vdi = vdi_offer(&core);
    // 24 GB hold twelve A10-2Q, although all 32 VFs show one available.
    assert_eq!(
        (vdi.available, vdi.in_use, vdi.max_instances),
        (12, 0, 12),
        "{vdi:?}"
    );

    let spec = InstanceSpec {
        target: InstanceTarget::Profile("vdi-2g".into()),
        ..on_gpu(&type_named(host.as_ref(), "NVIDIA A10-2Q"), A10)
    };
    let a = create(&core, spec.clone()).unwrap();
    let b = create(&core, spec).unwrap();
    assert_eq!((a.parent.as_str(), b.parent.as_str()), (VF0, VF1));

    let vdi = vdi_offer(&core);
    assert_eq!((vdi.available, vdi.in_use), (10, 2), "{vdi:?}");
    let gpus = core.execute(ListGpus).unwrap();
    let view = gpus.iter().find(|g| g.id == A10).unwrap();
    assert_eq!(view.instances.len(), 2, "{view:?}");
    let q2 = type_named(host.as_ref(), "NVIDIA A10-2Q");
    // The GPU's view sums the VFs' available instances (30 free VFs each show one).
    assert!(
        view.types.iter().any(|(t, n)| *t == q2 && *n == 30),
        "{view:?}"
    );
}

#[test]
fn a_pool_gives_each_slot_a_vf_shrinks_and_comes_back_after_a_reboot() {
    let host = Arc::new(SimHost::builtin("ampere").unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());

    let grown = core.execute(ApplyPool { toml: pool(4) }).unwrap();
    assert_eq!(grown.created.len(), 4, "{grown:?}");
    let parents = a10_parents(&core);
    assert_eq!(
        parents.iter().collect::<BTreeSet<_>>().len(),
        4,
        "{parents:?}"
    );
    let again = core.execute(ApplyPool { toml: pool(4) }).unwrap();
    assert!(
        again.created.is_empty() && again.removed.is_empty(),
        "{again:?}"
    );

    // Twelve A10-2Q fill the A10; a thirteenth does not fit and nothing changes.
    let full = core.execute(ApplyPool { toml: pool(12) }).unwrap();
    assert_eq!(full.created.len(), 8, "{full:?}");
    let err = core.execute(ApplyPool { toml: pool(13) }).unwrap_err();
    assert!(err.to_string().contains("1 missing"), "{err}");
    assert_eq!(a10_parents(&core).len(), 12);

    let shrunk = core.execute(ApplyPool { toml: pool(2) }).unwrap();
    assert_eq!(shrunk.removed.len(), 10, "{shrunk:?}");
    let kept = a10_parents(&core);
    assert_eq!(kept.len(), 2);
    drop(core);

    // Host reboot: `sriov-manage -e` has enabled the VFs again, no vGPU exists; vgpud makes the
    // pool's slots again on the VFs they are defined on.
    let rebooted = Arc::new(SimHost::builtin("ampere").unwrap());
    let core = open(&rebooted, dir.path());
    let mut back = a10_parents(&core);
    back.sort();
    let mut kept = kept;
    kept.sort();
    assert_eq!(back, kept);
    for parent in &kept {
        assert!(rebooted.exists(&paths::mdev_parent(parent)));
    }
    let q2 = type_named(rebooted.as_ref(), "NVIDIA A10-2Q");
    let left: u32 = rebooted
        .read_trimmed(&paths::mdev_type_dir(&kept[0], &q2).join("available_instances"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(left, 0, "the slot's VF holds its vGPU again");
}

#[test]
fn one_enabled_vf_is_one_vgpu() {
    let text =
        include_str!("../../mdev-types/sims/ampere.toml").replace("num_vfs = 32", "num_vfs = 1");
    let host = Arc::new(SimHost::from_toml("ampere-one-vf.toml", &text).unwrap());
    let dir = tempfile::tempdir().unwrap();
    let core = open(&host, dir.path());
    let vdi = vdi_offer(&core);
    assert_eq!((vdi.available, vdi.max_instances), (1, 1), "{vdi:?}");
    let q2 = type_named(host.as_ref(), "NVIDIA A10-2Q");
    assert_eq!(create(&core, on_gpu(&q2, A10)).unwrap().parent, VF0);
    let err = create(&core, on_gpu(&q2, A10)).unwrap_err();
    assert!(
        matches!(err, CoreError::Invalid(RequestError::VfsFull { .. })),
        "{err:?}"
    );
}
