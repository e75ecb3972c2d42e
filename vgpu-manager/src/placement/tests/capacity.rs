//! Each backend's capacity rule, with the vendor facts it encodes.

use super::super::model::{Choice, Cost, Demand, GpuCap, Problem, Rule};
use super::super::{Policy, plan};
use super::target;

fn pools(key: &str, uses: &[u64], class: &str) -> Choice {
    Choice {
        key: key.into(),
        cost: Cost::Pools {
            uses: uses.to_vec(),
            class: class.into(),
            limit: None,
        },
        target: target(key),
    }
}

fn demand(profile: &str, count: u32, choices: Vec<Vec<Choice>>) -> Demand {
    Demand {
        profile: profile.into(),
        count,
        numa: None,
        choices,
    }
}

fn gpu(id: &str, numa: u32, rule: Rule) -> GpuCap {
    GpuCap {
        id: id.into(),
        numa_node: Some(numa),
        rule,
    }
}

/// A T4 as classic mdev: 16 GiB framebuffer, homogeneous (T4 data sheet; NVIDIA vGPU User Guide).
fn t4(locked: Option<&str>, free: u64) -> Rule {
    Rule::Pools {
        free: vec![free],
        slots: None,
        homogeneous: true,
        locked: locked.map(str::to_string),
    }
}

#[test]
fn homogeneous_gpu_takes_one_type_and_a_bigger_type_can_serve_both_profiles() {
    // ws-4g fits T4-4Q only; vdi-2g fits T4-2B or T4-4Q. On one T4: 2 ws-4g + 2 vdi-2g only if the
    // vdi desktops take T4-4Q too (4 × 4 GiB = 16 GiB).
    let p = Problem {
        gpus: vec![gpu("t4", 0, t4(None, 16384))],
        demands: vec![
            demand(
                "ws-4g",
                2,
                vec![vec![pools("nvidia-232", &[4096], "nvidia-232")]],
            ),
            demand(
                "vdi-2g",
                4,
                vec![vec![
                    pools("nvidia-223", &[2048], "nvidia-223"),
                    pools("nvidia-232", &[4096], "nvidia-232"),
                ]],
            ),
        ],
    };
    let s = plan(&p, Policy::Consolidate).unwrap();
    // 2 ws-4g + 2 vdi-2g, all on T4-4Q, fill the 16 GiB: 4. The 4 vdi-2g on T4-2B: also 4, and no
    // T4-4Q may join them. Without the alternative the mix would be 2 (ws alone) or 4 (vdi alone).
    assert_eq!(s.placed, 4);
    assert!(s.proven_optimal);
    // A GPU locked to T4-2B by an existing instance cannot take T4-4Q at all.
    let mut q = p.clone();
    q.gpus[0].rule = t4(Some("nvidia-223"), 14336);
    let s = plan(&q, Policy::Consolidate).unwrap();
    assert_eq!(s.placed, 4, "4 more vdi-2g on T4-2B, no ws-4g");
    assert_eq!(s.shortfall.len(), 1);
    assert_eq!(s.shortfall[0].profile, "ws-4g");
    assert_eq!(s.shortfall[0].missing, 2);
    assert_eq!(s.shortfall[0].alone_at_most, 0);
}

#[test]
fn vendor_vfio_framebuffer_is_shared_by_all_vfs() {
    // L40S: 48 GiB and 32 VFs (L40S data sheet; NVIDIA vGPU User Guide, SR-IOV). Counting per VF would
    // allow 32 × 2 GiB; the framebuffer allows 24.
    let l40s = Rule::Pools {
        free: vec![49152],
        slots: Some(32),
        homogeneous: true,
        locked: None,
    };
    let p = Problem {
        gpus: vec![gpu("l40s", 1, l40s.clone())],
        demands: vec![demand(
            "vdi-2g",
            32,
            vec![vec![pools("1146", &[2048], "2048 MiB")]],
        )],
    };
    let s = plan(&p, Policy::Spread).unwrap();
    assert_eq!(s.placed, 24);
    // 1 GiB vGPUs: the 32 VFs limit first.
    let p = Problem {
        gpus: vec![gpu("l40s", 1, l40s)],
        demands: vec![demand(
            "vdi-1g",
            40,
            vec![vec![pools("1145", &[1024], "1024 MiB")]],
        )],
    };
    assert_eq!(plan(&p, Policy::Spread).unwrap().placed, 32);
}

#[test]
fn sriov_split_is_sized_by_the_largest_need_and_fixed_once_enabled() {
    // Flex 170: 16 GiB, up to 31 VFs (Intel Flex virtualization guide). Enabling n VFs gives each
    // 16/n GiB, so 2 GiB desktops fit 8 at most, and mixing in a 4 GiB one halves the split.
    let flex = Rule::SplitOnEnable {
        memory_mib: Some(16384),
        max_vfs: 31,
    };
    let split = |need| Choice {
        key: "vf".into(),
        cost: Cost::Split { need_mib: need },
        target: target("vf"),
    };
    let p = Problem {
        gpus: vec![gpu("flex", 0, flex)],
        demands: vec![
            demand("vdi-2g", 8, vec![vec![split(2048)]]),
            demand("vdi-1g", 8, vec![vec![split(1024)]]),
        ],
    };
    let s = plan(&p, Policy::Consolidate).unwrap();
    // k instances with any 2 GiB one among them need k × 2 GiB, so 8 at most; 8 vdi-1g alone are 8
    // too (only 8 asked). The most is 8.
    assert_eq!(s.placed, 8);
    assert!(s.proven_optimal);
    let (_, n) = s.enable_vfs[0];
    assert!((8..=16).contains(&n), "enable {n} VFs");
    // Once enabled the VF count is fixed: 4 VFs enabled means 4 instances at most.
    let p = Problem {
        gpus: vec![gpu(
            "flex",
            0,
            Rule::Pools {
                free: vec![],
                slots: Some(4),
                homogeneous: false,
                locked: None,
            },
        )],
        demands: vec![demand("vdi-1g", 10, vec![vec![pools("vf", &[], "vf")]])],
    };
    assert_eq!(plan(&p, Policy::Spread).unwrap().placed, 4);
}

#[test]
fn heterogeneous_placement_ids_conflict_by_overlap() {
    // NVIDIA mixed-size mode (NVML nvmlVgpuPlacementList_v2_t: placement ids and a placement size in
    // slots). An illustrative 8-slot GPU, not a vendor table: a 4-slot type at ids 0 and 4, a 2-slot
    // type at 0, 2, 4, 6.
    let geo = |size, starts: &[u32]| Cost::Geometry {
        size,
        starts: starts.to_vec(),
        limit: None,
    };
    let p = Problem {
        gpus: vec![gpu(
            "gpu",
            0,
            Rule::Geometry {
                span: 8,
                occupied: vec![super::super::Span { start: 2, size: 2 }],
                existing: vec![],
            },
        )],
        demands: vec![
            demand(
                "big",
                2,
                vec![vec![Choice {
                    key: "8Q".into(),
                    cost: geo(4, &[0, 4]),
                    target: target("8Q"),
                }]],
            ),
            demand(
                "small",
                3,
                vec![vec![Choice {
                    key: "4Q".into(),
                    cost: geo(2, &[0, 2, 4, 6]),
                    target: target("4Q"),
                }]],
            ),
        ],
    };
    let s = plan(&p, Policy::Consolidate).unwrap();
    // Slots 2-3 are taken: a big one fits only at 4; small ones at 0 and, if no big, 4 and 6.
    // Best: 1 big (4-7) + 1 small (0-1) = 2, or 3 small (0, 4, 6) = 3.
    assert_eq!(s.placed, 3);
    assert!(s.proven_optimal);
}

#[test]
fn policies_and_numa_preference() {
    let two = |n| Rule::Pools {
        free: vec![n],
        slots: None,
        homogeneous: false,
        locked: None,
    };
    let p = |numa| Problem {
        gpus: vec![
            gpu("a", 0, two(8)),
            gpu("b", 1, two(8)),
            gpu("c", 1, two(8)),
        ],
        demands: vec![Demand {
            profile: "x".into(),
            count: 4,
            numa,
            choices: vec![vec![pools("t", &[1], "t")]; 3],
        }],
    };
    let gpus_used = |s: &super::super::Solution| {
        let mut g: Vec<usize> = s.assignments.iter().map(|a| a.gpu).collect();
        g.dedup();
        g
    };
    let s = plan(&p(None), Policy::Consolidate).unwrap();
    assert_eq!(gpus_used(&s), vec![0]);
    let s = plan(&p(None), Policy::Spread).unwrap();
    assert_eq!(gpus_used(&s), vec![0, 1, 2]);
    let s = plan(&p(Some(1)), Policy::Consolidate).unwrap();
    assert_eq!(gpus_used(&s), vec![1]);
    let s = plan(&p(Some(1)), Policy::Spread).unwrap();
    assert_eq!(gpus_used(&s), vec![1, 2]);
}

#[test]
fn malformed_problems_are_errors_not_panics() {
    let p = Problem {
        gpus: vec![gpu("a", 0, t4(None, 1))],
        demands: vec![demand("x", 1, vec![])],
    };
    let e = plan(&p, Policy::Spread).unwrap_err().to_string();
    assert!(
        e.contains("demand 'x'") && e.contains("one (possibly empty) list per GPU"),
        "{e}"
    );
    let p = Problem {
        gpus: vec![gpu("a", 0, t4(None, 1))],
        demands: vec![demand("x", 1, vec![vec![pools("t", &[1, 2], "t")]])],
    };
    let e = plan(&p, Policy::Spread).unwrap_err().to_string();
    assert!(e.contains("uses 2 dimensions but the GPU has 1"), "{e}");
}
