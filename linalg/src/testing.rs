//! Helpers of the unit tests.

/// SplitMix64: fresh shapes and values from one printed seed.
pub(crate) struct Rng(pub u64);

impl Rng {
    /// Seeded from the clock; the seed is printed so that a failure can be replayed.
    pub(crate) fn fresh() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        eprintln!("seed {seed}");
        Rng(seed)
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, hi: usize) -> usize {
        (self.next() % hi as u64) as usize
    }
    /// Uniform in [−1, 1).
    pub(crate) fn value(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// The generator's `m × n` normal draws of `seed`, whole.
pub(crate) fn normal(m: usize, n: usize, seed: u64) -> ndarray::Array2<f64> {
    let g =
        rankwise_sources::Generated::new(m as u64, n as u64, seed, rankwise_sources::Dist::Normal);
    ndarray::Array2::from_shape_fn((m, n), |(i, j)| g.value(i as u64, j as u64))
}
