//! gaffer's own handlers in a [`Registry`]. Here rather than beside the registry, so the
//! handler API (`crate::host::handler`) does not depend on the handlers built on it.

use super::builtin::{Flaky, Memhog, Noop, PreloadDemo, Sleep};
use super::exec::Exec;
use crate::host::handler::Registry;

impl Registry {
    /// The built-in handlers: `exec`, `noop`, `sleep`, `flaky`, `memhog`, `preload_demo`.
    pub fn builtin() -> Self {
        Registry::empty()
            .with_builtin::<Exec>("exec")
            .with_builtin::<Noop>("noop")
            .with_builtin::<Sleep>("sleep")
            .with_builtin::<Flaky>("flaky")
            .with_builtin::<Memhog>("memhog")
            .with_builtin::<PreloadDemo>("preload_demo")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Handler as HandlerConfig;

    #[test]
    fn builtin_has_every_built_in_name_but_no_custom_one() {
        let r = Registry::builtin();
        let mut names = HandlerConfig::NAMES.to_vec();
        names.sort_unstable();
        assert_eq!(r.names(), names);
        assert!(r.custom_names().is_empty());
    }
}
