//! Calendar windows: a `day`, `week`, `month` or `year` that starts at local midnight in an
//! IANA time zone (YAML `time_zone`, `week_start`), and the Go service's UTC calendar month
//! (USE_CALENDAR_MONTH_RATE_LIMIT, envoyproxy/ratelimit #1206).
//!
//! A [`Calendar`] is a small copyable id into a process-wide table of zones, so a
//! [`Window`](super::Window) stays `Copy`. Id 0 is the epoch-aligned windows every limit has by
//! default; id 1 is the Go service's calendar month (UTC, and keys without a marker, so Go
//! instances with the flag share them); the others are zones a config, a runtime limit or a
//! peer named. The table is bounded ([`MAX_CALENDARS`]): more than every (zone, first day of
//! the week) pair the time zone database has.
//!
//! A calendar window's index counts local units since 1970-01-01 (days, weeks from the week's
//! first day, months, years), so consecutive windows have consecutive indexes as epoch windows
//! do, and every store's "index, start, end" arithmetic holds for both. Its start is local
//! midnight of its first day, as the zone's rules give it at that date: a day is 23 or 25 hours
//! long across a daylight-saving change, and a midnight that a change skips starts at the first
//! instant after the gap (jiff's "compatible" choice, as RFC 5545 and Temporal do).

use std::sync::{Mutex, OnceLock};

use jiff::civil::Date;
use jiff::tz::TimeZone;

use super::Unit;

/// The most distinct calendars a process holds: zones times first days of the week. The time
/// zone database has about 600 names, so 4,200 pairs at most could be named.
pub(crate) const MAX_CALENDARS: usize = 4_608;

/// How a limit's windows line up with the clock; see the module documentation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Calendar(u16);

struct Zone {
    /// The IANA name as written (`Asia/Tokyo`).
    name: Box<str>,
    tz: TimeZone,
    /// The first day of a week, 0 for Monday to 6 for Sunday.
    week_start: u8,
}

static ZONES: [OnceLock<Zone>; MAX_CALENDARS] = [const { OnceLock::new() }; MAX_CALENDARS];
/// Serialises [`Calendar::zone`]'s look-up-or-add; readers never take it.
static ADDING: Mutex<usize> = Mutex::new(FIRST_ZONE);
const FIRST_ZONE: usize = 2;

/// [`Calendar::GO_MONTH`] on the peer protocol.
const GO_MONTH_WIRE: &str = "go-month";

/// 1970-01-01 was a Thursday: 3 days after a Monday.
const EPOCH_WEEKDAY: i64 = 3;

impl Calendar {
    /// Epoch-aligned windows of a fixed length, as the Go service's (the default).
    pub const EPOCH: Calendar = Calendar(0);
    /// The Go service's calendar month (USE_CALENDAR_MONTH_RATE_LIMIT): UTC months, keyed as
    /// Go keys them.
    pub const GO_MONTH: Calendar = Calendar(1);

    /// The calendar of an IANA zone, `week_start` naming a week's first day (`monday` when
    /// `None`). An unknown zone or day is an error that names it.
    pub fn zone(name: &str, week_start: Option<&str>) -> Result<Calendar, String> {
        let week_start = match week_start {
            None => 0,
            Some(day) => weekday_from_name(day).ok_or_else(|| {
                format!("unknown week_start '{day}' (a day's English name, such as 'sunday')")
            })?,
        };
        if let Some(found) = Self::find(name, week_start) {
            return Ok(found);
        }
        let tz = TimeZone::get(name).map_err(|_| {
            format!("unknown time_zone '{name}' (an IANA time zone name, such as 'Asia/Tokyo')")
        })?;
        let mut next = ADDING.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = Self::find(name, week_start) {
            return Ok(found);
        }
        if *next == MAX_CALENDARS {
            return Err(format!(
                "time_zone '{name}': more than {MAX_CALENDARS} distinct time zones are in use"
            ));
        }
        let id = *next;
        let zone = Zone {
            name: name.into(),
            tz,
            week_start,
        };
        let _ = ZONES[id].set(zone);
        *next += 1;
        Ok(Calendar(id as u16))
    }

    /// The calendar already made for `name` and `week_start`, without a lock (a peer's hits
    /// name their zone each time).
    fn find(name: &str, week_start: u8) -> Option<Calendar> {
        ZONES[FIRST_ZONE..]
            .iter()
            .map_while(OnceLock::get)
            .position(|z| &*z.name == name && z.week_start == week_start)
            .map(|i| Calendar((i + FIRST_ZONE) as u16))
    }

    /// Whether windows are epoch-aligned (no calendar).
    pub const fn is_epoch(self) -> bool {
        self.0 == 0
    }

    /// Whether keys name this calendar: a zone's do; the epoch's and Go's month's do not.
    pub const fn is_zoned(self) -> bool {
        self.0 as usize >= FIRST_ZONE
    }

    /// The zone's name (`UTC` for the Go month, "" for the epoch).
    pub fn name(self) -> &'static str {
        match self.zone_entry() {
            Some(z) => &z.name,
            None if self == Calendar::GO_MONTH => "UTC",
            None => "",
        }
    }

    /// The week's first day as YAML spells it, when it is not Monday.
    pub fn week_start(self) -> Option<&'static str> {
        let day = self.zone_entry()?.week_start;
        (day != 0).then(|| WEEKDAYS[usize::from(day)])
    }

    /// The peer protocol's spelling (`PeerHit.calendar`): "" for the epoch, `go-month`, or the
    /// zone's name and, unless it is Monday, a space and the week's first day.
    pub fn wire(self) -> String {
        match (self.zone_entry(), self.week_start()) {
            (Some(z), Some(day)) => format!("{} {day}", z.name),
            (Some(z), None) => z.name.to_string(),
            (None, _) if self == Calendar::GO_MONTH => GO_MONTH_WIRE.to_owned(),
            (None, _) => String::new(),
        }
    }

    /// The inverse of [`Calendar::wire`]; an unknown zone or day is an error.
    pub fn from_wire(text: &str) -> Result<Calendar, String> {
        match text {
            "" => Ok(Calendar::EPOCH),
            GO_MONTH_WIRE => Ok(Calendar::GO_MONTH),
            _ => {
                let (zone, day) = match text.split_once(' ') {
                    Some((zone, day)) => (zone, Some(day)),
                    None => (text, None),
                };
                Calendar::zone(zone, day)
            }
        }
    }

    fn zone_entry(self) -> Option<&'static Zone> {
        ZONES.get(usize::from(self.0))?.get()
    }

    fn tz_and_week(self) -> (&'static TimeZone, u8) {
        static UTC: TimeZone = TimeZone::UTC;
        match self.zone_entry() {
            Some(z) => (&z.tz, z.week_start),
            None => (&UTC, 0),
        }
    }

    /// The index of the local `unit` containing `now_secs` (units below a day are not local:
    /// the config refuses a zone on them, and they count from the epoch here).
    ///
    /// Each thread remembers the last window of each unit it found, with its start and end,
    /// so a decision asks the zone's rules only in its first call of a window.
    #[inline(never)]
    pub fn index(self, unit: Unit, now_secs: u64) -> u64 {
        if unit < Unit::Day {
            return now_secs / unit.secs();
        }
        let slot = unit.index() - Unit::Day.index();
        let hit = LAST.with(|last| {
            let known = last[slot].get();
            (known.calendar == self && known.start <= now_secs && now_secs < known.end)
                .then_some(known.index)
        });
        if let Some(index) = hit {
            return index;
        }
        let index = self.find_index(unit, now_secs);
        let known = Known {
            calendar: self,
            index,
            start: self.find_start(unit, index),
            end: self.find_start(unit, index.saturating_add(1)),
        };
        LAST.with(|last| last[slot].set(known));
        index
    }

    /// The start of the local `unit` numbered `index`, in seconds since the epoch.
    #[inline(never)]
    pub fn start(self, unit: Unit, index: u64) -> u64 {
        if unit < Unit::Day {
            return index.saturating_mul(unit.secs());
        }
        let slot = unit.index() - Unit::Day.index();
        let known = LAST.with(|last| last[slot].get());
        match known.calendar == self && known.end > 0 {
            true if index == known.index => known.start,
            true if Some(index) == known.index.checked_add(1) => known.end,
            _ => self.find_start(unit, index),
        }
    }

    /// [`Calendar::index`] from the zone's rules.
    fn find_index(self, unit: Unit, now_secs: u64) -> u64 {
        let (tz, week_start) = self.tz_and_week();
        let ts = jiff::Timestamp::from_second(i64::try_from(now_secs).unwrap_or(i64::MAX))
            .unwrap_or(jiff::Timestamp::MAX);
        let date = tz.to_datetime(ts).date();
        let index = match unit {
            Unit::Week => {
                (epoch_day(date) + EPOCH_WEEKDAY - i64::from(week_start) + 7).div_euclid(7)
            }
            Unit::Month => (i64::from(date.year()) - 1970) * 12 + i64::from(date.month()) - 1,
            Unit::Year => i64::from(date.year()) - 1970,
            _ => epoch_day(date),
        };
        u64::try_from(index).unwrap_or(0)
    }

    /// [`Calendar::start`] from the zone's rules.
    fn find_start(self, unit: Unit, index: u64) -> u64 {
        let (tz, week_start) = self.tz_and_week();
        let index = i64::try_from(index).unwrap_or(i64::MAX);
        let first = match unit {
            Unit::Week => date_of_epoch_day(
                index
                    .saturating_mul(7)
                    .saturating_add(i64::from(week_start) - EPOCH_WEEKDAY - 7),
            ),
            Unit::Month => jiff::civil::date(
                clamp_year(1970 + index.div_euclid(12)),
                (index.rem_euclid(12) + 1) as i8,
                1,
            ),
            Unit::Year => jiff::civil::date(clamp_year(1970_i64.saturating_add(index)), 1, 1),
            _ => date_of_epoch_day(index),
        };
        let ts = tz
            .to_timestamp(first.to_datetime(jiff::civil::Time::midnight()))
            .unwrap_or(jiff::Timestamp::MAX);
        u64::try_from(ts.as_second()).unwrap_or(0)
    }
}

/// A window a thread found last: [`Calendar::index`]'s memory.
#[derive(Clone, Copy, Default)]
struct Known {
    calendar: Calendar,
    index: u64,
    start: u64,
    end: u64,
}

thread_local! {
    /// The last window found of each unit from a day up (day, week, month, year). An empty one
    /// (end 0) contains no time.
    static LAST: [std::cell::Cell<Known>; 4] = Default::default();
}

/// The English names of the days, Monday first, as `week_start` spells them.
const WEEKDAYS: [&str; 7] = [
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
];

fn weekday_from_name(name: &str) -> Option<u8> {
    WEEKDAYS
        .iter()
        .position(|d| d.eq_ignore_ascii_case(name))
        .map(|i| i as u8)
}

/// Days from 1970-01-01 to `date` (the proleptic Gregorian count of "days from civil").
fn epoch_day(date: Date) -> i64 {
    let (m, d) = (i64::from(date.month()), i64::from(date.day()));
    let y = i64::from(date.year()) - i64::from(m <= 2);
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The date `days` after 1970-01-01: [`epoch_day`]'s inverse, within the years jiff knows.
fn date_of_epoch_day(days: i64) -> Date {
    let (year, month, day) = civil_from_days(i128::from(days.clamp(-719_000, 2_932_000)));
    jiff::civil::date(clamp_year(year as i64), month as i8, day as i8)
}

/// The proleptic Gregorian (year, month, day) of a day count since 1970-01-01 (Howard
/// Hinnant's "civil from days"); also what `/json` writes a `Timestamp` with.
pub(crate) fn civil_from_days(days: i128) -> (i128, i128, i128) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i128::from(month <= 2);
    (year, month, day)
}

fn clamp_year(year: i64) -> i16 {
    year.clamp(1, 9_999) as i16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Window;
    use proptest::prelude::*;

    fn zone(name: &str) -> Calendar {
        Calendar::zone(name, None).expect("a known zone")
    }

    /// The window of `unit` on `calendar` containing `now`: its (start, end).
    fn around(unit: Unit, calendar: Calendar, now: u64) -> (u64, u64) {
        let w = Window::of(unit).on(calendar);
        let i = w.index(now);
        (w.start(i), w.end(i))
    }

    #[test]
    fn a_tokyo_day_starts_at_midnight_in_tokyo() {
        let tokyo = zone("Asia/Tokyo");
        // 2026-11-29 00:00 JST is 2026-11-28 15:00 UTC.
        let midnight = 1_795_878_000;
        assert_eq!(
            around(Unit::Day, tokyo, midnight - 1),
            (midnight - 86_400, midnight)
        );
        assert_eq!(
            around(Unit::Day, tokyo, midnight),
            (midnight, midnight + 86_400)
        );
        let w = Window::of(Unit::Day).on(tokyo);
        assert_eq!(w.reset_after(midnight - 3_600), 3_600);
        assert_eq!(w.reset_after(midnight), 86_400);
    }

    #[test]
    fn the_go_month_is_the_utc_calendar_month() {
        // 2026-02-01, 2026-03-01, 2026-12-01 and 2027-01-01 at 00:00 UTC.
        let (feb, mar, dec, jan) = (1_769_904_000, 1_772_323_200, 1_796_083_200, 1_798_761_600);
        let month = Calendar::GO_MONTH;
        assert_eq!(around(Unit::Month, month, feb + 14 * 86_400), (feb, mar));
        assert_eq!(mar - feb, 28 * 86_400);
        assert_eq!(around(Unit::Month, month, jan - 1), (dec, jan));
        assert_eq!(around(Unit::Month, month, jan), (jan, jan + 31 * 86_400));
        // Without the calendar, a month is the Go service's 30-day epoch window.
        assert_eq!(
            Window::of(Unit::Month).start(Window::of(Unit::Month).index(jan)) % 2_592_000,
            0
        );
    }

    #[test]
    fn days_across_daylight_saving_changes_are_23_and_25_hours() {
        let new_york = zone("America/New_York");
        // 2026-03-08 and 2026-11-01 at 00:00 in New York.
        assert_eq!(
            around(Unit::Day, new_york, 1_772_946_000 + 12 * 3_600),
            (1_772_946_000, 1_773_028_800)
        );
        assert_eq!(1_773_028_800 - 1_772_946_000, 23 * 3_600);
        assert_eq!(
            around(Unit::Day, new_york, 1_793_505_600 + 3_600),
            (1_793_505_600, 1_793_595_600)
        );
        assert_eq!(1_793_595_600 - 1_793_505_600, 25 * 3_600);
    }

    #[test]
    fn a_midnight_that_a_change_skips_starts_the_day_after_the_gap() {
        // Chile moves its clocks from 00:00 to 01:00 on 2026-09-06: that day starts at 01:00
        // local (04:00 UTC), and lasts 23 hours.
        let santiago = zone("America/Santiago");
        let (start, end) = around(Unit::Day, santiago, 1_788_667_200 + 600);
        assert_eq!((start, end - start), (1_788_667_200, 23 * 3_600));
        assert_eq!(around(Unit::Day, santiago, start - 1).1, start);
    }

    #[test]
    fn weeks_start_on_monday_unless_told_otherwise() {
        // 2026-11-28 is a Saturday; Monday 2026-11-23, Sunday 2026-11-22 and Monday
        // 2026-11-30 at 00:00 UTC.
        let (sun, mon, next_mon) = (1_795_305_600, 1_795_392_000, 1_795_996_800);
        let saturday = mon + 5 * 86_400 + 3_600;
        assert_eq!(around(Unit::Week, zone("UTC"), saturday), (mon, next_mon));
        let sunday_first = Calendar::zone("UTC", Some("Sunday")).unwrap();
        assert_eq!(
            around(Unit::Week, sunday_first, saturday),
            (sun, sun + 7 * 86_400)
        );
        assert_eq!(sunday_first.week_start(), Some("sunday"));
        assert_eq!(zone("UTC").week_start(), None);
    }

    #[test]
    fn years_and_quarters_start_on_the_first_of_their_month() {
        let utc = zone("UTC");
        let (dec, jan) = (1_796_083_200, 1_798_761_600);
        assert_eq!(around(Unit::Year, utc, dec).1, jan);
        let quarter = Window::new(Unit::Month, 3).on(utc);
        let q = quarter.index(dec);
        // October, November and December 2026: 92 days.
        assert_eq!(
            (quarter.end(q), quarter.end(q) - quarter.start(q)),
            (jan, 92 * 86_400)
        );
    }

    #[test]
    fn unknown_zones_and_days_are_refused_by_name() {
        let err = Calendar::zone("Mars/Olympus_Mons", None).unwrap_err();
        assert!(
            err.contains("unknown time_zone 'Mars/Olympus_Mons'"),
            "{err}"
        );
        let err = Calendar::zone("UTC", Some("someday")).unwrap_err();
        assert!(err.contains("unknown week_start 'someday'"), "{err}");
    }

    #[test]
    fn calendars_are_made_once_and_cross_the_wire() {
        let a = Calendar::zone("Europe/Paris", Some("sunday")).unwrap();
        assert_eq!(Calendar::zone("Europe/Paris", Some("SUNDAY")).unwrap(), a);
        assert_ne!(Calendar::zone("Europe/Paris", None).unwrap(), a);
        for c in [a, Calendar::EPOCH, Calendar::GO_MONTH, zone("Asia/Tokyo")] {
            assert_eq!(Calendar::from_wire(&c.wire()), Ok(c));
        }
        assert_eq!(a.wire(), "Europe/Paris sunday");
        assert!(Calendar::from_wire("Nowhere/Bogus").is_err());
    }

    proptest! {
        /// Consecutive windows tile time: each starts where the one before ends, and every
        /// instant's window contains it.
        #[test]
        fn calendar_windows_tile_time(
            now in 0u64..4_102_444_800,
            unit in prop::sample::select(vec![Unit::Day, Unit::Week, Unit::Month, Unit::Year]),
            name in prop::sample::select(vec![
                "UTC", "Asia/Tokyo", "America/New_York", "America/Santiago",
                "Australia/Lord_Howe", "Asia/Kathmandu", "Pacific/Apia",
            ]),
            multiplier in 1u32..4,
        ) {
            let w = Window::new(unit, multiplier).on(zone(name));
            let i = w.index(now);
            prop_assert!(w.start(i) <= now, "start {} after {now}", w.start(i));
            prop_assert!(now < w.end(i), "end {} not after {now}", w.end(i));
            prop_assert_eq!(w.index(w.start(i)), i);
            prop_assert_eq!(w.index(w.end(i)), i + 1);
            prop_assert!(w.end(i) - w.start(i) <= w.max_secs());
        }
    }
}
