//! Summaries of samples: median, p90 and p99 by nearest rank (no interpolation, so every
//! reported figure is a value that was actually measured).

use serde::Serialize;

/// Summary of a set of samples (milliseconds, request counts, …).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Smallest sample.
    pub min: f64,
    /// Median (nearest rank: the ⌈n/2⌉-th smallest).
    pub median: f64,
    /// 90th percentile (nearest rank: the ⌈0.9·n⌉-th smallest).
    pub p90: f64,
    /// 99th percentile (nearest rank: the ⌈0.99·n⌉-th smallest; the largest below 100 samples).
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

/// The `q`-quantile of sorted samples by nearest rank.
fn nearest_rank(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

/// Summarises `samples`; `None` when there are none.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some(Summary {
        n: sorted.len(),
        min: sorted[0],
        median: nearest_rank(&sorted, 0.5),
        p90: nearest_rank(&sorted, 0.9),
        p99: nearest_rank(&sorted, 0.99),
        max: sorted[sorted.len() - 1],
    })
}

/// The median of `samples` (0 when empty).
pub fn median(samples: &[f64]) -> f64 {
    summarize(samples).map_or(0.0, |s| s.median)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_values_that_were_measured() {
        let s = summarize(&[5.0, 1.0, 4.0, 2.0, 3.0]).unwrap();
        assert_eq!(
            (s.n, s.min, s.median, s.p90, s.max),
            (5, 1.0, 3.0, 5.0, 5.0)
        );
        let twelve: Vec<f64> = (1..=12).map(f64::from).collect();
        let s = summarize(&twelve).unwrap();
        assert_eq!((s.median, s.p90, s.p99), (6.0, 11.0, 12.0));
        let hundred_and_one: Vec<f64> = (1..=101).map(f64::from).collect();
        assert_eq!(summarize(&hundred_and_one).unwrap().p99, 100.0);
        assert_eq!(summarize(&[7.0]).unwrap().p90, 7.0);
        assert!(summarize(&[]).is_none());
    }
}
