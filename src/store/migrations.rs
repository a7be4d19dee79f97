//! The schema's migrations, embedded in the binary by the build script (`build.rs`), so a
//! deployed `flashgate migrate` needs no files beside it. Each is applied once, in version
//! order, by sqlx's migrator; a file changed after it was applied fails the run with its
//! checksum.

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

/// `(version, description, sql)` of every file in `migrations/`, in version order.
const EMBEDDED: &[(i64, &str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// A migration whose file starts with this runs outside a transaction (sqlx's convention).
const NO_TRANSACTION: &str = "-- no-transaction";

/// The migrator over every embedded migration.
pub fn migrator() -> Migrator {
    Migrator::with_migrations(
        EMBEDDED
            .iter()
            .map(|&(version, description, sql)| {
                Migration::new(
                    version,
                    Cow::Borrowed(description),
                    MigrationType::Simple,
                    sql.into_sql_str(),
                    sql.starts_with(NO_TRANSACTION),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_embedded_in_version_order_with_its_name_as_description() {
        let migrator = migrator();
        let migrations: Vec<_> = migrator.iter().collect();
        let mut files: Vec<String> =
            std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
                .expect("the migrations folder reads")
                .map(|entry| {
                    entry
                        .expect("an entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
        files.sort();
        assert_eq!(migrations.len(), files.len());
        for (migration, file) in migrations.iter().zip(&files) {
            let expected = format!(
                "{}_{}.sql",
                migration.version,
                migration.description.replace(' ', "_")
            );
            assert_eq!(&expected, file);
        }
        assert!(
            migrations
                .windows(2)
                .all(|pair| pair[0].version < pair[1].version)
        );
    }
}
