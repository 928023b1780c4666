//! The tuner's quasi-random points (a scrambled Halton sequence), drawn from the project's
//! one seeded generator (`trainyard_core::rng`), so that suggestions stay reproducible
//! across dependency upgrades.

pub(crate) use trainyard_core::rng::{mix, Rng};
pub use trainyard_core::rng::splitmix64;

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
