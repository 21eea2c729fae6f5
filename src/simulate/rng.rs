//! The simulation's seeded randomness.

/// SplitMix64: small, seeded, and enough for arrivals.
pub(super) struct Rng(pub u64);

impl Rng {
    #[inline]
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[inline]
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// A Poisson draw with mean `lambda`.
    #[inline]
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        if lambda <= 0.0 {
            return 0;
        }
        if lambda < 30.0 {
            let (limit, mut p, mut k) = ((-lambda).exp(), 1.0, 0u64);
            loop {
                p *= self.uniform();
                if p <= limit {
                    return k;
                }
                k += 1;
            }
        }
        // Normal approximation (Box–Muller) for large means.
        let z =
            (-2.0 * self.uniform().ln()).sqrt() * (std::f64::consts::TAU * self.uniform()).cos();
        (lambda + z * lambda.sqrt()).round().max(0.0) as u64
    }
}
