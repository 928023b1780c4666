//! Work the server does for a tenant on its own CPU: stack dumps of a job's replicas, a
//! study's suggestions. Each piece runs on a thread of its own (never the driver's or
//! the observing thread's), at most `per_project` at once for one project and `total` in
//! all; the rest wait in order of arrival, a project at its share passed over for the
//! next one, so that one tenant's pile of work delays only its own. A piece can be
//! cancelled by its key (a deleted study's suggestion): the flag it is handed is set,
//! and it stops at its next look. The CPU seconds each piece used are told to the
//! gate's counter, by project.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A piece of work: it is handed its cancel flag, and looks at it between steps.
pub type Run = Box<dyn FnOnce(&AtomicBool) + Send>;

/// Told the CPU seconds of each piece that ended, with its project.
pub type CpuCounter = Arc<dyn Fn(&str, f64) + Send + Sync>;

struct Task {
    project: String,
    key: String,
    cancel: Arc<AtomicBool>,
    run: Run,
}

#[derive(Default)]
struct State {
    /// Pieces running, by project.
    running: HashMap<String, usize>,
    total: usize,
    /// The cancel flags of the pieces running, with their keys.
    flags: Vec<(String, Arc<AtomicBool>)>,
    waiting: VecDeque<Task>,
}

struct Inner {
    name: &'static str,
    per_project: usize,
    total: usize,
    nice: i32,
    state: Mutex<State>,
    cpu: CpuCounter,
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic is caught around each piece, never while the lock is held.
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// See the module's documentation.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

impl Gate {
    /// `name` names its threads; `nice`: their nice value (0 keeps the server's).
    pub fn new(name: &'static str, per_project: usize, total: usize, nice: i32, cpu: CpuCounter) -> Gate {
        let (per_project, total) = (per_project.max(1), total.max(1));
        Gate { inner: Arc::new(Inner { name, per_project, total, nice, state: Mutex::default(), cpu }) }
    }

    /// Run `run` for `project` when its turn comes. A piece whose thread cannot be
    /// started is run at once here with its flag set (it gives up at its first look).
    pub fn submit(&self, project: &str, key: &str, run: Run) {
        let task = Task { project: project.to_string(), key: key.to_string(), cancel: Arc::new(AtomicBool::new(false)), run };
        let start = {
            let mut st = self.inner.state();
            if self.has_room(&st, &task.project) {
                self.take_slot(&mut st, &task);
                Some(task)
            } else {
                st.waiting.push_back(task);
                None
            }
        };
        if let Some(task) = start {
            self.start(task);
        }
    }

    /// Every piece of `key`, waiting or running, is told to stop.
    pub fn cancel(&self, key: &str) {
        let st = self.inner.state();
        for (k, flag) in &st.flags {
            if k == key {
                flag.store(true, Ordering::SeqCst);
            }
        }
        for t in st.waiting.iter().filter(|t| t.key == key) {
            t.cancel.store(true, Ordering::SeqCst);
        }
    }

    /// Pieces running and waiting.
    pub fn load(&self) -> (usize, usize) {
        let st = self.inner.state();
        (st.total, st.waiting.len())
    }

    fn has_room(&self, st: &State, project: &str) -> bool {
        st.total < self.inner.total && st.running.get(project).copied().unwrap_or(0) < self.inner.per_project
    }

    fn take_slot(&self, st: &mut State, task: &Task) {
        st.total += 1;
        *st.running.entry(task.project.clone()).or_default() += 1;
        st.flags.push((task.key.clone(), Arc::clone(&task.cancel)));
    }

    /// The slot of `project`'s piece that ended (its cancel flag `done`) is given back,
    /// and the first waiting piece whose project has room takes one.
    fn next(&self, project: &str, done: &Arc<AtomicBool>) -> Option<Task> {
        let mut st = self.inner.state();
        st.total = st.total.saturating_sub(1);
        if let Some(n) = st.running.get_mut(project) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                st.running.remove(project);
            }
        }
        if let Some(i) = st.flags.iter().position(|(_, f)| Arc::ptr_eq(f, done)) {
            st.flags.swap_remove(i);
        }
        let i = st.waiting.iter().position(|t| self.has_room(&st, &t.project))?;
        let task = st.waiting.remove(i)?;
        self.take_slot(&mut st, &task);
        Some(task)
    }

    fn start(&self, task: Task) {
        let gate = self.clone();
        let (tx, rx) = std::sync::mpsc::channel::<Task>();
        let spawned = std::thread::Builder::new().name(format!("{}-{}", self.inner.name, task.project)).spawn(move || {
            if gate.inner.nice > 0 {
                crate::priority::lower_this_thread(gate.inner.nice);
            }
            let mut task = rx.recv().ok();
            while let Some(t) = task {
                let before = thread_cpu();
                let Task { project, key, cancel, run } = t;
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&cancel))).is_err() {
                    tracing::error!("{} work of project {project} ({key}) panicked", gate.inner.name);
                }
                (gate.inner.cpu)(&project, (thread_cpu() - before).max(0.0));
                task = gate.next(&project, &cancel);
            }
        });
        match spawned {
            Ok(_) => {
                // The thread holds the other end until it has the task.
                let _ = tx.send(task);
            }
            Err(e) => {
                tracing::error!("cannot start a thread for {} work of project {}: {e}", self.inner.name, task.project);
                let Task { project, cancel, run, .. } = task;
                cancel.store(true, Ordering::SeqCst);
                run(&cancel);
                if let Some(next) = self.next(&project, &cancel) {
                    self.start(next);
                }
            }
        }
    }
}

/// This thread's CPU seconds so far.
fn thread_cpu() -> f64 {
    let mut ts = nix::libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    if unsafe { nix::libc::clock_gettime(nix::libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::time::Duration;

    /// A piece that says it started, then waits for a word (or its cancel flag).
    fn held(started: &Sender<String>, name: &str, release: Receiver<()>) -> Run {
        let (started, name) = (started.clone(), name.to_string());
        Box::new(move |cancel| {
            let _ = started.send(name);
            while !cancel.load(Ordering::SeqCst) && release.recv_timeout(Duration::from_millis(10)).is_err() {}
        })
    }

    fn next(rx: &Receiver<String>) -> Option<String> {
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// One project's pile waits behind its share; another project's piece starts at
    /// once; a cancelled key stops its running and waiting pieces.
    #[test]
    fn a_project_at_its_share_waits_and_others_go_first() {
        let used = Arc::new(Mutex::new(HashMap::<String, f64>::new()));
        let counted = Arc::clone(&used);
        let gate = Gate::new("test", 2, 3, 0, Arc::new(move |p: &str, s| *counted.lock().unwrap().entry(p.to_string()).or_default() += s));
        let (tx, rx) = channel();
        let mut releases = Vec::new();
        for i in 0..4 {
            let (go, wait) = channel();
            releases.push(go);
            gate.submit("evil", &format!("e{i}"), held(&tx, &format!("evil-{i}"), wait));
        }
        let mut first = vec![next(&rx).expect("one"), next(&rx).expect("two")];
        first.sort();
        assert_eq!(first, ["evil-0", "evil-1"]);
        assert!(rx.recv_timeout(Duration::from_millis(200)).is_err(), "the third evil piece waits for its project's share");
        let (_go, wait) = channel();
        gate.submit("victim", "v", held(&tx, "victim", wait));
        assert_eq!(next(&rx).as_deref(), Some("victim"), "another project's piece starts at once");
        assert_eq!(gate.load(), (3, 2));
        gate.cancel("e0");
        assert_eq!(next(&rx).as_deref(), Some("evil-2"), "a cancelled piece gives its slot up");
        gate.cancel("e3");
        let _ = releases[1].send(());
        assert_eq!(next(&rx).as_deref(), Some("evil-3"), "a waiting piece cancelled still runs, its flag set");
        gate.cancel("v");
        gate.cancel("e2");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gate.load() != (0, 0) {
            assert!(std::time::Instant::now() < deadline, "{:?}", gate.load());
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(used.lock().unwrap().get("evil").is_some_and(|s| *s > 0.0), "the CPU of its pieces is counted");
    }

    /// A piece that panics gives its slot back.
    #[test]
    fn a_panicking_piece_frees_its_slot() {
        let gate = Gate::new("test", 1, 1, 0, Arc::new(|_: &str, _| {}));
        gate.submit("p", "a", Box::new(|_| panic!("a defect")));
        let (tx, rx) = channel();
        gate.submit("p", "b", Box::new(move |_| {
            let _ = tx.send(());
        }));
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok());
    }

    /// Fuzz: 300 pieces of five projects, of random lengths, some cancelled as they go:
    /// never more than a project's share or the total run at once, and every piece runs
    /// exactly once.
    #[test]
    fn shares_hold_under_a_random_load() {
        use std::sync::atomic::AtomicUsize;
        let gate = Gate::new("fuzz", 2, 5, 0, Arc::new(|_: &str, _| {}));
        let running: Arc<Vec<AtomicUsize>> = Arc::new((0..5).map(|_| AtomicUsize::new(0)).collect());
        let total = Arc::new(AtomicUsize::new(0));
        let (worst, ran) = (Arc::new(Mutex::new((0usize, 0usize))), Arc::new(AtomicUsize::new(0)));
        let mut rng = trainyard_core::rng::Rng::new(0x5EED);
        let mut next = move || rng.next_u64();
        for i in 0..300 {
            let p = (next() % 5) as usize;
            let micros = next() % 3000;
            let (running, total, worst, ran) = (Arc::clone(&running), Arc::clone(&total), Arc::clone(&worst), Arc::clone(&ran));
            gate.submit(&format!("p{p}"), &format!("k{i}"), Box::new(move |cancel| {
                let mine = running[p].fetch_add(1, Ordering::SeqCst) + 1;
                let all = total.fetch_add(1, Ordering::SeqCst) + 1;
                {
                    let mut w = worst.lock().unwrap();
                    *w = (w.0.max(mine), w.1.max(all));
                }
                if !cancel.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_micros(micros));
                }
                running[p].fetch_sub(1, Ordering::SeqCst);
                total.fetch_sub(1, Ordering::SeqCst);
                ran.fetch_add(1, Ordering::SeqCst);
            }));
            if next() % 4 == 0 {
                gate.cancel(&format!("k{}", next() % (i + 1)));
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while ran.load(Ordering::SeqCst) < 300 {
            assert!(std::time::Instant::now() < deadline, "{} of 300 ran", ran.load(Ordering::SeqCst));
            std::thread::sleep(Duration::from_millis(5));
        }
        let (per_project, all) = *worst.lock().unwrap();
        assert!(per_project <= 2 && all <= 5, "at most 2 per project and 5 in all at once: {per_project}, {all}");
        // The last pieces' threads give their slots back just after they ran.
        while gate.load() != (0, 0) {
            assert!(std::time::Instant::now() < deadline, "{:?}", gate.load());
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
