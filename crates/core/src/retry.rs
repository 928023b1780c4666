//! Retries as rules: one backoff policy for every effect that was refused and is asked
//! again, with its settings per effect, and the steps of a stop seen through (L20). Pure:
//! the caller keeps the state and the clock, these functions decide. The loops that sleep
//! between tries elsewhere (a shim's status write, the driver's recovery, a followed log,
//! the listener's accept) use the same [`Backoff`], in `Duration`s.

use std::time::Duration;

use crate::Micros;

const SECOND: Micros = 1_000_000;

/// Try again after a failure: `first`, doubling with each failure, at most `max`; with
/// `give_up_after`, no more tries after that many failures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub first: Micros,
    pub max: Micros,
    pub give_up_after: Option<u32>,
}

impl Backoff {
    pub const fn new(first: Micros, max: Micros) -> Backoff {
        Backoff { first, max, give_up_after: None }
    }

    /// As [`Backoff::new`], in `Duration`s (whole microseconds).
    pub const fn of(first: Duration, max: Duration) -> Backoff {
        Backoff::new(first.as_micros() as Micros, max.as_micros() as Micros)
    }

    pub const fn giving_up_after(self, failures: u32) -> Backoff {
        Backoff { give_up_after: Some(failures), ..self }
    }

    /// After `failures` failures (1 for the first), the delay before the next try; None
    /// when the effect is given up.
    pub fn delay(&self, failures: u32) -> Option<Micros> {
        if self.give_up_after.is_some_and(|n| failures >= n) {
            return None;
        }
        let doublings = failures.max(1) - 1;
        Some(self.first.saturating_mul(1 << doublings.min(30)).min(self.max))
    }

    /// The delay for a policy that never gives up (at most `max` for one that would).
    pub fn retry_after(&self, failures: u32) -> Micros {
        self.delay(failures).unwrap_or(self.max)
    }

    /// [`Backoff::retry_after`] as a `Duration`, for a loop that sleeps; no failure yet
    /// (`failures` 0) is no pause.
    pub fn pause(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        Duration::from_micros(u64::try_from(self.retry_after(failures)).unwrap_or(0))
    }
}

/// L16: a launch the engine could not take now (its host out of file descriptors,
/// processes or memory) is tried again, the job PENDING with the reason meanwhile: 2 s,
/// doubling, at most 30 s, never given up (a cancel ends it).
pub const LAUNCH_LATER: Backoff = Backoff::new(2 * SECOND, 30 * SECOND);
/// L16: a Slurm submission while the controller is unreachable, as [`LAUNCH_LATER`].
pub const SUBMIT: Backoff = LAUNCH_LATER;
/// L20: a stop or kill the engine refused is asked again: 1 s, doubling, at most 30 s,
/// until the run is gone.
pub const STOP_REFUSED: Backoff = Backoff::new(SECOND, 30 * SECOND);
/// A deleted job's files that could not be removed: 1 s, doubling, at most 60 s, given
/// up after 5 failures (then logged and counted).
pub const PURGE: Backoff = Backoff::new(SECOND, 60 * SECOND).giving_up_after(5);

/// L20: past the grace period, how long a delivered stop may take before it is escalated
/// to a kill that does not need the run's supervisor.
pub const STOP_MARGIN: Micros = 10 * SECOND;
/// L20: after a kill, how long before it is asked again (until the run is gone).
pub const KILL_AGAIN: Micros = 10 * SECOND;

/// The next thing to send for a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopStep {
    /// The stop was refused: ask again.
    Stop,
    /// The stop was delivered and not honoured in time, or a kill was: kill.
    Kill,
}

/// What became of a stop or kill that was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReport {
    /// The stop reached the run's supervisor.
    StopSent,
    Killed,
    StopFailed,
    KillFailed,
}

/// L20: a stop seen through until its run is gone. A stop the engine refused is asked
/// again with [`STOP_REFUSED`]; a delivered stop not honoured within the grace period and
/// [`STOP_MARGIN`] is escalated to a kill, asked again every [`KILL_AGAIN`]. The caller
/// ends the track when the run is seen gone, never before.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopTrack {
    /// Refusals so far (stop or kill).
    pub refusals: u32,
    /// What to send next, and when (None: waiting for what became of the last one).
    pub next: Option<(Micros, StopStep)>,
}

impl StopTrack {
    /// What follows a report; returns the refusal's delay when it was one.
    pub fn reported(&mut self, report: StopReport, grace: Micros, now: Micros) -> Option<Micros> {
        let (after, step, refused) = match report {
            StopReport::StopSent => (grace + STOP_MARGIN, StopStep::Kill, false),
            StopReport::Killed => (KILL_AGAIN, StopStep::Kill, false),
            StopReport::StopFailed | StopReport::KillFailed => {
                self.refusals += 1;
                let step = if report == StopReport::StopFailed { StopStep::Stop } else { StopStep::Kill };
                (STOP_REFUSED.retry_after(self.refusals), step, true)
            }
        };
        self.next = Some((now + after, step));
        refused.then_some(after)
    }

    /// The step due at `now`, taken (the next waits for what becomes of it).
    pub fn due(&mut self, now: Micros) -> Option<StopStep> {
        match self.next {
            Some((at, step)) if at <= now => {
                self.next = None;
                Some(step)
            }
            _ => None,
        }
    }

    /// When the track next needs attention.
    pub fn at(&self) -> Option<Micros> {
        self.next.map(|(at, _)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// L16: an engine that cannot take a launch is asked again after 2, 4, 8, 16, then
    /// every 30 s, never given up; a Slurm submission waits for its controller the same way.
    #[test]
    fn l16_launches_the_engine_could_not_take_back_off_and_are_never_given_up() {
        let delays: Vec<Micros> = (1..=7).map(|n| LAUNCH_LATER.delay(n).unwrap() / SECOND).collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(LAUNCH_LATER.delay(10_000), Some(30 * SECOND));
        assert_eq!(SUBMIT, LAUNCH_LATER);
    }

    #[test]
    fn a_sleeping_loop_pauses_nothing_before_a_failure_then_doubles_to_its_bound() {
        let b = Backoff::of(Duration::from_millis(10), Duration::from_secs(1));
        let pauses: Vec<u128> = (0..=9).map(|n| b.pause(n).as_millis()).collect();
        assert_eq!(pauses, [0, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.pause(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn a_purge_is_given_up_after_its_tries() {
        let delays: Vec<Option<Micros>> = (1..=5).map(|n| PURGE.delay(n).map(|d| d / SECOND)).collect();
        assert_eq!(delays, [Some(1), Some(2), Some(4), Some(8), None]);
    }

    /// L20: a delivered stop not honoured within the grace period and the margin is
    /// escalated to a kill, and the kill is asked again until the run is gone; nothing is
    /// due before its time, and a due step is taken once.
    #[test]
    fn l20_a_stop_not_honoured_in_time_is_escalated_to_a_kill_asked_again() {
        let grace = 30 * SECOND;
        let mut t = StopTrack::default();
        assert_eq!(t.reported(StopReport::StopSent, grace, 0), None);
        assert_eq!(t.due(grace + STOP_MARGIN - 1), None);
        assert_eq!(t.due(grace + STOP_MARGIN), Some(StopStep::Kill));
        assert_eq!(t.due(grace + STOP_MARGIN), None, "taken once");
        let at = grace + STOP_MARGIN + 5;
        t.reported(StopReport::Killed, grace, at);
        assert_eq!(t.at(), Some(at + KILL_AGAIN));
        assert_eq!(t.due(at + KILL_AGAIN), Some(StopStep::Kill));
    }

    /// L20: a stop or kill the engine refused is asked again (the same step) after 1, 2,
    /// 4 ... at most 30 s, never given up.
    #[test]
    fn l20_a_refused_stop_is_asked_again_with_backoff() {
        let mut t = StopTrack::default();
        let mut now = 0;
        let mut delays = Vec::new();
        for _ in 0..7 {
            let d = t.reported(StopReport::StopFailed, 30 * SECOND, now).expect("a refusal");
            delays.push(d / SECOND);
            now += d;
            assert_eq!(t.due(now), Some(StopStep::Stop));
        }
        assert_eq!(delays, [1, 2, 4, 8, 16, 30, 30]);
        t.reported(StopReport::KillFailed, 30 * SECOND, now);
        assert_eq!(t.due(now + 30 * SECOND), Some(StopStep::Kill), "a refused kill is a kill again");
    }
}
