//! The Citus test cluster itself (tests/cluster/src/citus.rs): a coordinator and two workers
//! come up with Citus and lockext on every node, a distributed table's shard moves from one
//! worker to the other, and its row is still read through the coordinator. PostgreSQL 16 or
//! newer with Citus installed (`make citus`); lockext is not exercised beyond installation.

use std::time::Instant;

use lockext_cluster_tests::citus::CitusCluster;

#[test]
fn citus_coordinator_and_two_workers_move_a_shard() {
    let started = Instant::now();
    let cluster = CitusCluster::start("citus-smoke", 2, "");
    eprintln!("cluster of 3 nodes up in {:?}", started.elapsed());
    for node in cluster.nodes() {
        assert!(
            cluster.lockext_version(node).is_some(),
            "lockext on {} (port {})",
            node.name,
            node.port
        );
        let mut c = node.connect();
        let nodes: i64 = c
            .query_one("SELECT count(*) AS n FROM pg_dist_node", &[])
            .expect("pg_dist_node")
            .get("n");
        assert_eq!(
            nodes, 3,
            "{} sees the coordinator and two workers",
            node.name
        );
    }

    let mut c = cluster.connect();
    c.batch_execute(
        "CREATE TABLE t(k text PRIMARY KEY); SELECT create_distributed_table('t', 'k'); \
         INSERT INTO t VALUES ('alpha')",
    )
    .expect("a distributed table with one row");

    let shard = cluster.shard_of("t", "alpha");
    let from = cluster.node_port_of_shard(shard);
    let to = cluster
        .workers
        .iter()
        .map(|w| w.port)
        .find(|&p| p != from)
        .expect("another worker");
    assert_ne!(
        from, cluster.coordinator.port,
        "shards go to the workers (the coordinator has no shards)"
    );
    let moving = Instant::now();
    cluster.move_shard(shard, from, to);
    eprintln!(
        "shard {shard} moved from port {from} to {to} in {:?}",
        moving.elapsed()
    );
    assert_eq!(cluster.node_port_of_shard(shard), to, "the placement moved");

    let rows: i64 = c
        .query_one("SELECT count(*) AS n FROM t WHERE k = 'alpha'", &[])
        .expect("read the row after the move")
        .get("n");
    assert_eq!(rows, 1, "the row is read after its shard moved");
    eprintln!("done in {:?}", started.elapsed());
}
