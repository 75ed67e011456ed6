//! Which key an operation touches: splitmix64 for the randomness, and a
//! draw of a key's popularity rank, Zipf (a table of cumulative weights
//! searched by bisection, so 10^6 keys cost 8 MB and a draw ~20
//! comparisons) or uniform. Owns no key names and no I/O (`command` spells
//! the keys).

use clap::ValueEnum;

/// Key popularity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Dist {
    /// P(rank r) ∝ 1/(r+1)^s.
    Zipf,
    /// Every key equally likely.
    Uniform,
}

/// splitmix64: small and fast; good enough to pick keys.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (multiply-high; the bias is below 2^-32 for n < 2^32).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

/// Ranks 0..n drawn with P(r) ∝ 1/(r+1)^s: the normalised cumulative
/// weights, searched by bisection.
pub(crate) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(crate) fn new(n: u64, s: f64) -> Zipf {
        let mut cdf = Vec::with_capacity(n as usize);
        let mut sum = 0.0f64;
        for r in 0..n {
            sum += ((r + 1) as f64).powf(-s);
            cdf.push(sum);
        }
        for c in &mut cdf {
            *c /= sum;
        }
        Zipf { cdf }
    }

    pub(crate) fn sample(&self, rng: &mut Rng) -> u64 {
        let u = rng.unit();
        let i = self.cdf.partition_point(|&c| c <= u);
        i.min(self.cdf.len().saturating_sub(1)) as u64
    }
}

/// How keys are drawn.
pub(crate) enum Sampler {
    Uniform(u64),
    Zipf(Zipf),
}

impl Sampler {
    /// A draw over `keys` keys by `dist` (`s`: the Zipf exponent).
    pub(crate) fn new(dist: Dist, keys: u64, s: f64) -> Sampler {
        match dist {
            Dist::Uniform => Sampler::Uniform(keys),
            Dist::Zipf => Sampler::Zipf(Zipf::new(keys, s)),
        }
    }

    pub(crate) fn sample(&self, rng: &mut Rng) -> u64 {
        match self {
            Sampler::Uniform(n) => rng.below(*n),
            Sampler::Zipf(z) => z.sample(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_follows_its_weights() {
        let (n, s) = (1_000_000u64, 0.99);
        let z = Zipf::new(n, s);
        let h: f64 = (1..=n).map(|r| (r as f64).powf(-s)).sum();
        let mut rng = Rng(7);
        let draws = 400_000;
        let mut top = [0u64; 3];
        for _ in 0..draws {
            let r = z.sample(&mut rng);
            assert!(r < n);
            if let Some(c) = top.get_mut(r as usize) {
                *c += 1;
            }
        }
        for (r, &c) in top.iter().enumerate() {
            let want = ((r + 1) as f64).powf(-s) / h;
            let got = c as f64 / draws as f64;
            assert!(
                (got - want).abs() < want * 0.05,
                "rank {r}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn uniform_covers_the_range() {
        let mut rng = Rng(1);
        let mut counts = [0u64; 10];
        for _ in 0..100_000 {
            counts[rng.below(10) as usize] += 1;
        }
        assert!(counts.iter().all(|&c| (9_000..11_000).contains(&c)));
    }
}
