//! NVIDIA: the RmPVMRL policy for both interfaces, refusals, and read-back from the driver listing.

use super::{backend, codes, host, opts, weights};
use crate::sched::{PlanOptions, SchedRequest, SettingTarget, TakesEffect};

fn sized(ws: &[(u32, u64)]) -> Vec<SchedRequest> {
    ws.iter()
        .map(|(w, fb)| SchedRequest {
            framebuffer_mib: Some(*fb),
            ..SchedRequest::weight(*w)
        })
        .collect()
}

#[test]
fn equal_weights_become_equal_share_in_modprobe_configuration() {
    let (h, inv) = host("vendors");
    let b = backend(&h, &inv, "0000:5e:00.0");
    let plan = b.plan(&weights(&[5, 5, 5]), &opts());
    assert!(plan.honoured(), "{:?}", plan.refusals);
    assert_eq!(plan.policy, "equal share");
    // The two existing vGPUs come first, then a new one.
    assert_eq!(plan.slots[0].slot, "6f1d8a10-2c4b-4e8e-9a57-3d2b1c0e9f01");
    assert_eq!(plan.slots[2].slot, "new1");
    assert!(
        plan.slots
            .iter()
            .all(|s| (s.effective_share.unwrap() - 1.0 / 3.0).abs() < 1e-12)
    );
    assert_eq!(plan.settings.len(), 1);
    let s = &plan.settings[0];
    assert_eq!(
        s.target,
        SettingTarget::ModuleOption {
            module: "nvidia".into(),
            option: "NVreg_RegistryDwordsPerDevice".into()
        }
    );
    assert_eq!(s.value, "pci=0000:5e:00.0;RmPVMRL=0x01");
    assert_eq!(s.takes_effect, TakesEffect::ModuleLoad);
    // Default slice: 2 ms with up to 8 vGPUs; a round of 3 slices.
    assert_eq!(plan.period_ms, Some(6.0));
    assert_eq!(plan.worst_case_wait_ms, Some(4.0));
    assert!(plan.notes.iter().any(|n| n.contains("2 vGPUs exist now")));
    // apply writes nothing now; the setting is pending.
    let report = b.apply(&h, &plan).unwrap();
    assert!(report.written.is_empty());
    assert_eq!(report.pending, plan.settings);
}

#[test]
fn unequal_weights_are_refused_with_the_reason() {
    let (h, inv) = host("vendors");
    let t4 = backend(&h, &inv, "0000:5e:00.0");
    let plan = t4.plan(&weights(&[1, 3]), &opts());
    assert_eq!(
        codes(&plan),
        vec!["unequal-weights", "share-off-target", "share-off-target"]
    );
    assert!(plan.refusals[0].reason.contains("weights 1, 3 differ"));
    // Mixed sizes on the vendor-VFIO L40S: the reason names fixed share's restriction.
    let l40s = backend(&h, &inv, "0000:86:00.0");
    let plan = l40s.plan(&sized(&[(1, 8192), (3, 8192), (2, 16384)]), &opts());
    assert_eq!(codes(&plan)[0], "unequal-weights-mixed-sizes");
    assert!(plan.refusals[0].reason.contains("mixed sizes"));
    let reserve = PlanOptions {
        reserve: true,
        ..opts()
    };
    let plan = l40s.plan(&sized(&[(1, 8192), (1, 8192), (1, 16384)]), &reserve);
    assert!(codes(&plan).contains(&"fixed-share-mixed-sizes"));
}

#[test]
fn fixed_share_and_custom_slices() {
    let (h, inv) = host("vendors");
    let l40s = backend(&h, &inv, "0000:86:00.0");
    let o = PlanOptions {
        reserve: true,
        time_slice_ms: Some(3),
        ..opts()
    };
    // Two L40S-8Q vGPUs exist: fixed share gives each 8/48 of the GPU, not the requested half.
    let plan = l40s.plan(&weights(&[1, 1]), &o);
    assert_eq!(plan.policy, "fixed share");
    assert_eq!(
        plan.settings[0].value,
        "pci=0000:86:00.0;RmPVMRL=0x00030011"
    );
    assert!((plan.slots[0].effective_share.unwrap() - 1.0 / 6.0).abs() < 1e-12);
    assert_eq!(codes(&plan), vec!["share-off-target", "share-off-target"]);
    let bad = PlanOptions {
        time_slice_ms: Some(31),
        ..opts()
    };
    assert_eq!(
        codes(&l40s.plan(&weights(&[1, 1]), &bad)),
        vec!["time-slice-range"]
    );
}

#[test]
fn read_back_from_the_driver_parameter_listing() {
    let (h, inv) = host("vendors");
    let l40s = backend(&h, &inv, "0000:86:00.0").read_back(&h).unwrap();
    assert_eq!(l40s.policy, "equal share (3 ms slices)");
    assert_eq!(l40s.slots.len(), 2);
    assert_eq!(l40s.slots[0].share, Some(0.5));
    let t4 = backend(&h, &inv, "0000:5e:00.0").read_back(&h).unwrap();
    assert!(t4.policy.starts_with("best effort"), "{}", t4.policy);
    // The demo host lists no nvidia parameters: unknown, with a note.
    let (h, inv) = host("demo");
    let st = backend(&h, &inv, "0000:01:00.0").read_back(&h).unwrap();
    assert_eq!(st.policy, "unknown");
    assert!(st.notes[0].contains("/proc/driver/nvidia/params"));
}
