//! A small WebDriver client for the browser tests: `chromedriver` started as a child
//! process on a free port, one headless Chromium session with a temporary profile, and
//! the few commands the tests use (navigate, find, click, type, read text, run a script,
//! take a screenshot).
//!
//! Written over plain HTTP/1.1 rather than taken from a crate: the tests need a dozen
//! commands, and the WebDriver crates bring two ICU stacks and an older `http` into a
//! build that runs on two cores. A [`Browser`] dropped while its test panics writes a
//! screenshot and the page's HTML to `target/tmp/console-screenshots/TEST.png|.html`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::redis_server::free_port;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The W3C name of an element reference in WebDriver answers.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long a test waits for the page to show what it expects.
pub const PATIENCE: Duration = Duration::from_secs(30);
/// How long one WebDriver command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// A WebDriver error: its `error` code (`no such element`, `stale element reference`…)
/// and message, or a transport failure.
#[derive(Debug, thiserror::Error)]
pub enum WdError {
    /// The driver answered with an error.
    #[error("webdriver {code}: {message}")]
    Driver {
        /// The W3C error code.
        code: String,
        /// What the driver said.
        message: String,
    },
    /// The driver could not be reached or answered nonsense.
    #[error("webdriver transport: {0}")]
    Transport(String),
}

impl WdError {
    /// Whether trying again may succeed: the element is not there yet, or was replaced
    /// by a refresh of the page, or is covered for a moment.
    fn passing(&self) -> bool {
        matches!(self, WdError::Driver { code, .. } if matches!(code.as_str(),
            "no such element" | "stale element reference" | "element not interactable"
                | "element click intercepted"))
    }
}

/// The Chromium and chromedriver to use: `GAFFER_CHROMIUM` / `GAFFER_CHROMEDRIVER`, else
/// Debian's (`chromium`, `chromium-driver`; `.ci/run` installs them).
fn programs() -> (PathBuf, PathBuf) {
    let chromium = std::env::var_os("GAFFER_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            // The real binary: Debian's /usr/bin/chromium is a shell wrapper.
            ["/usr/lib/chromium/chromium", "/usr/bin/chromium"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.exists())
        })
        .expect("no chromium: install Debian's chromium and chromium-driver (.ci/run does)");
    let driver = std::env::var_os("GAFFER_CHROMEDRIVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/chromedriver"));
    assert!(
        driver.exists(),
        "no chromedriver at {}: install Debian's chromium-driver (.ci/run does)",
        driver.display()
    );
    (chromium, driver)
}

/// A `chromedriver` child process, killed on drop.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP exchange with the driver, answered as (status, JSON).
async fn exchange(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), WdError> {
    let request = request_bytes(port, method, path, body);
    let io = async {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream.write_all(&request).await?;
        // chromedriver keeps the connection open whatever the request says: read one
        // whole answer, by its length.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16384];
        while !answer_complete(&raw) {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(raw)
    };
    let raw = tokio::time::timeout(COMMAND_TIMEOUT, io)
        .await
        .map_err(|_| WdError::Transport(format!("{method} {path}: no answer in time")))?
        .map_err(|e| WdError::Transport(format!("{method} {path}: {e}")))?;
    parse_answer(&raw)
}

/// [`exchange`] for `Drop`, where nothing can be awaited: the driver is another
/// process, so blocking this thread for it holds nothing up.
fn exchange_blocking(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(u16, Value), WdError> {
    let transport = |e: std::io::Error| WdError::Transport(e.to_string());
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(transport)?;
    stream
        .set_read_timeout(Some(COMMAND_TIMEOUT))
        .map_err(transport)?;
    stream
        .write_all(&request_bytes(port, method, path, body))
        .map_err(transport)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    while !answer_complete(&raw) {
        let n = stream.read(&mut buf).map_err(transport)?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    parse_answer(&raw)
}

/// Whether `raw` holds a whole answer: its head and as much body as its
/// `Content-Length` says, or a chunked body's last chunk.
fn answer_complete(raw: &[u8]) -> bool {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let body = &raw[split + 4..];
    if head.contains("transfer-encoding: chunked") {
        return body.ends_with(b"0\r\n\r\n");
    }
    let length = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        (name.trim() == "content-length").then(|| value.trim().parse::<usize>().ok())?
    });
    body.len() >= length.unwrap_or(0)
}

fn request_bytes(port: u16, method: &str, path: &str, body: Option<&Value>) -> Vec<u8> {
    let body = body.map(Value::to_string).unwrap_or_default();
    // chromedriver answers only a Host of localhost or an IP address.
    let mut out = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\
         Content-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

fn parse_answer(raw: &[u8]) -> Result<(u16, Value), WdError> {
    let bad = |what: &str| WdError::Transport(what.to_string());
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no header block"))?;
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body).ok_or_else(|| bad("bad chunked body"))?;
    }
    let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Ok((status, value))
}

fn dechunk(mut b: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let end = b.windows(2).position(|w| w == b"\r\n")?;
        let n = usize::from_str_radix(std::str::from_utf8(&b[..end]).ok()?.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.extend_from_slice(b.get(end + 2..end + 2 + n)?);
        b = b.get(end + 4 + n..)?;
    }
}

/// The `value` of a driver's answer, or its error.
fn value_of((status, v): (u16, Value)) -> Result<Value, WdError> {
    let value = v.get("value").cloned().unwrap_or(Value::Null);
    if status >= 400 || value.get("error").is_some_and(Value::is_string) {
        return Err(WdError::Driver {
            code: value["error"].as_str().unwrap_or("unknown").to_string(),
            message: value["message"].as_str().unwrap_or_default().to_string(),
        });
    }
    Ok(value)
}

/// Where failing tests leave their screenshots: `target/tmp/console-screenshots`.
pub fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
}

/// A headless Chromium driven through WebDriver; on drop during a panic it leaves a
/// screenshot and the page's HTML named after its test.
pub struct Browser {
    driver: Driver,
    session: String,
    test: String,
    /// The profile directory (removed on drop, after the browser).
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts chromedriver and a headless Chromium for the test named `test`.
    pub async fn start(test: &str) -> Browser {
        let (chromium, driver_path) = programs();
        let port = free_port().unwrap();
        let profile = tempfile::tempdir().unwrap();
        let log = std::fs::File::create(profile.path().join("chromedriver.log")).unwrap();
        let child = Command::new(&driver_path)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", driver_path.display()));
        let driver = Driver { child, port };
        wait_ready(port).await;
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--window-size=1280,900", "--disable-dev-shm-usage",
                    "--no-first-run", "--no-default-browser-check",
                    format!("--user-data-dir={}", profile.path().join("profile").display()),
                ],
            },
        }}});
        let answer = value_of(
            exchange(port, "POST", "/session", Some(&caps))
                .await
                .unwrap(),
        )
        .unwrap_or_else(|e| panic!("no browser session: {e}"));
        let session = answer["sessionId"].as_str().unwrap().to_string();
        Browser {
            driver,
            session,
            test: test.to_string(),
            _profile: profile,
        }
    }

    /// One command of this session.
    pub async fn cmd(
        &self,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, WdError> {
        let path = format!("/session/{}{path}", self.session);
        value_of(exchange(self.driver.port, method, &path, body.as_ref()).await?)
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({"url": url})))
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}"));
    }

    /// Runs `script` in the page (`arguments[i]` are `args`) and answers what it returns.
    pub async fn exec(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": args})),
        )
        .await
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Runs `script` as an async script: it ends by calling its last argument (the
    /// driver's callback) with what it answers.
    pub async fn exec_async(&self, script: &str, args: Value) -> Value {
        self.cmd(
            "POST",
            "/execute/async",
            Some(json!({"script": script, "args": args})),
        )
        .await
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// The element `css` selects, if there is one.
    async fn element(&self, css: &str) -> Result<String, WdError> {
        let v = self
            .cmd(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await?;
        v[ELEMENT]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| WdError::Transport(format!("no element reference in {v}")))
    }

    /// Polls `f` on the element `css` selects until it works, across re-renders of the
    /// page (a stale or missing element is tried again), up to [`PATIENCE`].
    async fn on_element<T, F, Fut>(&self, css: &str, what: &str, f: F) -> T
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<T, WdError>>,
    {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let attempt = match self.element(css).await {
                Ok(id) => f(id).await,
                Err(e) => Err(e),
            };
            match attempt {
                Ok(v) => return v,
                Err(e) if e.passing() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{what} {css}: {e}"),
            }
        }
    }

    /// Clicks the element `css` selects, once it is there and clickable.
    pub async fn click(&self, css: &str) {
        self.on_element(css, "click", |id| async move {
            self.cmd("POST", &format!("/element/{id}/click"), Some(json!({})))
                .await
                .map(drop)
        })
        .await
    }

    /// Types `text` into the field `css` selects, after clearing it.
    pub async fn type_into(&self, css: &str, text: &str) {
        self.on_element(css, "type into", |id| async move {
            self.cmd("POST", &format!("/element/{id}/clear"), Some(json!({})))
                .await?;
            self.cmd(
                "POST",
                &format!("/element/{id}/value"),
                Some(json!({"text": text})),
            )
            .await
            .map(drop)
        })
        .await
    }

    /// The text of the first element `css` selects, or `None` when there is none.
    pub async fn text(&self, css: &str) -> Option<String> {
        let v = self
            .exec(
                "const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                json!([css]),
            )
            .await;
        v.as_str().map(str::to_string)
    }

    /// How many elements `css` selects.
    pub async fn count(&self, css: &str) -> usize {
        let v = self
            .exec(
                "return document.querySelectorAll(arguments[0]).length;",
                json!([css]),
            )
            .await;
        v.as_u64().unwrap_or(0) as usize
    }

    /// Waits until the text of the element `css` selects satisfies `ok`; answers it.
    pub async fn wait_text(&self, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let text = self.text(css).await;
            if let Some(t) = text.as_deref().filter(|t| ok(t)) {
                return t.to_string();
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({css} reads {text:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until some element matches `css`.
    pub async fn wait_for(&self, css: &str, what: &str) {
        let deadline = Instant::now() + PATIENCE;
        while self.count(css).await == 0 {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what} ({css})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the script `script` returns true.
    pub async fn wait_script(&self, script: &str, args: Value, what: &str) {
        self.wait_script_for(script, args, what, PATIENCE).await
    }

    /// [`Browser::wait_script`] with a patience of `limit`.
    pub async fn wait_script_for(&self, script: &str, args: Value, what: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.exec(script, args.clone()).await != Value::Bool(true) {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A PNG of the window.
    pub async fn screenshot(&self) -> Vec<u8> {
        let v = self.cmd("GET", "/screenshot", None).await.unwrap();
        decode_base64(v.as_str().unwrap_or_default())
    }

    /// Writes a PNG of the window to `path`.
    pub async fn save_screenshot(&self, path: &Path) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(path, self.screenshot().await).unwrap();
    }

    /// Resizes the window (the page scrolls beyond it).
    pub async fn window_size(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .await
        .unwrap();
    }

    /// Leaves the screenshot and the page's HTML of a failed test (called from `Drop`).
    fn keep_evidence(&self) {
        let dir = screenshot_dir();
        let _ = std::fs::create_dir_all(&dir);
        let port = self.driver.port;
        let base = format!("/session/{}", self.session);
        if let Ok(v) =
            exchange_blocking(port, "GET", &format!("{base}/screenshot"), None).and_then(value_of)
        {
            let png = dir.join(format!("{}.png", self.test));
            let _ = std::fs::write(&png, decode_base64(v.as_str().unwrap_or_default()));
            eprintln!("screenshot of the failed test: {}", png.display());
        }
        if let Ok(v) =
            exchange_blocking(port, "GET", &format!("{base}/source"), None).and_then(value_of)
        {
            let _ = std::fs::write(
                dir.join(format!("{}.html", self.test)),
                v.as_str().unwrap_or_default(),
            );
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.keep_evidence();
        }
        let path = format!("/session/{}", self.session);
        let _ = exchange_blocking(self.driver.port, "DELETE", &path, None);
    }
}

/// Waits until chromedriver answers `/status` ready.
async fn wait_ready(port: u16) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok((200, v)) = exchange(port, "GET", "/status", None).await
            && v["value"]["ready"] == Value::Bool(true)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "chromedriver did not start on port {port}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Standard base64 (the driver's screenshots), padding and line breaks ignored.
fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| -> Option<u32> {
        Some(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(decode_base64("aGVsbG8gd29ybGQ="), b"hello world");
    assert_eq!(decode_base64("iVBO\nRw=="), [0x89, b'P', b'N', b'G']);
}
