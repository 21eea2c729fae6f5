//! Text read from Redis, made safe for an operator's terminal. Ids, notes, errors,
//! payloads and host names come from producers, handlers and old builds; a control
//! character among them (an `ESC ] 0;` title, `ESC [2J`, a bell) would reach the terminal
//! as a command, and a bidi override would reorder what is shown. Every path that prints
//! such text on a terminal (the CLI's tables, `gaffer top`) shows it through [`printable`];
//! JSON output is escaped by serde already.
//!
//! [`printable`] escapes control characters (C0, DEL, C1) and the invisible format
//! characters (bidi controls, zero-width, line and paragraph separators); [`one_line`] is
//! the same for a table cell. SECURITY.md relies on every terminal print path going through
//! here.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is shown escaped: the C0 controls (U+0000–U+001F), DEL (U+007F), the C1
/// controls (U+0080–U+009F), and the invisible format characters that reorder or hide
/// text (bidi marks, embeddings, overrides and isolates, zero-width characters, the line
/// and paragraph separators, the byte order mark).
pub fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200b}'..='\u{200f}'
                | '\u{2028}'..='\u{202e}'
                | '\u{2060}'..='\u{2069}'
                | '\u{feff}'
        )
}

/// `s` with every [`unprintable`] character escaped: `\n`, `\r`, `\t` as such, other
/// ASCII controls as `\xHH` (ESC is `\x1b`), the rest as `\u{HHHH}`. Borrowed when
/// nothing needs escaping, which is the common case.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(unprintable) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_ascii() && unprintable(c) => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if unprintable(c) => {
                let _ = write!(out, "\\u{{{:04x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `s` with its line breaks kept and everything else [`unprintable`] escaped: for text of
/// several lines (an error's, an indented JSON document's).
pub fn printable_lines(s: &str) -> String {
    s.split('\n').map(printable).collect::<Vec<_>>().join("\n")
}

/// `s` on one line for a table cell: line breaks as spaces (a multi-line error stays
/// readable), every other [`unprintable`] character escaped.
pub fn one_line(s: &str) -> String {
    printable(&s.replace(['\n', '\r'], " ")).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_invisible_format_characters_are_escaped() {
        let evil = "a\u{1b}]0;owned\u{7}\u{1b}[2Jb";
        assert_eq!(printable(evil), "a\\x1b]0;owned\\x07\\x1b[2Jb");
        assert_eq!(printable("del\u{7f} c1\u{9b}"), "del\\x7f c1\\u{009b}");
        assert_eq!(
            printable("rtl\u{202e}txt\u{200b}"),
            "rtl\\u{202e}txt\\u{200b}"
        );
        assert_eq!(printable("tab\tnl\ncr\r"), "tab\\tnl\\ncr\\r");
        assert_eq!(one_line("two\nlines\u{1b}"), "two lines\\x1b");
        assert_eq!(printable_lines("a\u{9b}\nb\r"), "a\\u{009b}\nb\\r");
    }

    #[test]
    fn ordinary_text_is_borrowed_as_it_is() {
        for s in ["invoice-42", "~g17", "#3", "café ünïcode 日本 🙂", "a\\x1b"] {
            assert!(matches!(printable(s), Cow::Borrowed(b) if b == s), "{s}");
        }
    }
}
