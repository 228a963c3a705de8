//! `sluicectl import-envoy` over config files covering every key envoyproxy/ratelimit's loader
//! accepts: those it loads are converted (rules sluiced accepts, and a per-file report of what
//! was not carried over, naming path and key); those it refuses are refused with its reason.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/envoy")
        .join(name)
}

fn import(args: &[&str], files: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluicectl"))
        .arg("import-envoy")
        .args(args)
        .args(files.iter().map(|f| fixture(f)))
        .output()
        .expect("runs sluicectl")
}

/// Imports files the service loads; returns the rule set and the report.
fn accepted(args: &[&str], files: &[&str]) -> (sluice_core::rules::RuleSet, String) {
    let out = import(args, files);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{files:?} refused: {stderr}");
    let yaml = String::from_utf8(out.stdout).expect("utf-8");
    let set = sluice_core::rules::parse_yaml(&yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    (set, stderr)
}

fn ids(set: &sluice_core::rules::RuleSet, domain: &str) -> Vec<String> {
    set.domain(domain)
        .unwrap_or_else(|| panic!("domain {domain}"))
        .rules
        .iter()
        .map(|r| r.id.to_string())
        .collect()
}

#[test]
fn configs_the_service_loads_are_converted_with_a_report_per_file() {
    // (file, domain, rules, report lines "path key: ..." it must hold, how many notes)
    let cases: &[(&str, &str, usize, &[&str], usize)] = &[
        (
            "basic.yaml",
            "shop",
            10,
            &[
                "descriptors[1] value: for client=probe Envoy follows the more specific entry (descriptors[3]) and applies no limit at this depth; carried as a mode: off rule there",
            ],
            1,
        ),
        (
            "replaces.yaml",
            "auth",
            2,
            &[
                "descriptors[1] replaces: [\"login_default\", \"nobody\"] not carried over",
                "descriptors[1] replaces: \"nobody\" names no limit",
                "descriptors[2] requests_per_unit: not carried over",
            ],
            3,
        ),
        (
            "metrics.yaml",
            "billing",
            3,
            &[
                "descriptors[0] detailed_metric: not carried over",
                "descriptors[0] value_to_metric: not carried over",
                "descriptors[1] quota_mode: not carried over",
                "descriptors[1] metadata: not carried over",
                "descriptors[2] shadow_mode: no effect without a rate_limit",
                "descriptors[2] value_to_metric: not carried over",
            ],
            6,
        ),
        (
            "wildcards.yaml",
            "files",
            2,
            &[
                "descriptors[2] value: not carried over: wildcard object=img/*",
                "nor its share_threshold",
                "descriptors[3] value: not carried over: wildcard object=doc*v2",
                "descriptors[4] value: not carried over: wildcard object=a*b*c",
                "descriptors[5] key: not carried over: key \"zone*\"",
            ],
            4,
        ),
        (
            "ignored.yaml",
            "misc",
            2,
            &[
                "document 2 ---: not read",
                "root name: ignored",
                "descriptors[0] unit: ignored",
                "descriptors[0].rate_limit key: ignored",
            ],
            4,
        ),
        ("no_descriptors.yaml", "idle", 0, &[], 0),
        ("merge_a.yaml", "merged", 1, &[], 0),
    ];
    for (file, domain, rules, lines, n) in cases {
        let (set, report) = accepted(&[], &[file]);
        assert_eq!(
            ids(&set, domain).len(),
            *rules,
            "{file}: {:?}",
            ids(&set, domain)
        );
        for l in *lines {
            assert!(report.contains(l), "{file}: missing {l:?} in:\n{report}");
        }
        let notes = report.lines().filter(|l| l.starts_with("  - ")).count();
        assert_eq!(notes, *n, "{file}:\n{report}");
        if *n == 0 {
            assert!(
                report.contains(&format!("{file}: everything was carried over")),
                "{report}"
            );
        }
    }
}

#[test]
fn carried_keys_land_where_they_should() {
    let (set, _) = accepted(&[], &["basic.yaml"]);
    let shop = set.domain("shop").expect("shop");
    let rule = |id: &str| {
        shop.rules
            .iter()
            .find(|r| &*r.id == id)
            .unwrap_or_else(|| panic!("{id} in {:?}", ids(&set, "shop")))
    };
    assert_eq!(rule("beta").mode, sluice_core::rules::Mode::Shadow);
    assert_eq!(rule("health").mode, sluice_core::rules::Mode::Off);
    rule("partner_daily");
    // client=probe has an entry of its own without a limit: Envoy applies none, and neither
    // does Sluice (its `off` rule wins the group over the bare `client` rule).
    let applied = |value: &str| -> Vec<String> {
        let d = sluice_core::matching::Descriptors::new(vec![
            ("client".to_string(), value.to_string()),
            ("envoy.keys".to_string(), "client".to_string()),
        ])
        .expect("descriptors");
        sluice_core::matching::applicable(shop, &d)
            .into_iter()
            .map(|a| a.rule.id.to_string())
            .collect()
    };
    assert!(applied("probe").is_empty(), "{:?}", applied("probe"));
    assert_eq!(applied("anyone"), vec!["client"]);
    assert_eq!(applied("partner"), vec!["partner_daily"]);
    // share_threshold on "*": every value shares one count (no key field); without it, per value.
    let (set, _) = accepted(&[], &["wildcards.yaml"]);
    let files = set.domain("files").expect("files");
    let keys: Vec<(String, usize)> = files
        .rules
        .iter()
        .map(|r| (r.id.to_string(), r.key.len()))
        .collect();
    assert_eq!(keys, vec![("bucket".into(), 1), ("shared".into(), 0)]);
    // The second document is not read, as by the service.
    let (set, _) = accepted(&[], &["ignored.yaml"]);
    assert!(set.domain("second-document").is_none());
    assert_eq!(ids(&set, "misc"), vec!["42_true", "free"]);
}

#[test]
fn domains_merge_across_files_only_when_asked() {
    let (set, report) = accepted(&["--merge-domains"], &["merge_a.yaml", "merge_b.yaml"]);
    assert_eq!(ids(&set, "merged"), vec!["a", "b"]);
    assert!(report.contains("from 2 file(s)"), "{report}");
    let out = import(&[], &["merge_a.yaml", "merge_b.yaml"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("merge_b.yaml: duplicate domain 'merged' in config file"),
        "{e}"
    );
    // Merged or not, a composite key may not repeat.
    let out = import(&["--merge-domains"], &["merge_a.yaml", "merge_a.yaml"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("duplicate descriptor composite key 'merged.a'"),
        "{e}"
    );
}

#[test]
fn configs_the_service_refuses_are_refused_with_its_reason() {
    for (file, why) in [
        ("bad_unit.yaml", "invalid rate limit unit 'fortnight'"),
        ("bad_yaml.yaml", "error loading config file"),
        (
            "bad_duplicate_key.yaml",
            "duplicate descriptor composite key 'd.a_b_c'",
        ),
        (
            "bad_empty_domain.yaml",
            "config file cannot have empty domain",
        ),
        (
            "bad_empty_key.yaml",
            "descriptors[0]: descriptor has empty key",
        ),
        (
            "bad_unknown_key.yaml",
            "descriptors[0]: config error, unknown key 'ratelimit'",
        ),
        (
            "bad_unknown_limit_key.yaml",
            "unknown key 'request_per_unit'",
        ),
        ("bad_non_map_list.yaml", "list of type other than map: x"),
        ("bad_non_string_key.yaml", "key is not of type string: 7"),
        (
            "bad_replaces_empty.yaml",
            "should not have an empty replaces entry",
        ),
        (
            "bad_replaces_self.yaml",
            "replaces should not contain name of same descriptor",
        ),
        (
            "bad_unlimited_with_unit.yaml",
            "should not specify rate limit unit when unlimited",
        ),
        (
            "bad_share_threshold.yaml",
            "share_threshold can only be used with wildcard values",
        ),
        ("bad_float.yaml", "error checking config"),
    ] {
        let out = import(&[], &[file]);
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file} accepted");
        assert!(out.stdout.is_empty(), "{file}: rules printed");
        assert!(
            e.contains(file) && e.contains(why),
            "{file}: want {why:?}, got {e}"
        );
    }
}
