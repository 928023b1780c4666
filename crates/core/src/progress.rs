//! Progress and ETA of a running job, from what its program reports: JSON lines
//! `{"step": N, "total": M}` appended to `$TRAINYARD_PROGRESS_FILE` (or cloudml-hypertune's
//! `global_step`). The steps per second are measured over the last [`WINDOW`], and the ETA
//! is what is left at that rate. Lines that do not parse, a negative step or total, or a
//! step above its total are ignored (the caller warns once per replica).

use std::collections::VecDeque;

use crate::job::{Micros, SECOND};

/// The window over which the rate is measured.
pub const WINDOW: Micros = 60 * SECOND;

/// One report: the step reached, and the total if known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Report {
    pub step: i64,
    pub total: Option<i64>,
}

/// The latest valid report in `text` (the end of a progress file), and the first line
/// ignored (with why), if any. `key` names the step (`step`, or `global_step` in a metric
/// file).
pub fn latest(text: &str, key: &str) -> (Option<Report>, Option<String>) {
    let mut best = None;
    let mut bad = None;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match parse_line(line, key) {
            Ok(Some(r)) => best = Some(r),
            Ok(None) => {}
            Err(why) => {
                bad.get_or_insert_with(|| format!("{why}: {}", line.chars().take(120).collect::<String>()));
            }
        }
    }
    (best, bad)
}

fn parse_line(line: &str, key: &str) -> Result<Option<Report>, &'static str> {
    let v: serde_json::Value = serde_json::from_str(line).map_err(|_| "not a JSON object")?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    let Some(step) = obj.get(key) else {
        // A metric file's lines without a step say nothing of progress.
        return if key == "step" { Err("no \"step\"") } else { Ok(None) };
    };
    let step = step.as_i64().or_else(|| step.as_f64().filter(|f| f.fract() == 0.0).map(|f| f as i64)).ok_or("the step is not a whole number")?;
    let total = match obj.get("total") {
        None | Some(serde_json::Value::Null) => None,
        Some(t) => Some(t.as_i64().ok_or("the total is not a whole number")?),
    };
    if step < 0 || total.is_some_and(|t| t <= 0) {
        return Err("a negative step or a total not above 0");
    }
    if total.is_some_and(|t| step > t) {
        return Err("a step above its total");
    }
    Ok(Some(Report { step, total }))
}

/// Reports seen over time.
#[derive(Clone, Debug, Default)]
pub struct Track {
    samples: VecDeque<(Micros, i64)>,
    total: Option<i64>,
}

/// What the job shows.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    pub step: i64,
    pub total: Option<i64>,
    /// Over the last window; None until two reports differ.
    pub steps_per_second: Option<f64>,
    /// When the total is reached at that rate.
    pub eta: Option<Micros>,
}

impl Track {
    /// A report read at `now`.
    pub fn push(&mut self, now: Micros, r: Report) {
        if self.samples.back().is_some_and(|(_, s)| r.step < *s) {
            // Started again from an earlier step (a restart): measured afresh.
            self.samples.clear();
        }
        if self.samples.back().is_none_or(|(_, s)| r.step != *s) || self.samples.len() < 2 {
            self.samples.push_back((now, r.step));
        }
        if r.total.is_some() {
            self.total = r.total;
        }
        while self.samples.len() > 2 && self.samples.front().is_some_and(|(t, _)| *t < now - WINDOW) {
            self.samples.pop_front();
        }
    }

    pub fn view(&self, now: Micros) -> Option<View> {
        let &(t1, s1) = self.samples.back()?;
        let rate = self.samples.front().and_then(|&(t0, s0)| {
            let dt = (t1.max(now) - t0) as f64 / SECOND as f64;
            (s1 > s0 && dt > 0.0).then(|| (s1 - s0) as f64 / dt)
        });
        let eta = match (self.total, rate) {
            (Some(total), Some(r)) if r > 0.0 => Some(now + (((total - s1).max(0) as f64 / r) * SECOND as f64) as Micros),
            _ => None,
        };
        Some(View { step: s1, total: self.total, steps_per_second: rate, eta })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The latest valid line wins; garbage, a negative total and a step above its total
    /// are ignored and named once.
    #[test]
    fn lines_parse_and_bad_ones_are_named() {
        let text = "{\"step\": 1, \"total\": 100}\ngarbage\n{\"step\": 5, \"total\": 100}\n{\"step\": 500, \"total\": 100}\n{\"step\": 3, \"total\": -1}\n";
        let (r, bad) = latest(text, "step");
        assert_eq!(r, Some(Report { step: 5, total: Some(100) }));
        assert!(bad.is_some_and(|b| b.contains("not a JSON object: garbage")));
        let (r, bad) = latest("{\"accuracy\": 0.5, \"global_step\": 12}\n{\"accuracy\": 0.6}\n", "global_step");
        assert_eq!((r, bad), (Some(Report { step: 12, total: None }), None));
    }

    /// Steps per second over the window, and the ETA of the rest at that rate.
    #[test]
    fn rate_and_eta() {
        let mut t = Track::default();
        t.push(0, Report { step: 0, total: Some(100) });
        assert_eq!(t.view(0).map(|v| v.steps_per_second), Some(None));
        t.push(10 * SECOND, Report { step: 20, total: Some(100) });
        let v = t.view(10 * SECOND).expect("view");
        assert_eq!(v.steps_per_second, Some(2.0));
        assert_eq!(v.eta, Some(50 * SECOND), "80 steps at 2 per second");
        // Old samples leave the window.
        t.push(100 * SECOND, Report { step: 60, total: Some(100) });
        t.push(110 * SECOND, Report { step: 70, total: Some(100) });
        assert_eq!(t.view(110 * SECOND).and_then(|v| v.steps_per_second), Some(1.0));
        // A restart from an earlier step starts afresh.
        t.push(120 * SECOND, Report { step: 10, total: Some(100) });
        assert_eq!(t.view(120 * SECOND).map(|v| (v.step, v.steps_per_second)), Some((10, None)));
    }
}
