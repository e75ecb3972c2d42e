//! What the crash tests share: a seeded generator whose seed is printed so a failing run can be
//! replayed with `VGPU_CRASH_SEED`.

/// xorshift64*: a small deterministic generator, seeded per run and printed so a failure can be replayed.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The run's generator: seeded from `VGPU_CRASH_SEED` when set, else from the clock; the seed is
/// printed with what it replays (`replays`, e.g. "the operation sequence").
pub fn seeded(test: &str, replays: &str) -> Rng {
    let seed = std::env::var("VGPU_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("{test} seed {seed} (VGPU_CRASH_SEED={seed} replays {replays})");
    Rng(seed)
}
