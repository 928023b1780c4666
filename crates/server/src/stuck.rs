//! What a replica that shows no progress is doing: its processes' CPU time (a progress
//! signal besides its output), and a stack dump taken before the service acts on a hang
//! or a straggler (`py-spy dump` for Python programs where py-spy is on the server's
//! PATH, else each thread's wait channel from `/proc`). Progress signals are read on the
//! observing thread, never the driver's; dumps, which may wait on a tenant's processes,
//! on threads of their own (see `tenant_work`), bounded in time and size.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

/// The most processes looked at, and of text kept, per replica.
const MAX_PROCS: usize = 64;
const MAX_DUMP: usize = 16 * 1024;
/// The most time one py-spy run takes, and the Python processes of a replica it is run on.
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(3);
const MAX_PY_SPY: usize = 4;
/// The most time the dumps of one job's replicas take, from the moment they are asked
/// for (waiting for the project's turn included): less than the job's tick waits for
/// its observation (`SCAN_HOLD`).
pub const DUMP_BUDGET: Duration = Duration::from_secs(6);

/// The replica's processes: those of its cgroup where it has one, else its program.
pub fn replica_pids(run_dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    if let Ok(Some(spec)) = trainyard_backend::shim::read_spec(run_dir) {
        if let (Some(base), Some(version)) = (spec.cgroup_base, spec.cgroup_version) {
            if !spec.cgroup_name.is_empty() && !spec.cgroup_name.contains('/') {
                if let Ok(v) = trainyard_backend::cgroup::CgroupVersion::from_number(version) {
                    let cg = trainyard_backend::cgroup::ReplicaCgroup::open(v, base.join(&spec.cgroup_name));
                    pids = cg.pids().unwrap_or_default();
                }
            }
        }
    }
    if pids.is_empty() {
        if let Ok(Some(s)) = trainyard_backend::shim::read_started(run_dir) {
            if let Ok(pid) = i32::try_from(s.pid) {
                pids.push(pid);
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids.truncate(MAX_PROCS);
    pids
}

/// `/proc/<pid>/stat`: its state letter and user + system CPU seconds.
fn stat(pid: i32) -> Option<(char, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let state = f.first()?.chars().next()?;
    let ticks = |i: usize| f.get(i)?.parse::<f64>().ok();
    let hz = clock_ticks();
    Some((state, (ticks(11)? + ticks(12)?) / hz))
}

fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as f64,
        _ => 100.0,
    }
}

/// CPU seconds the replica's processes have used so far (None: none could be read).
pub fn cpu_seconds(pids: &[i32]) -> Option<f64> {
    let times: Vec<f64> = pids.iter().filter_map(|p| stat(*p)).map(|(_, c)| c).collect();
    (!times.is_empty()).then(|| times.iter().sum())
}

/// Every process of the replica is stopped (state T or t: SIGSTOP, a debugger).
pub fn all_stopped(pids: &[i32]) -> bool {
    let states: Vec<char> = pids.iter().filter_map(|p| stat(*p)).map(|(s, _)| s).collect();
    !states.is_empty() && states.iter().all(|s| *s == 'T' || *s == 't')
}

/// A stack dump of the replica's processes, bounded in size and in time: it ends by
/// `deadline` whatever the processes are (py-spy is killed there, and processes not
/// reached are named as skipped). What goes to the job's log holds each thread's wait
/// channel and, for Python, py-spy's frames; the kernel stacks (kernel symbols and
/// offsets, which a tenant must not see) go to the server's log only, for its
/// administrator.
pub fn stack_dump(pids: &[i32], deadline: Instant) -> String {
    let mut out = String::new();
    let mut kernel = String::new();
    let mut py_spied = 0;
    for (i, &pid) in pids.iter().enumerate() {
        if out.len() >= MAX_DUMP {
            out.push_str("... (cut)\n");
            break;
        }
        if Instant::now() >= deadline {
            out.push_str(&format!("... {} more processes not dumped (out of time)\n", pids.len() - i));
            break;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
        let state = stat(pid).map(|(s, _)| s).unwrap_or('?');
        out.push_str(&format!("process {pid} ({comm}), state {state}\n"));
        if comm.starts_with("python") && py_spied < MAX_PY_SPY {
            py_spied += 1;
            if let Some(text) = py_spy(pid, deadline) {
                out.push_str(&text);
                continue;
            }
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { continue };
        for t in tasks.flatten().take(32) {
            let dir = t.path();
            let tid = t.file_name().to_string_lossy().into_owned();
            let wchan = std::fs::read_to_string(dir.join("wchan")).unwrap_or_default();
            out.push_str(&format!("  thread {tid}: waiting in {}\n", if wchan.is_empty() || wchan == "0" { "-" } else { wchan.trim() }));
            if kernel.len() < MAX_DUMP {
                if let Ok(stack) = std::fs::read_to_string(dir.join("stack")) {
                    kernel.push_str(&format!("thread {tid} of process {pid}:\n"));
                    for line in stack.lines().take(24) {
                        kernel.push_str("    ");
                        kernel.push_str(line.trim());
                        kernel.push('\n');
                    }
                }
            }
        }
    }
    if !kernel.is_empty() {
        tracing::info!("kernel stacks of a replica whose silence is reported:\n{}", cut(kernel, MAX_DUMP).trim_end());
    }
    cut(out, MAX_DUMP)
}

/// `text` cut to at most `max` bytes, on a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut at = max;
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.truncate(at);
    }
    text
}

/// `py-spy dump --pid <pid>`, where py-spy is on the server's PATH; None when it is not,
/// it fails, or it has not ended by `deadline` (killed then; the wait channels are shown
/// instead). Its output is read as it comes (a dump larger than a pipe's buffer never
/// blocks it), the first MAX_DUMP bytes kept and the rest thrown away.
fn py_spy(pid: i32, deadline: Instant) -> Option<String> {
    let text = bounded_output(std::process::Command::new("py-spy").args(["dump", "--pid", &pid.to_string()]), deadline)?;
    Some(format!("py-spy dump:\n{text}"))
}

/// What a program wrote to its standard output (its first MAX_DUMP bytes) when it ended
/// well by `deadline` (and within PY_SPY_TIMEOUT); None otherwise.
fn bounded_output(command: &mut std::process::Command, deadline: Instant) -> Option<String> {
    use std::os::unix::process::CommandExt;
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        // A group of its own: what it started is killed with it.
        .process_group(0)
        .spawn()
        .ok()?;
    let mut stdout = child.stdout.take()?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Detached: a process that keeps the pipe open keeps only this thread.
    std::thread::Builder::new()
        .name("dump-read".into())
        .spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut stdout).take(MAX_DUMP as u64).read_to_end(&mut kept);
            let _ = tx.send(kept);
            // The rest is read and dropped, so that the program never blocks on a full pipe.
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        })
        .ok()?;
    let deadline = deadline.min(Instant::now() + PY_SPY_TIMEOUT);
    let ended = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => break None,
        }
    };
    if !ended.is_some_and(|s| s.success()) {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        let _ = child.wait();
        return None;
    }
    let kept = rx.recv_timeout(deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(200))).ok()?;
    let text = String::from_utf8_lossy(&kept).into_owned();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process's own CPU time is read, and a stopped process shows state T in its dump.
    #[test]
    fn cpu_time_and_a_dump_of_a_stopped_process() {
        let me = std::process::id() as i32;
        let t0 = cpu_seconds(&[me]).expect("own stat");
        let mut x = 0u64;
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(cpu_seconds(&[me]).expect("own stat") > t0, "{x}");
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = child.id() as i32;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP");
        // The stop lands when the child next leaves the kernel (it may still be in its
        // exec, state D, on a busy machine): wait for it rather than for a fixed time.
        let until = Instant::now() + Duration::from_secs(30);
        while !all_stopped(&[pid]) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        let stopped = all_stopped(&[pid]);
        let dump = stack_dump(&[pid], Instant::now() + Duration::from_secs(5));
        let _ = child.kill();
        let _ = child.wait();
        assert!(dump.contains(&format!("process {pid} (sleep), state T")), "{dump}");
        assert!(stopped && !all_stopped(&[me]));
        assert!(dump.contains("thread"), "{dump}");
        assert!(!dump.contains("[<0>]") && !dump.contains("+0x"), "no kernel stack in a tenant's dump: {dump}");
    }

    /// A dump program that writes more than a pipe holds is read as it writes (it is not
    /// blocked, its output is cut at the bound), and one that never ends is killed at
    /// the deadline.
    #[test]
    fn a_dump_program_is_read_as_it_writes_and_killed_at_its_deadline() {
        let big = "head -c 1000000 /dev/zero | tr '\\0' x";
        let text = bounded_output(std::process::Command::new("sh").args(["-c", big]), Instant::now() + Duration::from_secs(20)).expect("output");
        assert_eq!(text.len(), MAX_DUMP);
        let t0 = Instant::now();
        let hung = format!("{big}; sleep 60");
        assert!(bounded_output(std::process::Command::new("sh").args(["-c", &hung]), Instant::now() + Duration::from_millis(500)).is_none());
        assert!(t0.elapsed() < Duration::from_secs(30), "killed at its deadline, not at the end of its sleep: {:?}", t0.elapsed());
    }
}
