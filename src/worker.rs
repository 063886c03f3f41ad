//! Which worker thread a task runs on, and one of something per worker. The listeners'
//! workers (`listen`) are shared-nothing threads; what each must own (a connection pool, an
//! upstream connection) is kept here by worker index, so a request never crosses threads.
//! A leaf: the listeners set the index, upstream reads it, neither imports the other.

thread_local! {
    static WORKER: std::cell::Cell<Option<usize>> = const { std::cell::Cell::new(None) };
}

/// Marks this thread as worker `index` (the listeners' worker threads, at their start).
pub fn enter(index: usize) {
    WORKER.with(|worker| worker.set(Some(index)));
}

/// Which worker this thread is; `None` off the workers (background work).
pub fn worker_index() -> Option<usize> {
    WORKER.with(std::cell::Cell::get)
}

/// One of something (a connection pool, a connection) per worker and one for background work,
/// each used only by its own thread, so a connection's task runs where its requests do. Sized
/// by the cores, the workers' default; more workers than that share by index.
#[derive(Debug)]
pub struct PerWorker<T>(Box<[T]>);

impl<T> PerWorker<T> {
    /// One `make()` for each worker the cores allow, and one for background work.
    pub fn new(mut make: impl FnMut() -> T) -> Self {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self((0..=workers).map(|_| make()).collect())
    }

    /// This thread's.
    pub fn get(&self) -> &T {
        let index = worker_index().map_or(0, |i| i + 1);
        &self.0[index % self.0.len()]
    }
}
