//! The console's files, embedded in the binary: no CDN, nothing to install beside it,
//! and the same on an air-gapped host. Each is answered with its type, `no-cache` and an
//! ETag, so a browser asks again each time and a new release's files replace the old at
//! once, at the cost of a 304 when nothing changed.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};

/// One embedded file.
pub(super) struct Asset {
    /// Its name under `/ui/`.
    pub name: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub body: &'static [u8],
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";

/// Every file: the two pages are answered at their routes (`/ui/`, `/ui/login`), the rest
/// at `/ui/NAME`. A new file is one line here.
const ASSETS: [Asset; 4] = [
    Asset {
        name: "index.html",
        content_type: HTML,
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        name: "login.html",
        content_type: HTML,
        body: include_bytes!("assets/login.html"),
    },
    Asset {
        name: "app.js",
        content_type: JS,
        body: include_bytes!("assets/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: CSS,
        body: include_bytes!("assets/app.css"),
    },
];

/// The pages, answered at their routes rather than under their file names.
const PAGES: [&str; 2] = ["index.html", "login.html"];

/// The file named `name`.
pub(super) fn file(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.name == name)
}

/// The file `/ui/NAME` answers with: any but the pages.
pub(super) fn served_as(name: &str) -> Option<&'static Asset> {
    file(name).filter(|a| !PAGES.contains(&a.name))
}

/// An asset's ETag: the start of its SHA-256, computed once.
pub(super) fn etag(asset: &Asset) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                let digest = Sha256::digest(a.body);
                format!("\"{}\"", super::session::hex(&digest[..12]))
            })
            .collect()
    });
    let i = ASSETS
        .iter()
        .position(|a| a.name == asset.name)
        .expect("an asset of the list");
    &tags[i]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_found_and_the_pages_only_at_their_routes() {
        for a in &ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.name);
            assert_eq!(file(a.name).unwrap().name, a.name);
        }
        assert!(served_as("app.js").is_some() && served_as("app.css").is_some());
        assert!(served_as("index.html").is_none() && served_as("login.html").is_none());
        assert!(served_as("../Cargo.toml").is_none());
        let tag = etag(file("app.js").unwrap());
        assert!(tag.starts_with('"') && tag.len() == 26, "{tag}");
        assert_ne!(tag, etag(file("app.css").unwrap()));
    }

    #[test]
    fn pages_load_no_inline_script() {
        for page in PAGES {
            let text = std::str::from_utf8(file(page).unwrap().body).unwrap();
            // (the CSP refuses inline script: a page that relied on it would not work)
            for (i, _) in text.match_indices("<script") {
                let tag = &text[i..text[i..].find('>').map_or(text.len(), |e| i + e)];
                assert!(tag.contains("src="), "{page}: inline script in {tag}");
            }
            assert!(
                !text.contains(" onclick=") && !text.contains(" onload="),
                "{page}"
            );
        }
    }
}
