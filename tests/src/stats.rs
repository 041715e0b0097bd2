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

/// Critical values of chi-square at p = 10^-6 by degrees of freedom (1..=5): a uniform random
/// spread fails the check once in a million runs. At p = 0.001 it failed a fresh CI run
/// ([3496, 3322, 3182] over 10,000 connects, chi-square 14.85, then 0.06-5.85 in twelve runs).
/// A backend that gets 37% of 10,000 connects instead of a third still fails it (about 60).
pub fn chi_square_critical_p1e6(df: usize) -> f64 {
    [23.928, 27.631, 30.664, 33.377, 35.888][df - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_spread_passes_and_skew_fails() {
        assert!(chi_square_uniform(&[3333, 3334, 3333]) < 0.01);
        assert!(chi_square_uniform(&[4000, 3000, 3000]) > chi_square_critical_p1e6(2));
        assert!(chi_square_uniform(&[3700, 3150, 3150]) > chi_square_critical_p1e6(2));
        assert!(chi_square_uniform(&[3496, 3322, 3182]) < chi_square_critical_p1e6(2));
    }
}
