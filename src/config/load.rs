//! Loading the configuration: the file read, `${ENV}` values substituted, `KAFKA_BACKFILL__…`
//! overrides applied, then the TOML typed and validated, every error naming its key path and line.
//! Owns the environment layering; what is valid is `validate`'s.

use std::collections::BTreeMap;
use std::path::Path;

use super::{err, Config, ConfigError};

impl Config {
    /// Reads, substitutes `${ENV}` values, parses and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), e.to_string()))?;
        Self::parse(&text, &path.display().to_string())
    }

    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let overrides: Vec<(String, String)> = std::env::vars()
            .filter(|(k, _)| k.starts_with(ENV_PREFIX))
            .collect();
        Self::parse_with(text, origin, &overrides)
    }

    /// Parses with explicit `KAFKA_BACKFILL__…` overrides (the environment's, in [`Config::parse`]).
    pub fn parse_with(
        text: &str,
        origin: &str,
        overrides: &[(String, String)],
    ) -> Result<Config, ConfigError> {
        // Parse first, then substitute `${ENV}` inside string values only: a value can never change
        // the file's structure, whatever characters it holds.
        let mut doc: toml::Table = toml::from_str(text).map_err(|e: toml::de::Error| {
            let span = e.span().map(|s| line_of(text, s.start)).unwrap_or_default();
            err(format!("{origin}{span}"), e.message().trim().to_string())
        })?;
        substitute_env_values(&mut doc, "")?;
        let mut set_by = Vec::new();
        for (k, v) in overrides {
            set_by.push((apply_override(&mut doc, k, v)?, k.clone()));
        }
        // An error at a key an override set names the variable that set it.
        let blame = |e: ConfigError| match set_by
            .iter()
            .rev()
            .find(|(path, _)| same_key(&e.path, path))
        {
            Some((_, var)) => err(format!("{} (set by {var})", e.path), e.message),
            None => e,
        };
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(doc))
            .map_err(|e| {
                let path = e.path().to_string();
                let path = if path == "." {
                    origin.to_string()
                } else {
                    path
                };
                err(path, e.inner().message().trim().to_string())
            })
            .map_err(blame)?;
        config.validate().map_err(blame)?;
        Ok(config)
    }
}

/// Whether a validation or type error at `error_path` is at the key an override set at `set`
/// (paths compared without the quoting validation puts around dotted Kafka keys).
fn same_key(error_path: &str, set: &str) -> bool {
    let e = error_path.replace('"', "");
    e == set || e.starts_with(&format!("{set}.")) || e.starts_with(&format!("{set}["))
}

/// `KEY=VALUE` pairs (from the command line) as librdkafka properties; `${ENV}` in a value is
/// substituted.
pub fn parse_properties(pairs: &[String]) -> Result<BTreeMap<String, String>, ConfigError> {
    pairs
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(kv, "expected KEY=VALUE"))?;
            let v = substitute_line(v).map_err(|m| err(k, m))?;
            Ok((k.trim().to_string(), v))
        })
        .collect()
}

/// Environment overrides: `KAFKA_BACKFILL__HTTP__LISTEN=0.0.0.0:9464`,
/// `KAFKA_BACKFILL__JOBS__0__WORKERS=4`, `KAFKA_BACKFILL__JOBS__0__KAFKA__bootstrap.servers=…`: the path
/// after the prefix, `__`-separated (table keys lower-cased, except under `kafka`), array items by index.
/// A Kafka property may also be written in a form a shell can export: upper case with `_` for `.`
/// (`KAFKA_BACKFILL__JOBS__0__KAFKA__SESSION_TIMEOUT_MS=45000` sets `session.timeout.ms`).
/// Values under `kafka` are strings, and so is a value replacing a string of the file
/// (`…__TOPIC=12345` is the topic `"12345"`); elsewhere a value is read as a TOML scalar when it
/// parses as one (`…__WORKERS=4`), else as a string.
pub const ENV_PREFIX: &str = "KAFKA_BACKFILL__";

/// Applies one override; returns the key path it set (`jobs[0].workers`), for errors to name it.
fn apply_override(doc: &mut toml::Table, key: &str, value: &str) -> Result<String, ConfigError> {
    let path: Vec<&str> = key[ENV_PREFIX.len()..].split("__").collect();
    let scalar: toml::Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .filter(|v| !matches!(v, toml::Value::Table(_) | toml::Value::Array(_)))
        .unwrap_or_else(|| toml::Value::String(value.to_string()));
    let text = toml::Value::String(value.to_string());
    // A string in the file stays a string; a key under `kafka` is always one.
    let typed = |existing: Option<&toml::Value>, in_kafka: bool| {
        if in_kafka || matches!(existing, Some(toml::Value::String(_))) {
            text.clone()
        } else {
            scalar.clone()
        }
    };
    let mut node = doc;
    let mut in_kafka = false;
    let mut at = String::new();
    for (i, seg) in path.iter().enumerate() {
        let name = if in_kafka {
            if !seg.contains('.') && seg.chars().all(|c| !c.is_ascii_lowercase()) {
                seg.to_ascii_lowercase().replace('_', ".")
            } else {
                seg.to_string()
            }
        } else {
            seg.to_lowercase()
        };
        if !at.is_empty() {
            at.push('.');
        }
        at.push_str(&name);
        let last = i + 1 == path.len();
        if last {
            let v = typed(node.get(&name), in_kafka);
            node.insert(name, v);
            return Ok(at);
        }
        in_kafka = name == "kafka";
        let entry = node
            .entry(name.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        node = match entry {
            toml::Value::Table(t) => t,
            toml::Value::Array(items) => {
                let idx: usize = path[i + 1].parse().map_err(|_| {
                    err(
                        key,
                        format!("{name} is a list: the next segment must be an index"),
                    )
                })?;
                let item = items
                    .get_mut(idx)
                    .ok_or_else(|| err(key, format!("{name} has no item {idx}")))?;
                at.push_str(&format!("[{idx}]"));
                if i + 2 == path.len() {
                    *item = typed(Some(item), false);
                    return Ok(at);
                }
                // Skip the index segment.
                match item {
                    toml::Value::Table(t) => {
                        let rest = apply_override(
                            t,
                            &format!("{ENV_PREFIX}{}", path[i + 2..].join("__")),
                            value,
                        )?;
                        return Ok(format!("{at}.{rest}"));
                    }
                    _ => return Err(err(key, format!("{name}[{idx}] is not a table"))),
                }
            }
            _ => return Err(err(key, format!("{name} is not a table"))),
        };
    }
    Ok(at)
}

fn line_of(text: &str, offset: usize) -> String {
    let line = text[..offset.min(text.len())].matches('\n').count() + 1;
    format!(":{line}")
}

/// Replaces `${NAME}` by the environment variable NAME in every string value of the parsed file
/// (keys and comments are left alone); an unset variable is an error naming the key.
fn substitute_env_values(table: &mut toml::Table, at: &str) -> Result<(), ConfigError> {
    fn walk(v: &mut toml::Value, at: &str) -> Result<(), ConfigError> {
        match v {
            toml::Value::String(s) if s.contains("${") => {
                *s = substitute_line(s).map_err(|m| err(at, m))?;
            }
            toml::Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, &format!("{at}[{i}]"))?;
                }
            }
            toml::Value::Table(t) => substitute_env_values(t, at)?,
            _ => {}
        }
        Ok(())
    }
    for (k, v) in table.iter_mut() {
        let key = if k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            k.clone()
        } else {
            format!("{k:?}")
        };
        let path = if at.is_empty() {
            key
        } else {
            format!("{at}.{key}")
        };
        walk(v, &path)?;
    }
    Ok(())
}

/// The environment variable `name`, else the contents of the file named by `name_FILE` (Docker and
/// Kubernetes secret files; one trailing newline dropped).
fn env_or_file(name: &str) -> Result<String, String> {
    if let Ok(v) = std::env::var(name) {
        return Ok(v);
    }
    let file_var = format!("{name}_FILE");
    match std::env::var(&file_var) {
        Ok(path) => std::fs::read_to_string(&path)
            .map(|s| s.strip_suffix('\n').map(str::to_string).unwrap_or(s))
            .map_err(|e| format!("{file_var} = {path}: {e} (used for ${{{name}}})")),
        Err(_) => Err(format!(
            "environment variable {name} is not set, nor {file_var} (used as ${{{name}}})"
        )),
    }
}

fn substitute_line(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after
            .find('}')
            .ok_or_else(|| "unterminated ${ in the value".to_string())?;
        let name = &after[..j];
        let value = env_or_file(name)?;
        out.push_str(&value);
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
