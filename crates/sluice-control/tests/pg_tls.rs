//! `sslmode` to PostgreSQL over rustls, against a server of the test's own with `ssl = on`
//! and a certificate made at test time (the shared server is never reconfigured).

use sluice_control::db;
use sluice_testkit::{PgServer, TestPki};
use std::time::Duration;

async fn ssl_in_use(url: &str) -> Result<bool, db::DbError> {
    let cfg = db::config(url, Duration::from_secs(5), "sluice-test")?;
    let client = db::connect(&cfg).await?;
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_and_verify_full_encrypt_and_a_wrong_root_is_refused() {
    let pki = TestPki::new().expect("test certificates");
    let server = PgServer::start_tls(&pki)
        .unwrap_or_else(|e| panic!("this test starts its own PostgreSQL server: {e:#}"));

    assert!(
        ssl_in_use(&server.url("sslmode=require"))
            .await
            .expect("sslmode=require"),
        "sslmode=require runs over TLS"
    );
    let ca = pki.ca_file().display().to_string();
    assert!(
        ssl_in_use(&server.url(&format!("sslmode=verify-full&sslrootcert={ca}")))
            .await
            .expect("verify-full with the right root")
    );
    assert!(
        ssl_in_use(&server.url(&format!("sslmode=verify-ca&sslrootcert={ca}")))
            .await
            .expect("verify-ca with the right root")
    );
    assert!(
        !ssl_in_use(&server.url("sslmode=disable"))
            .await
            .expect("disable"),
        "sslmode=disable stays plain"
    );

    let other = TestPki::new().expect("another CA");
    let wrong = other.ca_file().display().to_string();
    let err = ssl_in_use(&server.url(&format!("sslmode=verify-full&sslrootcert={wrong}")))
        .await
        .expect_err("a server certificate from another CA");
    assert!(
        format!("{err}").to_lowercase().contains("certificate"),
        "{err}"
    );
    let err = ssl_in_use(&server.url(&format!("sslmode=verify-ca&sslrootcert={wrong}")))
        .await
        .expect_err("verify-ca checks the chain too");
    assert!(
        format!("{err}").to_lowercase().contains("certificate"),
        "{err}"
    );
}
