//! `RANKWISE_FAULT=RANK:KIND[:PHASE]`: rank RANK fails on purpose at PHASE (default
//! `start`), with KIND `error`, `panic` or `exit` (leaves abruptly, as a crash would). Only
//! this test binary reads it, so that the failure tests run the real program under the
//! real launcher while the shipped `rankwise` has no way to fail on purpose: the command
//! line calls [`inject`] at each phase through `main_with_phase_hook`.

use std::sync::OnceLock;

/// The environment variable.
const VAR: &str = "RANKWISE_FAULT";

/// The phases the commands offer, in the order a run reaches them.
const PHASES: [&str; 7] = [
    "start",
    "before-svd",
    "after-svd",
    "side-files",
    "before-write",
    "after-write",
    "commit",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Error,
    Panic,
    Exit,
}

/// A parsed `RANKWISE_FAULT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fault {
    rank: usize,
    kind: Kind,
    phase: &'static str,
}

/// The fault of this process, set once before any rank starts.
static ARMED: OnceLock<Fault> = OnceLock::new();

/// Parses a value of `RANKWISE_FAULT`: a fault that can never fire (a misspelt kind or
/// phase) would make a failure test pass without failing anything, so it is an error.
fn parse(spec: &str) -> Result<Fault, String> {
    let usage = || {
        format!(
            "{spec:?} is not RANK:KIND[:PHASE] (KIND error, panic or exit; PHASE one of {})",
            PHASES.join(", ")
        )
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (rank, kind, phase) = match parts[..] {
        [rank, kind] => (rank, kind, "start"),
        [rank, kind, phase] => (rank, kind, phase),
        _ => return Err(usage()),
    };
    let rank = rank.parse::<usize>().map_err(|_| usage())?;
    let kind = match kind {
        "error" => Kind::Error,
        "panic" => Kind::Panic,
        "exit" => Kind::Exit,
        _ => return Err(usage()),
    };
    let phase = PHASES
        .iter()
        .find(|&&p| p == phase)
        .copied()
        .ok_or_else(usage)?;
    Ok(Fault { rank, kind, phase })
}

/// Reads `RANKWISE_FAULT` once, at start-up: `Err` with the line to print when it is set
/// but malformed (or not Unicode).
pub(crate) fn arm_from_env() -> Result<(), String> {
    let Some(value) = std::env::var_os(VAR) else {
        return Ok(());
    };
    let fault = value
        .to_str()
        .ok_or_else(|| format!("{value:?} is not valid Unicode"))
        .and_then(parse)
        .map_err(|e| format!("rankwise: {VAR}: {e}"))?;
    let _ = ARMED.set(fault);
    Ok(())
}

/// Fails rank `rank` at `phase` as the armed fault says (an error is the message the
/// rank fails with); nothing when none is armed.
pub(crate) fn inject(rank: usize, phase: &str) -> Result<(), String> {
    debug_assert!(PHASES.contains(&phase), "unknown fault phase {phase}");
    let Some(f) = ARMED.get() else {
        return Ok(());
    };
    if f.rank != rank || f.phase != phase {
        return Ok(());
    }
    match f.kind {
        Kind::Error => Err(format!("{VAR}: injected input error on rank {rank}")),
        Kind::Panic => panic!("injected panic on rank {rank}"),
        // SAFETY: _exit has no preconditions; leaving without unwinding is the point.
        Kind::Exit => unsafe { libc::_exit(3) },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_values_parse() {
        assert_eq!(
            parse("2:error"),
            Ok(Fault {
                rank: 2,
                kind: Kind::Error,
                phase: "start"
            })
        );
        assert_eq!(
            parse("0:exit:commit"),
            Ok(Fault {
                rank: 0,
                kind: Kind::Exit,
                phase: "commit"
            })
        );
        assert_eq!(parse("1:panic:before-svd").map(|f| f.kind), Ok(Kind::Panic));
    }

    #[test]
    fn malformed_values_are_errors_quoting_them() {
        for bad in [
            "",
            "1",
            "x:error",
            "-1:error",
            "1:explode",
            "1:error:never",
            "1:error:start:again",
            "1:Error",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
            assert!(e.contains("RANK:KIND[:PHASE]"), "{bad}: {e}");
        }
    }
}
