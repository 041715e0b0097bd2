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
    }
}
