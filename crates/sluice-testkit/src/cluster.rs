//! A real Redis Cluster on loopback.
//!
//! The store keeps every key of one identity under one hash tag `{identity}` so a multi-bucket
//! check is a single-slot script; that, `MOVED`/`ASK` handling during a live resharding, and
//! surviving a primary failure can only be tested against a real cluster. [`RedisCluster`]
//! builds one from [`RedisServer`]s with `redis-cli --cluster create` and offers the operations
//! a test needs to provoke those situations.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};

use crate::ports::free_cluster_ports;
use crate::process::{kill_and_reap, wait_timeout};
use crate::redis::RedisServer;

/// Number of hash slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// How long the cluster may take to report `cluster_state:ok` everywhere after creation.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `redis-cli --cluster create` may run.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long every node may take to learn a migrated slot's new owner.
const PROPAGATION_TIMEOUT: Duration = Duration::from_secs(15);
/// Keys moved per `MIGRATE` call.
const MIGRATE_BATCH: usize = 100;
/// How many ports a node start tries when another process grabs its port first.
const PORT_ATTEMPTS: usize = 3;

/// How to build a [`RedisCluster`].
///
/// The defaults are a small, quick cluster; raise `node_timeout_ms` for slow machines, lower it
/// to make failover tests faster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Number of primaries (each owns an even share of the 16384 slots). At least 1.
    pub primaries: usize,
    /// Replicas attached to each primary.
    pub replicas_per_primary: usize,
    /// `cluster-node-timeout` in milliseconds: how long before a silent node is marked failed.
    pub node_timeout_ms: u64,
    /// Extra `redis-server` arguments for every node.
    pub extra_args: Vec<String>,
}

/// The certificate files of a TLS Redis (clients are not asked for certificates).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTls {
    /// `--tls-cert-file`.
    pub cert_file: PathBuf,
    /// `--tls-key-file`.
    pub key_file: PathBuf,
    /// `--tls-ca-cert-file` (the nodes verify each other's bus connections with it).
    pub ca_file: PathBuf,
}

impl RedisTls {
    /// The server files of a [`TestPki`](crate::TestPki).
    #[must_use]
    pub fn from_pki(pki: &crate::TestPki) -> Self {
        RedisTls {
            cert_file: pki.server_cert_file(),
            key_file: pki.server_key_file(),
            ca_file: pki.ca_file(),
        }
    }

    /// `redis-server` arguments serving TLS on `tls_port` beside the plain port.
    #[must_use]
    pub fn args(&self, tls_port: u16) -> Vec<String> {
        vec![
            "--tls-port".into(),
            tls_port.to_string(),
            "--tls-cert-file".into(),
            self.cert_file.display().to_string(),
            "--tls-key-file".into(),
            self.key_file.display().to_string(),
            "--tls-ca-cert-file".into(),
            self.ca_file.display().to_string(),
            "--tls-auth-clients".into(),
            "no".into(),
        ]
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            primaries: 3,
            replicas_per_primary: 0,
            node_timeout_ms: 2000,
            extra_args: Vec::new(),
        }
    }
}

/// One node as seen in `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeView {
    id: String,
    port: u16,
    primary: bool,
    slots: Vec<(u16, u16)>,
}

/// A Redis Cluster of real `redis-server` processes on loopback.
///
/// Nodes are indexed in start order (`0..primaries * (1 + replicas)`); every method taking a
/// node takes such an index. Which index is a primary is decided by `redis-cli` and can change
/// on failover, so ask [`primaries`](Self::primaries) rather than assuming. Dropping the
/// cluster kills every node and removes their directories.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    options: ClusterOptions,
}

impl RedisCluster {
    /// Starts `primaries × (1 + replicas_per_primary)` nodes, joins them into a cluster and
    /// waits until every node reports `cluster_state:ok` (30 s at most).
    ///
    /// The usual entry point; uses a 2000 ms node timeout.
    pub fn start(primaries: usize, replicas_per_primary: usize) -> Result<Self> {
        Self::start_with(ClusterOptions {
            primaries,
            replicas_per_primary,
            ..ClusterOptions::default()
        })
    }

    /// Like [`start`](Self::start) with every option explicit.
    ///
    /// For a custom node timeout or extra server arguments.
    pub fn start_with(options: ClusterOptions) -> Result<Self> {
        Self::start_with_tls(options, None)
    }

    /// Like [`start_with`](Self::start_with), serving TLS too when `tls` is given: each node
    /// gets a TLS port of its own (see [`tls_urls`](Self::tls_urls)) and the cluster bus runs
    /// over TLS, so `CLUSTER SLOTS` asked over TLS names TLS ports.
    pub fn start_with_tls(options: ClusterOptions, tls: Option<RedisTls>) -> Result<Self> {
        ensure!(
            options.primaries >= 1,
            "a Redis Cluster needs at least 1 primary"
        );
        let total = options.primaries * (1 + options.replicas_per_primary);
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.push(options.node_timeout_ms.to_string());
        args.extend(options.extra_args.iter().cloned());

        let mut nodes = Vec::with_capacity(total);
        let mut ports = free_cluster_ports(total)?;
        while let Some(port) = ports.pop() {
            let mut attempt = 1;
            let mut port = port;
            loop {
                let mut node_args = args.clone();
                if let Some(tls) = &tls {
                    node_args.extend(tls.args(crate::free_port()));
                    // The bus follows the TLS port unless told: keep it beside the plain one.
                    node_args.extend(
                        [
                            "--tls-cluster",
                            "yes",
                            "--tls-replication",
                            "yes",
                            "--cluster-port",
                        ]
                        .map(String::from),
                    );
                    node_args.push((port + 10_000).to_string());
                }
                match RedisServer::start_on(port, node_args) {
                    Ok(node) => break nodes.push(node),
                    Err(e) if attempt < PORT_ATTEMPTS && format!("{e:#}").contains("in use") => {
                        attempt += 1;
                        port = free_cluster_ports(1)?[0];
                    }
                    Err(e) => return Err(e.context("starting a Redis Cluster node")),
                }
            }
        }
        let cluster = Self { nodes, options };
        if cluster.options.primaries >= 3 {
            cluster.create_with_redis_cli()?;
        } else {
            // redis-cli refuses fewer than 3 primaries; join them by hand.
            cluster.create_by_hand()?;
        }
        cluster.wait_formed(FORM_TIMEOUT)?;
        Ok(cluster)
    }

    fn create_with_redis_cli(&self) -> Result<()> {
        let mut cmd = Command::new("redis-cli");
        cmd.arg("--cluster").arg("create");
        for node in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.arg("--cluster-replicas")
            .arg(self.options.replicas_per_primary.to_string())
            .arg("--cluster-yes")
            .stdin(Stdio::null());
        let out_path = self.nodes[0].dir().join("cluster-create.log");
        let out = std::fs::File::create(&out_path)
            .with_context(|| format!("creating {}", out_path.display()))?;
        let err = out
            .try_clone()
            .with_context(|| format!("opening {}", out_path.display()))?;
        let mut child = match cmd.stdout(out).stderr(err).spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "redis-cli not found: install it with `apt-get install redis-server` (or redis-tools)"
            ),
            Err(e) => return Err(anyhow!(e).context("spawning redis-cli --cluster create")),
        };
        let output = || {
            std::fs::read(&out_path)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        };
        match wait_timeout(&mut child, CREATE_TIMEOUT)? {
            Some(status) if status.success() => Ok(()),
            Some(status) => bail!(
                "`redis-cli --cluster create` failed ({status}):\n{}",
                output()
            ),
            None => {
                let _ = kill_and_reap(&mut child);
                bail!(
                    "`redis-cli --cluster create` did not finish within {CREATE_TIMEOUT:?}:\n{}",
                    output()
                )
            }
        }
    }

    fn create_by_hand(&self) -> Result<()> {
        let p = self.options.primaries;
        let ids = (0..self.nodes.len())
            .map(|i| self.node_id(i))
            .collect::<Result<Vec<_>>>()?;
        for i in 0..p {
            let start = usize::from(SLOTS) * i / p;
            let end = usize::from(SLOTS) * (i + 1) / p - 1;
            let node = &self.nodes[i];
            node.cmd(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &start.to_string(),
                &end.to_string(),
            ])?;
            node.cmd(&["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()])?;
        }
        let seed = self.nodes[0].port().to_string();
        for node in &self.nodes[1..] {
            node.cmd(&["CLUSTER", "MEET", "127.0.0.1", &seed])?;
        }
        let total = self.nodes.len();
        wait_until(FORM_TIMEOUT, "every node to know every other", || {
            self.nodes.iter().try_fold(true, |acc, node| {
                let info = node.cmd(&["CLUSTER", "INFO"])?;
                Ok(acc && info_field(&info, "cluster_known_nodes") == Some(total.to_string()))
            })
        })?;
        for (j, node) in self.nodes.iter().enumerate().skip(p) {
            let primary = &ids[(j - p) % p];
            node.cmd(&["CLUSTER", "REPLICATE", primary])?;
        }
        Ok(())
    }

    /// Waits until every node reports the full topology: state ok, all slots assigned, all
    /// nodes known, and every replica attached.
    fn wait_formed(&self, timeout: Duration) -> Result<()> {
        let total = self.nodes.len();
        let want_replicas = self.options.primaries * self.options.replicas_per_primary;
        wait_until(
            timeout,
            "the cluster to form (cluster_state:ok on every node)",
            || {
                for node in &self.nodes {
                    let info = node.cmd(&["CLUSTER", "INFO"])?;
                    if info_field(&info, "cluster_state").as_deref() != Some("ok")
                        || info_field(&info, "cluster_slots_assigned").as_deref() != Some("16384")
                        || info_field(&info, "cluster_known_nodes") != Some(total.to_string())
                    {
                        return Ok(false);
                    }
                    let view = parse_nodes(&node.cmd(&["CLUSTER", "NODES"])?)?;
                    let replicas = view.iter().filter(|n| !n.primary).count();
                    if replicas != want_replicas {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
    }

    /// All nodes, in start order.
    ///
    /// For per-node commands (`cluster.nodes()[i].cmd(..)`), pausing a node, or reading logs.
    #[must_use]
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i` (panics when out of range, like slice indexing).
    ///
    /// Shorthand for `&cluster.nodes()[i]`.
    #[must_use]
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// Node `i`, mutably (panics when out of range), to kill or restart it.
    ///
    /// E.g. `cluster.node_mut(i).restart_keeping_files()` to bring a killed node back.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// The options the cluster was built with.
    #[must_use]
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// The seed URLs (`redis://127.0.0.1:PORT/`) of every node, in start order.
    ///
    /// What a cluster client (the store) is configured with.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The TLS seed URLs (`rediss://127.0.0.1:TLS_PORT/`) of every node, for a cluster
    /// started with [`start_with_tls`](Self::start_with_tls).
    pub fn tls_urls(&self) -> Result<Vec<String>> {
        self.nodes.iter().map(RedisServer::tls_url).collect()
    }

    /// The cluster node id of node `i` (`CLUSTER MYID`).
    ///
    /// Needed for `CLUSTER SETSLOT … NODE <id>`, `CLUSTER REPLICATE <id>` and similar.
    pub fn node_id(&self, i: usize) -> Result<String> {
        self.checked(i)?.cmd(&["CLUSTER", "MYID"])
    }

    /// The indices of the nodes that are currently primaries owning slots, ascending.
    ///
    /// Roles are chosen by `redis-cli` and change on failover, so tests ask rather than guess.
    pub fn primaries(&self) -> Result<Vec<usize>> {
        let view = self.view()?;
        let mut out: Vec<usize> = view
            .iter()
            .filter(|n| n.primary && !n.slots.is_empty())
            .filter_map(|n| self.index_of_port(n.port))
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// The node ids of the primaries owning slots, in the order of [`primaries`](Self::primaries).
    ///
    /// For commands that name nodes by id.
    pub fn primary_ids(&self) -> Result<Vec<String>> {
        let view = self.view()?;
        let by_port: HashMap<u16, &NodeView> = view.iter().map(|n| (n.port, n)).collect();
        self.primaries()?
            .into_iter()
            .map(|i| {
                by_port
                    .get(&self.nodes[i].port())
                    .map(|n| n.id.clone())
                    .ok_or_else(|| anyhow!("node {i} vanished from CLUSTER NODES"))
            })
            .collect()
    }

    /// The index of the primary owning `slot`, as seen by the first live node.
    ///
    /// Lets a test find which node to pause or kill to hit a given key.
    pub fn node_for_slot(&self, slot: u16) -> Result<usize> {
        ensure!(slot < SLOTS, "slot {slot} is out of range (0..16384)");
        let view = self.view()?;
        let port = owner_port(&view, slot)
            .ok_or_else(|| anyhow!("no primary owns slot {slot} in CLUSTER NODES"))?;
        self.index_of_port(port)
            .ok_or_else(|| anyhow!("slot {slot} is owned by unknown port {port}"))
    }

    /// The slot of `key`, as the first live node computes it (`CLUSTER KEYSLOT`).
    ///
    /// The server's answer rather than a copy of its hash, so a test can check the store's
    /// own slot function against it.
    pub fn slot_of(&self, key: &str) -> Result<u16> {
        let mut last = anyhow!("no live node in the cluster");
        for (i, node) in self.nodes.iter().enumerate() {
            if !self.is_live(i) {
                continue;
            }
            match node.cmd(&["CLUSTER", "KEYSLOT", key]) {
                Ok(text) => {
                    return text
                        .parse()
                        .with_context(|| format!("CLUSTER KEYSLOT {key:?} answered {text:?}"));
                }
                Err(e) => last = e,
            }
        }
        Err(last.context(format!("CLUSTER KEYSLOT {key:?}")))
    }

    /// The index of the primary owning `key`'s slot.
    ///
    /// Shorthand for `node_for_slot(slot_of(key)?)`.
    pub fn node_for_key(&self, key: &str) -> Result<usize> {
        self.node_for_slot(self.slot_of(key)?)
    }

    /// Moves `slot` from primary `from` to primary `to` while the cluster is live, with the
    /// standard resharding sequence, and returns how many keys were moved.
    ///
    /// Lets tests provoke `ASK`/`MOVED` redirections under load. Steps: `CLUSTER SETSLOT
    /// IMPORTING` on the target, `MIGRATING` on the source, `CLUSTER GETKEYSINSLOT` + `MIGRATE
    /// … KEYS` in batches of 100 until the slot is empty on the source, then `CLUSTER SETSLOT
    /// … NODE <target>` on the target, the source and every other primary; finally it waits
    /// until every live node names the target as the owner.
    pub fn migrate_slot(&self, slot: u16, from: usize, to: usize) -> Result<usize> {
        ensure!(slot < SLOTS, "slot {slot} is out of range (0..16384)");
        ensure!(
            from != to,
            "cannot migrate slot {slot} from node {from} to itself"
        );
        let owner = self.node_for_slot(slot)?;
        ensure!(
            owner == from,
            "slot {slot} is owned by node {owner}, not by node {from}"
        );
        let source = self.checked(from)?;
        let target = self.checked(to)?;
        let source_id = self.node_id(from)?;
        let target_id = self.node_id(to)?;
        let slot_s = slot.to_string();
        let ctx =
            |step: &str| format!("migrating slot {slot} from node {from} to node {to}: {step}");

        target
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &source_id])
            .with_context(|| ctx("SETSLOT IMPORTING"))?;
        source
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &target_id])
            .with_context(|| ctx("SETSLOT MIGRATING"))?;

        let batch = MIGRATE_BATCH.to_string();
        let target_port = target.port().to_string();
        let mut moved = 0;
        loop {
            let keys = source
                .cmd_reply(&["CLUSTER", "GETKEYSINSLOT", &slot_s, &batch])
                .with_context(|| ctx("GETKEYSINSLOT"))?
                .into_bytes_list()
                .with_context(|| ctx("GETKEYSINSLOT"))?;
            if keys.is_empty() {
                break;
            }
            let mut args: Vec<Vec<u8>> = vec![
                b"MIGRATE".to_vec(),
                b"127.0.0.1".to_vec(),
                target_port.as_bytes().to_vec(),
                Vec::new(),
                b"0".to_vec(),
                b"5000".to_vec(),
                b"KEYS".to_vec(),
            ];
            let n = keys.len();
            args.extend(keys);
            let reply = source.cmd(&args).with_context(|| ctx("MIGRATE"))?;
            ensure!(
                reply == "OK" || reply == "NOKEY",
                "{}",
                ctx(&format!("MIGRATE answered {reply:?}"))
            );
            moved += n;
        }

        target
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &target_id])
            .with_context(|| ctx("SETSLOT NODE on the target"))?;
        source
            .cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &target_id])
            .with_context(|| ctx("SETSLOT NODE on the source"))?;
        for i in self.primaries()? {
            if i != from && i != to && self.is_live(i) {
                self.nodes[i]
                    .cmd(&["CLUSTER", "SETSLOT", &slot_s, "NODE", &target_id])
                    .with_context(|| ctx(&format!("SETSLOT NODE on node {i}")))?;
            }
        }

        let target_port = target.port();
        wait_until(
            PROPAGATION_TIMEOUT,
            &format!("every node to see slot {slot} on node {to}"),
            || {
                for (i, node) in self.nodes.iter().enumerate() {
                    if !self.is_live(i) {
                        continue;
                    }
                    let view = parse_nodes(&node.cmd(&["CLUSTER", "NODES"])?)?;
                    if owner_port(&view, slot) != Some(target_port) {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )?;
        Ok(moved)
    }

    /// Kills node `i` with SIGKILL (a node crash); the cluster fails it over after the node
    /// timeout if it was a primary with a replica.
    ///
    /// For failover tests; bring it back with `node_mut(i).restart_keeping_files()`.
    pub fn kill_node(&mut self, i: usize) -> Result<()> {
        self.checked(i)?;
        self.nodes[i].kill()
    }

    /// Waits until every live (running, not paused) node reports `cluster_state:ok`.
    ///
    /// After a kill or a failover, before the test goes on.
    pub fn wait_state_ok(&self, timeout: Duration) -> Result<()> {
        wait_until(timeout, "cluster_state:ok on every live node", || {
            for (i, node) in self.nodes.iter().enumerate() {
                if self.is_live(i) {
                    let info = node.cmd(&["CLUSTER", "INFO"])?;
                    if info_field(&info, "cluster_state").as_deref() != Some("ok") {
                        return Ok(false);
                    }
                }
            }
            Ok(true)
        })
    }

    fn checked(&self, i: usize) -> Result<&RedisServer> {
        self.nodes.get(i).ok_or_else(|| {
            anyhow!(
                "node index {i} out of range (the cluster has {} nodes)",
                self.nodes.len()
            )
        })
    }

    fn is_live(&self, i: usize) -> bool {
        self.nodes[i].pid().is_some() && !self.nodes[i].is_paused()
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// `CLUSTER NODES` from the first live node that answers.
    fn view(&self) -> Result<Vec<NodeView>> {
        let mut last = anyhow!("no live node in the cluster");
        for (i, node) in self.nodes.iter().enumerate() {
            if !self.is_live(i) {
                continue;
            }
            match node.cmd(&["CLUSTER", "NODES"]) {
                Ok(text) => return parse_nodes(&text),
                Err(e) => last = e,
            }
        }
        Err(last.context("reading CLUSTER NODES"))
    }
}

/// Polls `check` every 50 ms until it returns true; errors from `check` are retried until the
/// deadline and reported if it passes.
fn wait_until(
    timeout: Duration,
    what: &str,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last_err = None;
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(match last_err {
                Some(e) => e.context(format!("timed out after {timeout:?} waiting for {what}")),
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of `field` in `CLUSTER INFO` / `INFO` output.
fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k == field).then(|| v.trim().to_owned())
    })
}

/// Parses `CLUSTER NODES`: `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong>
/// <epoch> <link> <slot> <slot> ...`.
fn parse_nodes(text: &str) -> Result<Vec<NodeView>> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        ensure!(fields.len() >= 8, "malformed CLUSTER NODES line {line:?}");
        let addr = fields[1].split(['@', ',']).next().unwrap_or_default();
        let port = addr
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .ok_or_else(|| anyhow!("bad address in CLUSTER NODES line {line:?}"))?;
        let flags = fields[2];
        if flags.contains("noaddr") || flags.contains("handshake") {
            continue;
        }
        let mut slots = Vec::new();
        for s in &fields[8..] {
            if s.starts_with('[') {
                continue; // an importing/migrating marker, not ownership
            }
            let range = match s.split_once('-') {
                Some((a, b)) => (a.parse(), b.parse()),
                None => (s.parse(), s.parse()),
            };
            match range {
                (Ok(a), Ok(b)) => slots.push((a, b)),
                _ => bail!("bad slot range {s:?} in CLUSTER NODES line {line:?}"),
            }
        }
        out.push(NodeView {
            id: fields[0].to_owned(),
            port,
            primary: flags.contains("master"),
            slots,
        });
    }
    Ok(out)
}

fn owner_port(view: &[NodeView], slot: u16) -> Option<u16> {
    view.iter()
        .filter(|n| n.primary)
        .find(|n| n.slots.iter().any(|&(a, b)| a <= slot && slot <= b))
        .map(|n| n.port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cluster_nodes() -> Result<()> {
        let text = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host replica e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5461-<-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1]
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16382 16383
";
        let view = parse_nodes(text)?;
        assert_eq!(view.len(), 4);
        assert!(!view[0].primary);
        assert_eq!(owner_port(&view, 0), Some(30001));
        assert_eq!(owner_port(&view, 5461), Some(30002));
        assert_eq!(owner_port(&view, 16383), Some(30003));
        assert_eq!(
            info_field("a:1\r\ncluster_state:ok\r\n", "cluster_state").as_deref(),
            Some("ok")
        );
        Ok(())
    }
}
