//! What `/proc` says about processes: the children of a process (found by their parent
//! pid, for a subreaper that must kill orphans it never spawned).

use std::fs;

/// The pids whose parent is `parent`, from `/proc/<pid>/stat`. Processes that vanish
/// while we read are skipped.
pub fn children_of(parent: libc::pid_t) -> Vec<libc::pid_t> {
    children_with_state(parent).into_iter().map(|(pid, _)| pid).collect()
}

/// The children of `parent` with their state letter (`R`, `S`, `T`, `Z` for a zombie
/// that its parent has not reaped yet, ...).
pub fn children_with_state(parent: libc::pid_t) -> Vec<(libc::pid_t, char)> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            (parse_ppid(&stat)? == parent).then_some((pid, parse_state(&stat)?))
        })
        .collect()
}

/// The state letter from a `/proc/<pid>/stat` line (the field after the command name).
pub fn parse_state(stat: &str) -> Option<char> {
    stat[stat.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

/// The parent pid from a `/proc/<pid>/stat` line. The command name is in parentheses and
/// may itself contain spaces and parentheses, so fields are counted after the last `)`.
pub fn parse_ppid(stat: &str) -> Option<libc::pid_t> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_after_a_command_name_with_parens_and_spaces() {
        assert_eq!(parse_ppid("4242 (a) b (c) S 17 4242 4242 0 -1 4194560"), Some(17));
        assert_eq!(parse_ppid("garbage"), None);
        assert_eq!(parse_state("4242 (a) b (c) Z 17 4242 4242 0 -1 4194560"), Some('Z'));
    }

    #[test]
    fn our_test_process_is_a_child_of_its_parent() {
        let me = std::process::id() as libc::pid_t;
        let parent = nix::unistd::getppid().as_raw();
        assert!(children_of(parent).contains(&me));
    }
}
