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
                 panel and its scratch); raise --memory-per-actor to at least {} or lower \
                 --chunk-rows",
                format_bytes(budget),
                threads,
                format_bytes(workspace_per_thread),
                format_bytes(workspace)
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
        })
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

#[cfg(test)]
mod tests {
    use super::*;

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
        let e = MemoryPlan::decide(100, 100, 2, 0).unwrap_err().to_string();
        assert!(
            e.contains("--memory-per-actor") && e.contains("--chunk-rows"),
            "{e}"
        );
    }
}
