//! The report of a run: decisions per second, allowed/denied/errors, latency percentiles, as
//! text for people and JSON (`--json`) for scripts such as bench/compare-limitador.sh.

use crate::run::{Mode, Outcome, Plan};
use serde_json::{Value, json};

/// Percentiles reported, as (name, quantile).
pub const QUANTILES: [(&str, f64); 4] =
    [("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999)];

/// The run as a JSON document.
pub fn json(plan: &Plan, o: &Outcome) -> Value {
    let answered = o.allowed + o.denied;
    let us = |ns: u64| (ns as f64 / 1e3 * 10.0).round() / 10.0;
    let mut lat = serde_json::Map::new();
    for (name, q) in QUANTILES {
        lat.insert(name.into(), json!(us(o.latency.value_at_quantile(q))));
    }
    lat.insert("max".into(), json!(us(o.latency.max())));
    lat.insert(
        "mean".into(),
        json!((o.latency.mean() / 100.0).round() / 10.0),
    );
    let (mode, rate) = match plan.mode {
        Mode::Closed => ("closed", Value::Null),
        Mode::Open { rate } => ("open", json!(rate)),
    };
    json!({
        "api": plan.shape.api.name(),
        "addr": plan.shape.addr.to_string(),
        "domain": plan.shape.domain,
        "mode": mode,
        "offered_rate": rate,
        "concurrency": plan.concurrency,
        "connections": plan.connections,
        "distribution": plan.dist.name(),
        "keys": match &plan.dist { crate::keys::Dist::Hot => 1, crate::keys::Dist::Uniform(n) => *n, crate::keys::Dist::Zipf { keys, .. } => *keys },
        "zipf_s": match &plan.dist { crate::keys::Dist::Zipf { s, .. } => json!(s), _ => Value::Null },
        "seconds": (o.seconds * 1000.0).round() / 1000.0,
        "requests": answered + o.errors,
        "decisions_per_s": if o.seconds > 0.0 { (answered as f64 / o.seconds).round() } else { 0.0 },
        "allowed": o.allowed,
        "denied": o.denied,
        "errors": o.errors,
        "unsent": o.unsent,
        "latency_us": lat,
        "first_error": o.first_error,
        "client_cpu_s": o.client_cpu.map(|(cpu, _)| (cpu * 100.0).round() / 100.0),
        "client_cpu_share": o.client_cpu.map(|(cpu, wall)| ((cpu / wall.max(1e-9)) * 100.0).round() / 100.0),
    })
}

/// The run as text.
pub fn text(plan: &Plan, o: &Outcome) -> String {
    let v = json(plan, o);
    let l = &v["latency_us"];
    let mut s = format!(
        "{} {} loop against {} ({}, {} keys), {:.1} s measured\n",
        v["api"].as_str().unwrap_or_default(),
        v["mode"].as_str().unwrap_or_default(),
        v["addr"].as_str().unwrap_or_default(),
        v["distribution"].as_str().unwrap_or_default(),
        v["keys"],
        o.seconds,
    );
    if let Mode::Open { rate } = plan.mode {
        s += &format!("  offered      {rate:.0} req/s\n");
    }
    s += &format!(
        "  decisions/s  {}\n  allowed      {}\n  denied       {}\n  errors       {}\n",
        v["decisions_per_s"], o.allowed, o.denied, o.errors
    );
    if o.unsent > 0 {
        s += &format!(
            "  unsent       {} (the server fell behind the offered rate)\n",
            o.unsent
        );
    }
    s += &format!(
        "  latency us   p50 {}  p90 {}  p99 {}  p99.9 {}  max {}\n",
        l["p50"], l["p90"], l["p99"], l["p999"], l["max"]
    );
    if let Some((cpu, wall)) = o.client_cpu {
        s += &format!(
            "  client CPU   {cpu:.1} s over {wall:.1} s ({:.2} cores)\n",
            cpu / wall.max(1e-9)
        );
    }
    if let Some(e) = &o.first_error {
        s += &format!("  first error  {e}\n");
    }
    s
}
