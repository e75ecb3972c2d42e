//! Placement benchmark: plan 256 GPUs × 10,000 requests (target < 50 ms) and report the
//! number placed against an upper bound no placement can beat (the LP-relaxation bound of
//! `placement::bound`; target ≥ 98 %). Prints what one run measured; asserts nothing about time.
//!
//! The host: 96 T4 (classic mdev, 16 GiB, homogeneous), 64 L40S (vendor-specific VFIO, 48 GiB shared
//! by 32 VFs, equal-size mode), 64 Flex 170 (SR-IOV off: 16 GiB split over up to 31 VFs), 32 A100-40GB
//! in MIG mode, alternating NUMA nodes. Requests: vdi-1g, vdi-2g, workstation-4g and compute-8g, each
//! half preferring node 0 and half node 1.
//!
//! Run: `cargo bench -p vgpu-manager --bench placement`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use vgpu_manager::placement::bound::upper_bound;
use vgpu_manager::placement::mig::MigGeometry;
use vgpu_manager::placement::{Choice, Cost, Demand, GpuCap, Policy, Problem, Rule, plan};
use vgpu_manager::profile::ProfileTarget;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    T4,
    L40s,
    Flex,
    A100,
}

fn target(key: &str) -> ProfileTarget {
    ProfileTarget::Mdev {
        parent: "bench".into(),
        type_id: key.parse().unwrap(),
        type_name: None,
    }
}

/// Choices of a profile needing `need` MiB (and `heads` displays, `graphics`) on a GPU kind, smallest
/// first, as matching would rank them.
fn choices(kind: Kind, need: u64, heads: bool, graphics: bool) -> Vec<Choice> {
    let pools = |key: String, fb: u64, class: String| Choice {
        target: target(&key),
        key,
        cost: Cost::Pools {
            uses: vec![fb],
            class,
            limit: None,
        },
    };
    match kind {
        // T4 Q types (4 heads) 1-16 GiB; B types only up to 2 GiB (NVIDIA vGPU User Guide, T4 types).
        Kind::T4 => [1u64, 2, 4, 8, 16]
            .iter()
            .filter(|g| **g * 1024 >= need)
            .map(|g| {
                let key = format!("t4-{g}q");
                pools(key.clone(), g * 1024, key)
            })
            .collect(),
        // L40S: 1-48 GiB; classes by size (equal-size mode).
        Kind::L40s => [1u64, 2, 3, 4, 6, 8, 12, 16, 24, 48]
            .iter()
            .filter(|g| **g * 1024 >= need)
            .map(|g| pools(format!("l40s-{g}q"), g * 1024, format!("{g} GiB")))
            .collect(),
        // Flex VFs have no display heads (the Data Center GPU Flex Series has no display outputs; the simulated one in sims/demo.toml has none).
        Kind::Flex if !heads && graphics => vec![Choice {
            key: "vf".into(),
            cost: Cost::Split { need_mib: need },
            target: target("vf"),
        }],
        Kind::Flex => Vec::new(),
        // MIG-backed vGPUs are compute (C-series) only.
        Kind::A100 if !graphics => {
            let g = MigGeometry::a100_40gb();
            let p = g.smallest_with_memory(need).unwrap();
            vec![Choice {
                key: p.name.clone(),
                cost: MigGeometry::cost(p),
                target: target(&p.name),
            }]
        }
        Kind::A100 => Vec::new(),
    }
}

fn host(requests: u32) -> Problem {
    let mut kinds = Vec::new();
    kinds.extend([Kind::T4; 96]);
    kinds.extend([Kind::L40s; 64]);
    kinds.extend([Kind::Flex; 64]);
    kinds.extend([Kind::A100; 32]);
    let gpus: Vec<GpuCap> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| GpuCap {
            id: format!("gpu{i}"),
            numa_node: Some((i % 2) as u32),
            rule: match k {
                Kind::T4 => Rule::Pools {
                    free: vec![16384],
                    slots: None,
                    homogeneous: true,
                    locked: None,
                },
                Kind::L40s => Rule::Pools {
                    free: vec![49152],
                    slots: Some(32),
                    homogeneous: true,
                    locked: None,
                },
                Kind::Flex => Rule::SplitOnEnable {
                    memory_mib: Some(16384),
                    max_vfs: 31,
                },
                Kind::A100 => MigGeometry::a100_40gb().rule(&[]),
            },
        })
        .collect();
    // (profile, share of the requests in percent, need MiB, needs heads, needs graphics)
    let mix = [
        ("vdi-1g", 45, 1024, false, true),
        ("vdi-2g", 30, 2048, false, true),
        ("workstation-4g", 15, 4096, true, true),
        ("compute-8g", 10, 8192, false, false),
    ];
    let mut demands = Vec::new();
    for (name, share, need, heads, graphics) in mix {
        let n = requests * share / 100;
        for node in 0..2u32 {
            demands.push(Demand {
                profile: name.into(),
                count: n / 2 + if node == 0 { n % 2 } else { 0 },
                numa: Some(node),
                choices: kinds
                    .iter()
                    .map(|k| choices(*k, need, heads, graphics))
                    .collect(),
            });
        }
    }
    Problem { gpus, demands }
}

fn run(label: &str, p: &Problem, policy: Policy) {
    let mut times = Vec::new();
    let mut solution = None;
    for _ in 0..7 {
        let t = Instant::now();
        let s = plan(p, policy).unwrap();
        times.push(t.elapsed());
        solution = Some(s);
    }
    times.sort();
    let s = solution.unwrap();
    let t = Instant::now();
    let b = upper_bound(p).unwrap();
    let bound_time = t.elapsed();
    let t = Instant::now();
    let greedy = vgpu_manager::placement::plan_with(
        p,
        policy,
        vgpu_manager::placement::PlanOptions { search_budget: 0 },
    )
    .unwrap();
    let greedy_time = t.elapsed();
    println!(
        "  (bound alone {:.2} ms; plan without search {:.2} ms placing {})",
        bound_time.as_secs_f64() * 1e3,
        greedy_time.as_secs_f64() * 1e3,
        greedy.placed
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "{label:<34} {:>6} requested  {:>6} placed  bound {:>6} (per-profile {:>6})  placed/bound {:>6.2} %  \
         time median {:>6.2} ms  min {:>6.2} ms  (target < 50 ms, ≥ 98 %){}",
        s.requested,
        s.placed,
        b.lagrangian,
        b.per_profile,
        100.0 * s.placed as f64 / b.lagrangian.max(1) as f64,
        ms(times[times.len() / 2]),
        ms(times[0]),
        if s.proven_optimal {
            "  proven optimal"
        } else {
            ""
        },
    );
}

fn main() {
    println!("placement: 256 GPUs (96 T4, 64 L40S, 64 Flex 170, 32 A100 MIG), one run each");
    let big = host(10_000);
    run("10,000 requests, consolidate", &big, Policy::Consolidate);
    run("10,000 requests, spread", &big, Policy::Spread);
    let fits = host(4_000);
    run("4,000 requests, consolidate", &fits, Policy::Consolidate);
    run("4,000 requests, spread", &fits, Policy::Spread);
}
