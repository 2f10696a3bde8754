use proptest::prelude::*;
use serde_json::json;

use super::*;

fn ok(line: &str) -> Request {
    match parse(line.as_bytes()) {
        Ok(r) => r,
        Err(e) => panic!("{line} was rejected: {e:?}"),
    }
}

fn err(line: &str) -> RequestError {
    match parse(line.as_bytes()) {
        Ok(r) => panic!("{line} was accepted as {r:?}"),
        Err(e) => e,
    }
}

fn args_err(name: &str, args: serde_json::Value) -> String {
    let e = err(&json!({"execute": name, "arguments": args}).to_string());
    assert_eq!(e.class, ErrorClass::GenericError, "{e:?}");
    e.desc
}

#[test]
fn parse_accepts_command_without_arguments_or_id() {
    assert_eq!(
        ok(r#"{"execute":"query-vm"}"#),
        Request {
            id: None,
            command: Command::QueryVm(NoArgs {})
        }
    );
}

#[test]
fn parse_keeps_any_json_id_even_on_errors() {
    let r = ok(r#"{"execute":"quit","id":{"seq":[1,"a"]}}"#);
    assert_eq!(r.id, Some(json!({"seq": [1, "a"]})));
    let e = err(r#"{"execute":"nope","id":7}"#);
    assert_eq!(
        (e.id, e.class),
        (Some(json!(7)), ErrorClass::CommandNotFound)
    );
}

#[test]
fn parse_accepts_surrounding_whitespace() {
    assert_eq!(
        ok("\n {\"execute\":\"pause\"}\r\n").command,
        Command::Pause(NoArgs {})
    );
}

#[test]
fn qemu_run_state_names_parse_beside_ours() {
    assert_eq!(
        ok(r#"{"execute":"stop"}"#).command,
        Command::Stop(NoArgs {})
    );
    assert_eq!(
        ok(r#"{"execute":"cont"}"#).command,
        Command::Cont(NoArgs {})
    );
}

#[test]
fn get_stats_fd_for_vcpu_takes_index_or_all() {
    let one = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu","vcpu":3}}"#);
    let Command::GetStatsFd(a) = one.command else {
        panic!()
    };
    assert_eq!(a.vcpu, Some(VcpuSelector::One(3)));
    let all = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu","vcpu":"all"}}"#);
    let Command::GetStatsFd(a) = all.command else {
        panic!()
    };
    assert_eq!(a.vcpu, Some(VcpuSelector::All));
    let desc = args_err("get-stats-fd", json!({"target": "vcpu", "vcpu": "some"}));
    assert!(
        desc.contains("'vcpu'") && desc.contains("\"all\""),
        "{desc}"
    );
}

#[test]
fn get_stats_fd_for_vm_rejects_a_vcpu_argument() {
    let desc = args_err("get-stats-fd", json!({"target": "vm", "vcpu": 0}));
    assert!(
        desc.contains("'vcpu' only goes with target 'vcpu'"),
        "{desc}"
    );
}

#[test]
fn missing_arguments_are_named() {
    let desc = args_err("get-stats-fd", json!({}));
    assert_eq!(desc, "get-stats-fd: parameter 'target' is missing");
    let desc = args_err("guest-command", json!({"vcpu": 0}));
    assert_eq!(desc, "guest-command: parameter 'command' is missing");
}

#[test]
fn query_stats_takes_qemus_filter_with_qom_paths() {
    let r = ok(r#"{"execute":"query-stats","arguments":{"target":"vcpu",
        "providers":[{"provider":"kvm","names":["exits"]}],
        "vcpus":["/machine/unattached/device[1]", 0]}}"#);
    let Command::QueryStats(a) = r.command else {
        panic!()
    };
    assert_eq!(
        a.providers,
        Some(vec![StatsRequest {
            provider: StatsProvider::Kvm,
            names: Some(vec!["exits".into()])
        }])
    );
    assert_eq!(
        a.vcpus,
        Some(vec![
            VcpuRef::QomPath("/machine/unattached/device[1]".into()),
            VcpuRef::Index(0)
        ])
    );
}

#[test]
fn query_stats_rejects_vcpus_with_vm_target() {
    let desc = args_err("query-stats", json!({"target": "vm", "vcpus": [0]}));
    assert!(desc.contains("'vcpus'"), "{desc}");
}

#[test]
fn unknown_providers_and_targets_are_errors_naming_the_member() {
    let desc = args_err("query-stats", json!({"target": "disk"}));
    assert!(desc.contains("target"), "{desc}");
    let desc = args_err(
        "query-stats",
        json!({"target": "vm", "providers": [{"provider": "xen"}]}),
    );
    assert!(desc.contains("providers[0].provider"), "{desc}");
}

#[test]
fn wrong_argument_types_name_the_member() {
    for (name, args, member) in [
        (
            "guest-command",
            json!({"vcpu": "0", "command": "x"}),
            "vcpu",
        ),
        ("guest-command", json!({"vcpu": 0, "command": 5}), "command"),
        ("guest-command", json!({"vcpu": -1, "command": "x"}), "vcpu"),
        ("query-exits", json!({"vcpus": 3}), "vcpus"),
        ("query-samples", json!({"since": -1}), "since"),
    ] {
        let desc = args_err(name, args.clone());
        assert!(desc.contains(&format!("'{member}'")), "{args}: {desc}");
    }
}

#[test]
fn unexpected_argument_is_named() {
    let desc = args_err("query-vm", json!({"verbose": true}));
    assert!(desc.contains("verbose"), "{desc}");
}

#[test]
fn envelope_errors_use_qemus_words() {
    for (line, words) in [
        ("[1]", "must be a JSON object"),
        ("17", "must be a JSON object"),
        ("{\"execute\": 5}", "'execute' must be a string"),
        ("{\"arguments\": {}}", "lacks member 'execute'"),
        (
            "{\"execute\":\"quit\",\"arguments\":[]}",
            "must be an object",
        ),
        (
            "{\"execute\":\"quit\",\"extra\":1}",
            "member 'extra' is unexpected",
        ),
        ("{\"execute\":", "JSON parse error"),
    ] {
        let e = err(line);
        assert_eq!(e.class, ErrorClass::GenericError, "{line}");
        assert!(e.desc.contains(words), "{line}: {}", e.desc);
    }
}

#[test]
fn unknown_command_is_command_not_found() {
    let e = err(r#"{"execute":"query-everything"}"#);
    assert_eq!(e.class, ErrorClass::CommandNotFound);
    assert_eq!(e.desc, "The command query-everything has not been found");
}

#[test]
fn every_listed_command_round_trips_through_serde() {
    for name in Command::names() {
        let minimal = match *name {
            "get-stats-fd" | "query-stats" => json!({"target": "vm"}),
            "guest-command" => json!({"vcpu": 0, "command": "exits count=1"}),
            "migrate" => json!({"uri": "unix:/tmp/m.sock"}),
            "set-vcpu-dirty-limit" => json!({"dirty-rate": 5}),
            "calc-dirty-rate" => json!({"calc-time": 1}),
            "migrate-set-capabilities" => {
                json!({"capabilities": [{"capability": "auto-converge", "state": true}]})
            }
            _ => json!({}),
        };
        let line = json!({"execute": name, "arguments": minimal}).to_string();
        let command = ok(&line).command;
        assert_eq!(command.name(), *name);
        let back = parse(&request_line(&command, None)).unwrap().command;
        assert_eq!(back, command);
    }
}

#[test]
fn only_query_commands_are_queries() {
    assert!(ok(r#"{"execute":"query-samples"}"#).command.is_query());
    assert!(!ok(r#"{"execute":"quit"}"#).command.is_query());
    assert!(!ok(r#"{"execute":"subscribe-samples"}"#).command.is_query());
}

#[test]
fn query_readiness_takes_defaults_and_checks_ranges() {
    let check = |args: serde_json::Value| {
        let line = json!({"execute": "query-readiness", "arguments": args}).to_string();
        parse(line.as_bytes()).map(|r| match r.command {
            Command::QueryReadiness(r) => r.check().unwrap(),
            other => panic!("{other:?}"),
        })
    };
    let a = check(json!({})).unwrap();
    assert_eq!(
        (a.scan, a.calc_time, a.bandwidth, a.max_downtime),
        (false, None, None, None)
    );
    let a = check(json!({"scan": true, "calc-time": 0, "bandwidth": 1e6, "max-downtime": 0.03}))
        .unwrap();
    assert!(a.scan && a.calc_time == Some(Duration::ZERO) && a.bandwidth == Some(1_000_000));
    assert_eq!(a.max_downtime, Some(Duration::from_millis(30)));
    let unlimited = check(json!({"bandwidth": 0})).unwrap();
    assert_eq!(unlimited.bandwidth, Some(0));
    for (args, key) in [
        (json!({"calc-time": -1}), "calc-time"),
        (json!({"calc-time": 1e9}), "calc-time"),
        (json!({"max-downtime": -0.5}), "max-downtime"),
        (json!({"bandwidth": 0.5}), "bandwidth"),
        (json!({"bandwidth": "fast"}), "bandwidth"),
        (json!({"scan": "yes"}), "scan"),
    ] {
        let e = check(args.clone()).unwrap_err();
        assert!(e.desc.contains(key), "{args}: {}", e.desc);
    }
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(line in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&line);
    }

    #[test]
    fn errors_keep_the_id_of_any_object_request(
        name in "[a-z_-]{0,20}",
        id in proptest::option::of(any::<i64>()),
    ) {
        let mut req = json!({"execute": name, "arguments": {"x": 1}});
        if let Some(id) = id {
            req["id"] = json!(id);
        }
        if let Err(e) = parse(req.to_string().as_bytes()) {
            prop_assert_eq!(e.id, id.map(|i| json!(i)));
        }
    }
}

#[test]
fn a_wrong_argument_is_named_without_a_place_in_text_the_client_never_sent() {
    let e = args_err("query-readiness", json!({"calc-time": "0.5"}));
    assert_eq!(
        e,
        "query-readiness: parameter 'calc-time': invalid type: string \"0.5\", expected a number"
    );
    // In JSON's words, not Rust's.
    let e = args_err(
        "migrate-set-parameters",
        json!({"x-cpu-throttle-vcpus": [-1]}),
    );
    assert_eq!(
        e,
        "migrate-set-parameters: parameter 'x-cpu-throttle-vcpus[0]': invalid value: integer `-1`, expected a non-negative integer"
    );
    let e = args_err("migrate-set-parameters", json!({"x-check-ram": 1}));
    assert!(e.ends_with("expected true or false"), "{e}");
    let e = args_err("query-stats", json!({"target": "bogus"}));
    assert!(
        e.starts_with("query-stats: parameter 'target': unknown variant `bogus`"),
        "{e}"
    );
    assert!(!e.contains(" at line "), "{e}");
    // Missing and unexpected members named as QEMU names them.
    assert_eq!(
        args_err("query-stats", json!({})),
        "query-stats: parameter 'target' is missing"
    );
    assert_eq!(
        args_err("query-stats", json!({"target": "vm", "bogus": 1})),
        "query-stats: parameter 'bogus' is unexpected (it takes `target`, `providers`, `names`, `vcpus`)"
    );
    assert_eq!(
        args_err("query-status", json!({"bogus": 1})),
        "query-status: parameter 'bogus' is unexpected (it takes none)"
    );
    // A name given as a number.
    assert_eq!(
        args_err("query-stats", json!({"target": 5})),
        "query-stats: parameter 'target': invalid type, expected a name (a string)"
    );
}

#[test]
fn a_key_named_twice_is_refused_as_qemu_refuses_it() {
    for line in [
        r#"{"execute":"query-status","execute":"quit"}"#,
        r#"{"execute":"query-stats","arguments":{"target":"vm","target":"vcpu"}}"#,
        r#"{"execute":"query-stats","arguments":{"target":"vm"},"arguments":{}}"#,
        r#"{"execute":"migrate-set-parameters","arguments":{"x":[{"a":1,"a":2}]}}"#,
    ] {
        let e = parse(line.as_bytes()).expect_err(line);
        assert!(
            e.desc.starts_with("JSON parse error, duplicate key '"),
            "{line}: {}",
            e.desc
        );
    }
    // The same key in two objects is no duplicate.
    let r = parse(br#"{"execute":"query-stats","arguments":{"target":"vm","providers":[{"provider":"kvm"},{"provider":"kvmscope"}]}}"#);
    assert!(r.is_ok(), "{r:?}");
    // Numbers of each kind survive the strict read.
    let r = parse(br#"{"execute":"query-readiness","arguments":{"calc-time":0.25,"bandwidth":125000000},"id":-3}"#)
        .unwrap();
    assert_eq!(r.id, Some(serde_json::json!(-3)));
}

#[test]
fn readiness_takes_the_downtimes_downtime_limit_takes() {
    let check = |v: f64| {
        let r: ReadinessRequest =
            serde_json::from_value(serde_json::json!({"max-downtime": v})).unwrap();
        r.check().map(|a| a.max_downtime)
    };
    assert_eq!(check(0.0), Ok(Some(Duration::ZERO)));
    assert_eq!(check(2000.0), Ok(Some(Duration::from_secs(2000))));
    let e = check(2000.5).unwrap_err();
    assert_eq!(
        e,
        "parameter 'max-downtime' must be a number of seconds from 0 to 2000"
    );
    assert!(check(-1.0).is_err());
}

/// A null is refused wherever it is, named, as QEMU refuses it: serde read
/// a null optional member as absent (`"cpu-index": null` limited every vCPU).
#[test]
fn a_null_argument_is_refused_not_read_as_absent() {
    let e = args_err(
        "set-vcpu-dirty-limit",
        json!({"cpu-index": null, "dirty-rate": 100}),
    );
    assert_eq!(
        e,
        "set-vcpu-dirty-limit: parameter 'cpu-index': invalid type: null (leave a parameter out for its default)"
    );
    let e = args_err("migrate-set-parameters", json!({"downtime-limit": null}));
    assert!(
        e.contains("parameter 'downtime-limit': invalid type: null"),
        "{e}"
    );
    let e = args_err(
        "migrate-set-capabilities",
        json!({"capabilities": [{"capability": "auto-converge", "state": null}]}),
    );
    assert!(
        e.contains("parameter 'capabilities[0].state': invalid type: null"),
        "{e}"
    );
    // A member the command does not take is named as such, null or not.
    let e = args_err(
        "set-vcpu-dirty-limit",
        json!({"tls-creds": null, "dirty-rate": 1}),
    );
    assert!(e.contains("parameter 'tls-creds' is unexpected"), "{e}");
}
