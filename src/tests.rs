//! In-backend tests of the SQL interface. Each runs in a transaction that is rolled back, so
//! nothing here sees another session or the reaper: those live in tests/cluster.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    fn one<T: pgrx::IntoDatum + pgrx::FromDatum>(sql: &str) -> Option<T> {
        Spi::get_one::<T>(sql).expect("query failed")
    }

    fn token_of(lock_id: &str, owner: &str, ttl: &str) -> Option<i64> {
        one(&format!(
            "SELECT (lockext.lock_acquire('{lock_id}', '{owner}', '{ttl}')).fence_token"
        ))
    }

    fn expiry_of(lock_id: &str) -> Option<TimestampWithTimeZone> {
        one(&format!(
            "SELECT expires_at FROM lockext.locks WHERE lock_id = '{lock_id}'"
        ))
    }

    fn sleep_ms(ms: u32) {
        Spi::run(&format!("SELECT pg_sleep({})", f64::from(ms) / 1000.0)).expect("pg_sleep");
    }

    /// The SQLSTATE a statement raises, or "00000"; run in a subtransaction so the test's own
    /// transaction survives the error.
    fn sqlstate_of(sql: &str) -> String {
        Spi::run(
            "CREATE OR REPLACE FUNCTION pg_temp.sqlstate_of(q text) RETURNS text LANGUAGE plpgsql AS \
             $f$ BEGIN EXECUTE q; RETURN '00000'; EXCEPTION WHEN OTHERS THEN RETURN SQLSTATE; END $f$",
        )
        .expect("create helper");
        let quoted = sql.replace('\'', "''");
        one::<String>(&format!("SELECT pg_temp.sqlstate_of('{quoted}')")).expect("sqlstate")
    }

    fn rows(table: &str) -> i64 {
        one(&format!("SELECT count(*) FROM lockext.{table}")).expect("count")
    }

    #[pg_test]
    fn acquire_free_lock_grants_a_positive_token() {
        let token = token_of("job@acquire_free_lock_gr", "w1", "30 seconds")
            .expect("a free lock is granted");
        assert!(token > 0);
        let ok: bool = one("SELECT l.owner = 'w1' AND l.expires_at > l.acquired_at \
                AND l.expires_at <= clock_timestamp() + interval '30 seconds' \
               FROM lockext.locks l WHERE lock_id = 'job@acquire_free_lock_gr'")
        .unwrap();
        assert!(ok);
    }

    #[pg_test]
    fn acquire_returns_grant_columns() {
        let ok: bool = one(
            "SELECT g.lock_id = 'cols@acquire_returns_gran' AND g.owner = 'me' AND g.fence_token > 0 \
                AND g.expires_at - g.acquired_at = interval '5 seconds' \
               FROM lockext.lock_acquire('cols@acquire_returns_gran', 'me', '5 seconds') g",
        )
        .unwrap();
        assert!(ok);
    }

    #[pg_test]
    fn live_lease_refuses_other_owner() {
        assert!(token_of("job@live_lease_refuses_o", "w1", "30 seconds").is_some());
        assert_eq!(
            token_of("job@live_lease_refuses_o", "w2", "30 seconds"),
            None
        );
        let is_null: bool = one(
            "SELECT lockext.lock_acquire('job@live_lease_refuses_o', 'w2', '1 minute') IS NULL",
        )
        .unwrap();
        assert!(is_null);
    }

    #[pg_test]
    fn same_owner_again_gets_same_grant_with_new_expiry() {
        let first = token_of("job@same_owner_again_get", "w1", "1 second").unwrap();
        let before = expiry_of("job@same_owner_again_get").unwrap();
        let second = token_of("job@same_owner_again_get", "w1", "1 minute").unwrap();
        assert_eq!(first, second);
        assert!(expiry_of("job@same_owner_again_get").unwrap() > before);
    }

    #[pg_test]
    fn tokens_strictly_increase_across_locks() {
        let a = token_of("a@tokens_strictly_incr", "w", "1 minute").unwrap();
        let b = token_of("b@tokens_strictly_incr", "w", "1 minute").unwrap();
        let c = token_of("c@tokens_strictly_incr", "w", "1 minute").unwrap();
        assert!(a < b && b < c);
    }

    #[pg_test]
    fn expired_lease_is_taken_over_in_place_with_higher_token() {
        let old = token_of("job@expired_lease_is_tak", "w1", "10 milliseconds").unwrap();
        sleep_ms(30);
        let new = token_of("job@expired_lease_is_tak", "w2", "1 minute")
            .expect("an expired lease is free");
        assert!(new > old);
        assert_eq!(rows("locks"), 1);
        let owner: String =
            one("SELECT owner FROM lockext.locks WHERE lock_id = 'job@expired_lease_is_tak'")
                .unwrap();
        assert_eq!(owner, "w2");
    }

    #[pg_test]
    fn same_owner_after_expiry_gets_a_new_token() {
        let old = token_of("job@same_owner_after_exp", "w1", "10 milliseconds").unwrap();
        sleep_ms(30);
        let new = token_of("job@same_owner_after_exp", "w1", "1 minute").unwrap();
        assert!(
            new > old,
            "an expired grant is over; a new one needs a new token"
        );
    }

    /// The article's scenario: A pauses past its lease, B takes the lock and writes, A wakes.
    #[pg_test]
    fn paused_holder_is_fenced_off() {
        let a = token_of("ledger@paused_holder_is_fen", "A", "20 milliseconds").unwrap();
        assert!(one::<bool>(&format!(
            "SELECT lockext.fenced_update('acct', {a}, '{{\"by\":\"A\"}}')"
        ))
        .unwrap());
        sleep_ms(50); // A's "GC pause"
        let b = token_of("ledger@paused_holder_is_fen", "B", "1 minute")
            .expect("B gets the expired lock");
        assert!(b > a);
        assert!(one::<bool>(&format!(
            "SELECT lockext.fenced_update('acct', {b}, '{{\"by\":\"B\"}}')"
        ))
        .unwrap());
        // A wakes up believing it holds the lock.
        assert!(!one::<bool>(&format!(
            "SELECT lockext.fenced_update('acct', {a}, '{{\"by\":\"A\"}}')"
        ))
        .unwrap());
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('ledger@paused_holder_is_fen', 'A', '1 minute') IS NULL"
        )
        .unwrap());
        assert!(
            !one::<bool>("SELECT lockext.lock_release('ledger@paused_holder_is_fen', 'A')")
                .unwrap()
        );
        let by: String =
            one("SELECT data->>'by' FROM lockext.resources WHERE resource_id = 'acct'").unwrap();
        assert_eq!(by, "B");
        let holder: String =
            one("SELECT owner FROM lockext.locks WHERE lock_id = 'ledger@paused_holder_is_fen'")
                .unwrap();
        assert_eq!(holder, "B");
    }

    #[pg_test]
    fn renew_extends_a_live_lease() {
        token_of("job@renew_extends_a_live", "w1", "1 second").unwrap();
        let before = expiry_of("job@renew_extends_a_live").unwrap();
        let renewed: TimestampWithTimeZone =
            one("SELECT lockext.lock_renew('job@renew_extends_a_live', 'w1', '1 minute')")
                .expect("live lease renews");
        assert!(renewed > before);
        assert_eq!(expiry_of("job@renew_extends_a_live").unwrap(), renewed);
    }

    #[pg_test]
    fn renew_of_expired_lease_fails() {
        token_of("job@renew_of_expired_lea", "w1", "10 milliseconds").unwrap();
        sleep_ms(30);
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('job@renew_of_expired_lea', 'w1', '1 minute') IS NULL"
        )
        .unwrap());
    }

    #[pg_test]
    fn renew_checks_owner_and_token() {
        let t = token_of("job@renew_checks_owner_a", "w1", "1 minute").unwrap();
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('job@renew_checks_owner_a', 'w2', '1 minute') IS NULL"
        )
        .unwrap());
        assert!(one::<bool>(&format!(
            "SELECT lockext.lock_renew('job@renew_checks_owner_a', 'w1', '1 minute', {}) IS NULL",
            t + 1
        ))
        .unwrap());
        assert!(one::<bool>(&format!("SELECT lockext.lock_renew('job@renew_checks_owner_a', 'w1', '1 minute', {t}) IS NOT NULL")).unwrap());
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('nope@renew_checks_owner_a', 'w1', '1 minute') IS NULL"
        )
        .unwrap());
    }

    #[pg_test]
    fn release_frees_the_lock() {
        token_of("job@release_frees_the_lo", "w1", "1 minute").unwrap();
        assert!(
            one::<bool>("SELECT lockext.lock_release('job@release_frees_the_lo', 'w1')").unwrap()
        );
        assert_eq!(rows("locks"), 0);
        assert!(token_of("job@release_frees_the_lo", "w2", "1 minute").is_some());
    }

    #[pg_test]
    fn release_checks_owner_and_token() {
        let t = token_of("job@release_checks_owner", "w1", "1 minute").unwrap();
        assert!(
            !one::<bool>("SELECT lockext.lock_release('job@release_checks_owner', 'w2')").unwrap()
        );
        assert!(!one::<bool>(&format!(
            "SELECT lockext.lock_release('job@release_checks_owner', 'w1', {})",
            t + 1
        ))
        .unwrap());
        assert_eq!(rows("locks"), 1);
        assert!(one::<bool>(&format!(
            "SELECT lockext.lock_release('job@release_checks_owner', 'w1', {t})"
        ))
        .unwrap());
        assert!(
            !one::<bool>("SELECT lockext.lock_release('job@release_checks_owner', 'w1')").unwrap(),
            "released twice"
        );
    }

    #[pg_test]
    fn release_of_expired_lease_reports_false_and_cleans_up() {
        token_of("job@release_of_expired_l", "w1", "10 milliseconds").unwrap();
        sleep_ms(30);
        assert!(
            !one::<bool>("SELECT lockext.lock_release('job@release_of_expired_l', 'w1')").unwrap()
        );
        assert_eq!(rows("locks"), 0);
    }

    #[pg_test]
    fn fenced_update_accepts_equal_and_higher_rejects_lower() {
        let t1 = token_of("l1@fenced_update_accept", "w", "1 minute").unwrap();
        let t2 = token_of("l2@fenced_update_accept", "w", "1 minute").unwrap();
        let write = |t: i64, v: i32| -> bool {
            one(&format!(
                "SELECT lockext.fenced_update('r', {t}, '{{\"v\":{v}}}')"
            ))
            .unwrap()
        };
        assert!(write(t1, 1), "first write creates the resource");
        assert!(write(t1, 2), "the same grant writes again");
        assert!(write(t2, 3), "a newer grant writes");
        assert!(!write(t1, 4), "an older grant is rejected");
        let (token, v): (Option<i64>, Option<i32>) = Spi::get_two(
            "SELECT fence_token, (data->>'v')::int FROM lockext.resources WHERE resource_id = 'r'",
        )
        .unwrap();
        assert_eq!((token, v), (Some(t2), Some(3)));
    }

    #[pg_test]
    fn fenced_update_refuses_forged_token() {
        let t = token_of("l@fenced_update_refuse", "w", "1 minute").unwrap();
        assert_eq!(
            sqlstate_of(&format!(
                "SELECT lockext.fenced_update('r', {}, '{{}}')",
                t + 1000
            )),
            "22023"
        );
        assert_eq!(rows("resources"), 0);
    }

    #[pg_test]
    fn reap_batch_ends_an_expired_keepalive_then_its_leases_then_its_row() {
        let k: i64 = one("SELECT keepalive FROM lockext.lock_keepalive_grant('1 minute')").unwrap();
        let live: i64 =
            one("SELECT keepalive FROM lockext.lock_keepalive_grant('1 minute')").unwrap();
        for (lock_id, of) in [
            ("a@reap_keepalive", k),
            ("b@reap_keepalive", k),
            ("c@reap_keepalive", live),
        ] {
            assert!(one::<bool>(&format!(
                "SELECT lockext.lock_acquire('{lock_id}', 'w', NULL, keepalive => {of}) IS NOT NULL"
            ))
            .unwrap());
        }
        assert!(one::<bool>(&format!(
            "SELECT lockext.lock_acquire('d@reap_keepalive', 'w', NULL, mode => 'shared', \
                                         keepalive => {k}) IS NOT NULL"
        ))
        .unwrap());
        // A live keep-alive's leases are left alone, whatever their own (infinite) expiry.
        assert_eq!(crate::reaper::reap_batch(10, false).unwrap(), (0, false));
        Spi::run(&format!(
            "UPDATE lockext.keepalives SET expires_at = clock_timestamp() - interval '1 second' \
              WHERE keepalive = {k}"
        ))
        .unwrap();
        // One batch: the keep-alive is ended, its three leases deleted, then its row.
        assert_eq!(crate::reaper::reap_batch(10, false).unwrap(), (3, false));
        let left: String = one("SELECT string_agg(lock_id, ',') FROM lockext.locks").unwrap();
        assert_eq!(left, "c@reap_keepalive");
        assert_eq!(rows("shared_leases"), 0);
        let keepalives: i64 = one("SELECT count(*) FROM lockext.keepalives").unwrap();
        assert_eq!(
            keepalives, 1,
            "the live keep-alive stays, the expired one is gone"
        );
    }

    #[pg_test]
    fn reap_batch_deletes_only_expired_leases() {
        token_of("dead1@reap_batch_deletes_o", "w", "10 milliseconds").unwrap();
        token_of("dead2@reap_batch_deletes_o", "w", "10 milliseconds").unwrap();
        token_of("dead3@reap_batch_deletes_o", "w", "10 milliseconds").unwrap();
        token_of("live@reap_batch_deletes_o", "w", "1 minute").unwrap();
        assert!(one::<bool>(
            "SELECT lockext.lock_acquire('read@reap_batch_deletes_o', 'r', '10 milliseconds', \
                                         mode => 'shared') IS NOT NULL"
        )
        .unwrap());
        sleep_ms(30);
        assert_eq!(
            crate::reaper::reap_batch(2, false).unwrap(),
            (3, true),
            "a batch is bounded for each kind of lease"
        );
        assert_eq!(crate::reaper::reap_batch(2, false).unwrap(), (1, false));
        assert_eq!(crate::reaper::reap_batch(2, false).unwrap(), (0, false));
        let left: String = one("SELECT string_agg(lock_id, ',') FROM lockext.locks").unwrap();
        assert_eq!(left, "live@reap_batch_deletes_o");
        assert_eq!(rows("shared_leases"), 0);
    }

    #[pg_test]
    fn reap_batch_spares_a_lease_renewed_before_expiry() {
        token_of("job@reap_batch_spares_a_", "w", "40 milliseconds").unwrap();
        sleep_ms(20);
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('job@reap_batch_spares_a_', 'w', '1 minute') IS NOT NULL"
        )
        .unwrap());
        sleep_ms(40);
        assert_eq!(crate::reaper::reap_batch(100, false).unwrap(), (0, false));
        assert_eq!(rows("locks"), 1);
    }

    #[pg_test]
    fn bad_input_raises_documented_sqlstates_and_writes_nothing() {
        let long = "x".repeat(257);
        let cases: Vec<(String, &str)> = vec![
            (
                "SELECT lockext.lock_acquire(NULL, 'o', '1s')".into(),
                "22004",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', NULL, '1s')".into(),
                "22004",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', 'o', NULL)".into(),
                "22004",
            ),
            ("SELECT lockext.lock_acquire('', 'o', '1s')".into(), "22023"),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', '', '1s')".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', 'o', '0s')".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', 'o', '-1s')".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', 'o', '1 day 1 second')"
                    .into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_acquire('l@bad_input_raises_doc', 'o', '1 month')".into(),
                "22023",
            ),
            (
                format!("SELECT lockext.lock_acquire('{long}', 'o', '1s')"),
                "22001",
            ),
            (
                format!("SELECT lockext.lock_acquire('l@bad_input_raises_doc', '{long}', '1s')"),
                "22001",
            ),
            ("SELECT lockext.lock_renew(NULL, 'o', '1s')".into(), "22004"),
            (
                "SELECT lockext.lock_renew('l@bad_input_raises_doc', 'o', '0s')".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_renew('l@bad_input_raises_doc', 'o', '1s', 0)".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_renew('l@bad_input_raises_doc', 'o', '1s', -5)".into(),
                "22023",
            ),
            (
                "SELECT lockext.lock_release('l@bad_input_raises_doc', NULL)".into(),
                "22004",
            ),
            ("SELECT lockext.lock_release('', 'o')".into(), "22023"),
            (
                "SELECT lockext.lock_release('l@bad_input_raises_doc', 'o', 0)".into(),
                "22023",
            ),
            (
                "SELECT lockext.fenced_update(NULL, 1, '{}')".into(),
                "22004",
            ),
            (
                "SELECT lockext.fenced_update('r', NULL, '{}')".into(),
                "22004",
            ),
            ("SELECT lockext.fenced_update('r', 1, NULL)".into(), "22004"),
            ("SELECT lockext.fenced_update('', 1, '{}')".into(), "22023"),
            ("SELECT lockext.fenced_update('r', 0, '{}')".into(), "22023"),
            (
                format!("SELECT lockext.fenced_update('{long}', 1, '{{}}')"),
                "22001",
            ),
        ];
        for (sql, want) in cases {
            assert_eq!(sqlstate_of(&sql), want, "{sql}");
        }
        assert_eq!(rows("locks"), 0);
        assert_eq!(rows("resources"), 0);
    }

    #[pg_test]
    fn ttl_of_exactly_one_day_is_accepted() {
        assert!(token_of("long@ttl_of_exactly_one_d", "w", "1 day").is_some());
        assert!(token_of("long2@ttl_of_exactly_one_d", "w", "24 hours").is_some());
    }

    // That a grant commits durably whatever synchronous_commit says at commit is decided at
    // pre-commit, which a rolled-back test never reaches: tests/cluster/tests/tokens.rs
    // checks it with a crash.

    #[pg_test]
    fn tables_are_not_writable_by_ordinary_roles() {
        Spi::run("CREATE ROLE lockext_test_app IN ROLE lockext_user").unwrap();
        Spi::run("SET LOCAL ROLE lockext_test_app").unwrap();
        assert_eq!(
            sqlstate_of("INSERT INTO lockext.resources VALUES ('r', 999999, '{}', now())"),
            "42501"
        );
        assert_eq!(sqlstate_of("DELETE FROM lockext.locks"), "42501");
        assert!(
            token_of("job@tables_are_not_writa", "app", "1 minute").is_some(),
            "the functions still work"
        );
    }

    #[pg_test]
    fn functions_need_lockext_user() {
        Spi::run("CREATE ROLE lockext_test_outsider").unwrap();
        Spi::run("SET LOCAL ROLE lockext_test_outsider").unwrap();
        assert_eq!(
            sqlstate_of("SELECT lockext.lock_acquire('job@functions_need_locke', 'x', '1 minute')"),
            "42501"
        );
        assert_eq!(
            sqlstate_of("SELECT lockext.fenced_update('r', 1, '{}')"),
            "42501"
        );
    }

    #[pg_test]
    fn only_the_granting_role_or_an_admin_renews_and_releases() {
        Spi::run("CREATE ROLE lockext_test_a IN ROLE lockext_user").unwrap();
        Spi::run("CREATE ROLE lockext_test_b IN ROLE lockext_user").unwrap();
        Spi::run("CREATE ROLE lockext_test_ops IN ROLE lockext_admin").unwrap();
        Spi::run("SET LOCAL ROLE lockext_test_a").unwrap();
        token_of("job@only_the_granting_ro", "w1", "1 minute").unwrap();
        Spi::run("SET LOCAL ROLE lockext_test_b").unwrap();
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('job@only_the_granting_ro', 'w1', '1 minute') IS NULL"
        )
        .unwrap());
        assert!(
            !one::<bool>("SELECT lockext.lock_release('job@only_the_granting_ro', 'w1')").unwrap()
        );
        assert_eq!(
            token_of("job@only_the_granting_ro", "w1", "1 minute"),
            None,
            "same owner string, other role"
        );
        Spi::run("SET LOCAL ROLE lockext_test_ops").unwrap();
        assert!(one::<bool>(
            "SELECT lockext.lock_renew('job@only_the_granting_ro', 'w1', '1 minute') IS NOT NULL"
        )
        .unwrap());
        assert!(
            one::<bool>("SELECT lockext.lock_release('job@only_the_granting_ro', 'w1')").unwrap()
        );
    }

    #[pg_test]
    fn tokens_fit_in_a_double_and_carry_the_era_in_force() {
        use crate::ledger::{Layout, MAX_SAFE_TOKEN};
        let t = token_of("job@tokens_fit_in_a_double", "w", "1 minute").unwrap();
        let u = token_of("job@tokens_fit_in_a_double-2", "w", "1 minute").unwrap();
        assert!(
            0 < t && t < u && u <= MAX_SAFE_TOKEN,
            "{t} < {u} <= 2^53 - 1"
        );
        let (layout, era, counter): (Option<i32>, Option<i32>, Option<i64>) = Spi::get_three(
            &format!("SELECT layout, era, counter FROM lockext.token_parts({t})"),
        )
        .unwrap();
        assert_eq!(layout, Some(2));
        assert_eq!(i64::from(era.unwrap()) << 41 | counter.unwrap(), t);
        let recorded: Option<i64> = one("SELECT (SELECT epoch::bigint FROM lockext.token_epoch)");
        // Recorded by this transaction, or by a concurrent test's that is still open.
        if let Some(recorded) = recorded {
            assert_eq!(recorded, i64::from(era.unwrap()));
        }
        let timeline: i64 = one("SELECT timeline_id::bigint FROM pg_control_checkpoint()").unwrap();
        assert!(i64::from(era.unwrap()) >= Layout::Safe.floor(timeline as u32));
    }

    #[pg_test]
    fn adopting_evidence_raises_the_ledger_above_it() {
        use crate::ledger::State;
        use crate::token::{wanted, Evidence, Layout, Row};
        const US: u64 = 7;
        const THEM: u64 = 8;
        let safe = |base, reserved, timeline| State {
            layout: Layout::Safe.code(),
            base,
            reserved,
            timeline,
        };
        let row = |era, layout, system| Evidence {
            row: Some(Row {
                era,
                layout,
                own: false,
                system,
            }),
            highest_kept: None,
        };
        let kept = |token| Evidence {
            row: None,
            highest_kept: Some(token),
        };
        let none = Evidence::default();
        let fresh = State::default();
        // A fresh cluster and a database with no history: nothing to raise; the first token
        // then is era 0 (timeline 1), counter 1.
        assert_eq!(wanted(&none, fresh, 1, US), None);
        // A row this cluster wrote under its ledger: nothing, even on a later timeline.
        let ledger = safe(0, 5000, 1);
        assert_eq!(wanted(&row(0, Layout::Safe, US), ledger, 1, US), None);
        assert_eq!(wanted(&row(0, Layout::Safe, US), ledger, 3, US), None);
        // A row from another cluster (a dump restored here, pg_upgrade): passed by two, as
        // it may lag its source's era by one.
        let w = wanted(&row(9, Layout::Safe, THEM), ledger, 1, US).unwrap();
        assert_eq!(w.era(1), 11);
        // The jump is a base: a fork of this cluster from before the adoption (a standby
        // that replayed the restore, not the adoption; a PITR between them) adopts the same
        // row on its later timeline and lands above this server's era, even when its
        // timeline alone already puts its era above the row's.
        for fork in [2, 3, 40] {
            let f = wanted(&row(9, Layout::Safe, THEM), ledger, fork, US).unwrap();
            assert!(f.era(fork) > w.era(1), "timeline {fork}");
        }
        // Once adopted, the same evidence asks for nothing more, on any timeline.
        let adopted = ledger.merge(w, 1);
        assert_eq!(wanted(&row(9, Layout::Safe, THEM), adopted, 1, US), None);
        assert_eq!(wanted(&row(9, Layout::Safe, THEM), adopted, 5, US), None);
        // A row of this system above the era in force (the ledger was lost): passed.
        assert_eq!(
            wanted(&row(4, Layout::Safe, US), ledger, 1, US)
                .unwrap()
                .era(1),
            5
        );
        // The same, for a cluster with no ledger yet (0.3.0's rows of this system).
        assert_eq!(
            wanted(&row(0, Layout::Safe, US), fresh, 1, US)
                .unwrap()
                .era(1),
            1
        );
        // Tokens in the tables: in the era in force only the counter goes past them...
        let w = wanted(&kept(9000), ledger, 1, US).unwrap();
        assert_eq!((w.era(1), w.reserved), (0, 9000));
        assert_eq!(wanted(&kept(4000), ledger, 1, US), None);
        // ...in a higher era, the era does.
        assert_eq!(
            wanted(&kept((5 << 41) | 7), ledger, 1, US).unwrap().era(1),
            6
        );
        // 0.2.0's layout, from a row or a token, makes the ledger Wide, above it.
        // (Wide's floor is 4096 per timeline: a base of 4098 is era 8194 on timeline 1.)
        let w = wanted(&row(4097, Layout::Wide, US), ledger, 1, US).unwrap();
        assert_eq!((w.layout(), w.era(1)), (Layout::Wide, 4096 + 4098));
        let w = wanted(&kept((12290 << 43) | 3), ledger, 1, US).unwrap();
        assert_eq!((w.layout(), w.era(1)), (Layout::Wide, 4096 + 12291));
        // A safe-layout row past the era space stays safe-layout: adopting it is 2200H
        // (the raise checks the era), never a switch to 0.2.0's layout.
        let w = wanted(&row(5000, Layout::Safe, US), ledger, 1, US).unwrap();
        assert_eq!(w.layout(), Layout::Safe);
        assert!(w.era(1) >= Layout::Safe.era_limit());
        // A Wide ledger never goes back to Safe for a Safe row.
        let wide = State {
            layout: Layout::Wide.code(),
            base: 5,
            reserved: 0,
            timeline: 1,
        };
        assert_eq!(wanted(&row(3, Layout::Safe, THEM), wide, 1, US), None);
        // The end of the era space is an error, never a wrap.
        assert!(Layout::Safe.compose(0, 1 << 41).is_err());
        assert!(Layout::Safe.compose(4096, 1).is_err());
        assert_eq!(
            Layout::Safe.compose(4095, (1 << 41) - 1).unwrap(),
            crate::ledger::MAX_SAFE_TOKEN
        );
    }

    #[pg_test]
    fn the_ledger_merges_upward_and_never_lowers_its_era() {
        use crate::ledger::State;
        use crate::token::Layout;
        let s = State {
            layout: 2,
            base: 3,
            reserved: 100,
            timeline: 4,
        };
        // The era rises with the timeline by itself.
        assert_eq!(s.era(4), 6);
        assert_eq!(s.era(5), 7);
        // Moved to a lower timeline (a new cluster: pg_upgrade starts at timeline 1), the
        // era goes above the one it had.
        assert_eq!(s.moved_to(1).era(1), 7);
        // Merging keeps the maximum of each part, and Wide wins.
        let t = State {
            base: 1,
            reserved: 500,
            ..s
        };
        assert_eq!(s.merge(t, 4), State { reserved: 500, ..s });
        let w = State {
            layout: Layout::Wide.code(),
            base: 0,
            reserved: 0,
            timeline: 4,
        };
        // The counter is one for both layouts: its reservation never falls.
        assert_eq!(s.merge(w, 4), State { reserved: 100, ..w });
        assert_eq!(s.merge(State::default(), 4), s);
    }

    #[pg_test]
    fn the_ledger_file_reads_back_what_it_wrote_and_refuses_damage() {
        use crate::ledger::State;
        let s = State {
            layout: 1,
            base: 12290,
            reserved: 1 << 40,
            timeline: 3,
        };
        assert_eq!(State::parse(&s.render()), Ok(s));
        assert!(State::parse("").is_err());
        assert!(State::parse("lockext-ledger 1\nlayout 2\n").is_err());
        assert!(
            State::parse("lockext-ledger 1\nlayout 2\nbase x\nreserved 1\ntimeline 1\n").is_err()
        );
        // An era base past any layout's era space is damage, not a wrap.
        assert!(State::parse(
            &State {
                base: i64::MAX,
                ..s
            }
            .render()
        )
        .is_err());
        assert!(State::parse(&State { layout: 3, ..s }.render()).is_err());
    }

    #[pg_test]
    fn epoch_durability_needs_no_preload() {
        // Tokens no longer depend on boot epochs, so epoch mode is allowed anywhere.
        assert_eq!(sqlstate_of("SET lockext.durability = epoch"), "00000");
    }
    // Statements with named parameters (statements::Statement): each value goes to the
    // parameter of its name whatever order it is given in, and a header that does not name
    // the parameters as `params` does, or a value for no parameter, is refused before the
    // statement runs.
    static JOIN: crate::statements::Statement = crate::statements::Statement {
        sql: "-- Joins a word and a number.\n-- $1 number, $2 word\nSELECT $2 || ':' || $1::text AS joined",
        params: &[
            ("number", pg_sys::BuiltinOid::INT4OID),
            ("word", pg_sys::BuiltinOid::TEXTOID),
        ],
    };

    #[pg_test]
    fn named_parameters_bind_by_name_and_columns_read_by_name() {
        use crate::statements::{first_named, Args};
        let joined = Spi::connect_mut(|client| {
            let args = Args::new().set("word", "x").set("number", 7);
            first_named::<String>(JOIN.run(client, args)?, "joined")
        })
        .expect("run");
        assert_eq!(joined.as_deref(), Some("x:7"));
    }

    #[pg_test]
    fn named_parameters_given_in_order_bind_the_same() {
        use crate::statements::{first_named, Args};
        let joined = Spi::connect_mut(|client| {
            let args = Args::with_capacity(2).set("number", 7).set("word", "x");
            first_named::<String>(JOIN.run(client, args)?, "joined")
        })
        .expect("run");
        assert_eq!(joined.as_deref(), Some("x:7"));
    }

    // As many values as parameters, one of them misnamed: refused, not bound by position.
    #[pg_test(error = "lockext: no value for $word of Joins a word and a number.")]
    fn a_misnamed_value_in_place_is_refused() {
        use crate::statements::Args;
        let args = Args::new().set("number", 7).set("letter", "x");
        let _ = Spi::connect_mut(|client| JOIN.run(client, args).map(|rows| rows.len()));
    }

    static MISNAMED: crate::statements::Statement = crate::statements::Statement {
        sql: "-- A header that names its parameter otherwise.\n-- $1 other\nSELECT $1::int AS n",
        params: &[("number", pg_sys::BuiltinOid::INT4OID)],
    };

    #[pg_test(
        error = "lockext: the header of A header that names its parameter otherwise. does not name $1 number"
    )]
    fn a_header_that_does_not_name_the_parameters_is_refused() {
        use crate::statements::Args;
        let _ = Spi::connect_mut(|client| {
            MISNAMED
                .run(client, Args::new().set("number", 1))
                .map(|rows| rows.len())
        });
    }

    #[pg_test(error = "lockext: Joins a word and a number. has no parameter $letter")]
    fn a_value_for_no_parameter_is_refused() {
        use crate::statements::Args;
        let args = Args::new()
            .set("word", "x")
            .set("number", 7)
            .set("letter", "y");
        let _ = Spi::connect_mut(|client| JOIN.run(client, args).map(|rows| rows.len()));
    }

    /// Every refusal of the fence_guard trigger reaches the client with its own SQLSTATE:
    /// lockext's 55L01 too, which the trigger raises itself (a pgrx boundary would have
    /// turned it into XX000). Rows are written with the trigger disabled, so that nothing
    /// is declared before the UPDATE that must declare its token.
    #[pg_test]
    fn fence_guard_refusals_carry_their_sqlstates() {
        let a = token_of("a@guard_sqlstates", "a", "1 minute").unwrap();
        let b = token_of("b@guard_sqlstates", "b", "1 minute").unwrap();
        Spi::run(&format!(
            "CREATE TABLE gs (id int, v text, fence_token bigint);
             CREATE TRIGGER gs_fence BEFORE INSERT OR UPDATE OR DELETE ON gs
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
             CREATE TABLE gs_res (id int, fence_token bigint);
             CREATE TRIGGER gs_res_fence BEFORE INSERT ON gs_res
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token', 'gs:res');
             CREATE TABLE gs_missing (id int);
             CREATE TRIGGER gs_missing_fence BEFORE INSERT ON gs_missing
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
             CREATE TABLE gs_text (id int, fence_token text);
             CREATE TRIGGER gs_text_fence BEFORE INSERT ON gs_text
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
             CREATE TABLE gs_after (id int, fence_token bigint);
             CREATE TRIGGER gs_after_fence AFTER INSERT ON gs_after
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard('fence_token');
             CREATE TABLE gs_noargs (id int, fence_token bigint);
             CREATE TRIGGER gs_noargs_fence BEFORE INSERT ON gs_noargs
                 FOR EACH ROW EXECUTE FUNCTION lockext.fence_guard();
             ALTER TABLE gs DISABLE TRIGGER gs_fence;
             INSERT INTO gs VALUES (1, 'b wrote it', {b});
             ALTER TABLE gs ENABLE TRIGGER gs_fence;
             SELECT lockext.fence('gs:res', {b});"
        ))
        .expect("tables");
        let cases = [
            ("UPDATE gs SET v = 'no token'".to_string(), "22004"),
            ("DELETE FROM gs".to_string(), "22004"),
            (
                "INSERT INTO gs VALUES (2, 'null', NULL)".to_string(),
                "22004",
            ),
            (format!("UPDATE gs SET fence_token = {a}"), "55L01"),
            (format!("INSERT INTO gs_res VALUES (1, {a})"), "55L01"),
            ("INSERT INTO gs VALUES (2, 'zero', 0)".to_string(), "22023"),
            (
                format!("INSERT INTO gs VALUES (2, 'forged', {})", b + 1_000_000),
                "22023",
            ),
            ("INSERT INTO gs_missing VALUES (1)".to_string(), "42703"),
            ("INSERT INTO gs_text VALUES (1, NULL)".to_string(), "42804"),
            (format!("INSERT INTO gs_after VALUES (1, {b})"), "39P01"),
            (format!("INSERT INTO gs_noargs VALUES (1, {b})"), "22023"),
            ("SELECT lockext.fence_guard()".to_string(), "0A000"),
            (format!("UPDATE gs SET fence_token = {b}"), "00000"),
        ];
        for (sql, state) in cases {
            assert_eq!(sqlstate_of(&sql), state, "{sql}");
        }
    }
}
