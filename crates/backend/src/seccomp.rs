//! The system calls a tenant's program may not make: a seccomp filter installed just
//! before exec in a replica that runs as its project's user (host programs; a container
//! gets its engine's default profile). Like the container runtimes' default profiles, it
//! closes kernel surfaces an unprivileged training program never needs and that have a
//! history of privilege escalations:
//!
//! - new user namespaces (`unshare` or `clone` with `CLONE_NEWUSER`; `clone3`, whose flags
//!   a filter cannot read, answers `ENOSYS`, so that libc falls back to `clone`), and
//!   `setns`;
//! - the kernel keyring (`keyctl`, `add_key`, `request_key`), `bpf`, `userfaultfd`,
//!   `perf_event_open`, `io_uring_setup`;
//! - modules and kexec, `open_by_handle_at` (refused without privileges anyway: here by
//!   name too);
//! - system calls of another ABI (a 32-bit `int 0x80` on x86_64 ends the process; x32
//!   calls are refused).
//!
//! Each refused call fails with `EPERM`; everything else is allowed. [`REFUSED`] names
//! them for the documentation and the tests.

use libc::sock_filter;

/// The system calls refused outright (besides the flag checks on `unshare` and `clone`,
/// and `clone3`'s `ENOSYS`).
pub const REFUSED: &[(&str, libc::c_long)] = &[
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("bpf", libc::SYS_bpf),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("setns", libc::SYS_setns),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
];

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// x86_64's x32 ABI: its system call numbers have this bit set.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Offsets in `struct seccomp_data`: nr, arch, instruction pointer, then args[6].
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
#[cfg(target_endian = "little")]
const OFFSET_ARG0_LOW: u32 = 16;
#[cfg(target_endian = "big")]
const OFFSET_ARG0_LOW: u32 = 20;

fn stmt(code: u32, k: u32) -> sock_filter {
    sock_filter { code: code as u16, jt: 0, jf: 0, k }
}

fn jump(code: u32, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code: code as u16, jt, jf, k }
}

const LOAD: u32 = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
const RET: u32 = libc::BPF_RET | libc::BPF_K;
const JEQ: u32 = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
const JSET: u32 = libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K;
#[cfg(target_arch = "x86_64")]
const JGE: u32 = libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K;

fn errno(e: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (e as u32 & libc::SECCOMP_RET_DATA)
}

/// The tenant filter's program, or None on an architecture it does not know (the
/// program then runs without one, as the shim's start line says).
pub fn tenant_program() -> Option<Vec<sock_filter>> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let eperm = errno(libc::EPERM);
        let mut p = vec![
            stmt(LOAD, OFFSET_ARCH),
            jump(JEQ, AUDIT_ARCH, 1, 0),
            stmt(RET, libc::SECCOMP_RET_KILL_PROCESS),
            stmt(LOAD, OFFSET_NR),
        ];
        #[cfg(target_arch = "x86_64")]
        p.extend([jump(JGE, X32_SYSCALL_BIT, 0, 1), stmt(RET, eperm)]);
        for (_, nr) in REFUSED {
            p.extend([jump(JEQ, *nr as u32, 0, 1), stmt(RET, eperm)]);
        }
        p.extend([jump(JEQ, libc::SYS_clone3 as u32, 0, 1), stmt(RET, errno(libc::ENOSYS))]);
        // unshare(flags) and clone(flags, ...): flags are the first argument on both ABIs.
        p.extend([
            jump(JEQ, libc::SYS_unshare as u32, 1, 0),
            jump(JEQ, libc::SYS_clone as u32, 0, 3),
            stmt(LOAD, OFFSET_ARG0_LOW),
            jump(JSET, libc::CLONE_NEWUSER as u32, 0, 1),
            stmt(RET, eperm),
            stmt(RET, libc::SECCOMP_RET_ALLOW),
        ]);
        Some(p)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

/// Installs `program` on the calling thread (its exec'd program keeps it). The caller
/// has set `PR_SET_NO_NEW_PRIVS` (or is privileged). Async-signal-safe: no allocation, it
/// runs between fork and exec.
///
/// # Safety
/// `program` must be a valid filter program (as [`tenant_program`] makes).
pub unsafe fn install(program: &[sock_filter]) -> bool {
    let prog = libc::sock_fprog { len: program.len() as libc::c_ushort, filter: program.as_ptr() as *mut sock_filter };
    // SAFETY: prctl(2) reads `prog` and the array it points to, both alive for the call.
    unsafe { libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a child with the filter: what it refuses fails with EPERM (clone3 with ENOSYS),
    /// a plain namespace that needs no user namespace is not refused by the filter (the
    /// kernel decides), and ordinary calls work.
    #[test]
    fn the_tenant_filter_refuses_user_namespaces_and_the_listed_calls() {
        let Some(program) = tenant_program() else { return };
        // SAFETY: the child makes system calls only and _exits with a code per check.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            unsafe {
                let errno = || *libc::__errno_location();
                let mut code = 0;
                if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || !install(&program) {
                    libc::_exit(100);
                }
                if libc::unshare(libc::CLONE_NEWUSER) != -1 || errno() != libc::EPERM {
                    code |= 1;
                }
                if libc::syscall(libc::SYS_keyctl, 0, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    code |= 2;
                }
                if libc::syscall(libc::SYS_bpf, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    code |= 4;
                }
                if libc::syscall(libc::SYS_clone3, 0, 0) != -1 || errno() != libc::ENOSYS {
                    code |= 8;
                }
                let flags = (libc::CLONE_NEWUSER | libc::SIGCHLD) as libc::c_ulong;
                if libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) != -1 || errno() != libc::EPERM {
                    code |= 16;
                }
                if libc::getpid() <= 0 || libc::getuid() == u32::MAX {
                    code |= 32;
                }
                libc::_exit(code);
            }
        }
        let mut status = 0;
        // SAFETY: waiting for the child forked above.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "the child was killed: {status}");
        let code = libc::WEXITSTATUS(status);
        let failed: Vec<&str> = ["unshare(CLONE_NEWUSER)", "keyctl", "bpf", "clone3", "clone(CLONE_NEWUSER)", "getpid/getuid"]
            .iter()
            .enumerate()
            .filter(|(i, _)| code != 100 && code & (1 << i) != 0)
            .map(|(_, n)| *n)
            .collect();
        assert!(code != 100, "the filter could not be installed");
        assert!(failed.is_empty(), "not as the filter says: {failed:?}");
    }
}
