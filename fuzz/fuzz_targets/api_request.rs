//! An arbitrary HTTP request to a real api instance (with a real redis-server behind it,
//! both started once per fuzzing process): method, path and query, headers and body all
//! come from the input. The api must answer every request, and a refusal is a clean 4xx:
//! no panic, no dropped connection, no 5xx while Redis is up.
//!
//! The config gives the chain endpoints something to chain (`q` routes to `p` on done
//! and on failed) and the system endpoints a system (`s`, over `q`).
//!
//! Input: byte 0 picks the method; byte 1's bits pick the token (none, a queue key's, the
//! admin's) and whether a JSON content type is sent; then the path line, header lines up
//! to an empty line, and the body.
#![no_main]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::OnceLock;
use std::time::Duration;

use gaffer::redis_server::{RedisServer, RedisServerOptions};
use libfuzzer_sys::fuzz_target;

const SHOP: &str = "fuzz-shop-token";
const OPS: &str = "fuzz-ops-token";
const METHODS: [&str; 7] = ["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"];
/// Headers the target sets itself: the framing must stay valid HTTP, or the input only
/// tests hyper's parser.
const OWN_HEADERS: [&str; 5] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "authorization",
];

/// The api and the Redis behind it, alive as long as the process.
struct Service {
    addr: SocketAddr,
    _rt: tokio::runtime::Runtime,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

fn service() -> &'static Service {
    static SERVICE: OnceLock<Service> = OnceLock::new();
    SERVICE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        // Started from the fuzzing thread, which lives as long as the process
        // (the server's PDEATHSIG follows the spawning thread).
        let redis = RedisServer::start(dir.path(), RedisServerOptions::default())
            .expect("start redis-server");
        let text = format!(
            "[cluster]\nnamespace = \"fuzz\"\n\n\
             [queues.q]\nhandler = \"noop\"\nmax_payload = \"1KiB\"\nsystem = \"s\"\n\
             next = [{{ queue = \"p\", on = \"done\" }}, {{ queue = \"p\", on = \"failed\" }}]\n\n\
             [queues.p]\nhandler = \"noop\"\n\n\
             [queues.r]\nhandler = \"noop\"\ntrack = false\n\n\
             [systems.s]\nmax_concurrency = 4\nrate = \"50/s\"\n\n\
             [api]\nmax_body = \"16KiB\"\nmax_wait = \"1s\"\n\n\
             [api.keys.shop]\ntoken_sha256 = \"{}\"\nqueues = [\"q\"]\n\n\
             [api.keys.ops]\ntoken_sha256 = \"{}\"\nadmin = true\n",
            gaffer::api::hash_token(SHOP),
            gaffer::api::hash_token(OPS),
        );
        let config = gaffer::config::parse(&text, "fuzz.toml").expect("fuzz config");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let mut opts = gaffer::api::ApiOptions::new(config, redis.url());
        opts.listen = Some("127.0.0.1:0".parse().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel();
        let stop = tokio_util::sync::CancellationToken::new();
        rt.spawn(gaffer::api::run(opts, stop, Some(tx)));
        let addr = rt.block_on(rx).expect("the api binds");
        Service {
            addr,
            _rt: rt,
            _redis: redis,
            _dir: dir,
        }
    })
}

/// A request target hyper accepts: the input's bytes, those a URI cannot hold
/// percent-encoded, always starting with `/`.
fn target(raw: &[u8]) -> String {
    let mut out = String::from("/");
    let raw = raw.strip_prefix(b"/").unwrap_or(raw);
    for &b in raw {
        if b.is_ascii_alphanumeric() || b"-._~/?&=%:@!$'()*+,;{}".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The input's header lines that are valid HTTP, minus those the target sets itself.
fn headers(raw: &[u8]) -> String {
    let mut out = String::new();
    for line in raw.split(|&b| b == b'\n') {
        let Ok(line) = std::str::from_utf8(line) else {
            continue;
        };
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        let clean = value
            .bytes()
            .all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
        if token && clean && !OWN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            out.push_str(&format!("{name}:{value}\r\n"));
        }
    }
    out
}

/// The status of the answer to `request`; panics when there is none.
fn exchange(addr: SocketAddr, request: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).expect("connect to the api");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(request).expect("send the request");
    let mut answer = Vec::new();
    let _ = s.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let head: String = text.chars().take(64).collect();
    // The final status: interim ones (`100 Continue` to an `Expect` header) come first.
    let status = text
        .split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|rest| rest.get(..3)?.parse::<u16>().ok())
        .find(|code| *code >= 200);
    match status {
        Some(code) => code,
        None => panic!(
            "no answer to {:?}: {head:?}",
            String::from_utf8_lossy(&request[..request.len().min(400)])
        ),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let method = METHODS[data[0] as usize % METHODS.len()];
    let flags = data[1];
    let rest = &data[2..];
    let (path, rest) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &b""[..]),
    };
    let (head, body) = match rest.windows(2).position(|w| w == b"\n\n") {
        Some(i) => (&rest[..i], &rest[i + 2..]),
        None => (&b""[..], rest),
    };
    let mut request = format!(
        "{method} {} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n",
        target(path)
    );
    match flags & 3 {
        1 => request.push_str(&format!("Authorization: Bearer {SHOP}\r\n")),
        2 => request.push_str(&format!("Authorization: Bearer {OPS}\r\n")),
        _ => {}
    }
    if flags & 4 != 0 {
        request.push_str("Content-Type: application/json\r\n");
    }
    request.push_str(&headers(head));
    request.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = request.into_bytes();
    bytes.extend_from_slice(body);
    let status = exchange(service().addr, &bytes);
    assert!(
        (200..500).contains(&status),
        "answered {status} to {:?}",
        String::from_utf8_lossy(&bytes[..bytes.len().min(400)])
    );
});
