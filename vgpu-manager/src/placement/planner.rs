//! The planner: place as many instances as the GPUs hold — all of them when they fit — then follow
//! the policy and the NUMA preference.
//!
//! 1. Greedy runs, each one pass over the demands: in the order given, biggest instances first and
//!    smallest first, each under `consolidate` and `spread`. A run fills, per demand, the GPUs on the
//!    preferred NUMA node first, then those fewer of the demands still to come can use (scarce room
//!    stays free); `consolidate` fills the fullest GPU that still takes one (fewest GPUs touched),
//!    `spread` the emptiest (a heap, so a run is O(instances · log GPUs)).
//! 2. The run with the most instances wins; among equals, a run under the requested policy, then the
//!    one with more instances on their preferred node.
//! 3. When that count is below the capacity bound, an exact branch-and-bound (`search`)
//!    looks for more, within a node budget. [`Solution::proven_optimal`] says whether the count is the
//!    optimum (bound reached, or search finished).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;

use super::bound::bound_compiled;
use super::model::{Choice, ModelError, Problem};
use super::search::{Pick, Search};
use super::state::{CDemand, Compiled, Opt, State};

/// How to spread instances over GPUs once the count is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// As few GPUs as possible (fill one before starting the next): keeps whole GPUs free.
    Consolidate,
    /// As evenly as possible (the emptiest GPU first): less contention per GPU.
    Spread,
}

crate::spelling::spelled!("policy", Policy {
    Consolidate => "consolidate",
    Spread => "spread",
});

/// Knobs of [`plan_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanOptions {
    /// Work the exact phase may do, in (demand, GPU) capacity evaluations: a search node costs one
    /// per demand and GPU (0: greedy only). The default keeps a plan of 256 GPUs within milliseconds
    /// and solves small problems (a few GPUs and instances) exactly.
    pub search_budget: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            search_budget: 500_000,
        }
    }
}

/// One placed instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Assignment {
    /// Index into [`Problem::demands`].
    pub demand: usize,
    /// Index into [`Problem::gpus`].
    pub gpu: usize,
    /// Index into the demand's choices on that GPU.
    pub choice: usize,
    /// For geometry GPUs: the first slot of the instance's range.
    pub start: Option<u32>,
}

/// What could not be placed of one demand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Shortfall {
    /// Index into [`Problem::demands`].
    pub demand: usize,
    /// The demand's profile name.
    pub profile: String,
    /// Asked for.
    pub wanted: u32,
    /// How many of `wanted` were placed.
    pub placed: u32,
    /// `wanted - placed`.
    pub missing: u32,
    /// How many the GPUs could hold of this profile if it had them all to itself (an upper bound):
    /// below `wanted` means the host is too small for it; otherwise other profiles took the room.
    pub alone_at_most: u64,
}

/// The planner's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Solution {
    /// The policy the placement followed (consolidate or spread).
    pub policy: Policy,
    /// Every placed instance, by demand then GPU.
    pub assignments: Vec<Assignment>,
    /// Per GPU whose SR-IOV is off and gets instances: how many VFs to enable.
    pub enable_vfs: Vec<(usize, u32)>,
    /// Demands not fully placed.
    pub shortfall: Vec<Shortfall>,
    /// Instances asked for.
    pub requested: u64,
    /// Instances placed.
    pub placed: u64,
    /// No placement can place more than this ([`super::bound`]: LP relaxation).
    pub upper_bound: u64,
    /// Whether `placed` is the optimum (the bound was reached or the exact search finished).
    pub proven_optimal: bool,
}

impl Solution {
    /// The choice `a` uses, or `None` when its indices are out of range for `problem`.
    pub fn choice<'p>(&self, problem: &'p Problem, a: &Assignment) -> Option<&'p Choice> {
        problem
            .demands
            .get(a.demand)?
            .choices
            .get(a.gpu)?
            .get(a.choice)
    }
}

/// Plans `problem` under `policy` with default options.
pub fn plan(problem: &Problem, policy: Policy) -> Result<Solution, ModelError> {
    plan_with(problem, policy, PlanOptions::default())
}

/// Plans `problem` under `policy`.
pub fn plan_with(
    problem: &Problem,
    policy: Policy,
    options: PlanOptions,
) -> Result<Solution, ModelError> {
    problem.validate()?;
    let c = Compiled::new(problem);
    let alone: Vec<u64> = c
        .demands
        .iter()
        .map(|d| {
            c.gpus
                .iter()
                .zip(&d.opts)
                .map(|(s, o)| u64::from(s.upper_alone(o)))
                .sum()
        })
        .collect();
    let bound = bound_compiled(&c).lagrangian;

    let by_size = size_order(&c);
    let listed: Vec<usize> = (0..c.demands.len()).collect();
    let small_first: Vec<usize> = by_size.iter().rev().copied().collect();
    let other = match policy {
        Policy::Consolidate => Policy::Spread,
        Policy::Spread => Policy::Consolidate,
    };
    let mut best: Option<(Vec<Pick>, bool)> = None;
    for p in [policy, other] {
        for order in [&by_size, &small_first, &listed] {
            let picks = greedy(&c, order, p);
            let better = match &best {
                None => true,
                Some((b, b_policy)) => {
                    let key = |v: &[Pick], own: bool| (v.len(), own, numa_hits(&c, v));
                    key(&picks, p == policy) > key(b, *b_policy)
                }
            };
            if better {
                best = Some((picks, p == policy));
            }
        }
    }
    let mut picks = best.map(|(p, _)| p).unwrap_or_default();
    let mut proven = picks.len() as u64 >= bound;
    if !proven && options.search_budget > 0 {
        let order: Vec<Vec<usize>> = c.demands.iter().map(|d| gpu_order(&c, d)).collect();
        let per_node = (c.gpus.len() * c.demands.len()).max(1) as u64;
        let mut s = Search::new(&c, picks, &order, options.search_budget / per_node, bound);
        s.run();
        proven = !s.aborted;
        picks = s.best;
    }
    Ok(finish(problem, &c, policy, picks, &alone, bound, proven))
}

/// Demands by how much of a GPU one instance takes, biggest first.
fn size_order(c: &Compiled) -> Vec<usize> {
    let weight = |d: &CDemand| -> f64 {
        let (sum, n) = c
            .gpus
            .iter()
            .zip(&d.opts)
            .map(|(s, o)| s.upper_alone(o))
            .filter(|&m| m > 0)
            .fold((0.0, 0u32), |(s, n), m| (s + 1.0 / f64::from(m), n + 1));
        if n == 0 { 0.0 } else { sum / f64::from(n) }
    };
    let mut order: Vec<usize> = (0..c.demands.len()).collect();
    order.sort_by(|a, b| {
        weight(&c.demands[*b])
            .total_cmp(&weight(&c.demands[*a]))
            .then(a.cmp(b))
    });
    order
}

/// GPUs that offer `d` anything, preferred NUMA node first, then in problem order.
fn gpu_order(c: &Compiled, d: &CDemand) -> Vec<usize> {
    let mut gpus: Vec<usize> = (0..c.gpus.len())
        .filter(|&g| !d.opts[g].is_empty())
        .collect();
    gpus.sort_by_key(|&g| (numa_miss(c, d, g), g));
    gpus
}

fn numa_miss(c: &Compiled, d: &CDemand, g: usize) -> bool {
    d.numa.is_some() && c.numa.get(g).copied().flatten() != d.numa
}

fn numa_hits(c: &Compiled, picks: &[Pick]) -> usize {
    picks
        .iter()
        .filter(|(d, g, _)| !numa_miss(c, &c.demands[*d], *g))
        .count()
}

fn add_first(state: &mut State, opts: &[Opt]) -> Option<usize> {
    opts.iter().position(|o| state.try_add(o))
}

/// Utilization as an integer for ordering (parts per million).
fn ppm(s: &State) -> u64 {
    (s.utilization().clamp(0.0, 1.0) * 1e6) as u64
}

fn greedy(c: &Compiled, order: &[usize], policy: Policy) -> Vec<Pick> {
    let mut states = c.gpus.clone();
    let mut picks = Vec::new();
    for (pos, &d) in order.iter().enumerate() {
        let dem = &c.demands[d];
        let mut left = dem.count;
        let gpus = gpu_order(c, dem);
        // GPUs fewer of the demands still to come can use go first, so scarce room stays free.
        let later = &order[pos + 1..];
        let contention = |g: usize| -> usize {
            later
                .iter()
                .filter(|&&e| c.demands[e].count > 0 && !c.demands[e].opts[g].is_empty())
                .count()
        };
        match policy {
            Policy::Consolidate => {
                let mut gpus = gpus;
                // Preferred node first, then the fullest GPU (fewest GPUs touched), then problem order.
                gpus.sort_by_key(|&g| {
                    (
                        numa_miss(c, dem, g),
                        contention(g),
                        Reverse(ppm(&states[g])),
                        g,
                    )
                });
                for g in gpus {
                    while left > 0 {
                        match add_first(&mut states[g], &dem.opts[g]) {
                            Some(o) => {
                                picks.push((d, g, o));
                                left -= 1;
                            }
                            None => break,
                        }
                    }
                }
            }
            Policy::Spread => {
                let mut heap: BinaryHeap<Reverse<(bool, usize, u64, usize)>> = gpus
                    .iter()
                    .map(|&g| Reverse((numa_miss(c, dem, g), contention(g), ppm(&states[g]), g)))
                    .collect();
                while left > 0 {
                    let Some(Reverse((miss, busy, _, g))) = heap.pop() else {
                        break;
                    };
                    if let Some(o) = add_first(&mut states[g], &dem.opts[g]) {
                        picks.push((d, g, o));
                        left -= 1;
                        heap.push(Reverse((miss, busy, ppm(&states[g]), g)));
                    }
                }
            }
        }
    }
    picks
}

fn finish(
    problem: &Problem,
    c: &Compiled,
    policy: Policy,
    mut picks: Vec<Pick>,
    alone: &[u64],
    bound: u64,
    proven: bool,
) -> Solution {
    picks.sort_unstable();
    // Replay to learn geometry starts and VF counts.
    let mut states = c.gpus.clone();
    let mut index_on_gpu = Vec::with_capacity(picks.len());
    let mut added = vec![0usize; states.len()];
    for &(d, g, o) in &picks {
        let ok = states[g].try_add(&c.demands[d].opts[g][o]);
        debug_assert!(ok, "a planned set must replay");
        index_on_gpu.push(added[g]);
        added[g] += 1;
    }
    let assignments = picks
        .iter()
        .zip(index_on_gpu)
        .map(|(&(demand, gpu, choice), i)| Assignment {
            demand,
            gpu,
            choice,
            start: states[gpu].geometry_starts().get(i).copied(),
        })
        .collect();
    let enable_vfs = states
        .iter()
        .enumerate()
        .filter_map(|(g, s)| s.vfs_to_enable().map(|n| (g, n)))
        .collect();
    let shortfall = problem
        .demands
        .iter()
        .enumerate()
        .filter_map(|(d, dem)| {
            let placed = u32::try_from(picks.iter().filter(|p| p.0 == d).count()).unwrap_or(0);
            (placed < dem.count).then(|| Shortfall {
                demand: d,
                profile: dem.profile.clone(),
                wanted: dem.count,
                placed,
                missing: dem.count - placed,
                alone_at_most: alone.get(d).copied().unwrap_or(0),
            })
        })
        .collect();
    Solution {
        policy,
        assignments,
        enable_vfs,
        shortfall,
        requested: problem.requested(),
        placed: picks.len() as u64,
        upper_bound: bound,
        proven_optimal: proven,
    }
}
