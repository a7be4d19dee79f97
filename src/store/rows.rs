//! Reading a result row into a struct field by field (`FromRow` written by hand beside
//! each struct): these helpers cover the columns that are not read as they are stored,
//! text parsed into an enum, JSON, and a column some queries leave out.

use std::error::Error as StdError;

use serde::de::DeserializeOwned;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{Error, Row};

/// Column `name` read as text and parsed by `T`'s `TryFrom<String>`; a value `T` refuses
/// is a decode error naming the column.
pub fn parsed<T>(row: &PgRow, name: &str) -> Result<T, Error>
where
    T: TryFrom<String>,
    T::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    let text: String = row.try_get(name)?;
    T::try_from(text).map_err(|source| Error::ColumnDecode {
        index: name.to_owned(),
        source: source.into(),
    })
}

/// Column `name` holding JSON or NULL.
pub fn json<T: DeserializeOwned>(row: &PgRow, name: &str) -> Result<Option<T>, Error> {
    let value: Option<Json<T>> = row.try_get(name)?;
    Ok(value.map(|Json(value)| value))
}

/// Column `name`, or `None` when the query did not select it.
pub fn if_selected<T>(row: &PgRow, name: &str) -> Result<Option<T>, Error>
where
    for<'r> Option<T>: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    match row.try_get(name) {
        Err(Error::ColumnNotFound(_)) => Ok(None),
        read => read,
    }
}
