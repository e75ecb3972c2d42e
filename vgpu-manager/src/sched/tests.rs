//! Share arithmetic and the round-robin model: unit cases and properties.

use proptest::prelude::*;

use super::rr::{Load, RrSlot, simulate, wait_bound_us};
use super::share::{
    QuantaLimits, apportion, max_abs_diff, proportional_quanta, requested_shares, shares_of,
};
use super::*;

/// Limits like a GuC VF scheduler with a 32 ms default round (any vendor-neutral values would do).
const LIMITS: QuantaLimits = QuantaLimits {
    min: 1,
    max: 100_000,
    base_period: 32,
    max_period: 4_000,
};

fn busy_slots(quanta_ms: &[u32], preempt_us: u64) -> Vec<RrSlot> {
    quanta_ms
        .iter()
        .map(|q| RrSlot {
            quantum_us: u64::from(*q) * 1000,
            preempt_timeout_us: preempt_us,
            overrun_us: 0,
            load: Load::Busy,
            reserved: false,
        })
        .collect()
}

#[test]
fn apportion_hits_the_total_and_stays_within_one_unit() {
    let q = apportion(32, &[1, 1, 2], 1).unwrap();
    assert_eq!(q, vec![8, 8, 16]);
    // 10 over 3 equal weights: the remainder unit goes to the lowest index.
    assert_eq!(apportion(10, &[5, 5, 5], 1).unwrap(), vec![4, 3, 3]);
    // The minimum is honoured even for a tiny weight; the others shrink to make room.
    let q = apportion(10, &[1, 100], 1).unwrap();
    assert_eq!(q, vec![1, 9]);
    assert_eq!(apportion(2, &[1, 1, 1], 1), None);
    assert_eq!(apportion(5, &[0, 0], 1), None);
    assert_eq!(apportion(5, &[], 1), Some(vec![]));
}

#[test]
fn quanta_search_lengthens_the_period_until_within_tolerance() {
    // 1:100 cannot be within 1 % at 32 ms (1/33 = 3 %); the search must go longer.
    let q = proportional_quanta(&[1, 100], LIMITS, 0.01).unwrap();
    assert!(q.period > 32, "period {}", q.period);
    assert!(q.max_error <= 0.01);
    // Equal weights fit the base period exactly.
    let q = proportional_quanta(&[7, 7, 7, 7], LIMITS, 0.01).unwrap();
    assert_eq!((q.period, q.quanta.clone()), (32, vec![8, 8, 8, 8]));
    assert_eq!(q.max_error, 0.0);
}

#[test]
fn quanta_search_reports_the_closest_when_limits_forbid() {
    let tight = QuantaLimits {
        max_period: 40,
        ..LIMITS
    };
    let err = proportional_quanta(&[1, 100], tight, 0.001).unwrap_err();
    let best = err.expect("some period fits the limits");
    assert!(best.max_error > 0.001);
    assert!(best.period <= 40);
    // More slots than the longest period allows at 1 ms each.
    let tiny = QuantaLimits {
        max_period: 2,
        base_period: 1,
        ..LIMITS
    };
    assert_eq!(proportional_quanta(&[1, 1, 1], tiny, 0.01), Err(None));
}

#[test]
fn plan_tolerance_check_refuses_slots_off_target() {
    let mut plan = SchedPlan::new("gpu", "test", "p", 0.01);
    for (slot, req, eff) in [("a", 0.5, 0.5), ("b", 0.5, 0.48)] {
        plan.slots.push(SlotPlan {
            slot: slot.into(),
            device: None,
            label: None,
            weight: 1,
            priority: None,
            requested_share: req,
            effective_share: Some(eff),
            error: Some(eff - req),
            quantum_ms: None,
            preempt_timeout_us: None,
            mdev_type: None,
        });
    }
    plan.check_tolerance();
    assert!((plan.max_error - 0.02).abs() < 1e-9);
    assert_eq!(plan.refusals.len(), 1);
    assert_eq!(plan.refusals[0].slot.as_deref(), Some("b"));
    assert!(
        plan.refusals[0].reason.contains("48.00%"),
        "{}",
        plan.refusals[0].reason
    );
}

#[test]
fn model_gives_quantum_shares_and_skips_idle_slots() {
    let mut slots = busy_slots(&[10, 30], 1000);
    let out = simulate(&slots, 100);
    assert_eq!(out.share, vec![0.25, 0.75]);
    assert_eq!(out.max_wait_us, vec![30_000, 10_000]);
    // An idle slot gives its time away...
    slots[1].load = Load::Idle;
    assert_eq!(simulate(&slots, 10).share, vec![1.0, 0.0]);
    // ...unless its share is reserved.
    slots[1].reserved = true;
    assert_eq!(simulate(&slots, 10).share, vec![0.25, 0.0]);
}

#[test]
fn overruns_are_cut_at_the_preemption_timeout() {
    let mut slots = busy_slots(&[10, 10], 2_000);
    slots[0].overrun_us = 50_000;
    let out = simulate(&slots, 10);
    // Slot 0 runs 10 ms + 2 ms (reset at the timeout), not 60 ms.
    assert_eq!(out.run_us[0], 10 * 12_000);
    assert_eq!(out.max_wait_us[1], 12_000);
    assert_eq!(wait_bound_us(&slots, 1), 12_000);
}

fn weights() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(1u32..=100, 1..=31)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Programmed quanta give every slot its requested share within 1 % when all are busy.
    #[test]
    fn all_busy_slots_get_their_share(w in weights()) {
        let q = proportional_quanta(&w, LIMITS, DEFAULT_TOLERANCE).expect("a period within limits");
        let out = simulate(&busy_slots(&q.quanta, 16_000), 50);
        let want = requested_shares(&w);
        prop_assert!(max_abs_diff(&out.share, &want) <= DEFAULT_TOLERANCE,
            "weights {w:?} quanta {:?} shares {:?}", q.quanta, out.share);
        prop_assert_eq!(q.quanta.iter().map(|x| u64::from(*x)).sum::<u64>(), u64::from(q.period));
    }

    /// With some slots idle the busy ones share the whole engine: each gets at least its requested
    /// share (less the tolerance), and the busy slots' shares stay in proportion to their quanta.
    #[test]
    fn busy_slots_keep_at_least_their_share(w in weights(), idle_mask in any::<u32>()) {
        let q = proportional_quanta(&w, LIMITS, DEFAULT_TOLERANCE).expect("a period within limits");
        let mut slots = busy_slots(&q.quanta, 16_000);
        for (i, s) in slots.iter_mut().enumerate() {
            if idle_mask >> i & 1 == 1 {
                s.load = Load::Idle;
            }
        }
        let out = simulate(&slots, 50);
        let want = requested_shares(&w);
        for (i, s) in slots.iter().enumerate() {
            if s.load == Load::Busy {
                prop_assert!(out.share[i] + DEFAULT_TOLERANCE >= want[i],
                    "slot {i}: got {} wanted {}", out.share[i], want[i]);
            } else {
                prop_assert_eq!(out.run_us[i], 0);
            }
        }
    }

    /// However long work takes to yield, no busy slot waits longer than the bound, and no slot keeps
    /// the engine beyond its quantum plus its preemption timeout.
    #[test]
    fn waits_are_bounded(
        w in weights(),
        overruns in prop::collection::vec(0u64..200_000, 31),
        pt in 1_000u64..128_000,
        periodic in prop::collection::vec((1u64..50_000, 1u64..50_000, 0u64..50_000), 31),
        use_periodic in any::<bool>(),
    ) {
        let q = proportional_quanta(&w, LIMITS, DEFAULT_TOLERANCE).expect("a period within limits");
        let mut slots = busy_slots(&q.quanta, pt);
        for (i, s) in slots.iter_mut().enumerate() {
            s.overrun_us = overruns[i];
            if use_periodic && i % 2 == 1 {
                let (busy_us, idle_us, phase_us) = periodic[i];
                s.load = Load::Periodic { busy_us, idle_us, phase_us };
            }
        }
        let out = simulate(&slots, 40);
        for i in 0..slots.len() {
            prop_assert!(out.max_wait_us[i] <= wait_bound_us(&slots, i),
                "slot {i}: waited {} > bound {}", out.max_wait_us[i], wait_bound_us(&slots, i));
        }
        let total: u64 = out.run_us.iter().sum();
        prop_assert!(total <= out.elapsed_us);
    }

    /// The apportionment always sums to the period, respects the minimum and is within one unit.
    #[test]
    fn apportion_is_within_one_unit(w in weights(), extra in 0u64..5_000) {
        let total = w.len() as u64 + extra;
        let q = apportion(total, &w, 1).expect("total covers the minimum");
        prop_assert_eq!(q.iter().sum::<u64>(), total);
        let wsum: f64 = w.iter().map(|x| f64::from(*x)).sum();
        for (qi, wi) in q.iter().zip(&w) {
            prop_assert!(*qi >= 1);
            let ideal = total as f64 * f64::from(*wi) / wsum;
            // Raising tiny slots to the minimum can push others at most one unit per raised slot.
            let raised = w.iter().filter(|x| (total as f64 * f64::from(**x) / wsum) < 1.0).count() as f64;
            prop_assert!((*qi as f64 - ideal).abs() < 1.0 + raised, "{qi} vs {ideal}");
        }
        prop_assert_eq!(shares_of(&q).len(), w.len());
    }
}
