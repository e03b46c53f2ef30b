//! Latency histogram with log-linear buckets (HDR-style): recording is a
//! few integer operations and never allocates, so it can sit in a hot
//! ping-pong loop; percentiles are read from the bucket counts.
//!
//! Values are nanoseconds. Values below [`SUB`] get a bucket each; above,
//! every power of two is cut into [`SUB`] equal buckets, so a percentile
//! is within 1/[`SUB`] (0.4 %) of the true sample: finer than the
//! run-to-run spread, so the ratios the targets are read from (1.10 ×, a
//! few percent above 1) are not steps of the histogram (32 buckets, 3 %
//! wide at the microseconds a 64 B ping-pong takes, were). Values above
//! 2^40 ns (18 minutes) land in the last bucket; the counts take 70 KiB.

/// Linear sub-buckets per power of two.
pub(crate) const SUB: u64 = 256;
const SUB_BITS: u32 = 8;
const MAX_EXP: u32 = 40;
const BUCKETS: usize = ((MAX_EXP - SUB_BITS + 2) as u64 * SUB) as usize;

/// A log-linear histogram of nanosecond values.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    counts: Box<[u64]>,
    n: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

fn index(v: u64) -> usize {
    if v < SUB {
        return v as usize;
    }
    let e = 63 - v.leading_zeros();
    if e > MAX_EXP {
        return BUCKETS - 1;
    }
    let sub = (v >> (e - SUB_BITS)) & (SUB - 1);
    ((e - SUB_BITS + 1) as u64 * SUB + sub) as usize
}

/// Lowest and highest value (inclusive) of bucket `i`.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < SUB {
        return (i, i);
    }
    let e = (i / SUB) as u32 + SUB_BITS - 1;
    let sub = i % SUB;
    let width = 1u64 << (e - SUB_BITS);
    let lo = (1u64 << e) + sub * width;
    (lo, lo + width - 1)
}

impl Histogram {
    /// An empty histogram (allocates its buckets once, here).
    pub(crate) fn new() -> Histogram {
        Histogram {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            n: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one value (ns).
    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.n += 1;
        self.sum += ns as u128;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Number of values recorded.
    pub(crate) fn count(&self) -> u64 {
        self.n
    }

    /// Mean (ns), 0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum as f64 / self.n as f64
        }
    }

    /// Adds every value of `other`.
    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (0..=1): the middle of the bucket holding
    /// the sample of that rank, clamped to the observed min/max. 0 when
    /// empty.
    pub(crate) fn quantile(&self, q: f64) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0u64;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                let (lo, hi) = bounds(i);
                let mid = (lo as f64 + hi as f64) / 2.0;
                return mid.clamp(self.min as f64, self.max as f64);
            }
        }
        self.max as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_in_order() {
        let mut last = 0;
        for v in (0..100_000u64).chain([1 << 30, (1 << 40) - 1]) {
            let i = index(v);
            assert!(i >= last, "index not monotonic at {v}");
            last = i;
            let (lo, hi) = bounds(i);
            assert!(lo <= v && v <= hi, "{v} not in bucket {i} [{lo}, {hi}]");
            assert!((hi - lo) as f64 <= v as f64 / SUB as f64 + 1.0);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_are_close_to_the_samples() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        assert_eq!(h.count(), 10_000);
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.004, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.004, "p99 {p99}");
        // A 64 B ping-pong's microseconds: two values 1 % apart have
        // medians 1 % apart (to within a bucket), not the same bucket.
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        for i in 0..1000u64 {
            a.record(3_300 + i % 7);
            b.record(3_333 + i % 7);
        }
        let r = b.quantile(0.5) / a.quantile(0.5);
        assert!((r - 1.01).abs() < 0.003, "ratio of medians {r}");
        assert_eq!(h.quantile(1.0), 1_000_000.0);
        assert!((h.quantile(0.0) - 100.0).abs() <= 1.0);
        assert!((h.mean() - 500_050.0).abs() < 1.0);
        let mut g = Histogram::new();
        g.record(7);
        g.merge(&h);
        assert_eq!(g.count(), 10_001);
        assert_eq!(g.quantile(0.0), 7.0);
        assert_eq!(g.quantile(1.0), 1_000_000.0);
        assert_eq!(Histogram::new().quantile(0.5), 0.0);
    }
}
