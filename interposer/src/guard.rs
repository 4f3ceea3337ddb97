//! The FFI guard: no panic may unwind out of an exported `extern "C"` function (since Rust
//! 1.81 that aborts the user's process). Every export runs its body through [`ffi`].

use std::panic::{AssertUnwindSafe, catch_unwind};

/// Run `body`; if it panics, log the panic once per call site name and return `fallback`.
pub fn ffi<T>(name: &'static str, fallback: T, body: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            // Logging may itself panic (at process exit, thread-local state is already
            // gone): that must not unwind out either.
            let _ = catch_unwind(AssertUnwindSafe(|| {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_owned());
                crate::log::once(name, || {
                    tracing::error!("{name}: internal error ({message}); returning an error status")
                });
            }));
            fallback
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_panic_becomes_the_fallback() {
        assert_eq!(super::ffi("test_fn", 7u32, || panic!("boom")), 7);
        assert_eq!(super::ffi("test_fn", 7u32, || 3), 3);
    }
}
