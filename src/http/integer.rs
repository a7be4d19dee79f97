//! Integer fields of request bodies, read as JSON Schema reads them: `49`, `49.0` and
//! `4.9e1` are the same integer, while `49.5`, `"49"` or a value beyond the field's range
//! is refused with a message that names neither serde nor a Rust type.
//!
//! Use with `#[serde(deserialize_with = "integer::exact")]`, or `integer::optional` for an
//! `Option` field (with `#[serde(default)]`).

use std::fmt;
use std::marker::PhantomData;

use serde::Deserializer;
use serde::de::{Error, Unexpected, Visitor};

/// What every refusal says after the field's name.
const EXPECTED: &str = "an integer";

/// An integer that fits `T`, from any JSON number with no fractional part.
pub fn exact<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    deserializer.deserialize_any(Integer(PhantomData))
}

/// As [`exact`], for a field that may be absent or `null`.
pub fn optional<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64>,
{
    deserializer.deserialize_option(Optional(PhantomData))
}

struct Integer<T>(PhantomData<T>);

impl<T: TryFrom<i64>> Integer<T> {
    fn fit<E: Error>(value: i64) -> Result<T, E> {
        T::try_from(value).map_err(|_| E::custom(format!("{value} is out of range")))
    }
}

impl<'de, T: TryFrom<i64>> Visitor<'de> for Integer<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(EXPECTED)
    }

    fn visit_i64<E: Error>(self, value: i64) -> Result<T, E> {
        Self::fit(value)
    }

    fn visit_u64<E: Error>(self, value: u64) -> Result<T, E> {
        let value =
            i64::try_from(value).map_err(|_| E::custom(format!("{value} is out of range")))?;
        Self::fit(value)
    }

    fn visit_f64<E: Error>(self, value: f64) -> Result<T, E> {
        // Every integer-valued f64 in this range converts exactly; 2^63 itself does not fit.
        const LIMIT: f64 = 9_223_372_036_854_775_808.0;
        if value.fract() != 0.0 || !value.is_finite() {
            return Err(E::invalid_type(Unexpected::Float(value), &self));
        }
        if !(-LIMIT..LIMIT).contains(&value) {
            return Err(E::custom(format!("{value} is out of range")));
        }
        Self::fit(value as i64)
    }
}

struct Optional<T>(PhantomData<T>);

impl<'de, T: TryFrom<i64>> Visitor<'de> for Optional<T> {
    type Value = Option<T>;

    fn expecting(&self, formatter: &mut fmt::Formatter) -> fmt::Result {
        formatter.write_str(EXPECTED)
    }

    fn visit_none<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Option<T>, D::Error> {
        exact(deserializer).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    struct Body {
        #[serde(deserialize_with = "super::exact")]
        count: i32,
        #[serde(default, deserialize_with = "super::optional")]
        limit: Option<i64>,
    }

    fn read(json: &str) -> Result<Body, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn integer_valued_numbers_are_integers() {
        assert_eq!(read(r#"{"count": 49.0}"#).unwrap().count, 49);
        assert_eq!(read(r#"{"count": 4.9e1}"#).unwrap().count, 49);
        assert_eq!(read(r#"{"count": -3}"#).unwrap().count, -3);
        let body = read(r#"{"count": 1, "limit": 662.0}"#).unwrap();
        assert_eq!(body.limit, Some(662));
        assert_eq!(read(r#"{"count": 1, "limit": null}"#).unwrap().limit, None);
        assert_eq!(read(r#"{"count": 1}"#).unwrap().limit, None);
    }

    #[test]
    fn fractions_strings_and_overflow_are_refused_in_plain_words() {
        for (json, says) in [
            (r#"{"count": 49.5}"#, "expected an integer"),
            (r#"{"count": "2"}"#, "expected an integer"),
            (r#"{"count": true}"#, "expected an integer"),
            (r#"{"count": 3000000000}"#, "3000000000 is out of range"),
            (r#"{"count": 1e20}"#, "is out of range"),
            (r#"{"count": 1, "limit": 0.5}"#, "expected an integer"),
        ] {
            let error = read(json).unwrap_err();
            assert!(error.contains(says), "{json}: {error}");
            assert!(!error.contains("i32") && !error.contains("i64"), "{error}");
        }
    }
}
