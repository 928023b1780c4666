//! The progress line of a command that waits on a job (`local-run`, `create --wait`): on a
//! terminal, one line on stderr redrawn in place (state, elapsed time, why the job waits);
//! elsewhere (a pipe, a file, CI), a plain line each time the state or the reason changes.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

pub struct Progress {
    tty: bool,
    start: Instant,
    /// What the last plain line said (state and reason), to print only changes.
    last: Option<String>,
    /// Is a line drawn on the terminal now (to be cleared before other output)?
    drawn: bool,
    /// A prefix of every plain line (`[trainyard] ` for local-run).
    prefix: String,
}

impl Progress {
    /// A progress line on stderr, in place when stderr is a terminal (and `TERM` is not
    /// `dumb`).
    pub fn stderr(prefix: &str) -> Progress {
        let tty = std::io::stderr().is_terminal() && std::env::var("TERM").map_or(true, |t| t != "dumb");
        Progress::new(tty, prefix)
    }

    pub fn new(tty: bool, prefix: &str) -> Progress {
        Progress { tty, start: Instant::now(), last: None, drawn: false, prefix: prefix.to_string() }
    }

    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Show where the job is: `what` names it (`CustomJob 12`), `state` is its state,
    /// `reason` why it waits (empty when it does not), `extra` anything else worth a glance
    /// (trials done). Plain lines are printed when state or reason change, not `extra`.
    pub fn update(&mut self, what: &str, state: &str, reason: &str, extra: &str) {
        let elapsed = duration(self.elapsed());
        let mut line = format!("{what}: {state}, {elapsed}");
        if !extra.is_empty() {
            line.push_str(&format!(", {extra}"));
        }
        if !reason.is_empty() {
            line.push_str(&format!(", waiting: {reason}"));
        }
        let mut err = std::io::stderr().lock();
        if self.tty {
            let width = terminal_width().unwrap_or(80).max(20);
            let shown: String = line.chars().map(|c| if c.is_control() { ' ' } else { c }).take(width - 1).collect();
            let _ = write!(err, "\r\x1b[2K{shown}");
            let _ = err.flush();
            self.drawn = true;
        } else {
            let key = format!("{state}\n{reason}");
            if self.last.as_deref() != Some(key.as_str()) {
                let _ = writeln!(err, "{}{line}", self.prefix);
                self.last = Some(key);
            }
        }
    }

    /// Remove the line from the terminal before other output (log lines, the final
    /// message); the next `update` draws it again.
    pub fn clear(&mut self) {
        if self.tty && self.drawn {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[2K");
            let _ = err.flush();
            self.drawn = false;
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// `0.4s`, `12s`, `3m07s`, `2h05m`.
pub fn duration(d: Duration) -> String {
    let s = d.as_secs();
    if s < 10 {
        format!("{:.1}s", d.as_secs_f64())
    } else if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    }
}

/// The width of the terminal on stderr, if it is one.
fn terminal_width() -> Option<usize> {
    let mut ws = nix::libc::winsize { ws_row: 0, ws_col: 0, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: TIOCGWINSZ writes one winsize into the struct passed.
    let rc = unsafe { nix::libc::ioctl(2, nix::libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        return Some(ws.ws_col as usize);
    }
    std::env::var("COLUMNS").ok().and_then(|c| c.parse().ok())
}

/// The exit code of a command that waited on a job: 0 SUCCEEDED, 1 FAILED, 130 CANCELLED
/// (as a program stopped by Ctrl-C), None while it has not ended.
pub fn exit_code(state: &str) -> Option<u8> {
    match state.trim_start_matches("JOB_STATE_").trim_start_matches("PIPELINE_STATE_") {
        "SUCCEEDED" => Some(0),
        "FAILED" | "EXPIRED" => Some(1),
        "CANCELLED" => Some(130),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(Duration::from_millis(400)), "0.4s");
        assert_eq!(duration(Duration::from_secs(12)), "12s");
        assert_eq!(duration(Duration::from_secs(187)), "3m07s");
        assert_eq!(duration(Duration::from_secs(7500)), "2h05m");
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code("JOB_STATE_SUCCEEDED"), Some(0));
        assert_eq!(exit_code("JOB_STATE_FAILED"), Some(1));
        assert_eq!(exit_code("JOB_STATE_CANCELLED"), Some(130));
        assert_eq!(exit_code("JOB_STATE_RUNNING"), None);
        assert_eq!(exit_code("JOB_STATE_CANCELLING"), None);
    }
}
