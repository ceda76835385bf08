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
        assert!(one::<bool>(&format!(
            "SELECT lockext.lock_renew('ledger@paused_holder_is_fen', 'A', '1 minute') IS NULL"
        ))
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
            crate::reaper::reap_batch(2).unwrap(),
            (3, true),
            "a batch is bounded for each kind of lease"
        );
        assert_eq!(crate::reaper::reap_batch(2).unwrap(), (1, false));
        assert_eq!(crate::reaper::reap_batch(2).unwrap(), (0, false));
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
        assert_eq!(crate::reaper::reap_batch(100).unwrap(), (0, false));
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

    #[pg_test]
    fn grant_forces_synchronous_commit_for_its_transaction() {
        Spi::run("SET LOCAL synchronous_commit = off").unwrap();
        token_of("job@grant_forces_synchro", "w", "1 minute").unwrap();
        let setting: String = one("SHOW synchronous_commit").unwrap();
        assert_eq!(setting, "on");
    }

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
    fn tokens_carry_the_recorded_epoch() {
        let t = token_of("job@tokens_carry_the_rec", "w", "1 minute").unwrap();
        let timeline: i32 = one("SELECT timeline_id FROM pg_control_checkpoint()").unwrap();
        // Recorded by this transaction, unless a concurrent test's open transaction is
        // recording the same epoch (it then mints with it unrecorded: token.rs, rule 3).
        let recorded: Option<i64> = one("SELECT (SELECT epoch::bigint FROM lockext.token_epoch)");
        let epoch = recorded.unwrap_or_else(|| crate::token::next_epoch(None, timeline).unwrap());
        assert_eq!(t >> crate::token::COUNTER_BITS, epoch);
        let (era, raise): (Option<i32>, Option<i32>) =
            Spi::get_two(&format!("SELECT era, raise FROM lockext.token_parts({t})")).unwrap();
        assert_eq!(
            i64::from(era.unwrap()) << crate::token::RAISE_BITS | i64::from(raise.unwrap()),
            epoch
        );
        assert!(
            era.unwrap() >= timeline,
            "an era is at least the WAL timeline"
        );
    }

    #[pg_test]
    fn next_epoch_rises_for_every_kind_of_lost_history() {
        use crate::token::next_epoch;
        let era = |e: i64| e << crate::token::RAISE_BITS;
        // First epoch of a database: era = timeline.
        assert_eq!(next_epoch(None, 1).unwrap(), era(1));
        assert_eq!(next_epoch(None, 3).unwrap(), era(3));
        // A restart: the next raise in the same era.
        assert_eq!(
            next_epoch(Some((era(2) + 5, false, true)), 2).unwrap(),
            era(2) + 6
        );
        // A failover (new timeline) or a restore: a new era, above the recorded one...
        assert_eq!(
            next_epoch(Some((era(2) + 5, false, false)), 3).unwrap(),
            era(3)
        );
        // ...even when the recorded era is ahead of the timeline (restored elsewhere).
        assert_eq!(
            next_epoch(Some((era(7) + 1, false, false)), 1).unwrap(),
            era(8)
        );
        // The end of the epoch space is an error, never a wrap.
        assert!(next_epoch(Some((crate::token::EPOCH_LIMIT - 1, false, true)), 1).is_err());
        assert!(next_epoch(Some((era(crate::token::ERA_LIMIT - 1), false, false)), 1).is_err());
    }

    #[pg_test]
    fn epoch_durability_is_refused_when_not_preloaded() {
        // Not preloaded here, so epoch mode is refused outright.
        assert_eq!(sqlstate_of("SET lockext.durability = epoch"), "22023");
    }
}
