//! What `/proc` says about processes: the children of a process (found by their parent
//! pid, for a subreaper that must kill orphans it never spawned).

use std::fs;

/// The pids whose parent is `parent`. Processes that vanish while we read are skipped.
pub fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    match listed_children(parent) {
        Some(pids) => pids.into_iter().filter(|pid| fs::metadata(format!("/proc/{pid}")).is_ok()).collect(),
        None => children_with_state(parent).into_iter().map(|(pid, _)| pid).collect(),
    }
}

/// The children of `parent` with their state letter (`R`, `S`, `T`, `Z` for a zombie
/// that its parent has not reaped yet, ...).
pub fn children_with_state(parent: libc::pid_t) -> Vec<(libc::pid_t, char)> {
    let with_state = |pid: libc::pid_t| {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        (parse_ppid(&stat)? == parent).then_some((pid, parse_state(&stat)?))
    };
    if let Some(pids) = listed_children(parent) {
        return pids.into_iter().filter_map(with_state).collect();
    }
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok()).filter_map(with_state).collect()
}

/// The children of `parent` as its threads list them (`/proc/<pid>/task/<tid>/children`,
/// kernels with CONFIG_PROC_CHILDREN): a read per thread of `parent` instead of one per
/// process of the host, which a burst of replicas, each supervisor cleaning up after its
/// program, would pay squared. None where the kernel has no such files.
fn listed_children(parent: libc::pid_t) -> Option<Vec<libc::pid_t>> {
    let tasks = fs::read_dir(format!("/proc/{parent}/task")).ok()?;
    let mut pids = Vec::new();
    let mut any = false;
    for tid in tasks.filter_map(|e| e.ok()) {
        match fs::read_to_string(tid.path().join("children")) {
            Ok(list) => {
                any = true;
                pids.extend(list.split_whitespace().filter_map(|p| p.parse::<libc::pid_t>().ok()));
            }
            // A thread that ended meanwhile; a kernel without the files has none of them.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => return None,
        }
    }
    if !any {
        return None;
    }
    pids.sort_unstable();
    pids.dedup();
    Some(pids)
}

/// The live processes (not zombies) of the session or the process group whose id is `id`
/// (fields 6 and 5 of their stat lines): what a process that leads a session or a group
/// started, less what left it with setsid(2) or setpgid(2).
pub fn members_of(id: libc::pid_t) -> Vec<libc::pid_t> {
    let member = |pid: libc::pid_t| {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let live = !matches!(parse_state(&stat)?, 'Z' | 'X');
        let ids = [stat_field(&stat, 5)?, stat_field(&stat, 6)?].map(|f| f.parse::<libc::pid_t>().ok());
        (live && ids.contains(&Some(id))).then_some(pid)
    };
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok()).filter_map(member).collect()
}

/// Field `n` of a `/proc/<pid>/stat` line, numbered as proc(5) does (1: pid, 2: the
/// command name, 3: state, 4: ppid, ...; n >= 3). The command name is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted after the last `)`.
pub fn stat_field(stat: &str, n: usize) -> Option<&str> {
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(n.checked_sub(3)?)
}

/// The state letter from a `/proc/<pid>/stat` line (the field after the command name).
pub fn parse_state(stat: &str) -> Option<char> {
    stat_field(stat, 3)?.chars().next()
}

/// The parent pid from a `/proc/<pid>/stat` line.
pub fn parse_ppid(stat: &str) -> Option<libc::pid_t> {
    stat_field(stat, 4)?.parse().ok()
}

/// A process's CPU time in clock ticks from its `/proc/<pid>/stat` line: its own user and
/// system time and that of its children it has waited for (fields 14 to 17).
pub fn cpu_ticks_with_children(stat: &str) -> Option<u64> {
    (14..=17).map(|n| stat_field(stat, n)?.parse::<u64>().ok()).sum()
}

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`, 100 where it cannot be read).
pub fn clock_ticks() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(hz)) if hz > 0 => hz as f64,
        _ => 100.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_ticks_count_a_process_and_its_waited_for_children() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        let stat = "7 (a b) R 1 7 7 0 -1 0 0 0 0 0 11 22 33 44 20 0";
        assert_eq!(cpu_ticks_with_children(stat), Some(110));
        assert_eq!(cpu_ticks_with_children("7 (x) R 1"), None);
    }

    #[test]
    fn ppid_after_a_command_name_with_parens_and_spaces() {
        assert_eq!(parse_ppid("4242 (a) b (c) S 17 4242 4242 0 -1 4194560"), Some(17));
        assert_eq!(parse_ppid("garbage"), None);
        assert_eq!(parse_state("4242 (a) b (c) Z 17 4242 4242 0 -1 4194560"), Some('Z'));
    }

    /// A group's members are found by its id, with the grandchildren its leader left behind;
    /// one that left with setsid is not, nor a zombie.
    #[test]
    fn members_of_a_group_and_not_who_left_it() {
        use std::os::unix::process::CommandExt;
        let mut leader = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & setsid sleep 31 & echo $!; exit 0"])
            .process_group(0)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let id = leader.id() as libc::pid_t;
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(leader.stdout.take().unwrap()), &mut line).unwrap();
        let left: libc::pid_t = line.trim().parse().unwrap();
        leader.wait().unwrap();
        // setsid(1) may not have left yet.
        let sid = || fs::read_to_string(format!("/proc/{left}/stat")).ok().and_then(|s| stat_field(&s, 6)?.parse::<libc::pid_t>().ok());
        for _ in 0..1000 {
            if sid() == Some(left) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(sid(), Some(left), "setsid did not leave the group");
        let members = members_of(id);
        assert_eq!(members.len(), 1, "the backgrounded sleep: {members:?}");
        assert!(!members.contains(&left) && !members.contains(&id));
        for pid in members.into_iter().chain([left]) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }

    #[test]
    fn our_test_process_is_a_child_of_its_parent() {
        let me = std::process::id() as libc::pid_t;
        let parent = nix::unistd::getppid().as_raw();
        assert!(children_of(parent).contains(&me));
    }

    /// A child is listed under the thread that forked it: children started from another
    /// thread are found too, with their state (an unreaped one is a zombie).
    #[test]
    fn children_of_every_thread_with_their_state() {
        let me = std::process::id() as libc::pid_t;
        let mut child = std::thread::spawn(|| std::process::Command::new("true").spawn().unwrap()).join().unwrap();
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let listed = children_with_state(me);
            if listed.contains(&(pid, 'Z')) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{pid} not listed as a zombie child: {listed:?}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(children_of(me).contains(&pid));
        child.wait().unwrap();
        assert!(!children_of(me).contains(&pid));
    }
}
