//! A Citus cluster for the Citus tests: a coordinator and workers, each a scratch `Cluster`
//! on a loopback port, preloading Citus and lockext, joined as Citus nodes on 127.0.0.1,
//! with lockext created on the coordinator and propagated by Citus to every worker.
//!
//! Needs PostgreSQL 16 or newer in `LOCKEXT_PG_BIN` (Citus's source here accepts 16 to 18; the
//! tests run on 18) with Citus installed into that tree (`make citus`, scripts/citus.sh) and
//! lockext too (`make install PG=18`). Every node is stopped when the `CitusCluster` is dropped.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use crate::{pg_major, Client, Cluster, PG_BIN};

/// What every node's postgresql.conf gets, before the test's own settings (which win): Citus
/// first in the preload list (it insists), logical decoding for shard moves
/// (`shard_transfer_mode => 'force_logical'`), room for the background workers of both
/// extensions, and one background task executor per node (the rebalancer's), which keeps a
/// 2-core machine's load down.
pub const CITUS_CONF: &str = "shared_preload_libraries = 'citus,lockext'\n\
     wal_level = logical\n\
     max_replication_slots = 10\n\
     max_wal_senders = 10\n\
     max_worker_processes = 32\n\
     citus.max_background_task_executors_per_node = 1\n";

/// The host every node is known by to the others (each listens on loopback only).
pub const HOST: &str = "127.0.0.1";

pub struct CitusCluster {
    pub coordinator: Cluster,
    pub workers: Vec<Cluster>,
    name: String,
    extra_conf: String,
}

impl CitusCluster {
    /// Starts a coordinator and `workers` workers, with `extra_conf` appended to each node's
    /// postgresql.conf; creates Citus on each and joins them (`citus_set_coordinator_host`,
    /// `citus_add_node`), then creates lockext on the coordinator and checks that Citus
    /// created it on every worker.
    pub fn start(name: &str, workers: usize, extra_conf: &str) -> CitusCluster {
        check_citus_installed();
        let coordinator = start_node(&format!("{name}-coord"), extra_conf);
        let mut cluster = CitusCluster {
            coordinator,
            workers: Vec::new(),
            name: name.to_string(),
            extra_conf: extra_conf.to_string(),
        };
        cluster
            .coordinator
            .connect()
            .query_one(
                "SELECT citus_set_coordinator_host($1, $2)",
                &[&HOST, &i32::from(cluster.coordinator.port)],
            )
            .expect("citus_set_coordinator_host");
        for _ in 0..workers {
            cluster.add_worker();
        }
        cluster
            .coordinator
            .connect()
            .batch_execute("CREATE EXTENSION lockext")
            .expect("CREATE EXTENSION lockext on the coordinator");
        cluster.check_lockext_everywhere();
        cluster
    }

    /// Starts one more worker with the same settings and adds it to the cluster (no shard
    /// moves to it: see `move_shard` and `rebalance`). Citus creates on it every extension
    /// the coordinator has distributed, lockext included once it exists. Returns its port.
    pub fn add_worker(&mut self) -> u16 {
        let n = self.workers.len() + 1;
        let worker = start_node(&format!("{}-w{n}", self.name), &self.extra_conf);
        let port = worker.port;
        self.workers.push(worker);
        self.coordinator
            .connect()
            .query_one("SELECT citus_add_node($1, $2)", &[&HOST, &i32::from(port)])
            .unwrap_or_else(|e| panic!("citus_add_node('{HOST}', {port}): {e}"));
        if self.lockext_version(&self.coordinator).is_some() {
            self.check_lockext_everywhere();
        }
        port
    }

    /// The coordinator, then every worker.
    pub fn nodes(&self) -> impl Iterator<Item = &Cluster> {
        std::iter::once(&self.coordinator).chain(self.workers.iter())
    }

    /// The worker listening on `port`.
    pub fn worker(&self, port: u16) -> &Cluster {
        self.workers
            .iter()
            .find(|w| w.port == port)
            .unwrap_or_else(|| panic!("no worker on port {port}"))
    }

    /// A connection to the coordinator, database `postgres`.
    pub fn connect(&self) -> Client {
        self.coordinator.connect()
    }

    /// The shard of distributed table `table` that holds distribution value `value` (given
    /// as text: Citus converts it to the distribution column's type).
    pub fn shard_of(&self, table: &str, value: &str) -> i64 {
        self.connect()
            .query_one(
                "SELECT get_shard_id_for_distribution_column($1::text::regclass, $2::text) AS shardid",
                &[&table, &value],
            )
            .unwrap_or_else(|e| panic!("the shard of {table} holding {value:?}: {e}"))
            .get("shardid")
    }

    /// The port of the node that holds the placement of `shardid` (one placement: Citus's
    /// default replication factor of 1).
    pub fn node_port_of_shard(&self, shardid: i64) -> u16 {
        let rows = self
            .connect()
            .query(
                "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) \
                 WHERE p.shardid = $1",
                &[&shardid],
            )
            .unwrap_or_else(|e| panic!("the placement of shard {shardid}: {e}"));
        assert_eq!(
            rows.len(),
            1,
            "shard {shardid}: one placement expected, pg_dist_placement has {}",
            rows.len()
        );
        let port: i32 = rows[0].get("nodeport");
        u16::try_from(port).expect("a port")
    }

    /// Moves the placement of `shardid` (and of the shards colocated with it) from the node
    /// on `from_port` to the node on `to_port`, by logical replication, and waits for it.
    pub fn move_shard(&self, shardid: i64, from_port: u16, to_port: u16) {
        self.connect()
            .query_one(
                "SELECT citus_move_shard_placement($1, $2, $3, $2, $4, \
                 shard_transfer_mode => 'force_logical')",
                &[&shardid, &HOST, &i32::from(from_port), &i32::from(to_port)],
            )
            .unwrap_or_else(|e| {
                panic!("move shard {shardid} from port {from_port} to {to_port}: {e}")
            });
    }

    /// Moves shards until every node holds its share (`rebalance_table_shards`, by logical
    /// replication), and waits for it.
    pub fn rebalance(&self) {
        self.connect()
            .batch_execute("SELECT rebalance_table_shards(shard_transfer_mode => 'force_logical')")
            .expect("rebalance_table_shards");
    }

    /// lockext's version on `node`, if it is created there.
    pub fn lockext_version(&self, node: &Cluster) -> Option<String> {
        node.connect()
            .query_opt(
                "SELECT extversion FROM pg_extension WHERE extname = 'lockext'",
                &[],
            )
            .expect("pg_extension")
            .map(|row| row.get("extversion"))
    }

    /// Panics unless every worker has lockext at the coordinator's version.
    pub fn check_lockext_everywhere(&self) {
        let want = self
            .lockext_version(&self.coordinator)
            .expect("lockext is created on the coordinator");
        for worker in &self.workers {
            let got = self.lockext_version(worker);
            assert_eq!(
                got.as_deref(),
                Some(want.as_str()),
                "lockext {want} is created on the coordinator (port {}), but worker {} (port {}) \
                 has {got:?}: Citus did not propagate CREATE EXTENSION lockext",
                self.coordinator.port,
                worker.name,
                worker.port
            );
        }
    }
}

/// One node: a cluster with `CITUS_CONF` and `extra_conf`, loopback connections trusted,
/// started, with Citus created in database `postgres`.
fn start_node(name: &str, extra_conf: &str) -> Cluster {
    let node = Cluster::init_with_env(name, &format!("{CITUS_CONF}{extra_conf}"), &[]);
    trust_loopback(&node);
    node.pg_ctl("start -w -t 60");
    node.connect()
        .batch_execute("CREATE EXTENSION citus")
        .unwrap_or_else(|e| {
            panic!(
                "CREATE EXTENSION citus on {} (port {}): {e}\n{}",
                node.name,
                node.port,
                node.log()
            )
        });
    node
}

/// The nodes connect to each other over TCP on 127.0.0.1, logical replication connections
/// included (those match a database's lines, not `replication`'s): `initdb --auth=trust`
/// writes such a line; added if a future initdb does not.
fn trust_loopback(node: &Cluster) {
    let path = node.data().join("pg_hba.conf");
    let text = fs::read_to_string(&path).expect("read pg_hba.conf");
    let trusted = text.lines().any(|line| {
        let line = line.split_once('#').map_or(line, |(before, _)| before);
        line.split_whitespace()
            .eq(["host", "all", "all", "127.0.0.1/32", "trust"])
    });
    if !trusted {
        fs::write(&path, format!("{text}\nhost all all 127.0.0.1/32 trust\n"))
            .expect("write pg_hba.conf");
    }
}

fn pg_config(flag: &str) -> PathBuf {
    let out = Command::new(format!("{PG_BIN}/pg_config"))
        .arg(flag)
        .output()
        .expect("run pg_config");
    assert!(out.status.success(), "{PG_BIN}/pg_config {flag} failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// Panics, saying what to do, unless `PG_BIN` is PostgreSQL 16 or newer with Citus installed.
fn check_citus_installed() {
    let major = pg_major(PG_BIN.path());
    assert!(
        major >= 16,
        "the Citus tests need PostgreSQL 16 or newer (Citus supports 16 to 18); \
         LOCKEXT_PG_BIN={PG_BIN} is PostgreSQL {major}: run them with \
         LOCKEXT_PG_BIN=/opt/lockext-postgresql/18/bin"
    );
    let lib = pg_config("--pkglibdir").join("citus.so");
    let control = pg_config("--sharedir").join("extension/citus.control");
    assert!(
        lib.exists() && control.exists(),
        "Citus is not installed in the PostgreSQL {major} of LOCKEXT_PG_BIN={PG_BIN} \
         (no {} or no {}): run `make citus` first (for this tree: \
         `make citus PG_CONFIG={PG_BIN}/pg_config`)",
        lib.display(),
        control.display()
    );
}
