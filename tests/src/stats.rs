//! Statistics for spread assertions.

/// Pearson's chi-square statistic of `observed` counts against a uniform spread.
pub fn chi_square_uniform(observed: &[usize]) -> f64 {
    let total: usize = observed.iter().sum();
    let expected = total as f64 / observed.len() as f64;
    observed
        .iter()
        .map(|o| {
            let d = *o as f64 - expected;
            d * d / expected
        })
        .sum()
}

/// Critical values of chi-square at p = 0.001 by degrees of freedom (1..=5): a uniform random
/// spread fails the check once in a thousand runs.
pub fn chi_square_critical_p001(df: usize) -> f64 {
    [10.828, 13.816, 16.266, 18.467, 20.515][df - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_spread_passes_and_skew_fails() {
        assert!(chi_square_uniform(&[3333, 3334, 3333]) < 0.01);
        assert!(chi_square_uniform(&[4000, 3000, 3000]) > chi_square_critical_p001(2));
    }
}
