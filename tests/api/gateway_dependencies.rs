//! Test tools live beside the product: the gateway (the `flashgate` package, library and
//! binary) does not depend on the payment-provider simulator, directly or through another
//! workspace crate. Only its tests may, as a dev-dependency.

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use crate::helpers::crate_root;

const GATEWAY: &str = "flashgate";
const SIMULATOR: &str = "flashgate-psp-sim";

/// The workspace's packages, as `cargo metadata` describes them.
fn workspace_packages() -> Vec<Value> {
    let output = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(crate_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");
    metadata["packages"].as_array().cloned().unwrap_or_default()
}

/// The workspace packages `package` builds into its library and binaries: its normal and
/// build dependencies, followed through the workspace.
fn linked_workspace_packages(packages: &[Value], package: &str) -> BTreeSet<String> {
    let mut linked = BTreeSet::new();
    let mut next = vec![package.to_owned()];
    while let Some(name) = next.pop() {
        let Some(found) = packages.iter().find(|p| p["name"] == name.as_str()) else {
            continue;
        };
        let dependencies = found["dependencies"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for dependency in dependencies {
            let dev_only = dependency["kind"] == "dev";
            let dep_name = dependency["name"].as_str().unwrap_or_default().to_owned();
            if !dev_only && linked.insert(dep_name.clone()) {
                next.push(dep_name);
            }
        }
    }
    linked
}

#[test]
fn the_gateway_does_not_link_the_payment_simulator() {
    // Arrange
    let packages = workspace_packages();
    assert!(
        packages.iter().any(|p| p["name"] == SIMULATOR),
        "the simulator is a workspace package"
    );

    // Act
    let linked = linked_workspace_packages(&packages, GATEWAY);

    // Assert
    assert!(
        linked.contains("sqlx"),
        "the walk found the gateway's dependencies: {linked:?}"
    );
    assert!(
        !linked.contains(SIMULATOR),
        "{GATEWAY} depends on {SIMULATOR} outside [dev-dependencies]; the simulator is a \
         test tool with a binary of its own"
    );
}
