//! The tests' seeded random numbers: one xorshift64 stream per seed (the
//! seed spread by the golden-ratio constant, never zero), so every test
//! that draws from seed `s` sees the same values and a failure reproduces.
#![allow(dead_code)]

/// Seeded xorshift64.
pub struct Rng(u64);

impl Rng {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in `0..n` (0 for `n == 0`).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }

    /// `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }

    /// A float in [-1, 1) on a 2^-23 grid (never -0.0).
    pub fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// `n` values in `around ± scale` from the stream of `seed`.
pub fn values(n: usize, seed: u64, scale: f32, around: f32) -> Vec<f32> {
    let mut r = Rng::new(seed);
    (0..n).map(|_| around + r.unit() * scale).collect()
}
