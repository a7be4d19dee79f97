//! `flashgate migrate` says which migrations it applied, or that none was pending, and a
//! second start is quiet: no notice about the bookkeeping table it already has.

use crate::helpers::TestDb;
use crate::startup_errors::flashgate;

#[tokio::test]
async fn migrate_lists_what_it_applied_and_then_that_nothing_was_pending() {
    // Arrange
    let database = TestDb::create_empty().await;
    let env = [("DATABASE_URL", database.url.as_str())];

    // Act
    let first = flashgate(&["migrate"], &env);
    let second = flashgate(&["migrate"], &env);

    // Assert
    assert_eq!(first.code, Some(0), "{}", first.stderr);
    let applied: Vec<&str> = first.stdout.lines().collect();
    assert!(
        applied.len() > 1 && applied.iter().all(|l| l.starts_with("applied migration 2")),
        "{}",
        first.stdout
    );
    assert!(first.stdout.contains("core"), "{}", first.stdout);
    assert_eq!(second.code, Some(0), "{}", second.stderr);
    assert_eq!(
        second.stdout.trim(),
        "no migrations pending; the schema is up to date"
    );
    for run in [&first, &second] {
        assert!(
            !run.stderr.contains("_sqlx_migrations"),
            "PostgreSQL notice logged: {}",
            run.stderr
        );
    }
    database.drop_database().await;
}
