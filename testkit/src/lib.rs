//! Helpers shared by the tests of every rankwise crate (a dev-dependency only; it depends on
//! no rankwise crate, so that the lowest crates' tests use it too).
//!
//! * [`process`]: programs under `mpirun`, or alone, with a hard time limit that kills the
//!   whole process tree; the examples `cargo test` built.
//! * [`Draw`] and [`test_seed`]: fresh shapes and values from one printed seed
//!   (`RANKWISE_TEST_SEED` replays a failure).
//! * [`scratch`] and [`snapshot`]: a fresh directory per test under the target directory,
//!   and every file under a directory with its bytes.

pub mod process;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A fresh seed per run: `RANKWISE_TEST_SEED` when set, else the clock. Printed, so that
/// a failure can be replayed.
pub fn test_seed() -> u64 {
    let seed = std::env::var("RANKWISE_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("RANKWISE_TEST_SEED={seed}");
    seed
}

/// SplitMix64's finalizer (the same mixing as the generator's `mix64`).
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A small deterministic generator of test parameters and values (SplitMix64).
#[derive(Clone, Debug)]
pub struct Draw(pub u64);

impl Draw {
    /// Seeded by [`test_seed`].
    pub fn fresh() -> Draw {
        Draw(test_seed())
    }

    /// The next 64 random bits. (Not `Iterator::next`: the stream never ends, and an
    /// `Option` at every draw would only be unwrapped.)
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in `0..hi` (0 when `hi` is 0).
    pub fn below(&mut self, hi: u64) -> u64 {
        if hi == 0 {
            0
        } else {
            self.next() % hi
        }
    }

    /// Uniform integer in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    /// Log-uniform integer in `lo..=hi`.
    pub fn log_range(&mut self, lo: u64, hi: u64) -> u64 {
        let (a, b) = ((lo as f64).ln(), (hi as f64 + 1.0).ln());
        ((a + self.unit() * (b - a)).exp() as u64).clamp(lo, hi)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A fresh scratch directory `name-<pid>` under the target directory (next to the test
/// binaries), emptied if it exists.
pub fn scratch(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("a test binary inside target/<profile>/deps")
        .join("test-scratch")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the scratch directory");
    dir
}

/// Every file under `dir` with its contents (directories with none).
pub fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("reading a snapshot directory") {
            let p = e.expect("a directory entry").path();
            if p.is_dir() {
                out.insert(p.clone(), Vec::new());
                stack.push(p);
            } else {
                out.insert(
                    p.clone(),
                    std::fs::read(&p).expect("reading a snapshot file"),
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_their_ranges_and_replay() {
        let seed = test_seed();
        let (mut a, mut b) = (Draw(seed), Draw(seed));
        for _ in 0..1000 {
            assert_eq!(a.next(), b.next());
            let r = a.range(3, 9);
            assert!((3..=9).contains(&r));
            let l = a.log_range(1, 1 << 20);
            assert!((1..=1 << 20).contains(&l));
            assert!((0.0..1.0).contains(&a.unit()));
            assert!(a.below(7) < 7);
            b = a.clone();
        }
        assert_eq!(Draw(seed).below(0), 0);
    }

    #[test]
    fn scratch_is_fresh_and_snapshot_sees_every_file() {
        let d = scratch("testkit");
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::write(d.join("sub/x"), b"12").unwrap();
        let snap = snapshot(&d);
        assert_eq!(snap[&d.join("sub/x")], b"12");
        assert!(snap[&d.join("sub")].is_empty());
        assert!(scratch("testkit").read_dir().unwrap().next().is_none());
    }
}
