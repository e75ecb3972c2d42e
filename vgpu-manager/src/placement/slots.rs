//! Packing ranges on a line of at most 64 slots: each item has a size and legal start positions, and
//! no two items may overlap each other or the slots already taken. This is the geometry of MIG GPU
//! instances (memory slices) and of NVIDIA mixed-size vGPU placement ids.
//!
//! The search is exact: it returns a legal set of starts whenever one exists. Items are tried biggest
//! first (they have the fewest positions), and interchangeable items take increasing starts so the
//! same arrangement is not searched once per permutation.

/// One range to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Item<'a> {
    /// Slots it spans (1..=64).
    pub size: u32,
    /// Legal first slots.
    pub starts: &'a [u32],
}

/// The slots `[start, start + size)` as a bit mask, `None` when they run past slot 63.
pub fn mask(start: u32, size: u32) -> Option<u64> {
    let end = start.checked_add(size)?;
    if size == 0 || end > 64 {
        return None;
    }
    let ones = if size == 64 {
        u64::MAX
    } else {
        (1u64 << size) - 1
    };
    Some(ones << start)
}

/// A start for every item (in `items` order) so that no two overlap and none touches `taken`, or
/// `None` when no legal arrangement exists.
pub fn pack(taken: u64, items: &[Item<'_>]) -> Option<Vec<u32>> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(items[i].size), items[i].starts.len(), i));
    let mut starts = vec![0u32; items.len()];
    if place(items, &order, 0, taken, &mut starts) {
        Some(starts)
    } else {
        None
    }
}

fn place(items: &[Item<'_>], order: &[usize], at: usize, taken: u64, out: &mut [u32]) -> bool {
    let Some(&i) = order.get(at) else {
        return true;
    };
    let item = items[i];
    // An item equal to the previous one starts after it (their order does not matter).
    let floor = match at.checked_sub(1).map(|p| order[p]) {
        Some(prev) if items[prev] == item => out[prev].saturating_add(1),
        _ => 0,
    };
    for &s in item.starts.iter().filter(|&&s| s >= floor) {
        let Some(m) = mask(s, item.size) else {
            continue;
        };
        if taken & m == 0 {
            out[i] = s;
            if place(items, order, at + 1, taken | m, out) {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks() {
        assert_eq!(mask(0, 1), Some(1));
        assert_eq!(mask(4, 4), Some(0xf0));
        assert_eq!(mask(0, 64), Some(u64::MAX));
        assert_eq!(mask(60, 8), None);
        assert_eq!(mask(0, 0), None);
    }

    #[test]
    fn finds_an_arrangement_a_first_fit_misses() {
        // A 2-slot item allowed only at 0 or 2, and a 1-slot item allowed at 0..3: placing the small
        // one first at 0 would block; the packer puts the big one first.
        let small = [0, 1, 2, 3];
        let big = [0, 2];
        let items = [
            Item {
                size: 1,
                starts: &small,
            },
            Item {
                size: 2,
                starts: &big,
            },
            Item {
                size: 1,
                starts: &small,
            },
        ];
        let s = pack(0, &items).unwrap();
        let masks: Vec<u64> = items
            .iter()
            .zip(&s)
            .map(|(it, st)| mask(*st, it.size).unwrap())
            .collect();
        assert_eq!(masks.iter().fold(0, |a, m| a | m), 0b1111);
        assert_eq!(masks.iter().map(|m| m.count_ones()).sum::<u32>(), 4);
    }

    #[test]
    fn says_when_nothing_fits() {
        let big = [0, 2];
        let items = [Item {
            size: 2,
            starts: &big,
        }; 2];
        // Slot 1 taken: only start 2 is free for one of the two.
        assert_eq!(pack(0b10, &items), None);
        assert_eq!(pack(0, &items), Some(vec![0, 2]));
    }
}
