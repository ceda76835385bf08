//! Tokens never go backwards: through crashes, failover to an asynchronous standby, and
//! pg_dump/pg_restore. Each test prints the highest token before the event and the lowest
//! after it.

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::thread;
use std::time::Duration;

use lockext_cluster_tests::crash::crash_and_restart;
use lockext_cluster_tests::*;

/// A token is an era over a 41-bit counter, and at most 2^53 - 1 (docs/tokens.md).
const ERA_SHIFT: u32 = 41;
const MAX_SAFE_TOKEN: i64 = (1 << 53) - 1;

fn acquire(c: &mut Client, lock: &str, owner: &str) -> Option<i64> {
    c.query_one(
        "SELECT (lockext.lock_acquire($1, $2, '10 minutes')).fence_token",
        &[&lock, &owner],
    )
    .expect("lock_acquire")
    .get(0)
}

/// Acquires `n` fresh locks, one autocommit call each; returns the acknowledged tokens.
fn grant_many(c: &mut Client, prefix: &str, n: usize) -> Vec<i64> {
    (0..n)
        .map(|i| acquire(c, &format!("{prefix}-{i}"), "client").expect("fresh lock"))
        .collect()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn as_postgres(cmd: &str) -> String {
    run(Command::new("runuser").args(["-u", "postgres", "--", "sh", "-c", cmd]))
}

fn crash_keeps_tokens_rising(durability: &str) {
    let cluster = Cluster::start(
        &format!("crash-{durability}"),
        &format!("lockext.durability = '{durability}'"),
    );
    let mut c = cluster.connect();
    // The session asks for asynchronous commits; grants must not lose their tokens anyway.
    c.batch_execute("SET synchronous_commit = off").unwrap();
    let before = grant_many(&mut c, "pre", 300);
    let highest_before = *before.iter().max().unwrap();

    let mut c = crash_and_restart(&cluster);
    let after = grant_many(&mut c, "post", 20);
    let lowest_after = *after.iter().min().unwrap();
    println!(
        "crash ({durability}): highest token before {highest_before} (era {}), lowest after {lowest_after} (era {})",
        highest_before >> ERA_SHIFT,
        lowest_after >> ERA_SHIFT
    );
    assert!(lowest_after > highest_before);
    assert!(lowest_after <= MAX_SAFE_TOKEN);
    assert_eq!(
        lowest_after >> ERA_SHIFT,
        highest_before >> ERA_SHIFT,
        "a crash is the same history: the counter continues, no era is spent"
    );

    let survivors: i64 = c
        .query_one(
            "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'pre-%'",
            &[],
        )
        .unwrap()
        .get(0);
    if durability == "grant" {
        assert_eq!(
            survivors, 300,
            "every acknowledged grant survives the crash"
        );
    } else {
        // epoch mode: a grant lost in the crash only ends that lease early.
        assert!(survivors <= 300);
        println!("crash (epoch): {survivors} of 300 acknowledged grants survived");
    }
}

#[test]
fn crash_with_durable_grants_loses_nothing_and_keeps_tokens_rising() {
    crash_keeps_tokens_rising("grant");
}

#[test]
fn crash_with_epoch_durability_still_never_repeats_a_token() {
    crash_keeps_tokens_rising("epoch");
}

#[test]
fn epoch_durability_without_preload_hands_out_no_token() {
    // Without preload there is no token ledger (it travels in the WAL through lockext's
    // own resource manager, which only a preloaded library has): a grant is refused in
    // either durability mode, rather than handed out by a counter no WAL carries.
    let plain = Cluster::start("epoch-plain", "shared_preload_libraries = ''");
    let mut p = plain.connect();
    p.batch_execute("SET lockext.durability = epoch; SET synchronous_commit = off")
        .expect("the setting is still taken without preload");
    let refused = p
        .query_one(
            "SELECT lockext.lock_acquire('pre', 'client', '1 minute')",
            &[],
        )
        .expect_err("a grant without preload");
    assert_eq!(
        refused.code().map(|c| c.code()),
        Some("55000"),
        "{refused:?}"
    );
}

/// A streaming standby of `primary` made with pg_basebackup -R (asynchronous).
fn standby_of(primary: &Cluster, name: &str) -> Cluster {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let dir = PathBuf::from(format!("/tmp/lockext-tests/{name}-{port}"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    run(Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir));
    let standby = Cluster {
        name: name.to_string(),
        port,
        dir,
    };
    as_postgres(&format!(
        "{PG_BIN}/pg_basebackup -D {} -h 127.0.0.1 -p {} -U postgres -R -X stream -c fast",
        standby.data().display(),
        primary.port
    ));
    let conf = standby.data().join("postgresql.conf");
    let mut text = fs::read_to_string(&conf).unwrap();
    text.push_str(&format!(
        "\nport = {port}\nunix_socket_directories = '{}'\nhot_standby = on\n",
        standby.dir.display()
    ));
    fs::write(&conf, text).unwrap();
    standby.pg_ctl("start -w -t 60");
    standby
}

fn in_recovery(c: &mut Client) -> bool {
    c.query_one("SELECT pg_is_in_recovery()", &[])
        .unwrap()
        .get(0)
}

#[test]
fn promoted_async_standby_mints_above_everything_the_old_primary_issued() {
    let primary = Cluster::start("primary", "");
    let mut p = primary.connect();
    grant_many(&mut p, "replicated", 5);
    let standby = standby_of(&primary, "standby");
    let mut s = standby.connect();
    eventually(Duration::from_secs(30), "the standby catches up", || {
        let n: i64 = s
            .query_one("SELECT count(*) FROM lockext.locks", &[])
            .ok()?
            .get(0);
        (n == 5).then_some(())
    });

    // On a hot standby every lockext function says why it cannot work.
    let err = s
        .query_one("SELECT lockext.lock_acquire('x', 'y', '1 minute')", &[])
        .expect_err("refused on a standby");
    let db = err.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "25006");
    assert_eq!(db.hint(), Some("Connect to the primary server."));

    // The standby stops receiving WAL; the primary goes on granting.
    standby.pg_ctl("stop -m fast -w");
    let lost = grant_many(&mut p, "lost", 50);
    let highest_old = *lost.iter().max().unwrap();

    // Failover: the standby comes up without its primary and is promoted.
    let auto = standby.data().join("postgresql.auto.conf");
    let text = fs::read_to_string(&auto).unwrap();
    let kept: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("primary_conninfo"))
        .collect();
    fs::write(&auto, kept.join("\n") + "\n").unwrap();
    standby.pg_ctl("start -w -t 60");
    standby.pg_ctl("promote -w -t 60");
    let mut s = standby.reconnect(Duration::from_secs(30));
    eventually(Duration::from_secs(30), "the standby is promoted", || {
        (!in_recovery(&mut s)).then_some(())
    });

    let new = grant_many(&mut s, "new", 20);
    let lowest_new = *new.iter().min().unwrap();
    println!(
        "promotion: highest token of the old primary {highest_old} (era {}), lowest of the new primary {lowest_new} (era {})",
        highest_old >> ERA_SHIFT,
        lowest_new >> ERA_SHIFT
    );
    assert!(
        lowest_new > highest_old,
        "every token of the new primary beats the lost ones"
    );

    // The old primary, still running, can only mint lower tokens: a resource that has seen
    // a token of the new primary rejects its holders.
    let stale = acquire(&mut p, "old-side", "zombie").unwrap();
    assert!(stale < lowest_new);
    let accepted: bool = s
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"by\": \"new\"}')",
            &[&lowest_new],
        )
        .unwrap()
        .get(0);
    assert!(accepted);
    let highest_new: i64 = s
        .query_one("SELECT max(fence_token) FROM lockext.locks", &[])
        .unwrap()
        .get(0);
    assert!(stale < highest_new);
    // A write with the old primary's token is refused wherever the new token was seen.
    let refused: bool = s
        .query_one(
            "SELECT lockext.fenced_update('account', $1, '{\"by\": \"zombie\"}')",
            &[&stale],
        )
        .unwrap()
        .get(0);
    assert!(!refused);
}

#[test]
fn dump_and_restore_bring_back_leases_marks_and_rising_tokens() {
    let cluster = Cluster::start("dump", "");
    let mut c = cluster.connect();
    let tokens = grant_many(&mut c, "kept", 10);
    let highest_before = *tokens.iter().max().unwrap();
    c.query_one(
        "SELECT lockext.fenced_update('res', $1, '{\"v\": 1}')",
        &[&highest_before],
    )
    .unwrap();

    let dump = cluster.dir.join("lockext.dump");
    let url = |db: &str| format!("-h 127.0.0.1 -p {} -U postgres -d {db}", cluster.port);
    as_postgres(&format!(
        "{PG_BIN}/pg_dump -Fc -f {} {}",
        dump.display(),
        url("postgres")
    ));
    c.batch_execute("CREATE DATABASE restored").unwrap();
    as_postgres(&format!(
        "{PG_BIN}/pg_restore --exit-on-error {} {}",
        url("restored"),
        dump.display()
    ));

    let mut r = cluster.connect_to("restored");
    let leases: i64 = r
        .query_one(
            "SELECT count(*) FROM lockext.locks WHERE lock_id LIKE 'kept-%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(leases, 10, "live leases come back");
    let mark: i64 = r
        .query_one(
            "SELECT fence_token FROM lockext.resources WHERE resource_id = 'res'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(mark, highest_before, "the high-water mark comes back");
    let stale: bool = r
        .query_one(
            "SELECT lockext.fenced_update('res', $1, '{\"v\": 0}')",
            &[&(highest_before - 1)],
        )
        .unwrap()
        .get(0);
    assert!(!stale, "and still rejects older tokens");
    let after = acquire(&mut r, "fresh", "client").unwrap();
    println!("dump/restore: highest token before {highest_before}, first after {after}");
    // Restored into the same cluster, it counts on the cluster's counter (docs/tokens.md):
    // above every token the dump holds, and every token the cluster handed out.
    assert!(after > highest_before);
    assert!(after <= MAX_SAFE_TOKEN);
    thread::sleep(Duration::from_millis(10));
}
