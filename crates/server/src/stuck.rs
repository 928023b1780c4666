//! What a replica that shows no progress is doing: its processes' CPU time (a progress
//! signal besides its output), and a stack dump taken before the service acts on a hang
//! or a straggler (`py-spy dump` for Python programs where py-spy is on the server's
//! PATH, else each thread's kernel stack and wait channel from `/proc`). Read on the
//! observing thread, never the driver's.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

/// The most processes looked at, and of text kept, per replica.
const MAX_PROCS: usize = 64;
const MAX_DUMP: usize = 16 * 1024;
const PY_SPY_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A stack dump of the replica's processes, bounded.
pub fn stack_dump(pids: &[i32]) -> String {
    let mut out = String::new();
    for &pid in pids {
        if out.len() >= MAX_DUMP {
            out.push_str("... (cut)\n");
            break;
        }
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default().trim().to_string();
        let state = stat(pid).map(|(s, _)| s).unwrap_or('?');
        out.push_str(&format!("process {pid} ({comm}), state {state}\n"));
        if comm.starts_with("python") {
            if let Some(text) = py_spy(pid) {
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
            if let Ok(stack) = std::fs::read_to_string(dir.join("stack")) {
                for line in stack.lines().take(24) {
                    out.push_str("    ");
                    out.push_str(line.trim());
                    out.push('\n');
                }
            }
        }
    }
    if out.len() > MAX_DUMP {
        let mut cut = MAX_DUMP;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// `py-spy dump --pid <pid>`, where py-spy is on the server's PATH; None when it is not or
/// it fails (the kernel stacks are shown instead).
fn py_spy(pid: i32) -> Option<String> {
    let mut child = std::process::Command::new("py-spy")
        .args(["dump", "--pid", &pid.to_string()])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + PY_SPY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut text = String::new();
                child.stdout.take()?.take(MAX_DUMP as u64).read_to_string(&mut text).ok()?;
                return (status.success() && !text.is_empty()).then(|| format!("py-spy dump:\n{text}"));
            }
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
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
        std::thread::sleep(Duration::from_millis(100));
        let dump = stack_dump(&[pid]);
        let stopped = all_stopped(&[pid]);
        let _ = child.kill();
        let _ = child.wait();
        assert!(dump.contains(&format!("process {pid} (sleep), state T")), "{dump}");
        assert!(stopped && !all_stopped(&[me]));
        assert!(dump.contains("thread"), "{dump}");
    }
}
