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

#[test]
fn parse_accepts_command_without_arguments_or_id() {
    assert_eq!(
        ok(r#"{"execute":"query-vm"}"#),
        Request {
            id: None,
            command: Command::QueryVm
        }
    );
}

#[test]
fn parse_keeps_any_json_id() {
    let r = ok(r#"{"execute":"quit","id":{"seq":[1,"a"]}}"#);
    assert_eq!(r.id, Some(json!({"seq": [1, "a"]})));
}

#[test]
fn parse_accepts_trailing_carriage_return() {
    assert_eq!(ok("{\"execute\":\"pause\"}\r").command, Command::Pause);
}

#[test]
fn get_stats_fd_for_vm_has_no_vcpu() {
    let r = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vm"}}"#);
    assert_eq!(
        r.command,
        Command::GetStatsFd {
            target: StatsTarget::Vm,
            vcpu: None
        }
    );
}

#[test]
fn get_stats_fd_for_vcpu_takes_index_or_all_and_defaults_to_all() {
    let one = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu","vcpu":3}}"#);
    assert_eq!(
        one.command,
        Command::GetStatsFd {
            target: StatsTarget::Vcpu,
            vcpu: Some(VcpuSelector::One(3))
        }
    );
    let all = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu","vcpu":"all"}}"#);
    assert_eq!(
        all.command,
        Command::GetStatsFd {
            target: StatsTarget::Vcpu,
            vcpu: Some(VcpuSelector::All)
        }
    );
    let default = ok(r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu"}}"#);
    assert_eq!(default.command, all.command);
}

#[test]
fn get_stats_fd_for_vm_rejects_a_vcpu_argument() {
    let e = err(r#"{"execute":"get-stats-fd","arguments":{"target":"vm","vcpu":0}}"#);
    assert_eq!(e.class, ErrorClass::InvalidArgument);
    assert!(e.desc.contains("'vcpu' is unexpected"), "{}", e.desc);
}

#[test]
fn get_stats_fd_without_target_is_missing_argument() {
    let e = err(r#"{"execute":"get-stats-fd","id":7}"#);
    assert_eq!(
        (e.class, e.id),
        (ErrorClass::InvalidArgument, Some(json!(7)))
    );
    assert!(e.desc.contains("'target' is missing"));
}

#[test]
fn query_stats_takes_names_and_vcpus() {
    let r = ok(
        r#"{"execute":"query-stats","arguments":{"target":"vcpu","names":["exits"],"vcpus":[0,1]}}"#,
    );
    assert_eq!(
        r.command,
        Command::QueryStats {
            target: StatsTarget::Vcpu,
            names: Some(vec!["exits".into()]),
            vcpus: Some(vec![0, 1])
        }
    );
}

#[test]
fn query_stats_rejects_vcpus_with_vm_target() {
    assert_eq!(
        err(r#"{"execute":"query-stats","arguments":{"target":"vm","vcpus":[0]}}"#).class,
        ErrorClass::InvalidArgument
    );
}

#[test]
fn guest_command_needs_vcpu_and_command_and_takes_wait() {
    let r = ok(
        r#"{"execute":"guest-command","arguments":{"vcpu":0,"command":"touch size=4M","wait":true}}"#,
    );
    assert_eq!(
        r.command,
        Command::GuestCommand {
            vcpu: 0,
            command: "touch size=4M".into(),
            wait: true
        }
    );
    assert_eq!(
        err(r#"{"execute":"guest-command","arguments":{"vcpu":0}}"#).class,
        ErrorClass::InvalidArgument
    );
}

#[test]
fn wrong_argument_types_are_invalid_argument() {
    for line in [
        r#"{"execute":"guest-command","arguments":{"vcpu":"0","command":"touch"}}"#,
        r#"{"execute":"guest-command","arguments":{"vcpu":-1,"command":"touch"}}"#,
        r#"{"execute":"guest-command","arguments":{"vcpu":1.5,"command":"touch"}}"#,
        r#"{"execute":"guest-command","arguments":{"vcpu":0,"command":["touch"]}}"#,
        r#"{"execute":"guest-command","arguments":{"vcpu":0,"command":"touch","wait":"yes"}}"#,
        r#"{"execute":"get-stats-fd","arguments":{"target":"host"}}"#,
        r#"{"execute":"get-stats-fd","arguments":{"target":"vcpu","vcpu":"some"}}"#,
        r#"{"execute":"query-stats","arguments":{"target":"vm","names":"exits"}}"#,
        r#"{"execute":"query-stats","arguments":{"target":"vm","names":[1]}}"#,
        r#"{"execute":"query-exits","arguments":{"vcpus":[0,"1"]}}"#,
    ] {
        assert_eq!(err(line).class, ErrorClass::InvalidArgument, "{line}");
    }
}

#[test]
fn unexpected_argument_is_named() {
    let e = err(r#"{"execute":"query-vm","arguments":{"verbose":true}}"#);
    assert_eq!(e.class, ErrorClass::InvalidArgument);
    assert!(e.desc.contains("'verbose'"));
}

#[test]
fn unknown_command_is_command_not_found_with_id() {
    let e = err(r#"{"execute":"reboot","id":"x"}"#);
    assert_eq!(
        (e.class, e.id),
        (ErrorClass::CommandNotFound, Some(json!("x")))
    );
}

#[test]
fn malformed_lines_are_parse_errors() {
    for line in [
        "",
        "not json",
        "{\"execute\":",
        "[1,2]",
        "\"query-vm\"",
        r#"{"arguments":{}}"#,
        r#"{"execute":5}"#,
        r#"{"execute":"query-vm","arguments":[]}"#,
        r#"{"execute":"query-vm","extra":1}"#,
    ] {
        assert_eq!(err(line).class, ErrorClass::ParseError, "{line}");
    }
}

#[test]
fn deeply_nested_json_is_a_parse_error_not_a_crash() {
    let line = "[".repeat(100_000);
    assert_eq!(err(&line).class, ErrorClass::ParseError);
}

#[test]
fn every_listed_command_parses_with_its_minimal_arguments() {
    for name in COMMANDS {
        let args = match name {
            "get-stats-fd" | "query-stats" => json!({"target": "vcpu"}),
            "guest-command" => json!({"vcpu": 0, "command": "exits"}),
            _ => json!({}),
        };
        let line = json!({"execute": name, "arguments": args}).to_string();
        ok(&line);
    }
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(line in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse(&line);
    }

    #[test]
    fn parse_never_panics_on_request_shaped_lines(
        execute in prop_oneof![Just("get-stats-fd".to_string()), Just("query-stats".to_string()),
                               Just("guest-command".to_string()), "[a-z-]{0,16}"],
        key in prop_oneof![Just("target"), Just("vcpu"), Just("vcpus"), Just("names"), Just("command"), Just("wait"), Just("x")],
        value in prop_oneof![any::<i64>().prop_map(|n| json!(n)), any::<f64>().prop_map(|f| json!(f)),
                             "[a-z]{0,8}".prop_map(|s| json!(s)), any::<bool>().prop_map(|b| json!(b)),
                             proptest::collection::vec(any::<u32>(), 0..4).prop_map(|v| json!(v))],
        id in proptest::option::of(any::<i64>()),
    ) {
        let mut req = json!({"execute": execute, "arguments": {key: value}});
        if let Some(id) = id {
            req["id"] = json!(id);
        }
        match parse(req.to_string().as_bytes()) {
            Ok(r) => prop_assert_eq!(r.id, id.map(|i| json!(i))),
            Err(e) => prop_assert_eq!(e.id, id.map(|i| json!(i))),
        }
    }
}

#[test]
fn query_readiness_takes_defaults_and_checks_ranges() {
    let cmd = |args: &str| {
        parse(format!(r#"{{"execute":"query-readiness","arguments":{args}}}"#).as_bytes())
    };
    match cmd("{}").unwrap().command {
        Command::QueryReadiness(a) => {
            assert!(!a.scan);
            assert_eq!(a.calc_time, None);
            assert_eq!(a.bandwidth, 1_250_000_000);
            assert_eq!(a.max_downtime, std::time::Duration::from_millis(300));
        }
        other => panic!("{other:?}"),
    }
    match cmd(r#"{"scan":true,"calc-time":0,"bandwidth":1e6,"max-downtime":0.05}"#)
        .unwrap()
        .command
    {
        Command::QueryReadiness(a) => {
            assert!(
                a.scan
                    && a.calc_time == Some(std::time::Duration::ZERO)
                    && a.bandwidth == 1_000_000
            )
        }
        other => panic!("{other:?}"),
    }
    for (args, key) in [
        (r#"{"calc-time":-1}"#, "calc-time"),
        (r#"{"calc-time":1e9}"#, "calc-time"),
        (r#"{"max-downtime":0}"#, "max-downtime"),
        (r#"{"bandwidth":0}"#, "bandwidth"),
        (r#"{"bandwidth":"fast"}"#, "bandwidth"),
        (r#"{"scan":"yes"}"#, "scan"),
    ] {
        let e = cmd(args).unwrap_err();
        assert_eq!(e.class, ErrorClass::InvalidArgument, "{args}");
        assert!(e.desc.contains(key), "{args}: {}", e.desc);
    }
}

#[test]
fn sample_commands_parse_their_arguments() {
    let c = parse(br#"{"execute":"query-samples","arguments":{"since":5,"max":2}}"#)
        .unwrap()
        .command;
    assert_eq!(
        c,
        Command::QuerySamples {
            since: 5,
            max: Some(2)
        }
    );
    let c = parse(br#"{"execute":"query-samples"}"#).unwrap().command;
    assert_eq!(
        c,
        Command::QuerySamples {
            since: 0,
            max: None
        }
    );
    let c = parse(br#"{"execute":"subscribe-samples"}"#)
        .unwrap()
        .command;
    assert_eq!(c, Command::SubscribeSamples { since: None });
    let e = parse(br#"{"execute":"query-samples","arguments":{"since":-1}}"#).unwrap_err();
    assert!(e.desc.contains("since"));
}
