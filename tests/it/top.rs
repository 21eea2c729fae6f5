//! `gaffer top` in a real terminal: tmux runs it against `gaffer up --demo-load` on the
//! repo's config.toml, as a newcomer would; the test reads the screen with `capture-pane`
//! and types keys with `send-keys`. tmux is required: without it the test fails and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::harness::{eventually, poll_some};
use crate::up::{Up, repo};

/// The host name `Up` registers its master as.
const HOST: &str = "up-test";

/// A tmux server of our own (its socket in the test's temp dir), killed on drop, so the
/// test never touches an operator's sessions.
struct Tmux {
    socket: PathBuf,
}

impl Tmux {
    fn new(dir: &Path) -> Self {
        match Command::new("tmux").arg("-V").output() {
            Ok(out) if out.status.success() => {}
            other => panic!(
                "tmux is required by the `gaffer top` end-to-end test and is not usable \
                 ({other:?}): install it (apt-get install tmux)"
            ),
        }
        Tmux {
            socket: dir.join("tmux.sock"),
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// The visible screen of the pane, as text.
    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.run(&["capture-pane", "-p", "-t", "top"]).stdout).into_owned()
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", "-t", "top", keys]);
    }

    /// Types `text` as it is, no key names.
    fn text(&self, text: &str) {
        self.run(&["send-keys", "-t", "top", "-l", text]);
    }

    /// Polls the screen until `cond` holds; fails with the last screen otherwise.
    async fn wait_screen(
        &self,
        what: &str,
        limit: Duration,
        cond: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen();
            if cond(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for: {what}\nscreen:\n{screen}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
    }
}

/// `gaffer push QUEUE --payload {} --id ID`, as an operator would in a second terminal.
fn push(up: &Up, queue: &str, id: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .current_dir(repo())
        .args([
            "--config",
            "config.toml",
            "push",
            queue,
            "--payload",
            "{}",
            "--id",
            id,
        ])
        .env("GAFFER_STATE_DIR", up.state.path())
        .env_remove("GAFFER_REDIS")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "push {queue} --id {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[tokio::test(flavor = "multi_thread")]
async fn top_shows_the_cluster_in_tmux_looks_up_a_task_pauses_a_queue_and_restores_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let tmux = Tmux::new(dir.path());
    // The newcomer's cluster: `gaffer up --demo-load` on the repo's config.toml.
    let up = Up::start();
    let cfg = gaffer::config::load(&repo().join("config.toml")).unwrap();
    // top finds up's Redis through the state file, written once Redis answers.
    poll_some(Duration::from_secs(30), "gaffer up's redis", || async {
        up.stats()
    })
    .await;

    // A shell runs top, then records how it ended and the terminal's modes, then stays
    // so the pane (and what top left on it) can still be read.
    let exit = dir.path().join("exit");
    let stty = dir.path().join("stty");
    let script = format!(
        "cd {repo} && GAFFER_STATE_DIR={state} {bin} --config config.toml top --refresh 300ms; \
         echo $? > {exit}; stty -a > {stty}; echo TOP-EXITED; exec sleep 600",
        repo = quote(&repo()),
        state = quote(up.state.path()),
        bin = quote(Path::new(env!("CARGO_BIN_EXE_gaffer"))),
        exit = quote(&exit),
        stty = quote(&stty),
    );
    tmux.run(&[
        "new-session",
        "-d",
        "-s",
        "top",
        "-x",
        "160",
        "-y",
        "45",
        "sh",
        "-c",
        &script,
    ]);

    let screen = tmux
        .wait_screen(
            "the demo queues, a manager and the host on the dashboard",
            Duration::from_secs(60),
            |s| {
                cfg.queues.keys().all(|q| s.contains(q.as_str()))
                    && s.contains("manager ")
                    && s.contains("1 hosts")
                    && !s.contains("STALE")
            },
        )
        .await;
    assert!(screen.contains("gaffer top"), "{screen}");

    tmux.keys("2");
    tmux.wait_screen("the host in the slot map", Duration::from_secs(20), |s| {
        s.contains("slot map v") && s.contains(HOST) && s.contains("alive")
    })
    .await;

    // A task pushed with an id, looked up by it: / opens the line in the selected queue,
    // Tab moves to the task's queue, Enter looks it up.
    push(&up, "thumbnails", "top-lookup-1");
    tmux.keys("1");
    tmux.keys("/");
    tmux.wait_screen("the lookup line", Duration::from_secs(10), |s| {
        s.contains("look up task") && s.contains("id:")
    })
    .await;
    let mut tabs = 0;
    while !tmux.screen().contains(" in thumbnails  id:") {
        assert!(tabs <= cfg.queues.len(), "no thumbnails in the lookup line");
        tmux.keys("Tab");
        tabs += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tmux.text("top-lookup-1");
    tmux.keys("Enter");
    // A noop slot is idle, so the task is done within moments; Enter reads it again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let screen = loop {
        let screen = tmux.screen();
        if screen.contains("task top-lookup-1 in thumbnails") && screen.contains("state      done")
        {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "the task's record, done\nscreen:\n{screen}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
        tmux.keys("Enter");
    };
    assert!(screen.contains("submitted  cli"), "{screen}");
    assert!(screen.contains("history · "), "{screen}");
    // An id nobody pushed: no record. The line starts in the task view's queue.
    tmux.keys("/");
    tmux.wait_screen("the lookup line again", Duration::from_secs(10), |s| {
        s.contains(" in thumbnails  id:")
    })
    .await;
    tmux.text("no-such-task");
    tmux.keys("Enter");
    tmux.wait_screen("no record", Duration::from_secs(10), |s| {
        s.contains("no record of task no-such-task in thumbnails")
    })
    .await;

    // Pausing takes a confirmation; the pause lands in Redis and on screen.
    tmux.keys("Escape");
    tmux.wait_screen("the queues view again", Duration::from_secs(10), |s| {
        s.contains("slots now/want/avg")
    })
    .await;
    tmux.keys("p");
    let screen = tmux
        .wait_screen("the confirmation", Duration::from_secs(10), |s| {
            s.contains("Pause queue ")
        })
        .await;
    let queue = screen
        .split("Pause queue ")
        .nth(1)
        .and_then(|rest| rest.split('?').next())
        .expect("the queue in the confirmation")
        .to_string();
    assert!(cfg.queues.contains_key(&queue), "{queue:?} in {screen}");
    let paused = |q: &str| {
        up.stats()
            .is_some_and(|s| s["queues"][q]["paused"] == serde_json::json!(true))
    };
    assert!(!paused(&queue), "nothing paused before y");
    tmux.keys("y");
    eventually(
        Duration::from_secs(10),
        "the queue paused in redis",
        || async { paused(&queue) },
    )
    .await;
    tmux.wait_screen("the pause on screen", Duration::from_secs(10), |s| {
        let row = s.lines().find(|l| l.starts_with(&format!("│{queue}")));
        s.contains(&format!("{queue} paused")) && row.is_some_and(|r| r.contains("paused"))
    })
    .await;

    tmux.keys("q");
    let deadline = Instant::now() + Duration::from_secs(10);
    let code = loop {
        if let Ok(code) = std::fs::read_to_string(&exit)
            && !code.is_empty()
        {
            break code;
        }
        assert!(
            Instant::now() < deadline,
            "top did not exit after q\nscreen:\n{}",
            tmux.screen()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code.trim(), "0", "top's exit code");
    let screen = tmux
        .wait_screen("the shell after top", Duration::from_secs(10), |s| {
            s.contains("TOP-EXITED")
        })
        .await;
    assert!(
        !screen.contains(&queue),
        "the alternate screen was left, the dashboard is gone:\n{screen}"
    );
    let modes = std::fs::read_to_string(&stty).unwrap();
    let words: Vec<&str> = modes.split_whitespace().collect();
    for mode in ["icanon", "echo", "isig"] {
        assert!(
            words.contains(&mode),
            "raw mode left on: no {mode} in\n{modes}"
        );
    }
}
