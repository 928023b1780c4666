//! Background work yields the CPU to the API: threads that do work nobody waits on
//! interactively (checksums, backups) lower their own priority, so that when the machine
//! is saturated the scheduler gives the API's threads most of it, and on an idle machine
//! they lose nothing. Launch threads run at the replicas' own nice value (see
//! `executor::Pool::new`).

/// The nice value of background threads: against the API's 0, a weight of 110 to 1024
/// (the kernel's table), about a tenth of the CPU when both want it. The same as a
/// tenant's program's (`ShimSpec::nice`).
pub const BACKGROUND_NICE: i32 = 10;

/// Lowers the calling thread's priority to [`BACKGROUND_NICE`].
pub fn background_thread() {
    lower_this_thread(BACKGROUND_NICE);
}

/// Sets the calling thread's nice value to `nice` (processes it starts inherit it).
/// Raising a nice value needs no privilege; a failure leaves the priority as it is.
pub fn lower_this_thread(nice: i32) {
    // SAFETY: setpriority(2) on this thread's own id, with no pointer arguments.
    unsafe { nix::libc::setpriority(nix::libc::PRIO_PROCESS, nix::unistd::gettid().as_raw() as nix::libc::id_t, nice) };
}
