//! The WebDriver harness on its own: a page from a `data:` URL, clicks and text, the
//! screenshot a failing test leaves; and the login page's message, read from the assets
//! on disk.

use std::panic::AssertUnwindSafe;
use std::path::Path;

use serde_json::json;

use super::webdriver::{Browser, screenshot_dir};

/// A page whose button writes into a paragraph, as a `data:` URL.
const PAGE: &str = "data:text/html;charset=utf-8,\
<button id=b>go</button><p id=out></p>\
<script>document.getElementById('b').addEventListener('click',\
()=>{document.getElementById('out').textContent='clicked'})</script>";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_harness_clicks_and_reads_a_page() {
    let browser = Browser::start("the_harness_clicks_and_reads_a_page").await;
    browser.goto(PAGE).await;
    assert_eq!(browser.text("#out").await.as_deref(), Some(""));
    browser.click("#b").await;
    browser
        .wait_text("#out", "the click's text", |t| t == "clicked")
        .await;
    assert_eq!(browser.count("button").await, 1);
    assert_eq!(browser.text("#nothing").await, None);
    let png = browser.screenshot().await;
    assert_eq!(&png[..4], b"\x89PNG", "a PNG of the window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_test_leaves_a_screenshot() {
    let name = "a_failing_test_leaves_a_screenshot";
    let png = screenshot_dir().join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    let browser = Browser::start(name).await;
    browser.goto(PAGE).await;
    let outcome = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _browser = browser;
        panic!("failing on purpose, to see the screenshot written");
    }));
    assert!(outcome.is_err());
    let written = std::fs::read(&png).expect("the screenshot of the failed test");
    assert_eq!(&written[..4], b"\x89PNG");
    let html = std::fs::read_to_string(png.with_extension("html")).unwrap();
    assert!(
        html.contains("id=\"b\""),
        "the page's HTML beside it: {html}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_page_says_when_a_token_failed() {
    let assets = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api/console/assets");
    let url = format!("file://{}", assets.join("login.html").display());
    let browser = Browser::start("the_login_page_says_when_a_token_failed").await;
    browser.goto(&url).await;
    browser.wait_for("#token", "the token field").await;
    let hidden = "return document.querySelector('#login-failed').hidden;";
    assert_eq!(browser.exec(hidden, json!([])).await, json!(true));
    browser.goto(&format!("{url}?failed=1")).await;
    browser
        .wait_script(
            "return !document.querySelector('#login-failed').hidden;",
            json!([]),
            "the message",
        )
        .await;
    let form = "const f = document.querySelector('#login-form'); \
                return [f.method, f.getAttribute('action'), document.querySelector('#token').name];";
    assert_eq!(
        browser.exec(form, json!([])).await,
        json!(["post", "login", "token"])
    );
}
