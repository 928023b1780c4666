//! Times as text: RFC 3339 in UTC, the one formatter of the workspace (the API's own
//! `Timestamp` keeps the wire's rule of as few fraction digits as the value needs).

use crate::job::Micros;

/// How many fraction digits a time is written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Digits {
    /// Whole seconds: waiting reasons, usage hours.
    Seconds,
    /// Milliseconds: Cloud Storage's object times.
    Millis,
    /// Microseconds: log lines.
    Micros,
}

/// `us` (microseconds since the epoch) as RFC 3339 in UTC with `digits`; the epoch itself
/// for an instant the `time` crate cannot hold.
pub fn rfc3339(us: Micros, digits: Digits) -> String {
    use time::macros::format_description as fd;
    let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(us) * 1000).ok();
    let text = match digits {
        Digits::Seconds => {
            let whole = time::OffsetDateTime::from_unix_timestamp(us.div_euclid(1_000_000)).ok();
            whole.and_then(|t| t.format(fd!("[year]-[month]-[day]T[hour]:[minute]:[second]Z")).ok())
        }
        Digits::Millis => t.and_then(|t| t.format(fd!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z")).ok()),
        Digits::Micros => t.and_then(|t| t.format(fd!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z")).ok()),
    };
    text.unwrap_or_else(|| {
        match digits {
            Digits::Seconds => "1970-01-01T00:00:00Z",
            Digits::Millis => "1970-01-01T00:00:00.000Z",
            Digits::Micros => "1970-01-01T00:00:00.000000Z",
        }
        .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_precision_at_known_instants() {
        assert_eq!(rfc3339(0, Digits::Seconds), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_634_797_000_005, Digits::Seconds), "2026-12-07T09:13:17Z");
        assert_eq!(rfc3339(1_700_000_000_123_456, Digits::Millis), "2023-11-14T22:13:20.123Z");
        assert_eq!(rfc3339(1_795_946_400_123_456, Digits::Micros), "2026-11-29T10:00:00.123456Z");
        assert_eq!(rfc3339(-1, Digits::Micros), "1969-12-31T23:59:59.999999Z");
        assert_eq!(rfc3339(-1, Digits::Seconds), "1969-12-31T23:59:59Z");
        assert_eq!(rfc3339(i64::MAX, Digits::Millis), "1970-01-01T00:00:00.000Z");
    }
}
