//! Reading config text into a `Config` while collecting every error, not just the first.
//!
//! serde stops at the first bad key. To go on, the file is parsed once into toml's spanned
//! table (so every error keeps its line and column in the file as written), and after each
//! error the offending key is taken out of the table and the rest deserialized again: an
//! unknown key is simply dropped, a bad value falls back to its default. Once the rest
//! deserializes, the checks across keys (`Config::validate`) run on it too, except in tables
//! where a value was dropped, whose other checks would be judging a default the operator
//! never wrote. A missing required key ends the collection (there is nothing to drop).

use super::{Config, ConfigError, ConfigErrors};
use serde_path_to_error::Segment;
use toml::de::{DeTable, DeValue};

/// At most this many errors from serde; a file with more is mostly not a config.
const MAX_ERRORS: usize = 50;

/// Parses and validates config text, reporting every error it can find.
pub(super) fn parse(text: &str) -> Result<Config, ConfigErrors> {
    let mut root = DeTable::parse(text).map_err(|e| syntax_error(text, &e))?;
    let mut errors = Vec::new();
    // Tables in which a bad value was replaced by its default (dotted key prefixes).
    let mut defaulted: Vec<String> = Vec::new();
    while errors.len() < MAX_ERRORS {
        let deserializer = toml::de::Deserializer::from(root.clone());
        let error = match serde_path_to_error::deserialize::<_, Config>(deserializer) {
            Ok(config) => {
                let semantic = config.validate().into_iter().filter(|e| {
                    !defaulted.iter().any(|table| {
                        table.is_empty()
                            || e.key == *table
                            || e.key.starts_with(&format!("{table}."))
                            || e.key.starts_with(&format!("{table}["))
                    })
                });
                let mut all = in_file_order(errors);
                all.0.extend(semantic);
                return if all.0.is_empty() {
                    Ok(config)
                } else {
                    Err(all)
                };
            }
            Err(error) => error,
        };
        let path: Vec<Segment> = error.path().iter().cloned().collect();
        let inner = error.into_inner();
        let message = inner.message().trim().to_owned();
        let at = inner.span().map_or(usize::MAX, |span| span.start);
        let found = ConfigError {
            key: key_of(&path),
            message: format!("{message}{}", location(text, &inner)),
        };
        if message.starts_with("missing field") {
            // Left out by the operator, or the consequence of dropping a bad required value
            // (then already reported under its own key).
            if !defaulted.contains(&found.key) {
                errors.push((at, found));
            }
            break;
        }
        errors.push((at, found));
        if !remove(root.get_mut(), &path) {
            break;
        }
        // An unknown key was never a value of the config: dropping it changes nothing else.
        if !message.starts_with("unknown field") {
            defaulted.push(key_of(&path[..path.len() - 1]));
        }
    }
    Err(in_file_order(errors))
}

/// serde meets keys in its own order (tables sorted by name); the file's order reads better.
fn in_file_order(mut errors: Vec<(usize, ConfigError)>) -> ConfigErrors {
    errors.sort_by_key(|(at, _)| *at);
    ConfigErrors(errors.into_iter().map(|(_, error)| error).collect())
}

/// The dotted key of a path (`backends[1].capacity`); empty for the root.
fn key_of(path: &[Segment]) -> String {
    let mut key = String::new();
    for segment in path {
        match segment {
            Segment::Seq { index } => key.push_str(&format!("[{index}]")),
            Segment::Map { key: name } | Segment::Enum { variant: name } => {
                if !key.is_empty() {
                    key.push('.');
                }
                key.push_str(name);
            }
            Segment::Unknown => key.push_str(".?"),
        }
    }
    key
}

/// Takes the key at `path` out of the table; false when the path does not end at a key
/// reached through tables and array elements (then nothing is changed).
fn remove(table: &mut DeTable<'_>, path: &[Segment]) -> bool {
    let Some((Segment::Map { key }, rest)) = path.split_first() else {
        return false;
    };
    if rest.is_empty() {
        return table.remove(key.as_str()).is_some();
    }
    table
        .get_mut(key.as_str())
        .is_some_and(|value| remove_in(value.get_mut(), rest))
}

fn remove_in(value: &mut DeValue<'_>, path: &[Segment]) -> bool {
    match (value, path.split_first()) {
        (DeValue::Table(table), _) => remove(table, path),
        (DeValue::Array(array), Some((Segment::Seq { index }, rest))) if !rest.is_empty() => array
            .get_mut(*index)
            .is_some_and(|element| remove_in(element.get_mut(), rest)),
        _ => false,
    }
}

fn syntax_error(text: &str, error: &toml::de::Error) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        key: String::new(),
        message: format!(
            "TOML syntax error: {}{}",
            error.message().trim(),
            location(text, error)
        ),
    }])
}

/// " (line L, column C)" for an error's position in the file, when toml knows it.
fn location(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else {
        return String::new();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!(" (line {line}, column {column})")
}
