//! Latency histogram of nanosecond values, on [`hdrhistogram`].
//!
//! Contract: [`Histogram::new`] allocates every bucket up front (values
//! from 1 ns to [`MAX_NS`], three significant digits, no auto-resize), so
//! [`Histogram::record`] never allocates and can sit in a hot ping-pong
//! loop; a value above [`MAX_NS`] is recorded as [`MAX_NS`]. A percentile
//! is the middle of the bucket holding the sample of that rank, clamped to
//! the exact minimum and maximum recorded, so it is within 0.05 % of the
//! true sample: finer than the run-to-run spread, so the ratios the
//! targets are read from (1.10 ×, a few percent above 1) are not steps of
//! the histogram. The mean is exact (kept apart from the buckets).

/// Highest value told apart (ns): one minute.
pub(crate) const MAX_NS: u64 = 60_000_000_000;

/// Significant decimal digits of every bucket.
const SIGFIG: u8 = 3;

/// A histogram of nanosecond values.
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    h: hdrhistogram::Histogram<u64>,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    /// An empty histogram (allocates its buckets once, here).
    pub(crate) fn new() -> Histogram {
        let h = hdrhistogram::Histogram::new_with_bounds(1, MAX_NS, SIGFIG)
            .expect("fixed, valid histogram bounds");
        Histogram {
            h,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }

    /// Records one value (ns).
    #[inline]
    pub(crate) fn record(&mut self, ns: u64) {
        self.h.saturating_record(ns);
        self.sum += ns as u128;
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Number of values recorded.
    pub(crate) fn count(&self) -> u64 {
        self.h.len()
    }

    /// Mean (ns), 0 when empty.
    pub(crate) fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.sum as f64 / n as f64,
        }
    }

    /// Adds every value of `other`.
    pub(crate) fn merge(&mut self, other: &Histogram) {
        // Same bounds on both sides: adding cannot run out of range.
        self.h.add(&other.h).expect("histograms of the same bounds");
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// The value at quantile `q` (0..=1): the middle of the bucket holding
    /// the sample of that rank, clamped to the observed min/max. 0 when
    /// empty.
    pub(crate) fn quantile(&self, q: f64) -> f64 {
        if self.count() == 0 {
            return 0.0;
        }
        let v = self.h.value_at_quantile(q.clamp(0.0, 1.0));
        let mid = self.h.median_equivalent(v) as f64;
        mid.clamp(self.min as f64, self.max as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_close_to_the_samples() {
        let mut h = Histogram::new();
        for v in 1..=10_000u64 {
            h.record(v * 100);
        }
        assert_eq!(h.count(), 10_000);
        let p50 = h.quantile(0.5);
        let p99 = h.quantile(0.99);
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.001, "p50 {p50}");
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.001, "p99 {p99}");
        // A 64 B ping-pong's microseconds: two values 1 % apart have
        // medians 1 % apart (to within a bucket), not the same bucket.
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        for i in 0..1000u64 {
            a.record(3_300 + i % 7);
            b.record(3_333 + i % 7);
        }
        let r = b.quantile(0.5) / a.quantile(0.5);
        assert!((r - 1.01).abs() < 0.001, "ratio of medians {r}");
        assert_eq!(h.quantile(1.0), 1_000_000.0);
        assert!((h.quantile(0.0) - 100.0).abs() <= 1.0);
        assert!((h.mean() - 500_050.0).abs() < 1e-6);
        let mut g = Histogram::new();
        g.record(7);
        g.merge(&h);
        assert_eq!(g.count(), 10_001);
        assert_eq!(g.quantile(0.0), 7.0);
        assert_eq!(g.quantile(1.0), 1_000_000.0);
        assert_eq!(Histogram::new().quantile(0.5), 0.0);
    }

    #[test]
    fn out_of_range_values_saturate() {
        let mut h = Histogram::new();
        h.record(0);
        h.record(u64::MAX);
        assert_eq!(h.count(), 2);
        assert_eq!(h.quantile(0.0), 0.0);
        assert!(h.quantile(1.0) >= MAX_NS as f64 * 0.999);
    }
}
