//! Async work run to completion from synchronous code (teardown, `down`, `doctor`), on a
//! thread and runtime of its own, so that it also works when called from inside a runtime.

use std::future::Future;

/// Run `work` on a current-thread runtime of a thread of its own and wait for it.
pub fn blocking<F, T>(work: impl FnOnce() -> F + Send + 'static) -> Result<T, BlockingError>
where
    F: Future<Output = T>,
    T: Send + 'static,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map(|rt| rt.block_on(work()))
            .map_err(BlockingError::Runtime)
    })
    .join()
    .map_err(|_| BlockingError::Panicked)?
}

/// Why [`blocking`] work did not run to its end.
#[derive(Debug, thiserror::Error)]
pub enum BlockingError {
    #[error("cannot start a runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("the worker thread panicked")]
    Panicked,
}
