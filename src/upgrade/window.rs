//! A Plan's time window: the days and hours in which new nodes may start.

use jiff::Timestamp;
use jiff::civil::{Time, Weekday};
use jiff::tz::TimeZone;

use crate::api::plan::WindowSpec;

/// A parsed window, with kured's meaning (the library upstream uses).
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    days: Vec<Weekday>,
    start: Time,
    end: Time,
    zone: TimeZone,
}

impl Window {
    /// Parses the spec; the error names the field (upstream's "spec.window is invalid: ...").
    /// No days is valid, as in kured, and means no day: the window never opens.
    pub fn parse(spec: &WindowSpec) -> Result<Window, String> {
        let invalid = |why: String| format!("spec.window is invalid: {why}");
        let days = spec
            .days
            .iter()
            .filter(|d| !d.is_empty())
            .map(|d| weekday(d).ok_or_else(|| invalid(format!("Invalid weekday: {d}"))))
            .collect::<Result<Vec<_>, _>>()?;
        // kured refuses a missing time; nodewarden reads a missing start as
        // midnight and a missing end as the day's last second (a window that
        // could never be valid upstream, so no upstream Plan changes meaning).
        let time = |field: &str, v: &Option<String>, default: Time| -> Result<Time, String> {
            match v.as_deref() {
                None | Some("") => Ok(default),
                Some(s) => {
                    time_of_day(s).ok_or_else(|| invalid(format!("{field}: Invalid time format: {s}")))
                }
            }
        };
        let start = time("startTime", &spec.start_time, Time::midnight())?;
        let end = time("endTime", &spec.end_time, Time::constant(23, 59, 59, 0))?;
        let zone = match spec.time_zone.as_deref() {
            None | Some("") | Some("UTC") => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| invalid(format!("unknown time zone {name}")))?,
        };
        Ok(Window {
            days,
            start,
            end,
            zone,
        })
    }

    /// Has the window no days (so it never opens)?
    pub fn never_opens(&self) -> bool {
        self.days.is_empty()
    }

    /// Is `now` inside the window? kured's rule: today (in the window's
    /// zone) must be one of the days; start is inclusive and so is the whole
    /// end second; an end before the start crosses midnight and counts on
    /// the current day, so `sat 22:00-06:00` is Saturday 00:00-06:00 and
    /// 22:00-24:00.
    pub fn contains(&self, now: Timestamp) -> bool {
        let local = now.to_zoned(self.zone.clone());
        if !self.days.contains(&local.weekday()) {
            return false;
        }
        let t = local.time();
        let until_end = |t: Time| {
            (t.hour(), t.minute(), t.second()) <= (self.end.hour(), self.end.minute(), self.end.second())
        };
        if self.start > self.end {
            t >= self.start || until_end(t)
        } else {
            t >= self.start && until_end(t)
        }
    }
}

/// kured's days: a number 0-6 (Sunday is 0) or `su`, `sun`, `sunday`, ..., any case.
fn weekday(s: &str) -> Option<Weekday> {
    if let Ok(n) = s.parse::<i64>() {
        return match n {
            0 => Some(Weekday::Sunday),
            1..=6 => Weekday::from_monday_one_offset(n as i8).ok(),
            _ => None,
        };
    }
    Some(match s.to_ascii_lowercase().as_str() {
        "su" | "sun" | "sunday" => Weekday::Sunday,
        "mo" | "mon" | "monday" => Weekday::Monday,
        "tu" | "tue" | "tuesday" => Weekday::Tuesday,
        "we" | "wed" | "wednesday" => Weekday::Wednesday,
        "th" | "thu" | "thursday" => Weekday::Thursday,
        "fr" | "fri" | "friday" => Weekday::Friday,
        "sa" | "sat" | "saturday" => Weekday::Saturday,
        _ => return None,
    })
}

/// kured's time formats, as Go parses its layouts `15:04`, `15:04:05`,
/// `03:04pm`, `15`, `03pm` and `3pm`: a 24-hour hour of one or two digits
/// with two-digit minutes and seconds, or a 12-hour hour with lower-case
/// `am`/`pm` (two digits when minutes follow).
fn time_of_day(s: &str) -> Option<Time> {
    let two = |p: &str| {
        (p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<i8>().ok())
            .flatten()
    };
    let one_or_two = |p: &str| {
        ((1..=2).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()))
            .then(|| p.parse::<i8>().ok())
            .flatten()
    };
    let (clock, pm) = match (s.strip_suffix("pm"), s.strip_suffix("am")) {
        (Some(c), _) => (c, Some(true)),
        (_, Some(c)) => (c, Some(false)),
        _ => (s, None),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let (hour, minute, second) = match (pm, parts.as_slice()) {
        (None, [h]) => (one_or_two(h)?, 0, 0),
        (None, [h, m]) => (one_or_two(h)?, two(m)?, 0),
        (None, [h, m, sec]) => (one_or_two(h)?, two(m)?, two(sec)?),
        (Some(_), [h]) => (one_or_two(h)?, 0, 0),
        (Some(_), [h, m]) => (two(h)?, two(m)?, 0),
        _ => return None,
    };
    let hour = match pm {
        None if hour <= 23 => hour,
        None => return None,
        Some(_) if hour > 12 => return None,
        Some(true) if hour < 12 => hour + 12,
        Some(false) if hour == 12 => 0,
        Some(_) => hour,
    };
    (minute <= 59 && second <= 59)
        .then(|| Time::new(hour, minute, second, 0).ok())
        .flatten()
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
        // kured's layouts as Go parses them.
        let table = [
            ("22:00", Some((22, 0, 0))),
            ("6:05", Some((6, 5, 0))),
            ("6:05:09", Some((6, 5, 9))),
            ("22", Some((22, 0, 0))),
            ("7", Some((7, 0, 0))),
            ("10pm", Some((22, 0, 0))),
            ("03pm", Some((15, 0, 0))),
            ("3pm", Some((15, 0, 0))),
            ("12am", Some((0, 0, 0))),
            ("12pm", Some((12, 0, 0))),
            ("03:30pm", Some((15, 30, 0))),
            ("3:30pm", None),
            ("10PM", None),
            ("12:30 pm", None),
            ("13pm", None),
            ("24", None),
            ("25:00", None),
            ("6:5", None),
            ("noon", None),
        ];
        for (s, want) in table {
            let got = time_of_day(s).map(|t| (t.hour(), t.minute(), t.second()));
            assert_eq!(got, want, "{s}");
        }
    }

    #[test]
    fn inside_and_outside_by_kureds_rules() {
        // 2026-11-28 is a Saturday, 2026-11-23 a Monday.
        #[rustfmt::skip]
        let table = [
            ("inside", window(&["mon"], Some("01:00"), Some("05:00"), None), "2026-11-23T02:00:00Z", true),
            ("the whole end second counts", window(&["mon"], Some("01:00"), Some("05:00"), None), "2026-11-23T05:00:59Z", false),
            ("the end second", window(&["mon"], Some("01:00"), Some("05:00"), None), "2026-11-23T05:00:00.5Z", true),
            ("after the end", window(&["mon"], Some("01:00"), Some("05:00"), None), "2026-11-23T05:01:00Z", false),
            ("another day", window(&["tuesday"], Some("01:00"), Some("05:00"), None), "2026-11-23T02:00:00Z", false),
            ("bare hours", window(&["mo"], Some("22"), Some("23"), None), "2026-11-23T22:30:00Z", true),
            ("bare hours, outside", window(&["mo"], Some("22"), Some("23"), None), "2026-11-23T21:59:00Z", false),
            // Crossing midnight counts on the current day (kured).
            ("sat 22-06: Saturday night", window(&["sat"], Some("22:00"), Some("06:00"), None), "2026-11-28T23:00:00Z", true),
            ("sat 22-06: Saturday early morning", window(&["sat"], Some("22:00"), Some("06:00"), None), "2026-11-28T03:00:00Z", true),
            ("sat 22-06: not Sunday early morning", window(&["sat"], Some("22:00"), Some("06:00"), None), "2026-11-29T03:00:00Z", false),
            ("sat 22-06: not Saturday midday", window(&["sat"], Some("22:00"), Some("06:00"), None), "2026-11-28T12:00:00Z", false),
            ("no days: never", window(&[], Some("00:00"), Some("23:59"), None), "2026-11-23T12:00:00Z", false),
            ("day numbers", window(&["1"], None, None, None), "2026-11-23T23:59:30Z", true),
            // 02:30 UTC is 03:30 in Berlin (CET).
            ("time zone", window(&["mon"], Some("03:00"), Some("04:00"), Some("Europe/Berlin")), "2026-11-23T02:30:00Z", true),
            ("time zone, the day there", window(&["tue"], Some("00:00"), Some("01:00"), Some("Europe/Berlin")), "2026-11-23T23:30:00Z", true),
        ];
        for (what, w, now, want) in table {
            assert_eq!(w.expect("a valid window").contains(at(now)), want, "{what}");
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
        assert!(e.contains("time zone"), "{e}");
        let e = window(&["mon"], Some("7 o'clock"), None, None).unwrap_err();
        assert!(e.contains("startTime"), "{e}");
        assert!(
            window(&[], Some("22"), Some("6"), None)
                .expect("valid")
                .never_opens()
        );
    }
}
