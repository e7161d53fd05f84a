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

#[cfg(test)]
mod tests {
    #[test]
    fn seconds_are_formatted_for_people() {
        assert_eq!(super::seconds(2.5), "2.500 s");
        assert_eq!(super::seconds(0.0025), "2.5 ms");
        assert_eq!(super::seconds(2.5e-6), "2.5 µs");
    }
}
