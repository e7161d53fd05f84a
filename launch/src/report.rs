//! Run reports: what ran, where, how long each phase took, and how much memory it used.

/// Peak resident set size of this process in bytes (VmHWM), if the OS tells.
pub fn peak_rss_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

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

#[cfg(test)]
mod tests {
    #[test]
    fn peak_rss_is_reported_on_linux() {
        assert!(super::peak_rss_bytes().unwrap() > 0);
        assert_eq!(super::seconds(2.5), "2.500 s");
        assert_eq!(super::seconds(0.0025), "2.5 ms");
    }
}
