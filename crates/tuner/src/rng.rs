//! A small, seedable pseudo-random generator (xoshiro256++ seeded through
//! SplitMix64). Local to this crate so that suggestions stay reproducible
//! across dependency upgrades.

#[derive(Clone, Debug)]
pub(crate) struct Rng {
    s: [u64; 4],
}

/// SplitMix64: the next value of the sequence `state` walks (for a seed's words, or a
/// few draws where a whole generator is not needed).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes several words into one seed (order-sensitive).
pub(crate) fn mix(words: &[u64]) -> u64 {
    let mut state = 0x51_7CC1_B727_220A_u64;
    let mut out = 0u64;
    for &w in words {
        state ^= w;
        out = splitmix64(&mut state) ^ out.rotate_left(17);
    }
    out
}

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        let mut st = seed;
        let s = [
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
            splitmix64(&mut st),
        ];
        Rng { s }
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub(crate) fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n); n must be positive.
    pub(crate) fn below(&mut self, n: usize) -> usize {
        debug_assert!(n > 0);
        // Lemire's multiply-shift; the bias for n << 2^64 is negligible.
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64(); // (0, 1]
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

/// First 64 primes, the bases of the Halton sequence.
const PRIMES: [u32; 64] = [
    2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
    101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157, 163, 167, 173, 179, 181, 191, 193,
    197, 199, 211, 223, 227, 229, 233, 239, 241, 251, 257, 263, 269, 271, 277, 281, 283, 293, 307,
    311,
];

/// A randomised Halton sequence: each dimension is the radical inverse in its
/// own prime base with digits scrambled by a seeded random permutation per
/// dimension (so the point set depends on the seed), then rotated by a seeded
/// random shift (Cranley–Patterson). Dimensions beyond the 64th fall back to
/// seeded uniform numbers.
pub(crate) struct Halton {
    perms: Vec<Vec<u32>>,
    shifts: Vec<f64>,
    seed: u64,
}

impl Halton {
    pub(crate) fn new(dims: usize, seed: u64) -> Self {
        let mut rng = Rng::new(mix(&[seed, 0x004A_170A]));
        let mut perms = Vec::with_capacity(dims);
        let mut shifts = Vec::with_capacity(dims);
        for d in 0..dims.min(PRIMES.len()) {
            let b = PRIMES[d];
            // Keep 0 fixed so that the digit expansion stays finite.
            let mut p: Vec<u32> = (0..b).collect();
            for i in (2..b as usize).rev() {
                let j = 1 + rng.below(i);
                p.swap(i, j);
            }
            perms.push(p);
            shifts.push(rng.f64());
        }
        Halton {
            perms,
            shifts,
            seed,
        }
    }

    /// The point with the given index (index 0 is a valid point too).
    pub(crate) fn point(&self, index: u64, dims: usize) -> Vec<f64> {
        let mut out = Vec::with_capacity(dims);
        for d in 0..dims {
            if d < self.perms.len() {
                let b = PRIMES[d] as u64;
                let perm = &self.perms[d];
                let mut n = index + 1;
                let mut f = 1.0 / b as f64;
                let mut x = 0.0;
                while n > 0 {
                    x += perm[(n % b) as usize] as f64 * f;
                    n /= b;
                    f /= b as f64;
                }
                out.push((x + self.shifts[d]).fract());
            } else {
                let mut r = Rng::new(mix(&[self.seed, index, d as u64]));
                out.push(r.f64());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_uniformish() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut sum = 0.0;
        for _ in 0..10_000 {
            let x = a.f64();
            assert_eq!(x, b.f64());
            assert!((0.0..1.0).contains(&x));
            sum += x;
        }
        assert!((sum / 10_000.0 - 0.5).abs() < 0.02);
    }

    #[test]
    fn halton_points_are_in_unit_cube_and_spread() {
        let h = Halton::new(3, 1);
        let pts: Vec<_> = (0..64).map(|i| h.point(i, 3)).collect();
        for p in &pts {
            assert!(p.iter().all(|v| (0.0..1.0).contains(v)));
        }
        // Every octant of the unit cube gets at least one of 64 points.
        let mut seen = [false; 8];
        for p in &pts {
            let o = (p[0] >= 0.5) as usize
                | ((p[1] >= 0.5) as usize) << 1
                | ((p[2] >= 0.5) as usize) << 2;
            seen[o] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }
}
