//! Order statistics over sorted samples.

/// The median of sorted samples (0 when empty).
pub fn median(sorted: &[u64]) -> f64 {
    percentile(sorted, 0.5)
}

/// The `q`-quantile (0..=1) of sorted samples, nearest rank (0 when empty).
pub fn percentile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[rank_of(q, sorted.len())] as f64
}

/// The `q`-quantile of unsorted durations in seconds.
pub fn percentile_f64(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[rank_of(q, v.len())]
}

/// A figure over several passes: the median and the range.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub passes: usize,
}

impl Spread {
    /// The spread of per-pass values (NaN values are left out).
    pub fn of(values: &[f64]) -> Self {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return Self {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                passes: 0,
            };
        }
        Self {
            median: v[rank_of(0.5, v.len())],
            min: v[0],
            max: v[v.len() - 1],
            passes: v.len(),
        }
    }

    /// `median (min–max)` with `decimals` decimals.
    pub fn show(&self, decimals: usize) -> String {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            self.median,
            self.min,
            self.max,
            d = decimals
        )
    }
}

/// The nearest-rank index of the `q`-quantile among `len` samples (`len` > 0).
fn rank_of(q: f64, len: usize) -> usize {
    let rank = (q.clamp(0.0, 1.0) * (len - 1) as f64).round();
    // In 0..len by the clamp above.
    #[expect(clippy::cast_sign_loss, reason = "rank is clamped to be non-negative")]
    let rank = rank as usize;
    rank.min(len - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(median(&v), 51.0));
        assert!(close(percentile(&v, 0.99), 99.0));
        assert!(close(percentile(&[], 0.5), 0.0));
        assert!(close(percentile_f64(&[3.0, 1.0, 2.0], 0.5), 2.0));
        let s = Spread::of(&[3.0, f64::NAN, 1.0, 2.0, 9.0, 4.0]);
        assert!(close(s.median, 3.0) && close(s.min, 1.0) && close(s.max, 9.0));
        assert_eq!(s.passes, 5);
        assert_eq!(s.show(1), "3.0 (1.0–9.0)");
    }
}
