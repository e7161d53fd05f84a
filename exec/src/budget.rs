//! The per-actor memory budget.
//!
//! Each actor has a budget (`--memory-per-actor`). Before any work starts the plan checks
//! that every worker thread can hold its workspace (one panel and the kernel's scratch, a
//! size the kernel reports up front) and decides whether the data the algorithm keeps
//! between passes stays resident or is regenerated (re-read) in every pass.

use serde::{Deserialize, Serialize};

use crate::RuntimeError;

/// Whether panel data is kept between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Residency {
    /// Kept in the actor's memory.
    Resident,
    /// Produced again from the source in every pass.
    Regenerated,
}

/// One actor's memory decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryPlan {
    /// The actor's budget in bytes.
    pub budget: u64,
    /// Scratch for all its threads at once.
    pub workspace: u64,
    /// Bytes it would keep resident.
    pub resident_bytes: u64,
    /// The decision.
    pub residency: Residency,
    /// Decoded-panel buffers of its read-ahead (storage-backed sources; 0 otherwise).
    pub read_buffers: usize,
    /// Bytes of those buffers, all together.
    pub read_bytes: u64,
}

/// The decoded-panel buffers a storage-backed source needs: one per reader, plus one so
/// that a panel is decoded while the workers multiply the others.
#[derive(Clone, Debug)]
pub struct ReadBuffers {
    /// Bytes of one buffer (one band of stored chunks, decoded, with any scratch).
    pub bytes: u64,
    /// What one buffer holds, for the refusal message (e.g. `one band of stored chunks
    /// (20000 rows × 5000 float32, chunk key c/0/0)`).
    pub what: String,
}

impl MemoryPlan {
    /// Decides residency, or refuses when one panel's workspace per thread does not fit.
    pub fn decide(
        budget: u64,
        workspace_per_thread: u64,
        threads: usize,
        resident_bytes: u64,
    ) -> Result<MemoryPlan, RuntimeError> {
        let workspace = workspace_per_thread.saturating_mul(threads.max(1) as u64);
        if workspace > budget {
            return Err(RuntimeError::Budget(format!(
                "{} per actor cannot hold the workspace of {} worker thread(s) ({} each for one \
                 panel and its scratch); raise `memory_per_actor` to at least {} or lower \
                 `chunk_rows`",
                format_bytes(budget),
                threads,
                format_bytes(workspace_per_thread),
                format_bytes_up(workspace)
            )));
        }
        let residency = if workspace.saturating_add(resident_bytes) <= budget {
            Residency::Resident
        } else {
            Residency::Regenerated
        };
        Ok(MemoryPlan {
            budget,
            workspace,
            resident_bytes,
            residency,
            read_buffers: 0,
            read_bytes: 0,
        })
    }

    /// [`MemoryPlan::decide`] for a source read from storage: the budget must also hold
    /// at least one decoded band of stored chunks (refused otherwise, naming the band and
    /// the budget); it holds up to `threads + 1` of them when it can.
    pub fn decide_reading(
        budget: u64,
        workspace_per_thread: u64,
        threads: usize,
        resident_bytes: u64,
        reads: &ReadBuffers,
    ) -> Result<MemoryPlan, RuntimeError> {
        let workspace = workspace_per_thread.saturating_mul(threads.max(1) as u64);
        let need = workspace.saturating_add(reads.bytes);
        if need > budget {
            return Err(RuntimeError::Budget(format!(
                "{} per actor cannot hold {} ({}) plus the workspace of {} worker thread(s) \
                 ({}); raise `memory_per_actor` to at least {}",
                format_bytes(budget),
                reads.what,
                format_bytes(reads.bytes),
                threads,
                format_bytes(workspace),
                format_bytes_up(need)
            )));
        }
        let fit = ((budget - workspace) / reads.bytes.max(1)) as usize;
        let buffers = fit.clamp(1, threads.max(1) + 1);
        let read_bytes = buffers as u64 * reads.bytes;
        let mut plan = MemoryPlan::decide(
            budget - read_bytes,
            workspace_per_thread,
            threads,
            resident_bytes,
        )?;
        plan.budget = budget;
        plan.read_buffers = buffers;
        plan.read_bytes = read_bytes;
        Ok(plan)
    }
}

/// Parses sizes such as `4096`, `512M`, `1.5GiB`, `2G` (binary multiples).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 512M, 4G, 1.5GiB)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("`{s}`: unknown unit `{other}` (use K, M, G or T)")),
    };
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary unit.
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// [`format_bytes`] rounded up at its last digit, for a least budget: "at least 119.1
/// MiB" must be enough where 119.04 MiB is needed.
fn format_bytes_up(b: u64) -> String {
    let mut unit = 1u64;
    while b / unit >= 1024 && unit < 1 << 40 {
        unit <<= 10;
    }
    if unit == 1 {
        return format_bytes(b);
    }
    let tenths = (b as u128 * 10).div_ceil(unit as u128) as f64 / 10.0;
    // 1023.95 MiB rounds up to 1024.0 MiB, which format_bytes shows as 1.0 GiB: still
    // enough.
    format_bytes((tenths * unit as f64).ceil() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_budgets_round_up() {
        let mib = 1u64 << 20;
        assert_eq!(format_bytes_up(119 * mib + 40_000), "119.1 MiB");
        assert_eq!(format_bytes_up(119 * mib), "119.0 MiB");
        assert_eq!(format_bytes_up(1000), "1000 B");
        assert_eq!(format_bytes_up(1024 * mib - 1), "1.0 GiB");
        for b in [1u64 << 20, 3 << 29, 119 * mib + 1, 7_777_777_777] {
            assert!(
                parse_bytes(&format_bytes_up(b).replace(' ', "")).unwrap() >= b,
                "{b}"
            );
        }
    }

    #[test]
    fn parses_sizes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert!(parse_bytes("lots").is_err());
        assert!(parse_bytes("3X").is_err());
    }

    #[test]
    fn decides_residency_and_refuses_tiny_budgets() {
        let p = MemoryPlan::decide(1000, 100, 2, 500).unwrap();
        assert_eq!(p.residency, Residency::Resident);
        let p = MemoryPlan::decide(1000, 100, 2, 900).unwrap();
        assert_eq!(p.residency, Residency::Regenerated);
        let reads = ReadBuffers {
            bytes: 300,
            what: "one band of stored chunks".into(),
        };
        let p = MemoryPlan::decide_reading(1000, 100, 2, 100, &reads).unwrap();
        assert_eq!((p.read_buffers, p.residency), (2, Residency::Resident));
        let p = MemoryPlan::decide_reading(10_000, 100, 2, 100, &reads).unwrap();
        assert_eq!(p.read_buffers, 3);
        let p = MemoryPlan::decide_reading(600, 100, 2, 200, &reads).unwrap();
        assert_eq!((p.read_buffers, p.residency), (1, Residency::Regenerated));
        let e = MemoryPlan::decide_reading(400, 100, 2, 0, &reads)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("one band of stored chunks") && e.contains("400 B"),
            "{e}"
        );
        let e = MemoryPlan::decide(100, 100, 2, 0).unwrap_err().to_string();
        assert!(
            e.contains("`memory_per_actor`") && e.contains("`chunk_rows`"),
            "{e}"
        );
    }
}
