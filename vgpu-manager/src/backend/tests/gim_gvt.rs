//! GVT-g type choice, AMD GIM policies, generic mdev parents.

use super::{backend, codes, host, host_toml, opts, weights};
use crate::profile::Priority;
use crate::sched::{PlanOptions, SchedRequest, SettingTarget};

const IGPU: &str = "0000:00:02.0";

#[test]
fn gvt_chooses_the_types_whose_weights_fit() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, IGPU);
    let plan = b.plan(&weights(&[2, 4]), &opts());
    assert!(plan.honoured(), "{:?}", plan.refusals);
    let types: Vec<_> = plan.slots.iter().map(|s| s.mdev_type.as_deref()).collect();
    // V5_8 (weight 2) + V5_4 (weight 4) is exact and uses the least graphics memory.
    assert_eq!(types, vec![Some("i915-GVTg_V5_8"), Some("i915-GVTg_V5_4")]);
    assert_eq!(plan.max_error, 0.0);
    assert!(plan.settings.is_empty());
    let plan = b.plan(&weights(&[1, 1, 1]), &opts());
    assert!(
        plan.slots
            .iter()
            .all(|s| s.mdev_type.as_deref() == Some("i915-GVTg_V5_8"))
    );
}

#[test]
fn gvt_refuses_ratios_its_types_cannot_make() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, IGPU);
    // 1:3 — the closest that fits is 2:8 (20 % / 80 %), off by 5 points.
    let plan = b.plan(&weights(&[1, 3]), &opts());
    assert!(
        codes(&plan).contains(&"share-off-target"),
        "{:?}",
        plan.refusals
    );
    assert!((plan.max_error - 0.05).abs() < 1e-9, "{}", plan.max_error);
    let hi = vec![SchedRequest {
        priority: Some(Priority::High),
        ..SchedRequest::weight(1)
    }];
    assert_eq!(codes(&b.plan(&hi, &opts())), vec!["priority-unsupported"]);
    // Eight vGPUs exceed what is free (7 of the smallest type).
    assert!(codes(&b.plan(&weights(&[1; 8]), &opts())).contains(&"too-many-requests"));
}

#[test]
fn gvt_read_back_uses_type_weights() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, IGPU);
    let ty = "/sys/class/mdev_bus/0000:00:02.0/mdev_supported_types";
    for (t, u) in [
        ("i915-GVTg_V5_8", "0b5c2e2a-0000-4000-8000-000000000001"),
        ("i915-GVTg_V5_4", "0b5c2e2a-0000-4000-8000-000000000002"),
    ] {
        vgpu_host::Host::write(&h, std::path::Path::new(&format!("{ty}/{t}/create")), u).unwrap();
    }
    let inv = vgpu_host::discover::discover(&h).unwrap();
    let b2 = backend(&h, &inv, IGPU);
    let st = b2.read_back(&h).unwrap();
    let w: Vec<_> = st.slots.iter().map(|s| (s.weight, s.share)).collect();
    assert_eq!(w.len(), 2);
    assert!(w.contains(&(Some(2), Some(2.0 / 6.0))));
    assert!(w.contains(&(Some(4), Some(4.0 / 6.0))));
    // Planning with existing vGPUs keeps their types and chooses only for the new one.
    let plan = b2.plan(&weights(&[1, 2, 1]), &opts());
    assert_eq!(plan.slots[2].mdev_type.as_deref(), Some("i915-GVTg_V5_8"));
    drop(b);
}

#[test]
fn gim_equal_weights_set_the_policy_and_unequal_are_refused() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, "0000:86:00.0");
    let plan = b.plan(&weights(&[3, 3, 3, 3]), &opts());
    assert!(plan.honoured(), "{:?}", plan.refusals);
    assert_eq!(plan.policy, "SW round-robin");
    let vals: Vec<_> = plan
        .settings
        .iter()
        .map(|s| match &s.target {
            SettingTarget::ModuleOption { module, option } => {
                format!("{module}.{option}={}", s.value)
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(vals, vec!["gim.vf_num=4", "gim.sch_policy=4"]);
    assert_eq!(plan.slots[3].effective_share, Some(0.25));
    let plan = b.plan(&weights(&[1, 2]), &opts());
    assert_eq!(codes(&plan)[0], "unequal-weights");
    let reserve = PlanOptions {
        reserve: true,
        ..opts()
    };
    assert_eq!(b.plan(&weights(&[1, 1]), &reserve).policy, "HW solid");
    let st = {
        let (h, inv) = host("vendors");
        backend(&h, &inv, "0000:af:00.0").read_back(&h).unwrap()
    };
    assert_eq!(st.policy, "SW round-robin");
    assert_eq!(st.slots.len(), 2);
    assert!(
        st.raw
            .iter()
            .any(|(p, v)| p.ends_with("/vf_num") && v == "2")
    );
}

#[test]
fn older_gim_uses_gim_config_and_sched_interval() {
    let (h, inv) = host_toml(
        r#"
[[driver]]
name = "gim"
match = ["1002:6929"]

[[pci]]
address = "0000:d8:00.0"
vendor = "1002"
device = "6929"
class = 0x030000
driver = "gim"
iommu_group = 1

[pci.sriov]
total_vfs = 16
num_vfs = 2
vf_device = "692f"
offset = 1
stride = 1

[[module]]
name = "gim"
parameters = { gim_log_level = "1" }
"#,
    );
    let b = backend(&h, &inv, "0000:d8:00.0");
    let o = PlanOptions {
        time_slice_ms: Some(10),
        ..opts()
    };
    let plan = b.plan(&weights(&[1, 1]), &o);
    assert!(plan.honoured(), "{:?}", plan.refusals);
    let keys: Vec<_> = plan
        .settings
        .iter()
        .map(|s| match &s.target {
            SettingTarget::ConfigFile { path, key } => format!("{path}:{key}={}", s.value),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        keys,
        vec![
            "/etc/gim_config:vf_num=2",
            "/etc/gim_config:sched_interval=10"
        ]
    );
    assert_eq!(plan.period_ms, Some(20.0));
    // 0 means the 6 ms default.
    let plan = b.plan(&weights(&[1, 1]), &opts());
    assert_eq!(plan.period_ms, Some(12.0));
    let too_long = PlanOptions {
        time_slice_ms: Some(2001),
        ..opts()
    };
    assert_eq!(
        codes(&b.plan(&weights(&[1]), &too_long)),
        vec!["time-slice-range"]
    );
}

#[test]
fn sample_parents_have_nothing_to_schedule() {
    let (h, inv) = host("samples");
    let b = backend(&h, &inv, "mbochs");
    let plan = b.plan(&weights(&[1, 5]), &opts());
    assert!(plan.honoured());
    assert_eq!(plan.policy, "not scheduled");
    assert!(plan.slots.iter().all(|s| s.effective_share.is_none()));
    assert!(plan.settings.is_empty());
}
