//! The environment layer of the settings.
//!
//! Every setting has one canonical variable derived from its key,
//! `FLASHGATE__<SECTION>__<KEY>` (`server.listen` is `FLASHGATE__SERVER__LISTEN`). A few
//! settings also keep the short name they had before that scheme (`DATABASE_URL`,
//! `FLASHGATE_LISTEN`, …) as documented aliases; giving both names of one setting is refused,
//! since one of them would be silently ignored. Any other variable starting with
//! `FLASHGATE_` is refused too, with the closest known name suggested: a mistyped variable
//! is a setting the operator believes in and the gateway never saw.

use std::collections::BTreeMap;

use figment::value::Value;

use super::ConfigError;

/// The prefix of every canonical variable.
pub const PREFIX: &str = "FLASHGATE__";

/// Variables starting with this belong to flashgate, so an unknown one is a mistake.
const NAMESPACE: &str = "FLASHGATE_";

/// The short names kept from before the canonical scheme, and the key each one sets.
pub const ALIASES: [(&str, &str); 8] = [
    ("DATABASE_URL", "database.url"),
    ("DATABASE_DIRECT_URL", "database.direct_url"),
    ("REDIS_URL", "redis.url"),
    ("FLASHGATE_LISTEN", "server.listen"),
    ("FLASHGATE_OPS_LISTEN", "server.ops_listen"),
    ("FLASHGATE_ADMIN_TOKEN", "auth.admin_token"),
    ("FLASHGATE_JWT_SECRET", "auth.jwt_secret"),
    // The OpenTelemetry SDKs' standard name for the collector.
    ("OTEL_EXPORTER_OTLP_ENDPOINT", "telemetry.otlp_endpoint"),
];

/// Names under `FLASHGATE_` that other programs of this project read (the payment
/// simulator, the build script, the test, API-check and load scripts); they set no setting
/// of the gateway, and a shell that exports them for those programs must still start it.
const OTHER_PROGRAMS: [&str; 8] = [
    "FLASHGATE_EDGE_ORIGIN",
    "FLASHGATE_PSP_WEBHOOK_URL",
    "FLASHGATE_PSP_WEBHOOK_SECRET",
    "FLASHGATE_PSP_API_KEY",
    "FLASHGATE_GIT_COMMIT",
    "FLASHGATE_USER_TOKEN",
    "FLASHGATE_WRK_TOKEN",
    "FLASHGATE_TEST_NO_SYSTEM",
];

/// How alike (0 to 1, normalised Damerau-Levenshtein) a known name must be to an unknown
/// one to be offered as what was meant; below it the suggestion would be noise.
const SUGGESTION_SIMILARITY_MIN: f64 = 0.75;

/// The canonical variable of `key`.
pub fn canonical(key: &str) -> String {
    format!("{PREFIX}{}", key.replace('.', "__").to_ascii_uppercase())
}

/// The short alias of `key`, for the few settings that have one.
pub fn alias(key: &str) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(_, aliased)| *aliased == key)
        .map(|(name, _)| *name)
}

/// Every name `key` may be set with, the canonical one first (`A or B`).
pub fn names(key: &str) -> String {
    match alias(key) {
        Some(alias) => format!("{} or {alias}", canonical(key)),
        None => canonical(key),
    }
}

/// One setting given in the environment.
pub struct EnvSetting {
    /// The variable as the operator spelled it.
    pub var: String,
    pub key: String,
    pub value: Value,
}

/// What a variable's name means.
enum Named {
    Setting(String),
    NotOurs,
    Unknown,
}

/// The settings `vars` give, typed like their defaults; or every problem, one per line.
/// `defaults` holds every setting's key and default value.
pub fn read(
    vars: impl IntoIterator<Item = (String, String)>,
    defaults: &BTreeMap<String, Value>,
) -> Result<Vec<EnvSetting>, ConfigError> {
    let mut vars: Vec<(String, String)> = vars.into_iter().collect();
    vars.sort();
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for (var, raw) in vars {
        match name_of(&var, defaults) {
            Named::Setting(key) => {
                let value = typed(raw, &defaults[&key]);
                found.push(EnvSetting { var, key, value });
            }
            Named::NotOurs => {}
            Named::Unknown => problems.push(unknown(&var, defaults)),
        }
    }
    problems.extend(set_twice(&found));
    if problems.is_empty() {
        Ok(found)
    } else {
        Err(ConfigError::Invalid(problems.join("\n")))
    }
}

fn name_of(var: &str, defaults: &BTreeMap<String, Value>) -> Named {
    if let Some((_, key)) = ALIASES.iter().find(|(alias, _)| *alias == var) {
        return Named::Setting((*key).to_owned());
    }
    // Names are compared in upper case for the namespace only: `flashgate__server__listen`
    // is ours, misspelt, and must not be ignored in silence.
    if !var.to_ascii_uppercase().starts_with(NAMESPACE) || OTHER_PROGRAMS.contains(&var) {
        return Named::NotOurs;
    }
    let key = var
        .strip_prefix(PREFIX)
        .map(|rest| rest.to_ascii_lowercase().replace("__", "."));
    match key {
        Some(key) if defaults.contains_key(&key) && canonical(&key) == var => Named::Setting(key),
        _ => Named::Unknown,
    }
}

/// A text setting keeps the variable as given (a secret of digits stays text); any other
/// is read like a TOML value (`true`, `32`, `[ "10.0.0.0/8" ]`).
fn typed(raw: String, default: &Value) -> Value {
    match default {
        Value::String(..) => Value::from(raw),
        _ => raw.parse().unwrap_or_else(|never| match never {}),
    }
}

fn unknown(var: &str, defaults: &BTreeMap<String, Value>) -> String {
    let known = defaults
        .keys()
        .map(|key| canonical(key))
        .chain(ALIASES.iter().map(|(alias, _)| (*alias).to_owned()));
    let closest = known
        .map(|name| {
            let similarity =
                strsim::normalized_damerau_levenshtein(&var.to_ascii_uppercase(), &name);
            (similarity, name)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(similarity, _)| *similarity >= SUGGESTION_SIMILARITY_MIN);
    let hint = match closest {
        Some((_, name)) => format!("did you mean {name}?"),
        None => "no setting has a name like it".to_owned(),
    };
    format!(
        "{var} is not a flashgate setting: {hint} (every name: `flashgate config --help`, \
         docs/CONFIGURATION.md)"
    )
}

/// A setting given under both its names: which one wins would be a guess.
fn set_twice(found: &[EnvSetting]) -> Vec<String> {
    let mut by_key: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for setting in found {
        by_key.entry(&setting.key).or_default().push(&setting.var);
    }
    by_key
        .into_iter()
        .filter(|(_, vars)| vars.len() > 1)
        .map(|(key, vars)| {
            format!(
                "{} both set {key}: keep one of them (they are the same setting)",
                vars.join(" and ")
            )
        })
        .collect()
}

/// `--help`'s account of the environment: the scheme and the aliases.
pub fn help_summary() -> String {
    let aliases: Vec<String> = ALIASES
        .iter()
        .map(|(alias, key)| format!("  {alias:<24} {key} (also {})", canonical(key)))
        .collect();
    format!(
        "Environment:\n  Every setting section.key is also {PREFIX}SECTION__KEY, e.g. \
         FLASHGATE__DATABASE__REQUEST_POOL_MAX=32.\n  Short aliases (set one name per \
         setting, not both):\n{}\n  `flashgate config --help` lists every variable; \
         `flashgate config` prints the effective settings.",
        aliases.join("\n")
    )
}

/// Every setting's variables, one line each, for `flashgate config --help`.
pub fn help_list(defaults: &BTreeMap<String, Value>) -> String {
    let lines: Vec<String> = defaults
        .keys()
        .map(|key| format!("  {key:<46} {}", names(key)))
        .collect();
    format!(
        "Settings and their environment variables:\n{}",
        lines.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> BTreeMap<String, Value> {
        super::super::explain::defaults()
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect()
    }

    fn problem(pairs: &[(&str, &str)]) -> String {
        match read(vars(pairs), &defaults()) {
            Ok(_) => panic!("{pairs:?} accepted"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn canonical_names_aliases_and_other_programs_are_read() {
        let found = read(
            vars(&[
                ("FLASHGATE__SERVER__WORKER_THREADS", "2"),
                ("FLASHGATE_LISTEN", "127.0.0.1:1"),
                ("FLASHGATE__AUTH__ADMIN_TOKEN", "0123456789"),
                ("FLASHGATE_PSP_API_KEY", "for the simulator"),
                ("HOME", "/root"),
            ]),
            &defaults(),
        )
        .unwrap();
        let keys: Vec<&str> = found.iter().map(|s| s.key.as_str()).collect();
        assert_eq!(
            keys,
            ["server.listen", "auth.admin_token", "server.worker_threads"]
        );
        // Digits stay text for a text setting, and are a number for a number.
        assert_eq!(found[1].value, Value::from("0123456789".to_owned()));
        assert_eq!(found[2].value.to_u128(), Some(2));
    }

    #[test]
    fn typos_in_either_form_are_refused_with_the_closest_name() {
        let short = problem(&[("FLASHGATE_LISTN", "x")]);
        assert!(short.contains("did you mean FLASHGATE_LISTEN?"), "{short}");
        let long = problem(&[("FLASHGATE__SERVER__LISTN", "x")]);
        assert!(
            long.contains("did you mean FLASHGATE__SERVER__LISTEN?"),
            "{long}"
        );
        let section = problem(&[("FLASHGATE__SERVER", "x")]);
        assert!(section.contains("FLASHGATE__SERVER is not"), "{section}");
        let lower = problem(&[("flashgate__server__listen", "x")]);
        assert!(
            lower.contains("did you mean FLASHGATE__SERVER__LISTEN?"),
            "{lower}"
        );
        let far = problem(&[("FLASHGATE_COLOUR", "x")]);
        assert!(far.contains("no setting has a name like it"), "{far}");
    }

    #[test]
    fn both_names_of_one_setting_are_refused_naming_both() {
        let both = problem(&[
            ("FLASHGATE_LISTEN", "127.0.0.1:1"),
            ("FLASHGATE__SERVER__LISTEN", "127.0.0.1:2"),
        ]);
        assert!(
            both.contains("FLASHGATE_LISTEN and FLASHGATE__SERVER__LISTEN both set server.listen"),
            "{both}"
        );
    }

    #[test]
    fn every_alias_names_a_setting() {
        let defaults = defaults();
        for (alias, key) in ALIASES {
            assert!(defaults.contains_key(key), "{alias} sets unknown {key}");
        }
    }
}
