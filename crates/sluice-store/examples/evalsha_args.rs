//! Prints `numkeys`, the keys and the arguments of one `lua/check.lua` call for a token
//! bucket, one per line, exactly as the daemon encodes it (an item's argument holds spaces),
//! so `redis-benchmark ... EVALSHA <sha> "${args[@]}"` runs the same script work as a check
//! (bench/redis-throughput.sh reads them with `mapfile`).

use sluice_core::Rate;
use sluice_core::batch::{Call, Item};
use sluice_core::{Params, Remote};
use sluice_store::redis::encode_check;
use std::time::{SystemTime, UNIX_EPOCH};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?.as_micros() as u64;
    let call = Call {
        now,
        cost: 1,
        request_id: "bench".into(),
        items: vec![Item {
            key: "sl:{bench|user=u1}:bucket".into(),
            params: Params::TokenBucket {
                rate: Rate::per_second(1_000_000),
                burst: 1_000_000_000,
            },
            enforce: true,
            charge_rejected: false,
            remote: Remote::default(),
        }],
    };
    let enc = encode_check(&call)?;
    let mut out = vec![enc.keys.len().to_string()];
    out.extend(enc.keys);
    out.extend(enc.args);
    println!("{}", out.join("\n"));
    Ok(())
}
