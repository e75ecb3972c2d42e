//! Share arithmetic: requested shares from weights, and integer quanta proportional to weights.
//!
//! Quanta are apportioned by largest remainder (Hamilton's method): each slot gets the floor of its
//! ideal `period × weight / Σweight`, at least the scheduler's minimum, and the units left go to the
//! largest remainders. Each quantum is then within one unit of its ideal, so the share error of a slot
//! is below `1 / period`; the planner lengthens the period from the vendor's default until every slot
//! is within the tolerance (or the longest acceptable period is reached).

use serde::{Deserialize, Serialize};

/// weight / Σweight per slot (all zero when the weights sum to zero).
pub fn requested_shares(weights: &[u32]) -> Vec<f64> {
    let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
    weights
        .iter()
        .map(|w| {
            if total == 0 {
                0.0
            } else {
                f64::from(*w) / total as f64
            }
        })
        .collect()
}

/// Each value's fraction of their sum.
pub fn shares_of(values: &[u64]) -> Vec<f64> {
    let total: u64 = values.iter().sum();
    values
        .iter()
        .map(|v| {
            if total == 0 {
                0.0
            } else {
                *v as f64 / total as f64
            }
        })
        .collect()
}

/// Splits `total` units over `weights` in proportion, each slot at least `min`, by largest remainder;
/// ties go to the lower index, so the result is deterministic. `None` when `total < min × slots` or
/// every weight is zero.
pub fn apportion(total: u64, weights: &[u32], min: u64) -> Option<Vec<u64>> {
    if weights.is_empty() {
        return Some(Vec::new());
    }
    let w_sum: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    let n = weights.len() as u64;
    if w_sum == 0 || total < min.saturating_mul(n) {
        return None;
    }
    let total128 = u128::from(total);
    let mut q: Vec<u64> = weights
        .iter()
        .map(|w| {
            let floor = total128 * u128::from(*w) / w_sum;
            u64::try_from(floor).unwrap_or(u64::MAX).max(min)
        })
        .collect();
    // How far each slot is below its ideal, in units of 1/w_sum (negative: above).
    let excess = |q: &[u64], i: usize| -> i128 {
        let ideal = total128 * u128::from(weights[i]);
        i128::try_from(ideal).unwrap_or(i128::MAX)
            - i128::try_from(u128::from(q[i]) * w_sum).unwrap_or(i128::MAX)
    };
    let mut sum: u64 = q.iter().sum();
    while sum < total {
        // Most below its ideal first; the lowest index on ties.
        let Some(i) = (0..q.len()).max_by_key(|&i| (excess(&q, i), std::cmp::Reverse(i))) else {
            break;
        };
        q[i] += 1;
        sum += 1;
    }
    while sum > total {
        // Most above its ideal first, among slots that may shrink.
        let i = (0..q.len())
            .filter(|&i| q[i] > min)
            .min_by_key(|&i| (excess(&q, i), i))?;
        q[i] -= 1;
        sum -= 1;
    }
    Some(q)
}

/// The limits of a per-slot quantum scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuantaLimits {
    /// Smallest quantum the scheduler accepts (0 often means "unlimited", so at least 1).
    pub min: u32,
    /// Largest quantum it accepts.
    pub max: u32,
    /// The period to start from (the vendor's default round length).
    pub base_period: u32,
    /// The longest period the planner may choose (bounds the worst-case wait).
    pub max_period: u32,
}

/// Quanta for a set of weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Quanta {
    /// Σ quanta: one round with every slot busy.
    pub period: u32,
    /// Per slot, in weight order.
    pub quanta: Vec<u32>,
    /// Largest |quantum share − requested share|.
    pub max_error: f64,
}

/// Largest |a − b| over two share vectors.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .fold(0.0, |m, (x, y)| f64::max(m, (x - y).abs()))
}

/// Quanta proportional to `weights`: the shortest period from `limits.base_period` up to
/// `limits.max_period` whose apportionment is within `tolerance` of every requested share.
/// `Err` carries the closest result found (the caller reports its error), or `None` when no period
/// fits the limits at all (more slots than `max_period / min`, or quanta above `max`).
pub fn proportional_quanta(
    weights: &[u32],
    limits: QuantaLimits,
    tolerance: f64,
) -> Result<Quanta, Option<Quanta>> {
    let want = requested_shares(weights);
    let n = u32::try_from(weights.len()).unwrap_or(u32::MAX);
    let start = limits.base_period.max(limits.min.saturating_mul(n)).max(1);
    if start > limits.max_period {
        return Err(None);
    }
    let mut best: Option<Quanta> = None;
    for period in start..=limits.max_period {
        let Some(q) = apportion(u64::from(period), weights, u64::from(limits.min)) else {
            continue;
        };
        if q.iter().any(|x| *x > u64::from(limits.max)) {
            // Longer periods only make quanta larger.
            break;
        }
        let err = max_abs_diff(&shares_of(&q), &want);
        let quanta = Quanta {
            period,
            quanta: q
                .iter()
                .map(|x| u32::try_from(*x).unwrap_or(u32::MAX))
                .collect(),
            max_error: err,
        };
        if err <= tolerance {
            return Ok(quanta);
        }
        if best.as_ref().is_none_or(|b| err < b.max_error) {
            best = Some(quanta);
        }
    }
    Err(best)
}
