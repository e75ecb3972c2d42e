//! xe and i915 SR-IOV: proportional quanta, priorities, apply and read-back, and the round-robin
//! model driven by real plans.

use proptest::prelude::*;

use super::{backend, codes, host, opts, weights};
use crate::backend::BackendError;
use crate::profile::Priority;
use crate::sched::rr::{Load, RrSlot, simulate, wait_bound_us};
use crate::sched::{DEFAULT_TOLERANCE, PlanOptions, SchedRequest, SettingTarget};

const FLEX: &str = "0000:03:00.0";

#[test]
fn xe_quanta_follow_the_weights() {
    let (h, inv) = host("demo");
    let b = backend(&h, &inv, FLEX);
    let plan = b.plan(&weights(&[10, 30]), &opts());
    assert!(plan.honoured(), "{:?}", plan.refusals);
    let q: Vec<_> = plan.slots.iter().map(|s| s.quantum_ms).collect();
    assert_eq!(q, vec![Some(8), Some(24)]);
    // Intel Flex profile guide: 64000 / 2 VFs = 32000 µs.
    assert!(
        plan.slots
            .iter()
            .all(|s| s.preempt_timeout_us == Some(32_000))
    );
    assert_eq!(plan.slots[0].slot, "vf1");
    assert_eq!(plan.period_ms, Some(32.0));
    assert_eq!(plan.max_error, 0.0);
    // Worst wait of vf1: vf2 (24 ms + 32 ms) and the PF (20 ms + 20 ms).
    assert_eq!(plan.worst_case_wait_ms, Some(96.0));
    let paths: Vec<String> = plan
        .settings
        .iter()
        .map(|s| match &s.target {
            SettingTarget::Sysfs { path } => format!("{path}={}", s.value),
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(paths.contains(
        &"/sys/bus/pci/devices/0000:03:00.0/sriov_admin/vf2/profile/exec_quantum_ms=24".to_string()
    ));
    assert!(
        paths.contains(
            &"/sys/bus/pci/devices/0000:03:00.0/sriov_admin/pf/profile/preempt_timeout_us=20000"
                .to_string()
        )
    );
}

#[test]
fn xe_apply_programs_the_kernel_and_reads_back() {
    let (h, inv) = host("vendors");
    let b = backend(&h, &inv, "0000:3b:00.0");
    let before = b.read_back(&h).unwrap();
    assert!(before.notes.iter().any(|n| n.contains("unlimited")));
    let plan = b.plan(&weights(&[1, 1, 2, 4]), &opts());
    let report = b.apply(&h, &plan).unwrap();
    assert!(report.pending.is_empty());
    assert_eq!(report.written.len(), plan.settings.len());
    let st = &report.state;
    assert_eq!(st.slots[0].slot, "pf");
    assert_eq!(st.slots[0].quantum_ms, Some(20));
    let q: Vec<_> = st.slots[1..]
        .iter()
        .map(|s| s.quantum_ms.unwrap())
        .collect();
    assert_eq!(q, vec![4, 4, 8, 16]);
    let shares: Vec<_> = st.slots[1..].iter().map(|s| s.share.unwrap()).collect();
    assert_eq!(shares, vec![0.125, 0.125, 0.25, 0.5]);
    assert_eq!(st.slots[1].device.as_deref(), Some("0000:3b:00.1"));
    assert_eq!(b.read_back(&h).unwrap(), report.state);
}

#[test]
fn xe_priority_is_all_or_nothing_and_never_high() {
    let (h, inv) = host("vendors");
    let b = backend(&h, &inv, "0000:3b:00.0");
    let with = |ps: &[Option<Priority>]| -> Vec<SchedRequest> {
        ps.iter()
            .map(|p| SchedRequest {
                priority: *p,
                ..SchedRequest::weight(5)
            })
            .collect()
    };
    let mixed = b.plan(&with(&[Some(Priority::Low), None]), &opts());
    assert_eq!(codes(&mixed), vec!["priority-per-vf"]);
    let high = b.plan(&with(&[Some(Priority::High)]), &opts());
    assert_eq!(codes(&high), vec!["priority-high"]);
    let err = b.apply(&h, &high).unwrap_err();
    assert!(matches!(err, BackendError::Refused { .. }), "{err}");
    let low = b.plan(&with(&[Some(Priority::Low), Some(Priority::Low)]), &opts());
    assert!(low.honoured());
    b.apply(&h, &low).unwrap();
    let st = b.read_back(&h).unwrap();
    assert_eq!(st.slots[1].priority.as_deref(), Some("low"));
}

#[test]
fn xe_refuses_more_requests_than_vfs_and_unknown_slots() {
    let (h, inv) = host("vendors");
    let b = backend(&h, &inv, "0000:3b:00.0");
    let plan = b.plan(&weights(&[1; 5]), &opts());
    assert!(codes(&plan).contains(&"too-many-requests"));
    let named = vec![SchedRequest {
        slot: Some("vf9".into()),
        ..SchedRequest::weight(1)
    }];
    assert_eq!(codes(&b.plan(&named, &opts())), vec!["unknown-slot"]);
    // A slot may be named by its VF address too.
    let by_addr = vec![
        SchedRequest {
            slot: Some("0000:3b:00.3".into()),
            ..SchedRequest::weight(3)
        },
        SchedRequest::weight(1),
    ];
    let plan = b.plan(&by_addr, &opts());
    assert!(plan.honoured());
    assert_eq!(plan.slots[0].slot, "vf3");
    assert_eq!(plan.slots[1].slot, "vf1");
    let reserve = PlanOptions {
        reserve: true,
        ..opts()
    };
    assert_eq!(
        codes(&b.plan(&weights(&[1]), &reserve)),
        vec!["reserve-unsupported"]
    );
}

#[test]
fn apply_checks_the_plan_is_for_this_gpu() {
    let (h, inv) = host("vendors");
    let xe = backend(&h, &inv, "0000:3b:00.0");
    let i915 = backend(&h, &inv, "0000:00:02.0");
    let plan = i915.plan(&weights(&[1]), &opts());
    let err = xe.apply(&h, &plan).unwrap_err();
    assert!(matches!(err, BackendError::WrongGpu { .. }), "{err}");
}

#[test]
fn i915_prelim_iov_quanta_apply_and_refuse_priorities() {
    let (h, inv) = host("vendors");
    let b = backend(&h, &inv, "0000:00:02.0");
    let plan = b.plan(&weights(&[3, 1]), &opts());
    assert!(plan.honoured(), "{:?}", plan.refusals);
    let report = b.apply(&h, &plan).unwrap();
    let q: Vec<_> = report.state.slots.iter().map(|s| s.quantum_ms).collect();
    // vf3 and vf4 are enabled but not in the plan: they keep quantum 0 (unlimited), and both the
    // plan and the read-back say so.
    assert_eq!(q, vec![Some(20), Some(24), Some(8), Some(0), Some(0)]);
    assert!(
        plan.notes.iter().any(|n| n.contains("vf3, vf4")),
        "{:?}",
        plan.notes
    );
    assert!(report.state.notes.iter().any(|n| n.contains("unlimited")));
    assert!(report.state.raw.iter().any(|(p, v)| p
        == "/sys/class/drm/card0/prelim_iov/vf1/gt/preempt_timeout_us"
        && v == "16000"));
    let pr = vec![SchedRequest {
        priority: Some(Priority::High),
        ..SchedRequest::weight(1)
    }];
    assert_eq!(codes(&b.plan(&pr, &opts())), vec!["priority-unsupported"]);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The quanta an xe plan programs give every busy VF its requested share within 1 % in the
    /// round-robin model, idle VFs never lower a busy one below its share, and no VF waits longer than
    /// the plan's worst-case wait however long work takes to yield.
    #[test]
    fn xe_plans_hold_in_the_model(
        ws in prop::collection::vec(1u32..=100, 1..=31),
        idle in any::<u32>(),
        overrun in prop::collection::vec(0u64..500_000, 31),
    ) {
        let (h, inv) = host("demo");
        let b = backend(&h, &inv, FLEX);
        let plan = b.plan(&weights(&ws), &opts());
        prop_assert!(plan.honoured(), "{:?}", plan.refusals);
        let mut slots: Vec<RrSlot> = plan.slots.iter().map(|s| RrSlot {
            quantum_us: u64::from(s.quantum_ms.unwrap()) * 1000,
            preempt_timeout_us: u64::from(s.preempt_timeout_us.unwrap()),
            overrun_us: 0,
            load: Load::Busy,
            reserved: false,
        }).collect();
        let all = simulate(&slots, 20);
        for (s, got) in plan.slots.iter().zip(&all.share) {
            prop_assert!((got - s.requested_share).abs() <= DEFAULT_TOLERANCE,
                "{}: {got} vs {}", s.slot, s.requested_share);
        }
        // Some VFs idle (never all): the busy ones keep at least their share.
        for (i, s) in slots.iter_mut().enumerate() {
            if idle >> i & 1 == 1 && i > 0 {
                s.load = Load::Idle;
            }
        }
        let part = simulate(&slots, 20);
        for (i, s) in slots.iter().enumerate() {
            if s.load == Load::Busy {
                prop_assert!(part.share[i] + DEFAULT_TOLERANCE >= plan.slots[i].requested_share);
            }
        }
        // Overruns up to (and beyond) the preemption timeout: waits stay within the plan's bound.
        for (s, o) in slots.iter_mut().zip(&overrun) {
            s.load = Load::Busy;
            s.overrun_us = *o;
        }
        let worst = simulate(&slots, 10);
        let bound_ms = plan.worst_case_wait_ms.unwrap();
        for i in 0..slots.len() {
            prop_assert!(worst.max_wait_us[i] <= wait_bound_us(&slots, i));
            prop_assert!(worst.max_wait_us[i] as f64 / 1000.0 <= bound_ms);
        }
    }
}
