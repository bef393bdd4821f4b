//! Seeded random numbers and PyTorch's default initialisation for conv and
//! linear layers: weight and bias uniform in ±1/√fan_in
//! (`kaiming_uniform_(a=√5)` works out to exactly that).

/// SplitMix64: small, fast, reproducible across platforms.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in [-bound, bound).
    pub fn uniform(&mut self, n: usize, bound: f32) -> Vec<f32> {
        (0..n).map(|_| (self.unit() * 2.0 - 1.0) * bound).collect()
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let u1 = self.unit().max(1e-7);
                let u2 = self.unit();
                (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect()
    }

    /// Integers in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// PyTorch's default bound for a layer with `fan_in` inputs.
pub fn default_bound(fan_in: usize) -> f32 {
    1.0 / (fan_in as f32).sqrt()
}
