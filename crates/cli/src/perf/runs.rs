//! Figures of a benchmark set repeated `--runs N` times: each run maps a
//! key (`mbps/tcp/1024`, `lat/normal/1`, ...) to a cell, and the table
//! shows, per key, the median over the runs that measured it, the spread
//! ((max − min) / median) and, when none did, why. Ratios are taken
//! within each run, then summarised the same way.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use super::sockets::median;

/// A cell of one run: a figure, or the reason there is none.
pub(crate) trait Figure: Clone {
    /// The figure, when the run measured it.
    fn value(&self) -> Option<f64>;
    /// Whether the reason is an absence that is not a failure (a program
    /// not installed, a feature not built): it explains a row better than
    /// a failure does.
    fn absent(&self) -> bool;
}

/// Median, spread and count of one key's values over the runs.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Stats<C> {
    /// Median of the runs that measured it.
    pub median: Option<f64>,
    /// (max − min) / median, when at least two runs measured it.
    pub spread: Option<f64>,
    /// The runs that measured it.
    pub n: usize,
    /// Why it has no value, when no run measured it (an absence first,
    /// else the first reason).
    pub why: Option<C>,
}

/// Median and spread of `v`.
pub(crate) fn stats_of(v: &[f64]) -> (Option<f64>, Option<f64>) {
    let m = median(v.to_vec());
    let spread = match m {
        Some(m) if v.len() >= 2 && m != 0.0 => {
            let max = v.iter().copied().fold(f64::MIN, f64::max);
            let min = v.iter().copied().fold(f64::MAX, f64::min);
            Some((max - min) / m.abs())
        }
        _ => None,
    };
    (m, spread)
}

/// The statistics of `key` over `runs`.
pub(crate) fn stats<K: Ord + Borrow<str>, C: Figure>(
    runs: &[BTreeMap<K, C>],
    key: &str,
) -> Stats<C> {
    let cells: Vec<&C> = runs.iter().filter_map(|r| r.get(key)).collect();
    let vals: Vec<f64> = cells.iter().filter_map(|c| c.value()).collect();
    let (median, spread) = stats_of(&vals);
    let why = if vals.is_empty() {
        cells
            .iter()
            .find(|c| c.absent())
            .or_else(|| cells.first())
            .map(|c| (*c).clone())
    } else {
        None
    };
    Stats {
        median,
        spread,
        n: vals.len(),
        why,
    }
}

/// The statistics of `num / den`, taken per run.
pub(crate) fn ratio_stats<K: Ord + Borrow<str>, C: Figure>(
    runs: &[BTreeMap<K, C>],
    num: &str,
    den: &str,
) -> Stats<C> {
    let vals: Vec<f64> = runs
        .iter()
        .filter_map(|r| {
            let a = r.get(num)?.value()?;
            let b = r.get(den)?.value()?;
            (b > 0.0).then_some(a / b)
        })
        .collect();
    let (median, spread) = stats_of(&vals);
    Stats {
        median,
        spread,
        n: vals.len(),
        why: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Debug, PartialEq)]
    enum C {
        Ok(f64),
        Absent,
        Failed,
    }

    impl Figure for C {
        fn value(&self) -> Option<f64> {
            match self {
                C::Ok(v) => Some(*v),
                _ => None,
            }
        }
        fn absent(&self) -> bool {
            matches!(self, C::Absent)
        }
    }

    fn run(cells: &[(&str, C)]) -> BTreeMap<String, C> {
        cells
            .iter()
            .map(|(k, c)| (k.to_string(), c.clone()))
            .collect()
    }

    #[test]
    fn medians_spreads_and_reasons() {
        assert_eq!(stats_of(&[]), (None, None));
        assert_eq!(stats_of(&[2.0]), (Some(2.0), None));
        let runs = [
            run(&[("a", C::Ok(1.0)), ("b", C::Ok(2.0)), ("x", C::Failed)]),
            run(&[("a", C::Ok(4.0)), ("b", C::Failed), ("x", C::Absent)]),
            run(&[("a", C::Ok(2.0)), ("b", C::Ok(1.0)), ("x", C::Failed)]),
        ];
        let a = stats(&runs, "a");
        assert_eq!((a.median, a.n, a.why), (Some(2.0), 3, None));
        assert_eq!(a.spread, Some(1.5));
        // Nothing measured: the absence explains it, not the first failure.
        let x = stats(&runs, "x");
        assert_eq!((x.median, x.n, x.why), (None, 0, Some(C::Absent)));
        // Ratios per run, only where both were measured.
        let r = ratio_stats(&runs, "a", "b");
        assert_eq!(r.n, 2);
        assert_eq!(r.median, Some(1.25));
        assert_eq!(stats(&runs, "none").why, None);
    }
}
