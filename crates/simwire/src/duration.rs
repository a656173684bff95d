//! Durations as people write them in the sim-cloud's faults API and config file:
//! `"500ms"`, `"2s"`, `"1.5m"`, `"1h"`, or a bare number of seconds. Written
//! back as whole milliseconds (`"1500ms"`), which reads back exactly.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses `"500ms"`, `"2s"`, `"1.5m"`, `"1h"` or `"3"` (seconds).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 2s, 1m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        other => return Err(format!("unknown unit {other:?} in {text:?} (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Formats as whole milliseconds, the unit the simulator keeps time in.
pub fn format(duration: Duration) -> String {
    format!("{}ms", duration.as_millis())
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Seconds(f64),
    Text(String),
}

fn from_written(written: Written) -> Result<Duration, String> {
    match written {
        Written::Seconds(s) => Duration::try_from_secs_f64(s).map_err(|e| format!("{s}: {e}")),
        Written::Text(t) => parse(&t),
    }
}

/// `#[serde(with = "duration")]` for a `Duration` field: writes it as
/// [`format()`] does.
pub fn serialize<S: Serializer>(duration: &Duration, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&format(*duration))
}

/// The reading half of `#[serde(with = "duration")]`: a string as [`parse`]
/// reads it, or a bare number of seconds.
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    from_written(Written::deserialize(deserializer)?).map_err(serde::de::Error::custom)
}

/// `#[serde(with = "duration::option")]` for an `Option<Duration>` field.
pub mod option {
    use super::*;

    /// Writes `Some` as [`format()`] does, `None` as null.
    pub fn serialize<S: Serializer>(duration: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match duration {
            Some(d) => super::serialize(d, serializer),
            None => serializer.serialize_none(),
        }
    }

    /// Reads null as `None`, anything else as [`super::deserialize`] does.
    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        Option::<Written>::deserialize(deserializer)?
            .map(from_written)
            .transpose()
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_usual_units() {
        assert_eq!(parse("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("3"), Ok(Duration::from_secs(3)));
        assert!(parse("2 days").is_err());
        assert!(parse("-1s").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn formatting_reads_back_exactly() {
        let d = Duration::from_millis(1234);
        assert_eq!(parse(&format(d)), Ok(d));
    }
}
