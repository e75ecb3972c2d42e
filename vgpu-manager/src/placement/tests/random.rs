//! The planner against an exhaustive search on many random small problems: the counts must be equal,
//! the plan must be legal, and the bound must never be below the optimum.

use super::super::mig::MigGeometry;
use super::super::model::{Choice, Cost, Demand, GpuCap, Problem, Rule};
use super::super::slots::mask;
use super::super::state::Compiled;
use super::super::{Policy, bound::upper_bound, plan};
use super::target;

/// A small deterministic generator (xorshift64*), so a failing case can be replayed by its seed.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Per GPU, the classes a pools GPU offers (class name and its uses) — one cost per class.
struct Classes(Vec<(String, Vec<u64>)>);

fn random_gpu(r: &mut Rng, i: usize) -> (GpuCap, Classes) {
    let id = format!("gpu{i}");
    let numa = Some(r.below(2) as u32);
    match r.below(4) {
        0 => {
            let geo = MigGeometry::a100_40gb();
            let existing = if r.chance(30) {
                vec![super::super::mig::MigInstance {
                    profile: "1g.5gb".into(),
                    start: r.below(7) as u32,
                }]
            } else {
                Vec::new()
            };
            (
                GpuCap {
                    id,
                    numa_node: numa,
                    rule: geo.rule(&existing),
                },
                Classes(Vec::new()),
            )
        }
        1 => (
            GpuCap {
                id,
                numa_node: numa,
                rule: Rule::SplitOnEnable {
                    memory_mib: if r.chance(80) {
                        Some(1 + r.below(8))
                    } else {
                        None
                    },
                    max_vfs: 1 + r.below(4) as u32,
                },
            },
            Classes(Vec::new()),
        ),
        _ => {
            let dims = r.below(3) as usize;
            let classes: Vec<(String, Vec<u64>)> = (0..2)
                .map(|c| (format!("c{c}"), (0..dims).map(|_| r.below(4)).collect()))
                .collect();
            let homogeneous = r.chance(50);
            let rule = Rule::Pools {
                free: (0..dims).map(|_| r.below(9)).collect(),
                slots: if r.chance(50) {
                    Some(r.below(5) as u32)
                } else {
                    None
                },
                homogeneous,
                locked: if homogeneous && r.chance(25) {
                    Some(classes[r.below(2) as usize].0.clone())
                } else {
                    None
                },
            };
            // Without dimensions or slots nothing limits a pool: give such GPUs a slot limit.
            let rule = match rule {
                Rule::Pools {
                    free,
                    slots: None,
                    homogeneous,
                    locked,
                } if free.is_empty() => Rule::Pools {
                    free,
                    slots: Some(1 + r.below(4) as u32),
                    homogeneous,
                    locked,
                },
                other => other,
            };
            (
                GpuCap {
                    id,
                    numa_node: numa,
                    rule,
                },
                Classes(classes),
            )
        }
    }
}

fn random_choice(r: &mut Rng, gpu: &GpuCap, classes: &Classes, k: usize) -> Choice {
    match &gpu.rule {
        Rule::Geometry { .. } => {
            let geo = MigGeometry::a100_40gb();
            let p = &geo.profiles[r.below(geo.profiles.len() as u64) as usize];
            Choice {
                key: p.name.clone(),
                cost: MigGeometry::cost(p),
                target: target(&p.name),
            }
        }
        Rule::SplitOnEnable { .. } => {
            let need = r.below(5);
            Choice {
                key: format!("need{need}"),
                cost: Cost::Split { need_mib: need },
                target: target("vf"),
            }
        }
        Rule::Pools { .. } => {
            let (class, uses) = &classes.0[r.below(classes.0.len() as u64) as usize];
            // One key per (class, limit, k): a key's choices cost the same.
            let limit = r.chance(25).then_some((k % 3) as u32);
            let key = format!("{class}-k{k}-{limit:?}");
            Choice {
                target: target("pools"),
                key,
                cost: Cost::Pools {
                    uses: uses.clone(),
                    class: class.clone(),
                    limit,
                },
            }
        }
    }
}

pub(crate) fn random_problem(seed: u64) -> Problem {
    let mut r = Rng::new(seed);
    let gpus = 1 + r.below(3) as usize;
    let (caps, classes): (Vec<GpuCap>, Vec<Classes>) =
        (0..gpus).map(|i| random_gpu(&mut r, i)).unzip();
    let demands = (0..1 + r.below(3))
        .map(|d| Demand {
            profile: format!("p{d}"),
            count: r.below(5) as u32,
            numa: if r.chance(40) {
                Some(r.below(2) as u32)
            } else {
                None
            },
            choices: caps
                .iter()
                .zip(&classes)
                .map(|(g, c)| {
                    (0..r.below(3))
                        .map(|k| random_choice(&mut r, g, c, k as usize))
                        .collect()
                })
                .collect(),
        })
        .collect();
    Problem {
        gpus: caps,
        demands,
    }
}

/// The most instances any placement can place, by trying every multiset of options per demand.
pub(crate) fn exhaustive(p: &Problem) -> usize {
    let c = Compiled::new(p);
    let opts: Vec<Vec<(usize, usize)>> = c
        .demands
        .iter()
        .map(|d| {
            (0..c.gpus.len())
                .flat_map(|g| (0..d.opts[g].len()).map(move |o| (g, o)))
                .collect()
        })
        .collect();
    let mut best = 0;
    let mut path: Vec<(usize, usize, usize)> = Vec::new();
    walk(&c, &opts, 0, 0, 0, &mut path, &mut best);
    best
}

/// Whether `path` fits, replayed from the empty state.
fn fits(c: &Compiled, path: &[(usize, usize, usize)]) -> bool {
    let mut states = c.gpus.clone();
    path.iter()
        .all(|&(d, g, o)| states[g].try_add(&c.demands[d].opts[g][o]))
}

fn walk(
    c: &Compiled,
    opts: &[Vec<(usize, usize)>],
    d: usize,
    from: usize,
    used: u32,
    path: &mut Vec<(usize, usize, usize)>,
    best: &mut usize,
) {
    if d == c.demands.len() {
        *best = (*best).max(path.len());
        return;
    }
    if used < c.demands[d].count {
        for i in from..opts[d].len() {
            let (g, o) = opts[d][i];
            path.push((d, g, o));
            // Fitting is monotone: a set that does not fit has no superset that does.
            if fits(c, path) {
                walk(c, opts, d, i, used + 1, path, best);
            }
            path.pop();
        }
    }
    walk(c, opts, d + 1, 0, 0, path, best);
}

/// Checks a plan against the problem without the planner's state: counts, geometry legality.
fn check_legal(p: &Problem, s: &super::super::Solution) {
    let c = Compiled::new(p);
    let picks: Vec<_> = s
        .assignments
        .iter()
        .map(|a| (a.demand, a.gpu, a.choice))
        .collect();
    assert!(fits(&c, &picks), "the plan does not fit");
    for (d, dem) in p.demands.iter().enumerate() {
        let n = s.assignments.iter().filter(|a| a.demand == d).count();
        assert!(n <= dem.count as usize);
    }
    for (g, gpu) in p.gpus.iter().enumerate() {
        if let Rule::Geometry { occupied, .. } = &gpu.rule {
            let mut taken = occupied
                .iter()
                .filter_map(|o| mask(o.start, o.size))
                .fold(0u64, |a, m| a | m);
            for a in s.assignments.iter().filter(|a| a.gpu == g) {
                let choice = s.choice(p, a).unwrap();
                let Cost::Geometry { size, starts, .. } = &choice.cost else {
                    panic!("geometry GPU with a non-geometry choice")
                };
                let start = a.start.expect("geometry assignment without a start");
                assert!(starts.contains(&start), "start {start} is not legal");
                let m = mask(start, *size).unwrap();
                assert_eq!(taken & m, 0, "overlap at {start}");
                taken |= m;
            }
        }
    }
}

#[test]
fn planner_count_equals_exhaustive_search_on_1200_random_cases() {
    let mut nontrivial = 0;
    for seed in 0..1200u64 {
        let p = random_problem(seed);
        p.validate().unwrap();
        let best = exhaustive(&p);
        let policy = if seed % 2 == 0 {
            Policy::Consolidate
        } else {
            Policy::Spread
        };
        let s = plan(&p, policy).unwrap();
        assert_eq!(
            s.placed as usize, best,
            "seed {seed}: planner placed {} but {best} fit\n{p:#?}",
            s.placed
        );
        assert!(s.proven_optimal, "seed {seed}: small case not proven");
        check_legal(&p, &s);
        let b = upper_bound(&p).unwrap();
        assert!(
            b.lagrangian as usize >= best && b.per_profile >= b.lagrangian,
            "seed {seed}: bound {b:?} below the optimum {best}\n{p:#?}"
        );
        let missing: u64 = s.shortfall.iter().map(|x| u64::from(x.missing)).sum();
        assert_eq!(missing + s.placed, p.requested(), "seed {seed}");
        if best > 0 && (best as u64) < p.requested() {
            nontrivial += 1;
        }
    }
    // The generator must produce cases where not everything fits, or the test proves little.
    assert!(nontrivial > 200, "only {nontrivial} cases had a shortfall");
}

#[test]
fn greedy_alone_is_not_always_optimal_so_the_search_matters() {
    use super::super::{PlanOptions, plan_with};
    let worse = (0..1200u64)
        .filter(|&seed| {
            let p = random_problem(seed);
            let greedy = plan_with(&p, Policy::Spread, PlanOptions { search_budget: 0 }).unwrap();
            (greedy.placed as usize) < exhaustive(&p)
        })
        .count();
    assert!(
        worse > 0,
        "no case where greedy falls short: the oracle test would be weak"
    );
}
