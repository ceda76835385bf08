//! lockext in every server encoding: lock ids, owners, resource ids and documents with
//! non-ASCII characters in a LATIN1 and a SQL_ASCII database (and a UTF-8 one) go in and
//! come back as they were, through every way in and out (leases, sets, fences, views,
//! notifications, the reaper, the exit hook, the wait queue), as PostgreSQL's own text
//! functions keep them.
//!
//! The client speaks UTF-8 (the postgres crate insists): the server converts to and from
//! LATIN1, and passes bytes through unchanged in SQL_ASCII, where bytes that are not UTF-8
//! are written with `convert_from(bytea, 'SQL_ASCII')` and read with `convert_to`.

use std::thread;
use std::time::{Duration, Instant};

use lockext_cluster_tests::leases::sqlstate;
use lockext_cluster_tests::*;
use postgres::fallible_iterator::FallibleIterator;

/// A database of that encoding with lockext in it (locale C: every encoding goes with it).
fn create_db(cluster: &Cluster, name: &str, encoding: &str) -> Client {
    cluster
        .connect()
        .batch_execute(&format!(
            "CREATE DATABASE {name} ENCODING '{encoding}' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
        ))
        .expect("create database");
    let mut c = cluster.connect_to(name);
    c.batch_execute("CREATE EXTENSION lockext")
        .expect("create extension");
    c
}

/// Everything a caller can do with one lock id, owner and resource in database `db`,
/// checked for the values it gets back.
fn round_trip(c: &mut Client, db: &str, octets: i32) {
    let what = |s: &str| format!("{db}: {s}");
    // A grant hands the id and owner back as they went in, and the table holds them in the
    // database's encoding (4 bytes for "café" in LATIN1, 5 in UTF-8).
    let row = c
        .query_one(
            "SELECT lock_id, owner, fence_token FROM lockext.lock_acquire('café', 'ñandú', '1 minute')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("lock_acquire")));
    assert_eq!(
        row.get::<_, String>(0),
        "café",
        "{}",
        what("grant's lock_id")
    );
    assert_eq!(
        row.get::<_, String>(1),
        "ñandú",
        "{}",
        what("grant's owner")
    );
    let token: i64 = row.get(2);
    let (id, owner, bytes): (String, String, i32) = {
        let r = c
            .query_one(
                "SELECT lock_id, owner, octet_length(lock_id) FROM lockext.locks WHERE lock_id = 'café'",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!(
        (id.as_str(), owner.as_str(), bytes),
        ("café", "ñandú", octets),
        "{}",
        what("lockext.locks")
    );
    let holders: Vec<(String, String)> = c
        .query("SELECT lock_id, owner FROM lockext.holders", &[])
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        holders,
        [("café".to_string(), "ñandú".to_string())],
        "{}",
        what("lockext.holders")
    );
    // The same owner again gets the same grant; another is refused.
    let again: i64 = c
        .query_one(
            "SELECT fence_token FROM lockext.lock_acquire('café', 'ñandú', '1 minute')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(again, token, "{}", what("same-owner retry"));
    let refused: bool = c
        .query_one(
            "SELECT lockext.lock_acquire('café', 'ñu', '1 minute') IS NULL",
            &[],
        )
        .unwrap()
        .get(0);
    assert!(refused, "{}", what("another owner is refused"));
    let renewed: bool = c
        .query_one(
            "SELECT lockext.lock_renew('café', 'ñandú', '1 minute', $1) IS NOT NULL",
            &[&token],
        )
        .unwrap()
        .get(0);
    assert!(renewed, "{}", what("lock_renew"));
    let live: bool = c
        .query_one("SELECT lockext.lock_check('café', $1)", &[&token])
        .unwrap()
        .get(0);
    assert!(live, "{}", what("lock_check"));

    // Fencing: a resource bound to the lock, a document with characters and a number no
    // double holds, stored as it was sent.
    c.batch_execute("SELECT lockext.bind_resource('compte:é', 'café')")
        .unwrap();
    let doc = r#"{"n": 123456789012345678901234567890, "p": 0.1000000000000000055511151231257827, "s": "ça été"}"#;
    let stored: bool = c
        .query_one(
            "SELECT lockext.fenced_update('compte:é', $1, $2::text::jsonb)",
            &[&token, &doc],
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("fenced_update")))
        .get(0);
    assert!(stored, "{}", what("fenced_update"));
    let back: String = c
        .query_one(
            "SELECT data::text FROM lockext.resources WHERE resource_id = 'compte:é'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(back, doc, "{}", what("the stored document"));
    let read: String = c
        .query_one(
            "SELECT lockext.fenced_read('compte:é', $1)::text",
            &[&token],
        )
        .unwrap()
        .get(0);
    assert_eq!(read, doc, "{}", what("fenced_read"));

    // Events carry the id as it is.
    c.batch_execute("LISTEN lockext; SET lockext.notify = on")
        .unwrap();
    let released: bool = c
        .query_one(
            "SELECT lockext.lock_release('café', 'ñandú', $1)",
            &[&token],
        )
        .unwrap()
        .get(0);
    assert!(released, "{}", what("lock_release"));
    let payload = c
        .notifications()
        .timeout_iter(Duration::from_secs(5))
        .next()
        .unwrap()
        .map(|n| n.payload().to_string())
        .unwrap_or_default();
    assert!(
        payload.contains(r#""lock_id" : "café""#),
        "{}: {payload}",
        what("the release's event")
    );
    c.batch_execute("UNLISTEN lockext; RESET lockext.notify")
        .unwrap();

    // The released lock's resource now refuses the old token, and says which lock.
    let err = c
        .batch_execute(&format!("SELECT lockext.fence_read('compte:é', {token})"))
        .expect_err("a reader whose lease is gone");
    let db_err = err.as_db_error().expect("a database error");
    assert_eq!(db_err.code().code(), "55L01", "{}", what("fence_read"));
    assert!(
        db_err
            .detail()
            .unwrap_or("")
            .contains(r#"bound to lock "café""#),
        "{}: {db_err:?}",
        what("fence_read's detail")
    );

    // A set, in byte order of the ids (x is 0x78; é is 0xe9 in LATIN1, 0xc3 0xa9 in UTF-8).
    let set: Vec<(String, String)> = c
        .query(
            "SELECT lock_id, owner FROM lockext.lock_acquire_all(ARRAY['é', 'x', 'é'], 'ñu', '1 minute')",
            &[],
        )
        .unwrap_or_else(|e| panic!("{}: {e:?}", what("lock_acquire_all")))
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        set,
        [
            ("x".to_string(), "ñu".to_string()),
            ("é".to_string(), "ñu".to_string())
        ],
        "{}",
        what("lock_acquire_all")
    );
    let n: i32 = c
        .query_one(
            "SELECT lockext.lock_release_all(ARRAY['é', 'x'], 'ñu')",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(n, 2, "{}", what("lock_release_all"));

    // Shared leases and semaphores, and errors that name an id or a mode.
    c.batch_execute(
        "SELECT lockext.lock_acquire('sémaphore', 'ñ1', '1 minute', permits => 2); \
         SELECT lockext.lock_acquire('lecture', 'ñ1', '1 minute', mode => 'shared')",
    )
    .unwrap();
    let err = c
        .batch_execute("SELECT lockext.lock_acquire('sémaphore', 'ñ2', '1 minute')")
        .expect_err("a lock on a semaphore");
    assert_eq!(
        sqlstate(&err).as_deref(),
        Some("42809"),
        "{}: {err:?}",
        what("wrong kind")
    );
    let err = c
        .batch_execute("SELECT lockext.lock_acquire('x', 'ñ2', '1 minute', mode => 'partagé')")
        .expect_err("an unknown mode");
    assert_eq!(
        sqlstate(&err).as_deref(),
        Some("22023"),
        "{}: {err:?}",
        what("unknown mode")
    );
    println!(
        "{db}: {}",
        err.as_db_error().map(|e| e.message()).unwrap_or_default()
    );
}

#[test]
fn ids_and_documents_round_trip_in_latin1_sql_ascii_and_utf8() {
    let cluster = Cluster::start("encodings", "");
    let mut latin1 = create_db(&cluster, "lat1", "LATIN1");
    round_trip(&mut latin1, "LATIN1", 4);
    let mut ascii = create_db(&cluster, "ascii1", "SQL_ASCII");
    round_trip(&mut ascii, "SQL_ASCII", 5);
    round_trip(&mut cluster.connect(), "UTF8", 5);

    // SQL_ASCII holds bytes, whatever they are: a LATIN1 client's "café" (0xe9) and "ñ"
    // (0xf1), which are not UTF-8, go through every call unchanged.
    let raw = |hex: &str| format!("convert_from('\\x{hex}'::bytea, 'SQL_ASCII')");
    let (cafe, enye) = (raw("636166e9"), raw("f1"));
    let row = ascii
        .query_one(
            &format!(
                "SELECT convert_to(lock_id, 'SQL_ASCII'), convert_to(owner, 'SQL_ASCII'), fence_token \
                   FROM lockext.lock_acquire({cafe}, {enye}, '1 minute')"
            ),
            &[],
        )
        .expect("lock_acquire with bytes that are not UTF-8");
    assert_eq!(row.get::<_, Vec<u8>>(0), b"caf\xe9");
    assert_eq!(row.get::<_, Vec<u8>>(1), b"\xf1");
    let token: i64 = row.get(2);
    let held: i64 = ascii
        .query_one(
            &format!(
                "SELECT count(*) FROM lockext.holders WHERE lock_id = {cafe} AND owner = {enye}"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(held, 1);
    let set: Vec<Vec<u8>> = ascii
        .query(
            &format!(
                "SELECT convert_to(lock_id, 'SQL_ASCII') \
                   FROM lockext.lock_acquire_all(ARRAY[{}, 'x'], {enye}, '1 minute')",
                raw("e9")
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(set, [b"x".to_vec(), b"\xe9".to_vec()]);
    // An error message shows such bytes escaped (a message must be a valid string).
    let err = ascii
        .batch_execute(&format!(
            "SELECT lockext.lock_acquire({cafe}, 'x', '1 minute', permits => 2)"
        ))
        .expect_err("permits on a lock");
    let db_err = err.as_db_error().expect("a database error");
    assert_eq!(db_err.code().code(), "42809");
    assert_eq!(db_err.message(), r#""caf\xe9" is a lock, not a semaphore"#);
    let released: bool = ascii
        .query_one(
            &format!("SELECT lockext.lock_release({cafe}, {enye}, $1)"),
            &[&token],
        )
        .unwrap()
        .get(0);
    assert!(released);
}

#[test]
fn the_reaper_the_exit_hook_and_the_queue_keep_non_ascii_ids() {
    let cluster = Cluster::start(
        "encodings-workers",
        "lockext.database = 'postgres,lat1'\nlockext.reap_interval = '100ms'",
    );
    let mut c = create_db(&cluster, "lat1", "LATIN1");

    // The reaper deletes an expired lease whose id is not ASCII, and keeps reaping.
    c.batch_execute("SELECT lockext.lock_acquire('périmé', 'ñ', '100 milliseconds')")
        .unwrap();
    eventually(
        Duration::from_secs(20),
        "the reaper deletes 'périmé'",
        || {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM lockext.locks WHERE lock_id = 'périmé'",
                    &[],
                )
                .unwrap()
                .get(0);
            (n == 0).then_some(())
        },
    );
    let last_error: Option<String> = c
        .query_one(
            "SELECT last_error FROM lockext.reaper_status() WHERE database = 'lat1'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(last_error, None, "the reaper's rounds succeed");

    // A session-bound lease ends with its session.
    {
        let mut s = cluster.connect_to("lat1");
        s.batch_execute(
            "SELECT lockext.lock_acquire('séance', 'ñ', '1 hour', session_bound => true)",
        )
        .unwrap();
    }
    eventually(
        Duration::from_secs(10),
        "the exit hook ends 'séance'",
        || {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM lockext.locks WHERE lock_id = 'séance'",
                    &[],
                )
                .unwrap()
                .get(0);
            (n == 0).then_some(())
        },
    );
    assert!(
        !cluster
            .log()
            .contains("could not end this session's leases"),
        "the exit hook worked: {}",
        cluster.log()
    );

    // A waiter for a non-ASCII id is queued, shown, woken and served.
    c.batch_execute("SELECT lockext.lock_acquire('file:é', 'holder', '1 minute')")
        .unwrap();
    let url = cluster.url("lat1");
    let waiter = thread::spawn(move || {
        let mut w = Client::connect(&url, NoTls).unwrap();
        let started = Instant::now();
        let owner: Option<String> = w
            .query_one(
                "SELECT owner FROM lockext.lock_acquire('file:é', 'wäiter', '1 minute', wait => '60 seconds')",
                &[],
            )
            .unwrap()
            .get(0);
        (owner, started.elapsed())
    });
    let shown: String = eventually(Duration::from_secs(10), "the waiter is queued", || {
        c.query_opt("SELECT lock_id FROM lockext.waiters", &[])
            .unwrap()
            .map(|r| r.get(0))
    });
    assert_eq!(shown, "file:é", "lockext.waiters in the waiter's database");
    // Seen from a UTF-8 database (a superuser sees every database's waiters), a LATIN1 id
    // is not valid text: its non-ASCII bytes are escaped.
    let elsewhere: String = cluster
        .connect()
        .query_one("SELECT lock_id FROM lockext.waiters", &[])
        .unwrap()
        .get(0);
    assert_eq!(
        elsewhere, r"file:\xe9",
        "lockext.waiters in another database"
    );
    let released: bool = c
        .query_one("SELECT lockext.lock_release('file:é', 'holder')", &[])
        .unwrap()
        .get(0);
    assert!(released);
    let (owner, waited) = waiter.join().unwrap();
    assert_eq!(owner.as_deref(), Some("wäiter"), "the waiter got the lock");
    assert!(waited < Duration::from_secs(60), "woken by the release");
}
