//! Small numeric helpers: medians and FIFO inversion counts (the seeded generator and percentiles
//! are the crowd library's, `waitroom_tools::numbers`).

pub fn median(values: &[f64]) -> f64 {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Pairs (i, j) with `i` before `j` in ticket order but whose event came more than `slack` later
/// than `j`'s: `events[k]` is the event time of the k-th ticket. With `slack = 0` this is the
/// plain inversion count. O(n log n) with a Fenwick tree over the sorted event times.
pub fn inversions(events: &[f64], slack: f64) -> u64 {
    let mut sorted: Vec<f64> = events.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    let mut tree = vec![0u64; n + 1];
    let add = |tree: &mut Vec<u64>, mut i: usize| {
        i += 1;
        while i <= n {
            tree[i] += 1;
            i += i & i.wrapping_neg();
        }
    };
    let prefix = |tree: &Vec<u64>, mut i: usize| -> u64 {
        // count of inserted values at sorted positions < i
        let mut s = 0;
        while i > 0 {
            s += tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    };
    let mut total = 0u64;
    for (inserted, &t) in events.iter().enumerate() {
        // earlier tickets whose event time is > t + slack
        let bound = t + slack;
        let at_most = sorted.partition_point(|&x| x <= bound);
        total += inserted as u64 - prefix(&tree, at_most);
        let pos = sorted.partition_point(|&x| x < t);
        add(&mut tree, pos);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_inversions() {
        assert_eq!(inversions(&[1.0, 2.0, 3.0], 0.0), 0);
        assert_eq!(inversions(&[3.0, 2.0, 1.0], 0.0), 3);
        assert_eq!(inversions(&[3.0, 2.0, 1.0], 1.5), 1);
        assert_eq!(inversions(&[1.0, 1.0], 0.0), 0);
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
