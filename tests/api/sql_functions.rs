//! One findable text per SQL function: `sql/functions/NAME.sql` holds the current definition
//! of every function the migrations create (see `sql/README.md`), and PostgreSQL runs
//! exactly that text after all migrations. Each file is run against a freshly migrated
//! database inside a transaction that is rolled back; PostgreSQL's own rendering of each
//! function (`pg_get_functiondef`: arguments, result, settings, body) must come out as it
//! was, and the file must have replaced exactly the functions of its name.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection};

use crate::helpers::{TestDb, crate_root, test_settings};

/// The functions of the migrated schema, leaving out PostgreSQL's own and extensions'.
const FUNCTIONS: &str = "\
    SELECT p.oid::regprocedure::text, p.proname::text, p.xmin::text, pg_get_functiondef(p.oid)
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname <> 'information_schema' AND n.nspname NOT LIKE 'pg\\_%'
       AND p.prokind IN ('f', 'p')
       AND NOT EXISTS (SELECT 1 FROM pg_depend d
                        WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                          AND d.deptype = 'e')";

/// A function as PostgreSQL holds it.
struct Held {
    name: String,
    /// The catalog row's version (`xmin`): a `CREATE OR REPLACE` changes it even when the
    /// definition stays the same, which shows which functions a file defined.
    row_version: String,
    definition: String,
}

/// Every function, by signature (`name(argument types)`).
async fn functions(conn: &mut PgConnection) -> BTreeMap<String, Held> {
    let rows: Vec<(String, String, String, String)> = sqlx::query_as(FUNCTIONS)
        .fetch_all(conn)
        .await
        .expect("list the functions");
    rows.into_iter()
        .map(|(signature, name, row_version, definition)| {
            let held = Held {
                name,
                row_version,
                definition,
            };
            (signature, held)
        })
        .collect()
}

/// `sql/functions/*.sql` by file stem; none when the directory is missing.
fn function_files() -> BTreeMap<String, String> {
    let dir = crate_root().join("sql/functions");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return BTreeMap::new();
    };
    let mut files = BTreeMap::new();
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "sql") {
            let stem = path.file_stem().expect("a file name").to_string_lossy();
            let text = std::fs::read_to_string(&path).expect("read a function's file");
            files.insert(stem.into_owned(), text);
        }
    }
    files
}

/// A function without a file, and a file without a function.
fn unmatched(held: &BTreeMap<String, Held>, files: &BTreeMap<String, String>) -> Vec<String> {
    let in_database: BTreeSet<&str> = held.values().map(|f| f.name.as_str()).collect();
    let mut problems = Vec::new();
    for name in &in_database {
        if !files.contains_key(*name) {
            problems.push(format!(
                "function {name} exists after the migrations but sql/functions/{name}.sql does not"
            ));
        }
    }
    for name in files.keys() {
        if !in_database.contains(name.as_str()) {
            problems.push(format!(
                "sql/functions/{name}.sql names no function the migrations create"
            ));
        }
    }
    problems
}

/// Runs the file `name` in a savepoint, compares, and undoes it.
async fn check_file(
    conn: &mut PgConnection,
    held: &BTreeMap<String, Held>,
    name: &str,
    text: &str,
) -> Vec<String> {
    conn.execute("SAVEPOINT file").await.expect("savepoint");
    let ran = conn.execute(sqlx::raw_sql(AssertSqlSafe(text))).await;
    let after = if ran.is_ok() {
        functions(conn).await
    } else {
        BTreeMap::new()
    };
    conn.execute("ROLLBACK TO SAVEPOINT file")
        .await
        .expect("roll back to the savepoint");
    match ran {
        Err(error) => vec![format!(
            "sql/functions/{name}.sql does not run against the migrated database: {error}"
        )],
        Ok(_) => compare(held, &after, name),
    }
}

fn compare(
    held: &BTreeMap<String, Held>,
    after: &BTreeMap<String, Held>,
    file: &str,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (signature, now) in after {
        let Some(was) = held.get(signature) else {
            problems.push(format!(
                "sql/functions/{file}.sql creates {signature}, which the migrations do not"
            ));
            continue;
        };
        if was.definition != now.definition {
            problems.push(format!(
                "function {}: the definition after the migrations differs from \
                 sql/functions/{file}.sql ({signature})\n{}",
                now.name,
                first_difference(&was.definition, &now.definition)
            ));
        }
        let replaced = was.row_version != now.row_version;
        if replaced && now.name != file {
            problems.push(format!(
                "sql/functions/{file}.sql defines {signature}: it belongs in sql/functions/{}.sql",
                now.name
            ));
        }
        if !replaced && now.name == file {
            problems.push(format!(
                "sql/functions/{file}.sql does not define {signature}"
            ));
        }
    }
    problems
}

/// The first line where the migrated definition and the file's differ.
fn first_difference(migrated: &str, file: &str) -> String {
    let mut migrated_lines = migrated.lines();
    let mut file_lines = file.lines();
    for n in 1.. {
        let (a, b) = (migrated_lines.next(), file_lines.next());
        if a != b {
            return format!(
                "  line {n} of the definition\n  migrations: {}\n  file:       {}",
                a.unwrap_or("(end)"),
                b.unwrap_or("(end)")
            );
        }
        if a.is_none() {
            break;
        }
    }
    "  (the definitions differ only in line endings)".to_owned()
}

#[tokio::test]
async fn every_sql_function_is_the_text_of_its_file() {
    // Arrange
    let database = TestDb::create().await;
    flashgate::store::migrate(&test_settings(&database.url).database)
        .await
        .expect("migrate a fresh database");
    let mut conn = PgConnection::connect(&database.url)
        .await
        .expect("connect to the test database");
    let mut tx = conn.begin().await.expect("begin");
    let held = functions(&mut tx).await;
    let files = function_files();

    // Act
    let mut problems = unmatched(&held, &files);
    for (name, text) in &files {
        problems.extend(check_file(&mut tx, &held, name, text).await);
    }
    tx.rollback().await.expect("roll back");
    let _ = conn.close().await;
    database.drop_database().await;

    // Assert
    assert!(
        problems.is_empty(),
        "SQL functions and sql/functions/ disagree (see sql/README.md):\n{}",
        problems.join("\n")
    );
}
