//! CREATE EXTENSION and ALTER EXTENSION UPDATE say so when the server did not preload
//! lockext (no reaper, no statistics, no wait queue: nothing else would tell), with the
//! setting that fixes it; on a server that preloads it they say nothing. (A WARNING: an
//! extension's script runs with client_min_messages at least WARNING, so a NOTICE from it
//! never reaches the client.)

use std::sync::mpsc;

use lockext_cluster_tests::*;
use postgres::error::DbError;

const NOT_PRELOADED: &str = "lockext is not loaded through shared_preload_libraries";

/// The notices and warnings the server sends while `sql` runs.
fn notices(cluster: &Cluster, sql: &str) -> Vec<DbError> {
    let (tx, rx) = mpsc::channel();
    let mut config: postgres::Config = cluster.url("postgres").parse().expect("url");
    config.notice_callback(move |notice| {
        let _ = tx.send(notice);
    });
    let mut c = config.connect(NoTls).expect("connect");
    c.batch_execute(sql).expect(sql);
    drop(c);
    rx.try_iter().collect()
}

/// A fresh install, and an update from the first release.
const INSTALL: &str = "DROP EXTENSION lockext; CREATE EXTENSION lockext";
const UPDATE: &str =
    "DROP EXTENSION lockext; CREATE EXTENSION lockext VERSION '0.1.0'; ALTER EXTENSION lockext UPDATE";

fn preload_warnings(cluster: &Cluster, sql: &str) -> Vec<DbError> {
    notices(cluster, sql)
        .into_iter()
        .filter(|n| n.message() == NOT_PRELOADED)
        .collect()
}

#[test]
fn create_and_update_say_what_is_missing_without_preload() {
    // The last setting wins: this cluster does not preload lockext.
    let cluster = Cluster::start("preload-off", "shared_preload_libraries = ''");
    for sql in [INSTALL, UPDATE] {
        let found = preload_warnings(&cluster, sql);
        assert_eq!(found.len(), 1, "{sql}: one warning, got {found:#?}");
        let n = &found[0];
        assert_eq!(n.severity(), "WARNING");
        let detail = n.detail().unwrap_or_default();
        for missing in ["no reaper runs", "poll", "lockext.stats", "reaper_status"] {
            assert!(
                detail.contains(missing),
                "{sql}: detail names {missing:?}: {detail}"
            );
        }
        let hint = n.hint().unwrap_or_default();
        assert!(
            hint.contains("shared_preload_libraries = 'lockext'") && hint.contains("restart"),
            "{sql}: hint: {hint}"
        );
    }
    // What the warning says is so: no counters, no reaper.
    let mut c = cluster.connect();
    let counters: i64 = c
        .query_one("SELECT count(*) FROM lockext.stats", &[])
        .unwrap()
        .get(0);
    assert_eq!(counters, 0);
    assert_eq!(reaper_pid(&mut c, "postgres"), None);
}

#[test]
fn a_preloading_server_gets_no_warning() {
    let cluster = Cluster::start("preload-on", "");
    for sql in [INSTALL, UPDATE] {
        assert!(
            preload_warnings(&cluster, sql).is_empty(),
            "{sql}: no warning when lockext is preloaded"
        );
    }
}
