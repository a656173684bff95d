//! A Plan's time window: the days and hours in which new nodes may start.

use jiff::Timestamp;
use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;

use crate::api::plan::WindowSpec;

/// A parsed window.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    days: Vec<Weekday>,
    start: Time,
    end: Option<Time>,
    zone: TimeZone,
}

impl Window {
    /// Parses the spec; the error names the field (upstream's "spec.window is invalid: ...").
    pub fn parse(spec: &WindowSpec) -> Result<Window, String> {
        let invalid = |why: String| format!("spec.window is invalid: {why}");
        let days = spec
            .days
            .iter()
            .map(|d| weekday(d).ok_or_else(|| invalid(format!("unknown day {d:?}"))))
            .collect::<Result<Vec<_>, _>>()?;
        if days.is_empty() {
            return Err(invalid("no days".into()));
        }
        let time = |field: &str, v: &Option<String>| -> Result<Option<Time>, String> {
            v.as_deref()
                .map(|s| time_of_day(s).ok_or_else(|| invalid(format!("{field} {s:?} is not a time of day"))))
                .transpose()
        };
        let start = time("startTime", &spec.start_time)?.unwrap_or(Time::midnight());
        let end = time("endTime", &spec.end_time)?;
        let zone = match spec.time_zone.as_deref() {
            None | Some("") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| invalid(format!("unknown timeZone {name:?}")))?,
        };
        Ok(Window {
            days,
            start,
            end,
            zone,
        })
    }

    /// Is `now` inside the window? An end before the start spans midnight
    /// (the window belongs to the day it started on).
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        let (day, t) = (local.weekday(), local.time());
        let on = |d: Weekday| self.days.contains(&d);
        match self.end {
            None => on(day) && t >= self.start,
            Some(end) if end > self.start => on(day) && t >= self.start && t < end,
            Some(end) => (on(day) && t >= self.start) || (on(day.previous()) && t < end),
        }
    }
}

/// `mon`, `monday`, `mo`, `1` (Sunday is 0), any case.
fn weekday(s: &str) -> Option<Weekday> {
    Some(match s.to_ascii_lowercase().as_str() {
        "0" | "su" | "sun" | "sunday" => Weekday::Sunday,
        "1" | "mo" | "mon" | "monday" => Weekday::Monday,
        "2" | "tu" | "tue" | "tuesday" => Weekday::Tuesday,
        "3" | "we" | "wed" | "wednesday" => Weekday::Wednesday,
        "4" | "th" | "thu" | "thursday" => Weekday::Thursday,
        "5" | "fr" | "fri" | "friday" => Weekday::Friday,
        "6" | "sa" | "sat" | "saturday" => Weekday::Saturday,
        _ => return None,
    })
}

/// `22:00`, `22:00:30`, `10pm`, `10:30 PM`.
fn time_of_day(s: &str) -> Option<Time> {
    let lower = s.trim().to_ascii_lowercase();
    let (clock, pm) = if let Some(c) = lower.strip_suffix("pm") {
        (c.trim(), Some(true))
    } else if let Some(c) = lower.strip_suffix("am") {
        (c.trim(), Some(false))
    } else {
        (lower.as_str(), None)
    };
    let mut parts = clock.split(':').map(|p| p.parse::<i8>().ok());
    let hour = parts.next()??;
    let minute = parts.next().unwrap_or(Some(0))?;
    let second = parts.next().unwrap_or(Some(0))?;
    if parts.next().is_some() {
        return None;
    }
    let hour = match pm {
        None => hour,
        Some(_) if !(1..=12).contains(&hour) => return None,
        Some(true) => hour % 12 + 12,
        Some(false) => hour % 12,
    };
    Time::new(hour, minute, second, 0).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(
        days: &[&str],
        start: Option<&str>,
        end: Option<&str>,
        zone: Option<&str>,
    ) -> Result<Window, String> {
        Window::parse(&WindowSpec {
            days: days.iter().map(|d| d.to_string()).collect(),
            start_time: start.map(String::from),
            end_time: end.map(String::from),
            time_zone: zone.map(String::from),
        })
    }

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn times_of_day() {
        let table = [
            ("22:00", Some((22, 0, 0))),
            ("6:05:09", Some((6, 5, 9))),
            ("10pm", Some((22, 0, 0))),
            ("12am", Some((0, 0, 0))),
            ("12:30 PM", Some((12, 30, 0))),
            ("13pm", None),
            ("25:00", None),
            ("noon", None),
        ];
        for (s, want) in table {
            let got = time_of_day(s).map(|t| (t.hour(), t.minute(), t.second()));
            assert_eq!(got, want, "{s}");
        }
    }

    #[test]
    fn inside_and_outside() {
        // 2026-11-23 is a Monday.
        let table = [
            (
                window(&["mon"], Some("01:00"), Some("05:00"), None),
                "2026-11-23T02:00:00Z",
                true,
            ),
            (
                window(&["mon"], Some("01:00"), Some("05:00"), None),
                "2026-11-23T05:00:00Z",
                false,
            ),
            (
                window(&["tuesday"], Some("01:00"), Some("05:00"), None),
                "2026-11-23T02:00:00Z",
                false,
            ),
            (window(&["1"], None, None, None), "2026-11-23T23:59:00Z", true),
            // Spanning midnight: Monday 22:00 to Tuesday 04:00.
            (
                window(&["mon"], Some("22:00"), Some("04:00"), None),
                "2026-11-24T03:00:00Z",
                true,
            ),
            (
                window(&["mon"], Some("22:00"), Some("04:00"), None),
                "2026-11-23T03:00:00Z",
                false,
            ),
            // 02:00 UTC is 03:00 in Berlin (CET).
            (
                window(&["mon"], Some("03:00"), Some("04:00"), Some("Europe/Berlin")),
                "2026-11-23T02:30:00Z",
                true,
            ),
        ];
        for (i, (w, now, want)) in table.into_iter().enumerate() {
            assert_eq!(w.expect("a valid window").contains(at(now)), want, "row {i}");
        }
    }

    #[test]
    fn bad_windows_name_the_field() {
        let e = window(&["someday"], None, None, None).unwrap_err();
        assert!(
            e.contains("spec.window is invalid") && e.contains("someday"),
            "{e}"
        );
        let e = window(&["mon"], None, None, Some("Mars/Olympus")).unwrap_err();
        assert!(e.contains("timeZone"), "{e}");
        let e = window(&["mon"], Some("7 o'clock"), None, None).unwrap_err();
        assert!(e.contains("startTime"), "{e}");
    }
}
