//! An upper bound on how many instances any placement can place: the Lagrangian dual of a linear
//! relaxation, to judge the planner on problems too large to solve exactly.
//!
//! Per GPU the integer set of instance counts that fit is relaxed to a polytope: per demand at most
//! `m` (what fits of it alone); per shared dimension, slot count, slice line or VF memory
//! `Σ a_d x_d ≤ b` with `a_d` the demand's cheapest choice; and for a homogeneous GPU
//! `Σ x_d / k_d ≤ 1` with `k_d` the most instances of any class the demand can use (all instances
//! are of one class). Every
//! real placement lies in the relaxation, so for any multipliers `λ ∈ [0,1]^D` on the per-demand
//! counts,
//!
//! `Σ_d λ_d n_d + Σ_g max_{x ∈ P_g} Σ_d (1 − λ_d) x_d`
//!
//! is at least the optimum (weak duality). The inner maximum is bounded by the least fractional
//! knapsack over the GPU's constraints, and the multipliers are tuned by a projected subgradient
//! descent; the smallest value seen is the bound.

use super::model::{ModelError, Problem};
use super::state::{Compiled, Opt, OptCost, State};

/// One relaxed constraint `Σ a_d x_d ≤ b` of one GPU.
struct Constraint {
    a: Vec<f64>,
    b: f64,
}

/// A GPU's relaxation.
struct Relaxed {
    /// Per demand: at most this many.
    m: Vec<f64>,
    constraints: Vec<Constraint>,
    /// How many GPUs share it.
    times: f64,
}

impl Relaxed {
    fn same(&self, o: &Relaxed) -> bool {
        self.m == o.m
            && self.constraints.len() == o.constraints.len()
            && self
                .constraints
                .iter()
                .zip(&o.constraints)
                .all(|(a, b)| a.a == b.a && a.b == b.b)
    }
}

/// Upper bounds for a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The Lagrangian (LP-relaxation) bound.
    pub lagrangian: u64,
    /// The per-profile bound: each profile alone, summed (never below `lagrangian`).
    pub per_profile: u64,
}

/// Bounds the number of instances any placement of `problem` can place.
pub fn upper_bound(problem: &Problem) -> Result<Bound, ModelError> {
    problem.validate()?;
    Ok(bound_compiled(&Compiled::new(problem)))
}

/// [`upper_bound`] of a compiled problem.
pub(crate) fn bound_compiled(c: &Compiled) -> Bound {
    let n: Vec<f64> = c.demands.iter().map(|d| f64::from(d.count)).collect();
    // Identical GPUs relax identically: keep one of each with its multiplicity.
    let mut relaxed: Vec<Relaxed> = Vec::new();
    for g in 0..c.gpus.len() {
        let r = relax(c, g);
        match relaxed.iter_mut().find(|x| x.same(&r)) {
            Some(x) => x.times += 1.0,
            None => relaxed.push(r),
        }
    }
    let per_profile: f64 = (0..n.len())
        .map(|d| n[d].min(relaxed.iter().map(|r| r.m[d] * r.times).sum()))
        .sum();
    let dims = n.len();
    let mut lambda = vec![0.5; dims];
    let mut best = per_profile.min(n.iter().sum());
    let mut step = 0.5;
    for _ in 0..400 {
        let (value, used) = dual(&relaxed, &n, &lambda);
        best = best.min(value);
        // Subgradient of the dual in λ: n_d − Σ_g x_gd.
        let grad: Vec<f64> = (0..dims).map(|d| n[d] - used[d]).collect();
        let norm = grad.iter().map(|x| x * x).sum::<f64>().sqrt();
        if norm < 1e-12 {
            break;
        }
        for d in 0..dims {
            lambda[d] = (lambda[d] - step * grad[d] / norm).clamp(0.0, 1.0);
        }
        step *= 0.985;
    }
    // Every value is a bound on an integer optimum; the margin absorbs rounding.
    let floor = |x: f64| (x + 1e-6).floor().max(0.0) as u64;
    Bound {
        lagrangian: floor(best),
        per_profile: floor(per_profile),
    }
}

/// The dual value at `lambda` and the maximizers' per-demand totals.
fn dual(relaxed: &[Relaxed], n: &[f64], lambda: &[f64]) -> (f64, Vec<f64>) {
    let value: Vec<f64> = lambda.iter().map(|l| 1.0 - l).collect();
    let mut total: f64 = n.iter().zip(lambda).map(|(n, l)| n * l).sum();
    let mut used = vec![0.0; n.len()];
    for r in relaxed {
        let (v, x) = inner(r, &value);
        total += v * r.times;
        for (u, xd) in used.iter_mut().zip(x) {
            *u += xd * r.times;
        }
    }
    (total, used)
}

/// The least of the per-constraint fractional knapsack optima (each bounds the GPU's maximum).
fn inner(r: &Relaxed, value: &[f64]) -> (f64, Vec<f64>) {
    let boxed: Vec<f64> =
        r.m.iter()
            .zip(value)
            .map(|(m, v)| if *v > 0.0 { *m } else { 0.0 })
            .collect();
    let mut best = (boxed.iter().zip(value).map(|(x, v)| x * v).sum(), boxed);
    for k in &r.constraints {
        let cand = knapsack(k, &r.m, value);
        if cand.0 < best.0 {
            best = cand;
        }
    }
    best
}

/// max Σ v_d x_d s.t. Σ a_d x_d ≤ b, 0 ≤ x_d ≤ m_d (greedy by value per weight is exact).
fn knapsack(k: &Constraint, m: &[f64], value: &[f64]) -> (f64, Vec<f64>) {
    let mut order: Vec<usize> = (0..m.len()).filter(|&d| value[d] > 0.0).collect();
    let ratio = |d: usize| {
        if k.a[d] <= 0.0 {
            f64::INFINITY
        } else {
            value[d] / k.a[d]
        }
    };
    order.sort_by(|x, y| ratio(*y).total_cmp(&ratio(*x)));
    let mut room = k.b;
    let mut x = vec![0.0; m.len()];
    let mut total = 0.0;
    for d in order {
        let take = if k.a[d] <= 0.0 {
            m[d]
        } else {
            m[d].min(room / k.a[d]).max(0.0)
        };
        x[d] = take;
        total += take * value[d];
        room -= take * k.a[d].max(0.0);
    }
    (total, x)
}

fn least(opts: &[Opt], f: impl Fn(&OptCost) -> Option<u64>) -> f64 {
    opts.iter()
        .filter_map(|o| f(&o.cost))
        .min()
        .map_or(0.0, |v| v as f64)
}

fn relax(c: &Compiled, g: usize) -> Relaxed {
    let state = &c.gpus[g];
    let opts: Vec<&[Opt]> = c.demands.iter().map(|d| d.opts[g].as_slice()).collect();
    let m: Vec<f64> = opts
        .iter()
        .map(|o| f64::from(state.upper_alone(o)))
        .collect();
    let mut constraints = Vec::new();
    let per_demand = |f: &dyn Fn(&OptCost) -> Option<u64>| -> Vec<f64> {
        opts.iter().map(|o| least(o, f)).collect()
    };
    match state {
        State::Pools {
            free,
            slots,
            homogeneous,
            ..
        } => {
            for (dim, b) in free.iter().enumerate() {
                constraints.push(Constraint {
                    a: per_demand(&|cost| match cost {
                        OptCost::Pools { uses, .. } => uses.get(dim).copied(),
                        _ => None,
                    }),
                    b: *b as f64,
                });
            }
            if let Some(s) = slots {
                constraints.push(Constraint {
                    a: vec![1.0; opts.len()],
                    b: f64::from(*s),
                });
            }
            if *homogeneous {
                // All instances share one class c, so there are at most k_c of them, where k_c is
                // what the room allows of c's (equal) cost, limits aside. A demand d may only be in
                // classes it has a choice of, so Σ x_d / max_{c of d} k_c ≤ 1.
                let room = |uses: &[u64]| -> f64 {
                    let mut k = slots.map_or(f64::INFINITY, f64::from);
                    for (f, u) in free.iter().zip(uses) {
                        if *u > 0 {
                            k = k.min((f / u) as f64);
                        }
                    }
                    k
                };
                let locked = match state {
                    State::Pools { class, .. } => *class,
                    _ => None,
                };
                let a = opts
                    .iter()
                    .map(|o| {
                        let k = o
                            .iter()
                            .filter_map(|opt| match &opt.cost {
                                OptCost::Pools { uses, class, .. }
                                    if locked.is_none_or(|l| l == *class) =>
                                {
                                    Some(room(uses))
                                }
                                _ => None,
                            })
                            .fold(0.0, f64::max);
                        if k > 0.0 && k.is_finite() {
                            1.0 / k
                        } else {
                            0.0
                        }
                    })
                    .collect();
                constraints.push(Constraint { a, b: 1.0 });
            }
        }
        State::Geometry { span, fixed, .. } => constraints.push(Constraint {
            a: per_demand(&|cost| match cost {
                OptCost::Geometry { size, .. } => Some(u64::from(*size)),
                _ => None,
            }),
            b: f64::from(span.saturating_sub(fixed.count_ones())),
        }),
        State::Split {
            memory, max_vfs, ..
        } => {
            constraints.push(Constraint {
                a: vec![1.0; opts.len()],
                b: f64::from(*max_vfs),
            });
            if let Some(mem) = memory {
                constraints.push(Constraint {
                    a: per_demand(&|cost| match cost {
                        OptCost::Split { need } => Some(*need),
                        _ => None,
                    }),
                    b: *mem as f64,
                });
            }
        }
    }
    Relaxed {
        m,
        constraints,
        times: 1.0,
    }
}
