//! Rebuilds the library when a migration is added, renamed or changed: `sqlx::migrate!`
//! embeds the `migrations/` folder at compile time, and cargo would not notice otherwise.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
