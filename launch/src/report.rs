//! Figures for people: the report's types and the process figures live in
//! `rankwise::output::report`.

/// Formats seconds for humans.
pub fn seconds(s: f64) -> String {
    if s < 1e-3 {
        format!("{:.1} µs", s * 1e6)
    } else if s < 1.0 {
        format!("{:.1} ms", s * 1e3)
    } else {
        format!("{s:.3} s")
    }
}

/// One line of a summary's phases: the name, the time and, where the rank's transport
/// carried anything in the phase, its messages and bytes each way and the time its
/// receives waited.
pub fn phase_line(t: &rankwise::linalg::PhaseTiming) -> String {
    let mut line = format!("  {:<40} {:>10}", t.phase, seconds(t.seconds));
    let c = &t.comm;
    if !c.is_empty() {
        line.push_str(&format!(
            "   {} msg out ({}), {} in ({}), {} waiting",
            c.messages_sent,
            rankwise::exec::format_bytes(c.bytes_sent),
            c.messages_received,
            rankwise::exec::format_bytes(c.bytes_received),
            seconds(c.wait_seconds)
        ));
    }
    line
}

/// The summary's line about the machine limit: the GEMM rate (and the pinned kernels',
/// where lower) and, where the limit counts it, the rate the values are produced at.
pub fn machine_limit_line(l: &rankwise::output::report::MachineLimit) -> String {
    let kernels = l.gemm_kernels.as_deref().unwrap_or("the BLAS's");
    let pinned = match l.pinned_gemm_gflop_per_s {
        Some(p) => format!(
            " with OpenBLAS's {kernels} kernels ({p:.1} with the layout-independent ones \
             rankwise's own BLAS calls run)"
        ),
        None => format!(" with OpenBLAS's {kernels} kernels"),
    };
    let gemm = format!(
        "{} GEMM of all ranks' compute threads at once, {:.1} GFLOP/s{pinned}",
        l.precision, l.gemm_gflop_per_s
    );
    match l.production_gb_per_s {
        Some(gb) => format!(
            "machine limit: a pass's flops at the {gemm}, and then the values it produced at \
             the rate the same threads produce them, {gb:.2} GB/s (8 bytes a value)"
        ),
        None => format!("machine limit: {gemm}"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_are_formatted_for_people() {
        assert_eq!(super::seconds(2.5), "2.500 s");
        assert_eq!(super::seconds(0.0025), "2.5 ms");
        assert_eq!(super::seconds(2.5e-6), "2.5 µs");
    }
}
