//! Scaffolding of the tests that force an interleaving with gdb (`renew_race.rs`,
//! `held_row.rs`): a database no reaper serves, and the live holders of one lock id.

use crate::*;

/// The database of the race tests: the reaper serves `postgres` only, so no reaper deletes
/// an expired lease before the test's own acquire sees it.
pub const DB: &str = "race";

/// A cluster whose reaper serves `postgres` only (no lock-delay), and database `race` with
/// the extensions in `extensions` (lockext first).
pub fn race_cluster(name: &str, extensions: &[&str]) -> Cluster {
    let cluster = Cluster::start(
        name,
        "lockext.database = 'postgres'\nlockext.lock_delay = 0\n",
    );
    let mut pg = cluster.connect();
    pg.batch_execute(&format!("CREATE DATABASE {DB}"))
        .expect("create database race");
    let create: String = extensions
        .iter()
        .map(|e| format!("CREATE EXTENSION {e};"))
        .collect();
    cluster
        .connect_to(DB)
        .batch_execute(&create)
        .expect("create the extensions in race");
    // The launcher looks at the list every few seconds; nothing may ever reap `race`.
    assert_eq!(
        reaper_pid(&mut pg, DB),
        None,
        "a reaper serves database {DB}"
    );
    cluster
}

/// A live lease of one lock id, from `lockext.holders`.
#[derive(Debug, Clone)]
pub struct Holder {
    pub mode: String,
    pub owner: String,
    pub fence_token: i64,
    pub time_left_ms: f64,
}

/// The live leases of `lock`, oldest grant first.
pub fn holders(c: &mut Client, lock: &str) -> Vec<Holder> {
    c.query(
        "SELECT mode, owner, fence_token, (extract(epoch FROM time_left) * 1000)::float8 \
           FROM lockext.holders WHERE lock_id = $1 ORDER BY fence_token",
        &[&lock],
    )
    .expect("read lockext.holders")
    .iter()
    .map(|r| Holder {
        mode: r.get(0),
        owner: r.get(1),
        fence_token: r.get(2),
        time_left_ms: r.get::<_, f64>(3),
    })
    .collect()
}
