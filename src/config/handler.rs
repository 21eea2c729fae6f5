//! What handles a queue's tasks, and the names of gaffer's own handlers, written once here
//! for config validation, the built-in registry (`slot::Registry::builtin`) and its test.

use serde_json::Value;

/// What handles a queue's tasks: a program spoken to in JSON lines, or a handler built into
/// the binary and found by name in its registry.
#[derive(Debug, Clone, PartialEq)]
pub enum Handler {
    /// A long-lived child per slot speaking JSON lines, for handlers in any language.
    Exec {
        /// Program and arguments; never empty, no empty strings.
        command: Vec<String>,
        /// How each slot's child comes to be: started anew, or forked from a language
        /// zygote that preloaded the handler once per host.
        start: Start,
    },
    /// A handler built into the binary: one of gaffer's own ([`Handler::NAMES`]) or one a
    /// team registered in its own binary (see `slot::Registry`).
    Named {
        /// The name it is registered under, as written in `handler = "…"`.
        name: String,
        /// Its settings, a JSON object it reads in `preload`: a custom handler's `options`
        /// table, or the queue-level keys of a built-in one as validation checked them
        /// (`fail_rate`; `grow_per_task` and `preload` in bytes); `{}` when there are none.
        options: Value,
    },
}

/// `start` of an exec queue: how each slot's child comes to be.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Start {
    /// The `command` started once per slot (each child loads the handler itself).
    #[default]
    Spawn,
    /// The `command` started once per host as a language zygote, which loads the handler
    /// and forks each slot's child copy-on-write (the fork protocol, README "Handlers").
    Fork,
}

impl Start {
    /// The values `start` takes, as written.
    pub const NAMES: [&'static str; 2] = ["spawn", "fork"];

    /// The value written in the config.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "spawn" => Some(Start::Spawn),
            "fork" => Some(Start::Fork),
            _ => None,
        }
    }

    /// The value as written in the config and in `GAFFER_START`.
    pub fn name(self) -> &'static str {
        match self {
            Start::Spawn => "spawn",
            Start::Fork => "fork",
        }
    }
}

impl Handler {
    /// `handler = "exec"`: a child process per slot, see [`Handler::Exec`].
    pub const EXEC: &'static str = "exec";
    /// Acknowledges every task; measures the queue machinery itself.
    pub const NOOP: &'static str = "noop";
    /// Sleeps the payload's `{"ms": N}`; simulates slow work.
    pub const SLEEP: &'static str = "sleep";
    /// Fails a share of tasks (`fail_rate`, 0 to 1), to exercise retries and dead letters.
    pub const FLAKY: &'static str = "flaky";
    /// Keeps `grow_per_task` private bytes per task, to exercise memory recycling.
    pub const MEMHOG: &'static str = "memhog";
    /// Builds `preload` bytes in the zygote and reads them per task, to show shared pages.
    pub const PRELOAD_DEMO: &'static str = "preload_demo";

    /// The built-in handler names, the one list every part of gaffer checks names against.
    pub const NAMES: [&'static str; 6] = [
        Self::EXEC,
        Self::NOOP,
        Self::SLEEP,
        Self::FLAKY,
        Self::MEMHOG,
        Self::PRELOAD_DEMO,
    ];

    /// An exec handler running `command` as each slot's own child (`start = "spawn"`).
    pub fn exec(command: Vec<String>) -> Self {
        Handler::Exec {
            command,
            start: Start::Spawn,
        }
    }

    /// A named handler without settings, e.g. `Handler::named(Handler::NOOP)`.
    pub fn named(name: impl Into<String>) -> Self {
        Self::with_options(name, Value::Object(serde_json::Map::new()))
    }

    /// A named handler with its settings, a JSON object.
    pub fn with_options(name: impl Into<String>, options: Value) -> Self {
        Handler::Named {
            name: name.into(),
            options,
        }
    }

    /// Whether `name` is one of gaffer's own handlers, which a team cannot register.
    pub fn is_builtin(name: &str) -> bool {
        Self::NAMES.contains(&name)
    }

    /// The name written in the config, as hosts advertise the handlers they can run.
    pub fn name(&self) -> &str {
        match self {
            Handler::Exec { .. } => Self::EXEC,
            Handler::Named { name, .. } => name,
        }
    }

    /// A named handler's settings; `None` for [`Handler::Exec`], whose setting is its
    /// command.
    pub fn options(&self) -> Option<&Value> {
        match self {
            Handler::Exec { .. } => None,
            Handler::Named { options, .. } => Some(options),
        }
    }
}
