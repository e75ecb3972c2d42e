//! The capacity model at work: a GPU's state while instances are added, whether one more fits, and how
//! full the GPU is. The planner, the exhaustive oracle and the bound all ask this one model, so they
//! can only disagree about the search, never about what fits.

use std::collections::HashMap;
use std::sync::Arc;

use super::model::{Cost, Problem, Rule};
use super::slots::{Item, mask, pack};

/// A choice with its key and class interned.
#[derive(Debug, Clone)]
pub(crate) struct Opt {
    /// Interned key.
    pub key: u32,
    /// What one instance takes.
    pub cost: OptCost,
}

/// [`Cost`] with interned classes.
#[derive(Debug, Clone)]
pub(crate) enum OptCost {
    Pools {
        uses: Vec<u64>,
        class: u32,
        limit: Option<u32>,
    },
    Geometry {
        size: u32,
        starts: Arc<[u32]>,
        limit: Option<u32>,
    },
    Split {
        need: u64,
    },
}

/// A problem with names interned: per demand, per GPU, its options.
#[derive(Debug, Clone)]
pub(crate) struct Compiled {
    /// Initial state per GPU.
    pub gpus: Vec<State>,
    /// NUMA node per GPU.
    pub numa: Vec<Option<u32>>,
    /// Per demand: count, preferred node, options per GPU.
    pub demands: Vec<CDemand>,
}

/// One demand, compiled.
#[derive(Debug, Clone)]
pub(crate) struct CDemand {
    pub count: u32,
    pub numa: Option<u32>,
    /// `opts[gpu]`: the options on that GPU, best first.
    pub opts: Vec<Vec<Opt>>,
}

#[derive(Default)]
struct Interner(HashMap<String, u32>);

impl Interner {
    fn id(&mut self, s: &str) -> u32 {
        let next = u32::try_from(self.0.len()).unwrap_or(u32::MAX);
        *self.0.entry(s.to_string()).or_insert(next)
    }
}

impl Compiled {
    /// Interns `p`, which must have passed [`Problem::validate`].
    pub fn new(p: &Problem) -> Compiled {
        let mut keys = Interner::default();
        let mut classes = Interner::default();
        let gpus = p
            .gpus
            .iter()
            .map(|g| State::new(&g.rule, &mut keys, &mut classes))
            .collect();
        let demands = p
            .demands
            .iter()
            .map(|d| CDemand {
                count: d.count,
                numa: d.numa,
                opts: d
                    .choices
                    .iter()
                    .map(|row| {
                        row.iter()
                            .map(|c| Opt {
                                key: keys.id(&c.key),
                                cost: match &c.cost {
                                    Cost::Pools { uses, class, limit } => OptCost::Pools {
                                        uses: uses.clone(),
                                        class: classes.id(class),
                                        limit: *limit,
                                    },
                                    Cost::Geometry {
                                        size,
                                        starts,
                                        limit,
                                    } => OptCost::Geometry {
                                        size: *size,
                                        starts: starts.as_slice().into(),
                                        limit: *limit,
                                    },
                                    Cost::Split { need_mib } => OptCost::Split { need: *need_mib },
                                },
                            })
                            .collect()
                    })
                    .collect(),
            })
            .collect();
        Compiled {
            gpus,
            numa: p.gpus.iter().map(|g| g.numa_node).collect(),
            demands,
        }
    }
}

/// One GPU while instances are added.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Pools {
        free: Vec<u64>,
        free0: Vec<u64>,
        slots: Option<u32>,
        slots0: Option<u32>,
        homogeneous: bool,
        class: Option<u32>,
        /// Instances added per key.
        added: Vec<(u32, u32)>,
    },
    Geometry {
        span: u32,
        /// Slots existing instances hold.
        fixed: u64,
        /// Instances per key, existing ones included.
        counts: Vec<(u32, u32)>,
        /// Added instances: size and legal starts.
        items: Vec<(u32, Arc<[u32]>)>,
        /// A legal arrangement of `items` (same order).
        starts: Vec<u32>,
    },
    Split {
        memory: Option<u64>,
        max_vfs: u32,
        k: u32,
        max_need: u64,
    },
}

fn bump(counts: &mut Vec<(u32, u32)>, key: u32) {
    match counts.iter_mut().find(|(k, _)| *k == key) {
        Some((_, n)) => *n += 1,
        None => counts.push((key, 1)),
    }
}

fn count_of(counts: &[(u32, u32)], key: u32) -> u32 {
    counts
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(0, |(_, n)| *n)
}

impl State {
    fn new(rule: &Rule, keys: &mut Interner, classes: &mut Interner) -> State {
        match rule {
            Rule::Pools {
                free,
                slots,
                homogeneous,
                locked,
            } => State::Pools {
                free: free.clone(),
                free0: free.clone(),
                slots: *slots,
                slots0: *slots,
                homogeneous: *homogeneous,
                class: locked.as_deref().map(|c| classes.id(c)),
                added: Vec::new(),
            },
            Rule::Geometry {
                span,
                occupied,
                existing,
            } => State::Geometry {
                span: *span,
                fixed: occupied
                    .iter()
                    .filter_map(|s| mask(s.start, s.size))
                    .fold(0, |a, m| a | m),
                counts: existing.iter().map(|(k, n)| (keys.id(k), *n)).collect(),
                items: Vec::new(),
                starts: Vec::new(),
            },
            Rule::SplitOnEnable {
                memory_mib,
                max_vfs,
            } => State::Split {
                memory: *memory_mib,
                max_vfs: *max_vfs,
                k: 0,
                max_need: 0,
            },
        }
    }

    /// Adds one instance of `opt` when it fits; returns whether it did (the state is unchanged when
    /// not).
    pub fn try_add(&mut self, opt: &Opt) -> bool {
        match (self, &opt.cost) {
            (
                State::Pools {
                    free,
                    slots,
                    homogeneous,
                    class,
                    added,
                    ..
                },
                OptCost::Pools {
                    uses,
                    class: c,
                    limit,
                },
            ) => {
                if *homogeneous && class.is_some_and(|have| have != *c) {
                    return false;
                }
                if *slots == Some(0) {
                    return false;
                }
                if limit.is_some_and(|l| count_of(added, opt.key) >= l) {
                    return false;
                }
                if free.iter().zip(uses).any(|(f, u)| u > f) {
                    return false;
                }
                for (f, u) in free.iter_mut().zip(uses) {
                    *f -= u;
                }
                if let Some(s) = slots {
                    *s -= 1;
                }
                if *homogeneous {
                    *class = Some(*c);
                }
                bump(added, opt.key);
                true
            }
            (
                State::Geometry {
                    fixed,
                    counts,
                    items,
                    starts,
                    ..
                },
                OptCost::Geometry {
                    size,
                    starts: legal,
                    limit,
                },
            ) => {
                if limit.is_some_and(|l| count_of(counts, opt.key) >= l) {
                    return false;
                }
                // Fast path: the new item fits beside the current arrangement.
                let taken = items
                    .iter()
                    .zip(starts.iter())
                    .filter_map(|((sz, _), st)| mask(*st, *sz))
                    .fold(*fixed, |a, m| a | m);
                let direct = legal
                    .iter()
                    .copied()
                    .find(|s| mask(*s, *size).is_some_and(|m| m & taken == 0));
                let arrangement = match direct {
                    Some(s) => {
                        let mut v = starts.clone();
                        v.push(s);
                        Some(v)
                    }
                    None => {
                        let mut all: Vec<Item<'_>> = items
                            .iter()
                            .map(|(sz, st)| Item {
                                size: *sz,
                                starts: st,
                            })
                            .collect();
                        all.push(Item {
                            size: *size,
                            starts: legal,
                        });
                        pack(*fixed, &all)
                    }
                };
                let Some(arrangement) = arrangement else {
                    return false;
                };
                items.push((*size, legal.clone()));
                *starts = arrangement;
                bump(counts, opt.key);
                true
            }
            (
                State::Split {
                    memory,
                    max_vfs,
                    k,
                    max_need,
                },
                OptCost::Split { need },
            ) => {
                let n = *k + 1;
                let biggest = (*max_need).max(*need);
                if n > *max_vfs || memory.is_some_and(|m| u64::from(n).saturating_mul(biggest) > m)
                {
                    return false;
                }
                *k = n;
                *max_need = biggest;
                true
            }
            _ => false,
        }
    }

    /// How full the GPU is, 0 (untouched and empty) to 1: the largest share used of any dimension.
    pub fn utilization(&self) -> f64 {
        let share = |left: u64, all: u64| {
            if all == 0 {
                1.0
            } else {
                1.0 - left as f64 / all as f64
            }
        };
        match self {
            State::Pools {
                free,
                free0,
                slots,
                slots0,
                class,
                homogeneous,
                ..
            } => {
                let mut u = free
                    .iter()
                    .zip(free0)
                    .map(|(f, f0)| share(*f, *f0))
                    .fold(0.0, f64::max);
                if let (Some(s), Some(s0)) = (slots, slots0) {
                    u = u.max(share(u64::from(*s), u64::from(*s0)));
                }
                // A locked homogeneous GPU with nothing used yet counts as touched.
                if *homogeneous && class.is_some() && u == 0.0 {
                    u = f64::EPSILON;
                }
                u
            }
            State::Geometry {
                span, fixed, items, ..
            } => {
                let used: u32 = fixed.count_ones() + items.iter().map(|(s, _)| *s).sum::<u32>();
                f64::from(used) / f64::from((*span).max(1))
            }
            State::Split {
                memory,
                max_vfs,
                k,
                max_need,
            } => {
                let by_count = f64::from(*k) / f64::from((*max_vfs).max(1));
                let by_memory = memory
                    .map(|m| share(m.saturating_sub(u64::from(*k) * max_need), m))
                    .unwrap_or(0.0);
                by_count.max(by_memory)
            }
        }
    }

    /// An upper bound on how many more instances of a demand with options `opts` fit, alone.
    pub fn upper_alone(&self, opts: &[Opt]) -> u32 {
        if opts.is_empty() {
            return 0;
        }
        match self {
            State::Pools {
                free,
                slots,
                homogeneous,
                class,
                added,
                ..
            } => {
                let fits = |o: &Opt| match &o.cost {
                    OptCost::Pools { uses, class: c, .. } => {
                        !(*homogeneous && class.is_some_and(|have| have != *c))
                            && free.iter().zip(uses).all(|(f, u)| u <= f)
                    }
                    _ => false,
                };
                let usable: Vec<&Opt> = opts.iter().filter(|o| fits(o)).collect();
                let mut n = u64::from(slots.unwrap_or(u32::MAX));
                for (d, f) in free.iter().enumerate() {
                    let least = usable
                        .iter()
                        .filter_map(|o| match &o.cost {
                            OptCost::Pools { uses, .. } => uses.get(d).copied(),
                            _ => None,
                        })
                        .min()
                        .unwrap_or(0);
                    if let Some(q) = f.checked_div(least) {
                        n = n.min(q);
                    }
                }
                let limits: Option<u64> = usable
                    .iter()
                    .map(|o| match &o.cost {
                        OptCost::Pools { limit: Some(l), .. } => {
                            Some(u64::from(l.saturating_sub(count_of(added, o.key))))
                        }
                        _ => None,
                    })
                    .sum();
                if let Some(l) = limits {
                    n = n.min(l);
                }
                if usable.is_empty() { 0 } else { clamp_u32(n) }
            }
            State::Geometry {
                span,
                fixed,
                counts,
                items,
                ..
            } => {
                let free = span
                    .saturating_sub(fixed.count_ones())
                    .saturating_sub(items.iter().map(|(s, _)| *s).sum());
                let least = opts
                    .iter()
                    .filter_map(|o| match &o.cost {
                        OptCost::Geometry { size, .. } => Some(*size),
                        _ => None,
                    })
                    .min()
                    .unwrap_or(0);
                let mut n = free.checked_div(least).unwrap_or(0);
                let limits: Option<u32> = opts
                    .iter()
                    .map(|o| match &o.cost {
                        OptCost::Geometry { limit: Some(l), .. } => {
                            Some(l.saturating_sub(count_of(counts, o.key)))
                        }
                        _ => None,
                    })
                    .try_fold(0u32, |a, x| x.map(|x| a.saturating_add(x)));
                if let Some(l) = limits {
                    n = n.min(l);
                }
                n
            }
            State::Split {
                memory,
                max_vfs,
                k,
                max_need,
            } => {
                let least = opts
                    .iter()
                    .filter_map(|o| match &o.cost {
                        OptCost::Split { need } => Some(*need),
                        _ => None,
                    })
                    .min()
                    .unwrap_or(0);
                let mut n = max_vfs.saturating_sub(*k);
                if let Some(m) = memory
                    && let Some(q) = m.checked_div((*max_need).max(least))
                {
                    n = n.min(clamp_u32(q).saturating_sub(*k));
                }
                n
            }
        }
    }

    /// For a PF whose VFs are still off: how many VFs to enable for what was added (as many as the
    /// largest need allows, so VFs are left for later instances).
    pub fn vfs_to_enable(&self) -> Option<u32> {
        match self {
            State::Split {
                memory,
                max_vfs,
                k,
                max_need,
            } if *k > 0 => {
                let by_memory = match (memory, *max_need) {
                    (Some(m), need) if need > 0 => clamp_u32(m / need),
                    _ => *max_vfs,
                };
                Some(by_memory.min(*max_vfs).max(*k))
            }
            _ => None,
        }
    }

    /// The start of each added geometry instance, in the order they were added.
    pub fn geometry_starts(&self) -> &[u32] {
        match self {
            State::Geometry { starts, .. } => starts,
            _ => &[],
        }
    }
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
