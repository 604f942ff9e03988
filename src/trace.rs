//! Observability (feature `tracing`): spans around set-up (connections, the endpoint
//! exchange, the bootstrap) and events on the paths that decide something — a barrier
//! that times out and poisons its node, a queue pair aborted, flushed or quiesced, a verb
//! the provider refused, an RPC session that changed, a device that died. None of them is
//! on the data path's fast branch. Without the feature the macros expand to nothing: no
//! code, no allocation; with it and no subscriber, each costs tracing's per-callsite
//! interest check.
//!
//! Targets are module paths (`zverbs::node::run`, ...), so `RUST_LOG=zverbs=debug` with
//! `tracing-subscriber`'s `EnvFilter` shows them all.

/// An event at `$level` (`debug`, `info`, `warn`, `error`), with `tracing`'s field syntax.
macro_rules! event {
    ($level:ident, $($arg:tt)+) => {{
        #[cfg(feature = "tracing")]
        ::tracing::$level!($($arg)+);
    }};
}

/// Enters a span at `$level` (`DEBUG`, `INFO`) named `$name` until the end of the
/// enclosing block (not across an `.await`: sync code only).
macro_rules! span {
    ($level:ident, $name:literal $(, $($field:tt)*)?) => {
        #[cfg(feature = "tracing")]
        let _span = ::tracing::span!(::tracing::Level::$level, $name $(, $($field)*)?).entered();
    };
}

pub(crate) use {event, span};
