//! The web console in a real headless Chromium, driven through WebDriver: `webdriver.rs`
//! (chromedriver as a child process, the session, screenshots of failed tests in
//! `target/tmp/console-screenshots/`), `selftest.rs` (the harness itself, and the pages'
//! behaviour that needs no server), `console.rs` (the console's acceptance against a real
//! cluster: logins, a task followed live, cancel, requeue, a chain, a system, the rights
//! of a limited key, forged writes), `screenshots.rs` (the pictures of a small loaded cluster:
//! into `target/tmp` on every run, into `docs/img/` when `scripts/console-screenshots`
//! asks).

mod console;
mod screenshots;
mod selftest;
pub mod webdriver;
