//! The store's key → slot function against a real server's `CLUSTER KEYSLOT`: the edge cases
//! of the hash-tag rule, the store's own keys, and seeded random keys heavy in braces.

use sluice_core::algo::Kind;
use sluice_core::matching::store_key;
use sluice_rng::Rng;
use sluice_store::redis::key_slot;
use sluice_testkit::{RedisServer, RespConn};

/// A random string of `len` characters from `alphabet`.
fn draw(rng: &mut Rng, alphabet: &[char], len: usize) -> String {
    (0..len)
        .map(|_| alphabet[rng.below(alphabet.len())])
        .collect()
}

fn server_slot(conn: &mut RespConn, key: &str) -> u16 {
    conn.cmd(&["CLUSTER", "KEYSLOT", key])
        .expect("CLUSTER KEYSLOT")
        .parse()
        .expect("a slot number")
}

#[test]
fn key_slots_match_cluster_keyslot() {
    // A cluster-enabled node answers CLUSTER KEYSLOT before it owns any slot.
    let server = match RedisServer::start_with_args(&["--cluster-enabled", "yes"]) {
        Ok(s) => s,
        Err(e) => panic!("this test needs a real redis-server: {e:#}"),
    };
    let mut conn = server.connect().expect("a connection");
    let mut keys: Vec<String> = [
        "",
        "foo",
        "bar",
        "123456789",
        "{user1000}.following",
        "foo{bar}{zap}",
        "foo{}{bar}",
        "foo{bar",
        "foo}bar{",
        "foo{{bar}}zap",
        "{}",
        "{",
        "}",
        "sl:{edge|user=u}:f:per-user",
        "ключ{é}",
    ]
    .map(String::from)
    .to_vec();
    let seed = 0x5107;
    let mut rng = Rng::stream(seed, 0);
    let braces: Vec<char> = "ab{}:|=".chars().collect();
    let any: Vec<char> = "a{}é€🦀\u{0}\u{7f}".chars().collect();
    let ids: Vec<char> = "az09|=._-".chars().collect();
    for _ in 0..500 {
        let n = rng.below(25);
        keys.push(draw(&mut rng, &braces, n));
        let n = rng.below(12);
        keys.push(draw(&mut rng, &any, n));
        let (n, r) = (rng.below(17), 1 + rng.below(12));
        let (identity, rule) = (draw(&mut rng, &ids, n), draw(&mut rng, &ids, r));
        keys.push(store_key(&identity, &rule, Kind::FixedWindow));
    }
    for key in &keys {
        assert_eq!(
            key_slot(key),
            server_slot(&mut conn, key),
            "{key:?} (seed {seed})"
        );
    }
}
