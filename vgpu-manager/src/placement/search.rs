//! Exact branch-and-bound over instances: finds the most instances that can be placed, or gives up
//! after a node budget (the caller then keeps its greedy answer and says it is not proven optimal).
//!
//! Instances of one demand are interchangeable, so each demand's instances take options in
//! non-decreasing order of a fixed option list (a multiset, not a sequence). A branch is cut when even
//! every remaining instance's capacity bound cannot beat the best count found.

use super::state::{Compiled, State};

/// One placed instance: demand, GPU, option index.
pub(crate) type Pick = (usize, usize, usize);

pub(crate) struct Search<'a> {
    c: &'a Compiled,
    states: Vec<State>,
    /// Per demand: its (GPU, option) pairs in trial order.
    flat: Vec<Vec<(usize, usize)>>,
    path: Vec<Pick>,
    /// The best assignment found so far.
    pub best: Vec<Pick>,
    nodes: u64,
    budget: u64,
    /// Whether the budget ran out before the search finished.
    pub aborted: bool,
    /// Stop once this many are placed (an upper bound: nothing better exists).
    target: usize,
    done: bool,
}

impl<'a> Search<'a> {
    /// A search that must beat `incumbent` to replace it. `order[d]` lists GPUs in preference order
    /// for demand `d`.
    pub fn new(
        c: &'a Compiled,
        incumbent: Vec<Pick>,
        order: &[Vec<usize>],
        budget: u64,
        target: u64,
    ) -> Self {
        let flat = c
            .demands
            .iter()
            .zip(order)
            .map(|(d, gpus)| {
                gpus.iter()
                    .flat_map(|&g| (0..d.opts[g].len()).map(move |o| (g, o)))
                    .collect()
            })
            .collect();
        Search {
            c,
            states: c.gpus.clone(),
            flat,
            path: Vec::new(),
            best: incumbent,
            nodes: 0,
            budget,
            aborted: false,
            target: usize::try_from(target).unwrap_or(usize::MAX),
            done: false,
        }
    }

    /// Runs the search.
    pub fn run(&mut self) {
        let first = self.c.demands.first().map_or(0, |d| d.count);
        self.dfs(0, 0, first);
    }

    fn cap(&self, d: usize) -> u64 {
        let dem = &self.c.demands[d];
        self.states
            .iter()
            .zip(&dem.opts)
            .map(|(s, o)| u64::from(s.upper_alone(o)))
            .sum()
    }

    fn dfs(&mut self, d: usize, from: usize, left: u32) {
        if self.aborted || self.done {
            return;
        }
        self.nodes += 1;
        if self.nodes > self.budget {
            self.aborted = true;
            return;
        }
        let demands = self.c.demands.len();
        if d == demands {
            if self.path.len() > self.best.len() {
                self.best = self.path.clone();
                self.done = self.best.len() >= self.target;
            }
            return;
        }
        let mut bound = self.path.len() as u64 + u64::from(left).min(self.cap(d));
        for later in d + 1..demands {
            bound += u64::from(self.c.demands[later].count).min(self.cap(later));
        }
        if bound <= self.best.len() as u64 {
            return;
        }
        if left > 0 {
            for i in from..self.flat[d].len() {
                let (g, o) = self.flat[d][i];
                let saved = self.states[g].clone();
                if self.states[g].try_add(&self.c.demands[d].opts[g][o]) {
                    self.path.push((d, g, o));
                    self.dfs(d, i, left - 1);
                    self.path.pop();
                    self.states[g] = saved;
                    if self.aborted || self.done {
                        return;
                    }
                }
            }
        }
        // The rest of this demand's instances stay unplaced.
        let next = self.c.demands.get(d + 1).map_or(0, |n| n.count);
        self.dfs(d + 1, 0, next);
    }
}
