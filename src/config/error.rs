//! Errors of loading a config: one I/O failure, or every problem found in the document.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

/// Why a config could not be loaded.
///
/// The two cases need different handling by callers: a missing file is often solved by
/// looking elsewhere, a bad file never is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read at all.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The path as given, so the message names what the operator typed.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },
    /// The file was read but is not a valid config; every problem found is listed.
    #[error("{0}")]
    Invalid(Diagnostics),
}

/// Every problem found in one config, sorted by position.
///
/// All of them are collected before giving up so an operator fixes a file in one pass
/// instead of one error per run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl Diagnostics {
    /// Number of problems, for summaries such as "3 errors".
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether nothing was found; a `ConfigError::Invalid` never holds an empty list.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The problems in file order.
    pub fn iter(&self) -> std::slice::Iter<'_, Diagnostic> {
        self.0.iter()
    }
}

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl<'a> IntoIterator for &'a Diagnostics {
    type Item = &'a Diagnostic;
    type IntoIter = std::slice::Iter<'a, Diagnostic>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One problem, located precisely enough for an editor to jump to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The origin given to [`parse`](super::parse) (the path for [`load`](super::load)).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters so non-ASCII text does not shift it.
    pub column: usize,
    /// Dotted key path such as `queues.resize_photo.min_slots`; empty for TOML syntax
    /// errors, where no key is known.
    pub key: String,
    /// Lower-case, no trailing dot, so it reads well after the location prefix.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        write!(f, "{}", self.message)
    }
}

/// Collects problems while the document is walked, then turns byte spans into lines and
/// columns once at the end.
pub(crate) struct Collector<'a> {
    source: &'a str,
    origin: &'a str,
    found: Vec<(usize, Diagnostic)>,
}

impl<'a> Collector<'a> {
    pub(crate) fn new(source: &'a str, origin: &'a str) -> Self {
        Self {
            source,
            origin,
            found: Vec::new(),
        }
    }

    pub(crate) fn error(&mut self, span: Range<usize>, key: &str, message: impl Into<String>) {
        let offset = span.start.min(self.source.len());
        let (line, column) = line_col(self.source, offset);
        self.found.push((
            offset,
            Diagnostic {
                file: self.origin.to_owned(),
                line,
                column,
                key: key.to_owned(),
                message: message.into(),
            },
        ));
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.found.is_empty()
    }

    /// How many problems were found so far: a check that ends with more found one.
    pub(crate) fn count(&self) -> usize {
        self.found.len()
    }

    pub(crate) fn finish(mut self) -> Diagnostics {
        // Stable sort keeps the walk order for errors at the same spot.
        self.found.sort_by_key(|(offset, _)| *offset);
        self.found.dedup_by(|a, b| a.1 == b.1);
        Diagnostics(self.found.into_iter().map(|(_, d)| d).collect())
    }
}

/// 1-based line and character column of a byte offset.
pub(crate) fn line_col(source: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(source.len());
    while !source.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &source[..offset];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_characters() {
        let s = "a = 1\nbé = 2\n";
        assert_eq!(line_col(s, 0), (1, 1));
        assert_eq!(line_col(s, 6), (2, 1));
        // "bé " is 4 bytes but 3 characters.
        assert_eq!(line_col(s, 6 + 4), (2, 4));
        assert_eq!(line_col(s, s.len()), (3, 1));
    }

    #[test]
    fn display_omits_empty_key() {
        let d = Diagnostic {
            file: "c.toml".into(),
            line: 3,
            column: 7,
            key: String::new(),
            message: "unclosed array".into(),
        };
        assert_eq!(d.to_string(), "c.toml:3:7: unclosed array");
        let d = Diagnostic {
            key: "queues.a".into(),
            ..d
        };
        assert_eq!(d.to_string(), "c.toml:3:7: queues.a: unclosed array");
    }
}
