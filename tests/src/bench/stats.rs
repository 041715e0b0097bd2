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
    let rank = (q * (sorted.len() - 1) as f64).round();
    let index = usize::try_from(rank as u64)
        .unwrap_or(0)
        .min(sorted.len() - 1);
    sorted[index] as f64
}

/// The `q`-quantile of unsorted durations in seconds.
pub fn percentile_f64(values: &[f64], q: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * (v.len() - 1) as f64).round();
    v[usize::try_from(rank as u64).unwrap_or(0).min(v.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(median(&v), 51.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile_f64(&[3.0, 1.0, 2.0], 0.5), 2.0);
    }
}
