//! A helper command run to its end or to a deadline, whichever comes first: a `podman
//! pull`, a package build. It runs in a process group of its own, which is killed when it
//! ends or the deadline passes, so that nothing it started outlives it; its stderr is read
//! on a thread (a chatty command never blocks on a full pipe), at most 1 MiB kept.

use std::io::{self, Read};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How a bounded command ended.
#[derive(Debug)]
pub struct Bounded {
    /// Its exit status; `None` when the deadline passed first (it was killed).
    pub status: Option<ExitStatus>,
    /// What it wrote to stderr (its first MiB), lossily decoded.
    pub stderr: String,
}

/// Runs `cmd` (stdout discarded, stderr captured) until it ends or `deadline` passes.
/// An error means it could not be started or waited for.
pub fn run_until(cmd: &mut Command, deadline: Instant) -> io::Result<Bounded> {
    let mut child = cmd.process_group(0).stdout(Stdio::null()).stderr(Stdio::piped()).spawn()?;
    let stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(mut e) = stderr {
            let _ = (&mut e).take(1 << 20).read_to_end(&mut kept);
            let _ = io::copy(&mut e, &mut io::sink());
        }
        String::from_utf8_lossy(&kept).into_owned()
    });
    let group = nix::unistd::Pid::from_raw(child.id() as i32);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() >= deadline => break None,
            Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => {
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(e);
            }
        }
    };
    // Whatever it left running in its group goes with it (and so does it, past the deadline).
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    if status.is_none() {
        let _ = child.wait();
    }
    let stderr = reader.join().unwrap_or_default();
    Ok(Bounded { status, stderr })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_that_ends_gives_its_status_and_stderr() {
        let b = run_until(Command::new("sh").args(["-c", "echo oops >&2; exit 3"]), Instant::now() + Duration::from_secs(10)).unwrap();
        assert_eq!(b.status.and_then(|s| s.code()), Some(3));
        assert_eq!(b.stderr, "oops\n");
    }

    #[test]
    fn past_the_deadline_it_is_killed_with_what_it_started() {
        let marker = format!("sleep 77{}", std::process::id() % 1000);
        let script = format!("{marker} & sleep 60");
        let t0 = Instant::now();
        let b = run_until(Command::new("sh").args(["-c", &script]), Instant::now() + Duration::from_millis(300)).unwrap();
        assert!(b.status.is_none() && t0.elapsed() < Duration::from_secs(10), "{b:?}");
        std::thread::sleep(Duration::from_millis(100));
        let left = Command::new("pgrep").args(["-f", &marker]).output().unwrap();
        assert!(left.stdout.is_empty(), "what it started outlived it");
    }
}
