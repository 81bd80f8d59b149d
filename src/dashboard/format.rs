//! Numbers and times as people read them.

/// `bytes` in the largest binary unit that keeps a whole number before the
/// point: `1.5 GiB`, `512 MiB`, `0 B`.
pub fn bytes(bytes: i64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes.max(0) as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 100.0 || value.fract() < 0.05 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// How long ago `rfc3339` was, roughly: `5s`, `3m`, `2h`, `4d`.
pub fn ago(rfc3339: &str) -> String {
    let Ok(then) = rfc3339.parse::<jiff::Timestamp>() else {
        return String::new();
    };
    let seconds = jiff::Timestamp::now().as_second() - then.as_second();
    match seconds.max(0) {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(16 << 20), "16 MiB");
        assert_eq!(bytes(3 << 29), "1.5 GiB");
        assert_eq!(bytes(1000), "1000 B");
        assert_eq!(bytes(-5), "0 B");
    }

    #[test]
    fn times_read_as_how_long_ago() {
        let then = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(7200);
        assert_eq!(ago(&then.to_string()), "2h");
        assert_eq!(ago("not a time"), "");
    }
}
