//! The session protocol of `custom-jobs exec` (a Trainyard extension): a WebSocket on
//! `GET /v1/projects/{project}/locations/{location}/customJobs/{id}/exec`, shared by the
//! CLI and the console (docs/exec.md).
//!
//! The query names the session: `replica` (default `workerpool0-0`), `command` once per
//! argument (none: the replica's shell), `tty=true` for a terminal with `cols` and `rows`
//! (its first size) and `term` (its `TERM`). Every message is binary; its first byte is
//! the channel, the rest its payload:
//!
//! | channel | direction | payload |
//! | --- | --- | --- |
//! | 0 [`STDIN`] | to the server | bytes for the command's standard input; empty: end of input |
//! | 1 [`STDOUT`] | to the client | the command's standard output (a terminal's output) |
//! | 2 [`STDERR`] | to the client | its standard error (none with a terminal) |
//! | 3 [`STATUS`] | to the client | [`Status`] as JSON, the last message before the close |
//! | 4 [`RESIZE`] | to the server | [`Size`] as JSON: the terminal's new size |

use serde::{Deserialize, Serialize};

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const STATUS: u8 = 3;
pub const RESIZE: u8 = 4;

/// The largest message either side may send (a channel byte and its payload).
pub const MAX_MESSAGE: usize = 1 << 20;

/// A message of the protocol: the channel byte, then the payload.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    v
}

/// The replica a session enters when the query names none: the primary's first.
pub const DEFAULT_REPLICA: &str = "workerpool0-0";

/// How a session ended: exactly one of `exit_status`, `signal` and `error`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    /// The command exited with this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_status: Option<i32>,
    /// The command was killed by this signal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// The session ended for another reason (the replica ended, idle too long), in the
    /// API's error shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Failure>,
    /// What ended it, in words (also for an exit: "the replica ended").
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

impl Status {
    /// The exit status a local shell would give: the status, 128 + the signal, else 255.
    pub fn shell_status(&self) -> i32 {
        match (self.exit_status, self.signal) {
            (Some(s), _) => s,
            (None, Some(sig)) => 128 + sig,
            _ => 255,
        }
    }
}

/// Why a session ended without its command's status, as the API's errors say it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failure {
    /// The rpc code's number.
    pub code: i32,
    /// The rpc code's name (`FAILED_PRECONDITION`).
    pub status: String,
    pub message: String,
}

impl From<&crate::error::ApiError> for Failure {
    fn from(e: &crate::error::ApiError) -> Failure {
        Failure { code: e.code.number(), status: e.code.name().to_string(), message: e.message.clone() }
    }
}

/// A terminal's size, in characters (1 to 65535 each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Size {
    pub cols: u32,
    pub rows: u32,
}

impl Size {
    /// The size, or what is wrong with it (naming the field).
    pub fn check(self) -> Result<Size, String> {
        for (name, v) in [("cols", self.cols), ("rows", self.rows)] {
            if !(1..=65535).contains(&v) {
                return Err(format!("{name}: {v} is not a terminal size (1 to 65535)"));
            }
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_outside_a_terminals_are_named() {
        assert!(Size { cols: 80, rows: 24 }.check().is_ok());
        assert!(Size { cols: 0, rows: 24 }.check().unwrap_err().starts_with("cols"));
        assert!(Size { cols: 80, rows: 65536 }.check().unwrap_err().starts_with("rows"));
    }

    #[test]
    fn a_status_reads_as_a_shells() {
        assert_eq!(Status { exit_status: Some(3), ..Status::default() }.shell_status(), 3);
        assert_eq!(Status { signal: Some(9), ..Status::default() }.shell_status(), 137);
        assert_eq!(Status::default().shell_status(), 255);
        let s = serde_json::to_string(&Status { exit_status: Some(0), ..Status::default() }).unwrap();
        assert_eq!(s, r#"{"exitStatus":0}"#);
    }
}
