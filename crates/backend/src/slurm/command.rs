//! Running Slurm's commands: bounded in time, their errors as text, transient ones told
//! apart.

use super::*;

/// Runs a command with a bound; `Ok(stdout)` on exit 0, else Slurm's message.
pub(super) fn run_cmd(program: &str, args: &[OsString], timeout: Duration) -> Result<Vec<u8>, String> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let out_reader = thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(s) = stdout.as_mut() {
            let _ = s.read_to_end(&mut b);
        }
        b
    });
    let err_reader = thread::spawn(move || {
        let mut b = Vec::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_end(&mut b);
        }
        b
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{program} did not finish within {timeout:?}"));
            }
            Ok(None) => thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(format!("waiting for {program}: {e}")),
        }
    };
    let out = out_reader.join().unwrap_or_default();
    let err = err_reader.join().unwrap_or_default();
    if status.success() {
        Ok(out)
    } else {
        let text = String::from_utf8_lossy(&err).trim().to_string();
        let text = if text.is_empty() { String::from_utf8_lossy(&out).trim().to_string() } else { text };
        Err(if text.is_empty() { format!("{program} failed ({status})") } else { text })
    }
}

pub(super) fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

/// Errors of `sbatch` that mean "the controller could not be reached": worth a retry.
pub(super) fn is_transient(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    ["unable to contact slurm controller", "socket timed out", "temporarily unavailable", "try again", "did not finish within", "connection refused", "zero bytes were transmitted"]
        .iter()
        .any(|p| m.contains(p))
}

pub(super) fn sh_quote(s: &[u8]) -> String {
    let s = String::from_utf8_lossy(s);
    format!("'{}'", s.replace('\'', "'\\''"))
}

pub(super) fn scancel(opts: &SlurmOptions, args: &[&str]) -> Result<(), String> {
    run_cmd("scancel", &os(args), opts.command_timeout).map(|_| ())
}
