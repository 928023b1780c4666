//! The one seeded pseudo-random generator of the project: xoshiro256++ seeded through
//! SplitMix64. The tuner's suggestions, the scheduling simulator's workloads, the chaos
//! tests' choices and the benchmarks' data all draw from it, so that a printed seed
//! replays a run exactly, across dependency upgrades (no external crate's algorithm can
//! change under it).

/// SplitMix64: the next value of the sequence `state` walks (a seed's words, or a few
/// draws where a whole generator is not needed; an external script can reproduce it).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes several words into one seed (order-sensitive): a seed and a stream's number
/// give the stream's own seed.
pub fn mix(words: &[u64]) -> u64 {
    let mut state = 0x51_7CC1_B727_220A_u64;
    let mut out = 0u64;
    for &w in words {
        state ^= w;
        out = splitmix64(&mut state) ^ out.rotate_left(17);
    }
    out
}

/// xoshiro256++, its four words seeded from one through SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut st = seed;
        Rng { s: [splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st), splitmix64(&mut st)] }
    }

    pub fn next_u64(&mut self) -> u64 {
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
    pub fn f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in [0, n); 0 when n is 0.
    pub fn below(&mut self, n: usize) -> usize {
        // Lemire's multiply-shift; the bias for n << 2^64 is negligible.
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u32) -> bool {
        self.below(100) < percent as usize
    }

    /// One of `items`, uniformly (None when there are none).
    pub fn choose<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        items.get(self.below(items.len()))
    }

    /// An index of `weights`, with probability proportional to its weight.
    pub fn weighted(&mut self, weights: &[f64]) -> usize {
        let total: f64 = weights.iter().sum();
        let mut x = self.f64() * total;
        for (i, w) in weights.iter().enumerate() {
            if x < *w {
                return i;
            }
            x -= w;
        }
        weights.len().saturating_sub(1)
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64(); // (0, 1]
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// Log-normal with this median and log-scale spread.
    pub fn lognormal(&mut self, median: f64, sigma: f64) -> f64 {
        median * (sigma * self.normal()).exp()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_draws_are_uniformish() {
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
        assert_ne!(Rng::new(mix(&[7, 1])).next_u64(), Rng::new(mix(&[7, 2])).next_u64());
    }

    /// The published SplitMix64 sequence from 0 (external scripts reproduce it).
    #[test]
    fn splitmix64_is_the_published_sequence() {
        let mut st = 0u64;
        assert_eq!(splitmix64(&mut st), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64(&mut st), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn below_choose_weighted_and_chance_stay_in_range() {
        let mut r = Rng::new(1);
        assert_eq!(r.below(0), 0);
        assert!(r.choose::<u8>(&[]).is_none());
        let mut counts = [0usize; 3];
        for _ in 0..3000 {
            assert!(r.below(5) < 5);
            counts[r.weighted(&[1.0, 0.0, 3.0])] += 1;
        }
        assert_eq!(counts[1], 0);
        assert!(counts[2] > 2 * counts[0], "{counts:?}");
        assert!((0..100).all(|_| !r.chance(0) && r.chance(100)));
    }
}
