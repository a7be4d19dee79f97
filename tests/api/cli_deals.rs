//! The operator CLI can do what the admin API can when creating a deal (waiting room,
//! payment terms), takes negative numbers where they mean something, refuses values that
//! cannot work with a clear message, and prints an error once.

use serde_json::json;

use crate::helpers::{TestDb, delete_redis_keys, test_settings};
use crate::ops_cli::flashgate_cli;
use crate::startup_errors::flashgate;

#[tokio::test]
async fn a_deal_with_a_waiting_room_and_payment_terms_is_created_and_restocked() {
    // Arrange
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let migrated = flashgate_cli(&settings, &["migrate"]).await;
    assert!(migrated.success, "{}", migrated.stderr);

    // Act
    let created = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "queued",
            "--name",
            "Queued deal",
            "--stock",
            "20",
            "--buckets",
            "2",
            "--unit-price-minor",
            "500",
            "--late-payment-policy",
            "manual_review",
            "--capture-method",
            "manual",
            "--waiting-room",
            "--admit-per-second",
            "7",
            "--max-active",
            "30",
            "--pass-ttl-seconds",
            "90",
            "--queue-order",
            "random",
            "--pow-bits",
            "3",
            "--checkout-url",
            "https://shop.example/checkout",
        ],
    )
    .await;
    let delta_after =
        flashgate_cli(&settings, &["deals", "stock", "queued", "--delta", "-5"]).await;
    let delta_before =
        flashgate_cli(&settings, &["deals", "stock", "--delta", "-5", "queued"]).await;
    let equals = flashgate_cli(&settings, &["deals", "stock", "queued", "--delta=-1"]).await;
    let negative_stock = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "neg",
            "--name",
            "Neg",
            "--stock",
            "-5",
            "--unit-price-minor",
            "1",
        ],
    )
    .await;
    let options_without_room = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "x",
            "--name",
            "X",
            "--stock",
            "1",
            "--unit-price-minor",
            "1",
            "--max-active",
            "3",
        ],
    )
    .await;
    let bad_policy = flashgate_cli(
        &settings,
        &[
            "deals",
            "create",
            "--id",
            "y",
            "--name",
            "Y",
            "--stock",
            "1",
            "--unit-price-minor",
            "1",
            "--late-payment-policy",
            "keep",
        ],
    )
    .await;

    // Assert
    assert!(created.success, "{}", created.stderr);
    let deal = created.json();
    assert_eq!(deal["late_payment_policy"], json!("manual_review"));
    assert_eq!(deal["capture_method"], json!("manual"));
    let room = &deal["waiting_room"];
    assert_eq!(room["enabled"], json!(true));
    assert_eq!(room["admit_per_second"], json!(7));
    assert_eq!(room["max_active"], json!(30));
    assert_eq!(room["pass_ttl_seconds"], json!(90));
    assert_eq!(room["queue_order"], json!("random"));
    assert_eq!(room["pow_bits"], json!(3));
    assert_eq!(room["checkout_url"], json!("https://shop.example/checkout"));
    for (run, left) in [(&delta_after, 15), (&delta_before, 10), (&equals, 9)] {
        assert!(run.success, "{}", run.stderr);
        assert_eq!(run.json()["available"], json!(left), "{}", run.stdout);
    }
    assert!(!negative_stock.success);
    assert!(
        negative_stock.stderr.contains("stock must be"),
        "{}",
        negative_stock.stderr
    );
    assert_eq!(
        negative_stock.stderr.lines().count(),
        1,
        "{}",
        negative_stock.stderr
    );
    assert!(!options_without_room.success);
    assert!(
        options_without_room.stderr.contains("--waiting-room"),
        "{}",
        options_without_room.stderr
    );
    assert!(!bad_policy.success);
    assert!(
        bad_policy
            .stderr
            .contains("reserve_or_refund, refund, manual_review"),
        "{}",
        bad_policy.stderr
    );
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}

#[test]
fn a_token_must_live_at_least_a_second() {
    for ttl in ["0", "-5"] {
        let run = flashgate(&["token", "--user", "alice", "--ttl-seconds", ttl], &[]);
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(
            run.stderr.contains("--ttl-seconds") && run.stderr.contains("at least 1"),
            "{}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
    let run = flashgate(&["token", "--user", "alice", "--ttl-seconds", "60"], &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.stdout.matches('.').count(), 2, "a JWT: {}", run.stdout);
}

#[test]
fn create_help_lists_the_payment_terms_to_choose_from() {
    use flashgate::domain::{CaptureMethod, LatePaymentPolicy};

    let run = flashgate(&["deals", "create", "--help"], &[]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let help_of = |option: &str| {
        let start = run
            .stdout
            .find(option)
            .unwrap_or_else(|| panic!("no {option}: {}", run.stdout));
        let rest = &run.stdout[start + option.len()..];
        rest[..rest.find("\n  -").unwrap_or(rest.len())].to_owned()
    };
    let policies: Vec<&str> = LatePaymentPolicy::ALL.map(LatePaymentPolicy::as_str).into();
    let methods: Vec<&str> = CaptureMethod::ALL.map(CaptureMethod::as_str).into();
    for (option, names) in [
        ("--late-payment-policy", policies),
        ("--capture-method", methods),
    ] {
        let help = help_of(option);
        assert!(
            help.contains(&format!("[possible values: {}]", names.join(", "))),
            "{option}: {help}"
        );
    }
}

#[tokio::test]
async fn an_adaptive_waiting_room_is_created_shown_and_put_under_manual_control() {
    // Arrange: an adaptive deal made with the CLI; no gateway runs, so no outflow has been
    // published yet.
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    assert!(flashgate_cli(&settings, &["migrate"]).await.success);
    let adaptive = [
        "deals",
        "create",
        "--id",
        "adaptivecli",
        "--name",
        "Adaptive",
        "--stock",
        "10",
        "--unit-price-minor",
        "1",
        "--waiting-room",
        "--admission",
        "adaptive",
        "--min-per-second",
        "5",
        "--max-per-second",
        "50",
        "--target-p99-ms",
        "250",
    ];

    // Act
    let created = flashgate_cli(&settings, &adaptive).await;
    let shown = flashgate_cli(&settings, &["deals", "show", "adaptivecli"]).await;
    let fixed = flashgate_cli(
        &settings,
        &[
            "deals",
            "admission",
            "adaptivecli",
            "--mode",
            "fixed",
            "--admit-per-second",
            "12",
        ],
    )
    .await;
    let shown_fixed = flashgate_cli(&settings, &["deals", "show", "adaptivecli"]).await;
    let mut inverted = adaptive;
    inverted[3] = "adaptivebad";
    inverted[16] = "4";
    let inverted = flashgate_cli(&settings, &inverted).await;

    // Assert: the terms as given; before its first step the line shows the rate it starts
    // at (the minimum), then the operator's fixed rate.
    assert!(created.success, "{}", created.stderr);
    let admission = &created.json()["waiting_room"]["admission"];
    assert_eq!(admission["mode"], json!("adaptive"));
    assert_eq!(admission["min_per_second"], json!(5));
    assert_eq!(admission["max_per_second"], json!(50));
    assert_eq!(admission["target_p99_ms"], json!(250));
    assert!(shown.success, "{}", shown.stderr);
    assert_eq!(shown.json()["waiting_room"]["mode"], json!("adaptive"));
    assert_eq!(
        shown.json()["waiting_room"]["outflow_per_second"],
        json!(5.0)
    );
    assert!(fixed.success, "{}", fixed.stderr);
    assert_eq!(
        fixed.json()["waiting_room"]["admission"]["mode"],
        json!("fixed")
    );
    assert_eq!(shown_fixed.json()["waiting_room"]["mode"], json!("fixed"));
    assert_eq!(
        shown_fixed.json()["waiting_room"]["outflow_per_second"],
        json!(12.0)
    );
    assert!(!inverted.success);
    assert!(
        inverted.stderr.contains("max_per_second"),
        "{}",
        inverted.stderr
    );
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}

#[tokio::test]
async fn access_codes_are_issued_once_for_an_invitation_only_line() {
    // Arrange
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let migrated = flashgate_cli(&settings, &["migrate"]).await;
    assert!(migrated.success, "{}", migrated.stderr);
    let create = |id: &'static str, codes: bool| {
        let mut args = vec![
            "deals",
            "create",
            "--id",
            id,
            "--name",
            "Invited",
            "--stock",
            "5",
            "--unit-price-minor",
            "100",
            "--waiting-room",
            "--activation",
            "when_busy",
        ];
        if codes {
            args.push("--invitation-codes");
        }
        let settings = settings.clone();
        async move { flashgate_cli(&settings, &args).await }
    };
    let invited = create("invited", true).await;
    let open = create("open", false).await;
    assert!(
        invited.success && open.success,
        "{}{}",
        invited.stderr,
        open.stderr
    );

    // Act
    let issued = flashgate_cli(
        &settings,
        &["deals", "access-codes", "invited", "--count", "4"],
    )
    .await;
    let refused = flashgate_cli(
        &settings,
        &["deals", "access-codes", "open", "--count", "4"],
    )
    .await;
    let too_many = flashgate_cli(
        &settings,
        &["deals", "access-codes", "invited", "--count", "100000"],
    )
    .await;

    // Assert
    assert!(issued.success, "{}", issued.stderr);
    let body = issued.json();
    assert_eq!(
        body["codes"].as_array().map(Vec::len),
        Some(4),
        "{}",
        issued.stdout
    );
    assert_eq!(
        (body["issued"].clone(), body["redeemed"].clone()),
        (json!(4), json!(0))
    );
    assert_eq!(invited.json()["waiting_room"]["activation"], "when_busy");
    assert_eq!(invited.json()["waiting_room"]["invitation"]["codes"], true);
    assert!(!refused.success && refused.stderr.contains("takes no access codes"));
    assert!(!too_many.success && too_many.stderr.contains("count must be"));
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}

#[tokio::test]
async fn a_priority_group_is_created_from_flags_and_its_codes_issued() {
    // Arrange
    let database = TestDb::create().await;
    let settings = test_settings(&database.url);
    let migrated = flashgate_cli(&settings, &["migrate"]).await;
    assert!(migrated.success, "{}", migrated.stderr);
    let create = |id: &'static str, priority: &[&'static str]| {
        let mut args = vec![
            "deals",
            "create",
            "--id",
            id,
            "--name",
            "Members first",
            "--stock",
            "5",
            "--unit-price-minor",
            "100",
            "--waiting-room",
        ];
        args.extend_from_slice(priority);
        let settings = settings.clone();
        async move { flashgate_cli(&settings, &args).await }
    };

    // Act
    let by_claim = create(
        "members",
        &[
            "--priority-share-percent",
            "30",
            "--priority-claim",
            "tier",
            "--priority-value",
            "member",
        ],
    )
    .await;
    let by_code = create(
        "coded",
        &["--priority-share-percent", "40", "--priority-codes"],
    )
    .await;
    let no_share = create("noshare", &["--priority-codes"]).await;
    let out_of_bounds = create(
        "toomuch",
        &["--priority-share-percent", "100", "--priority-codes"],
    )
    .await;
    let issued = flashgate_cli(
        &settings,
        &["deals", "access-codes", "coded", "--count", "2"],
    )
    .await;

    // Assert
    assert!(by_claim.success, "{}", by_claim.stderr);
    let expected =
        json!({"claim": "tier", "values": ["member"], "codes": false, "share_percent": 30});
    assert_eq!(by_claim.json()["waiting_room"]["priority"], expected);
    assert!(by_code.success, "{}", by_code.stderr);
    assert_eq!(by_code.json()["waiting_room"]["priority"]["codes"], true);
    assert!(!no_share.success && no_share.stderr.contains("--priority-share-percent"));
    assert!(!out_of_bounds.success && out_of_bounds.stderr.contains("share_percent must be 1-99"));
    assert!(issued.success, "{}", issued.stderr);
    assert_eq!(issued.json()["codes"].as_array().map(Vec::len), Some(2));
    delete_redis_keys(&settings.redis.url, &settings.redis.key_prefix).await;
    database.drop_database().await;
}
