//! Calendar windows through the service (issue 51): a daily budget in Tokyo resets at midnight
//! in Tokyo, a monthly one with USE_CALENDAR_MONTH_RATE_LIMIT on the 1st at 00:00 UTC, and
//! `duration_until_reset` and the RateLimit headers say so.

use super::*;

const CALENDARS: &str = r#"
domain: cal
descriptors:
  - key: tokyo
    rate_limit: {unit: day, requests_per_unit: 2, time_zone: Asia/Tokyo}
  - key: tokyo_sliding
    rate_limit: {unit: day, requests_per_unit: 2, time_zone: Asia/Tokyo, algorithm: sliding_window}
  - key: utc_day
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 2}
"#;

/// 2026-11-29 00:00 in Tokyo (2026-11-28 15:00 UTC).
const TOKYO_MIDNIGHT: u64 = 1_795_878_000;
/// 2027-01-01 at 00:00 UTC.
const JANUARY: u64 = 1_798_761_600;

fn calendars(calendar_month: bool, now_secs: u64) -> (RateLimitService<MemoryStore>, ManualClock) {
    let load = LoadOptions {
        calendar_month,
        ..LoadOptions::default()
    };
    let options = ServiceOptions {
        response_headers: Some(HeaderNames::default()),
        ..ServiceOptions::default()
    };
    let (service, clock, _) = service_of(CALENDARS, &load, now_secs, options);
    (service, clock)
}

/// One hit on `key`: the code and the seconds until its window resets.
async fn hit(service: &RateLimitService<MemoryStore>, key: &str) -> (Code, Option<u64>) {
    let r = service
        .should_rate_limit(req("cal", vec![desc(&[(key, "t")])]))
        .await
        .expect("no error");
    let s = &r.statuses[0];
    if let Some(h) = &r.rate_limit {
        assert_eq!(Some(h.reset_secs), s.duration_until_reset_secs, "{key}");
    }
    (s.code, s.duration_until_reset_secs)
}

#[tokio::test]
async fn a_daily_budget_in_tokyo_resets_at_midnight_in_tokyo() {
    // An hour before midnight in Tokyo, 15 hours before midnight UTC.
    let (service, clock) = calendars(false, TOKYO_MIDNIGHT - 3_600);
    for key in ["tokyo", "tokyo_sliding", "utc_day"] {
        let reset = if key == "utc_day" {
            9 * 3_600 + 3_600
        } else {
            3_600
        };
        for _ in 0..2 {
            assert_eq!(hit(&service, key).await, (Code::Ok, Some(reset)), "{key}");
        }
        assert_eq!(hit(&service, key).await.0, Code::OverLimit, "{key}");
    }
    // The last second of the Tokyo day is still spent.
    clock.set(Timestamp::from_secs(TOKYO_MIDNIGHT - 1));
    assert_eq!(hit(&service, "tokyo").await, (Code::OverLimit, Some(1)));
    // At midnight in Tokyo its budget is back, for a whole day; the UTC day's is not.
    clock.set(Timestamp::from_secs(TOKYO_MIDNIGHT));
    assert_eq!(hit(&service, "tokyo").await, (Code::Ok, Some(86_400)));
    assert_eq!(hit(&service, "utc_day").await.0, Code::OverLimit);
    // A sliding window still weighs the day before: at its start, all of it.
    assert_eq!(hit(&service, "tokyo_sliding").await.0, Code::OverLimit);
    clock.set(Timestamp::from_secs(TOKYO_MIDNIGHT + 12 * 3_600));
    assert_eq!(hit(&service, "tokyo_sliding").await.0, Code::Ok);
}

#[tokio::test]
async fn with_the_go_flag_a_monthly_budget_resets_on_the_first_at_midnight_utc() {
    let (service, clock) = calendars(true, JANUARY - 10);
    for _ in 0..2 {
        assert_eq!(hit(&service, "month").await, (Code::Ok, Some(10)));
    }
    assert_eq!(hit(&service, "month").await.0, Code::OverLimit);
    clock.set(Timestamp::from_secs(JANUARY));
    // January has 31 days.
    assert_eq!(hit(&service, "month").await, (Code::Ok, Some(31 * 86_400)));
    // Without the flag, a month is the Go service's 30-day epoch window (2026-12-03 to
    // 2027-01-02 here).
    let (plain, _) = calendars(false, JANUARY);
    assert_eq!(
        hit(&plain, "month").await,
        (
            Code::Ok,
            Some(JANUARY.next_multiple_of(2_592_000) - JANUARY)
        )
    );
}
