//! gaffer's own handlers in a [`Registry`]. Here rather than beside the registry, so the
//! handler API (`crate::host::handler`) does not depend on the handlers built on it.

use super::builtin::{Flaky, Memhog, Noop, PreloadDemo, Sleep};
use super::exec::Exec;
use crate::config::Handler as HandlerConfig;
use crate::host::handler::Registry;

impl Registry {
    /// The built-in handlers, under the names of [`HandlerConfig::NAMES`]: `exec`, `noop`,
    /// `sleep`, `flaky`, `memhog`, `preload_demo`.
    pub fn builtin() -> Self {
        Registry::empty()
            .with_builtin::<Exec>(HandlerConfig::EXEC)
            .with_builtin::<Noop>(HandlerConfig::NOOP)
            .with_builtin::<Sleep>(HandlerConfig::SLEEP)
            .with_builtin::<Flaky>(HandlerConfig::FLAKY)
            .with_builtin::<Memhog>(HandlerConfig::MEMHOG)
            .with_builtin::<PreloadDemo>(HandlerConfig::PRELOAD_DEMO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_has_every_built_in_name_but_no_custom_one() {
        let r = Registry::builtin();
        let mut names = HandlerConfig::NAMES.to_vec();
        names.sort_unstable();
        assert_eq!(r.names(), names);
        assert!(r.custom_names().is_empty());
    }
}
