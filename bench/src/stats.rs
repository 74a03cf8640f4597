//! Small numeric helpers: a seeded generator, percentiles, medians, and FIFO inversion counts.

/// SplitMix64: repeatable per seed, good enough for arrival times and jitter.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

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
    fn percentiles_and_medians() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
