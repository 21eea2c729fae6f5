//! The web console in a real headless Chromium, driven through WebDriver: `webdriver.rs`
//! (chromedriver as a child process, the session, screenshots of failed tests in
//! `target/tmp/console-screenshots/`), `selftest.rs` (the harness itself, and the pages'
//! behaviour that needs no server).

mod selftest;
pub mod webdriver;
