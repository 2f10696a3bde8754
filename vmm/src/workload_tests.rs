use super::*;

fn err(text: &str) -> SpecError {
    parse_workload(text).expect_err(text)
}

#[test]
fn parses_the_issue_example() {
    let w = parse_workload("touch size=64M; dirty rate=2000/s for=5s").unwrap();
    assert_eq!(w.target, Target::Some(vec![0]));
    assert_eq!(
        w.commands[0],
        Command::Touch {
            span: Span {
                offset: 0,
                size: Some(64 << 20),
                stride: 1
            },
            pattern: 0x6b76_6d73_636f_7065
        }
    );
    assert_eq!(
        w.commands[1],
        Command::Dirty {
            offset: 0,
            ws: None,
            rate: 2000,
            duration: Duration::from_secs(5),
            seed: 1
        }
    );
}

#[test]
fn parses_targets() {
    assert_eq!(parse_workload("all: exits").unwrap().target, Target::All);
    assert_eq!(
        parse_workload("2: exits").unwrap().target,
        Target::Some(vec![2])
    );
    assert_eq!(
        parse_workload("1-3: exits").unwrap().target,
        Target::Some(vec![1, 2, 3])
    );
    assert_eq!(
        parse_workload("3,0,3: exits").unwrap().target,
        Target::Some(vec![0, 3])
    );
}

#[test]
fn target_resolution_rejects_missing_vcpus() {
    let t = parse_workload("0,5: exits").unwrap().target;
    assert_eq!(t.resolve(8).unwrap(), vec![0, 5]);
    assert!(matches!(
        t.resolve(4),
        Err(SpecError::NoSuchVcpu {
            index: 5,
            vcpus: 4,
            ..
        })
    ));
    assert_eq!(Target::All.resolve(3).unwrap(), vec![0, 1, 2]);
}

#[test]
fn rejects_bad_targets() {
    assert_eq!(err("3-1: exits"), SpecError::BadTarget("3-1".into()));
    assert_eq!(
        err("0-100000: exits"),
        SpecError::BadTarget("0-100000".into())
    );
}

#[test]
fn rejects_unknown_command_naming_it() {
    let e = err("tuch size=4M");
    assert_eq!(e, SpecError::UnknownCommand("tuch".into()));
    assert!(e.to_string().contains("'tuch'") && e.to_string().contains("touch-zero"));
}

#[test]
fn rejects_unknown_parameter_listing_known_ones() {
    let e = err("touch sz=4M");
    assert!(matches!(&e, SpecError::UnknownParam { command: "touch", param, .. } if param == "sz"));
    assert!(e.to_string().contains("offset, size, stride, pattern"));
}

#[test]
fn rejects_parameters_without_values() {
    assert!(matches!(err("touch size"), SpecError::MissingValue { param, .. } if param == "size"));
    assert!(matches!(err("touch size="), SpecError::MissingValue { param, .. } if param == "size"));
}

#[test]
fn rejects_duplicate_parameters() {
    assert!(matches!(
        err("touch size=4M size=8M"),
        SpecError::DuplicateParam { .. }
    ));
}

#[test]
fn rejects_bad_values_naming_param_and_value() {
    for (spec, param, value) in [
        ("touch size=abc", "size", "abc"),
        ("touch size=0", "size", "0"),
        ("touch offset=100", "offset", "100"),
        ("touch stride=0", "stride", "0"),
        ("touch pattern=0", "pattern", "0"),
        ("touch pattern=xyz", "pattern", "xyz"),
        ("dirty rate=fast", "rate", "fast"),
        ("dirty rate=0/s", "rate", "0/s"),
        ("dirty for=5", "for", "5"),
        ("exits count=-1", "count", "-1"),
        ("wait for=soon", "for", "soon"),
    ] {
        match err(spec) {
            SpecError::BadValue {
                param: p, value: v, ..
            } => assert_eq!((p, v.as_str()), (param, value), "{spec}"),
            other => panic!("{spec}: unexpected {other:?}"),
        }
    }
}

#[test]
fn rejects_empty_specs() {
    assert_eq!(err(""), SpecError::Empty);
    assert_eq!(err(" ; ;"), SpecError::Empty);
    assert_eq!(err("all:"), SpecError::Empty);
}

#[test]
fn exits_count_sets_both_kinds_and_specific_ones_win() {
    assert_eq!(
        parse_command("exits count=5").unwrap(),
        Command::Exits { ports: 5, mmio: 5 }
    );
    assert_eq!(
        parse_command("exits count=5 mmio=2").unwrap(),
        Command::Exits { ports: 5, mmio: 2 }
    );
}

#[test]
fn encodes_touch_for_the_guest_with_default_size_filling_the_arena() {
    let c = parse_command("touch offset=1M stride=2").unwrap();
    let g = c.to_guest(16 << 20).unwrap().unwrap();
    assert_eq!(g.code, abi::CMD_TOUCH);
    assert_eq!(&g.args[..3], &[1 << 20, 15 << 20, 2]);
    assert_ne!(g.args[3], 0);
}

#[test]
fn encoding_rejects_ranges_outside_the_arena() {
    let c = parse_command("touch offset=8M size=16M").unwrap();
    assert!(matches!(
        c.to_guest(16 << 20),
        Err(SpecError::OutsideArena {
            start: 0x80_0000,
            end: 0x180_0000,
            ..
        })
    ));
    let c = parse_command("read offset=16M").unwrap();
    assert!(c.to_guest(16 << 20).is_err());
}

#[test]
fn encodes_dirty_and_wait() {
    let c = parse_command("dirty ws=4M rate=max for=250ms seed=7").unwrap();
    let g = c.to_guest(64 << 20).unwrap().unwrap();
    assert_eq!(g.args, [0, 4 << 20, 0, 250_000, 7, 0]);
    assert_eq!(
        parse_command("wait for=1s")
            .unwrap()
            .to_guest(1 << 20)
            .unwrap(),
        None
    );
}

#[test]
fn display_round_trips_through_the_parser() {
    for spec in [
        "touch size=8M stride=3 pattern=0xabc",
        "touch-zero offset=4096",
        "dirty ws=1M rate=500/s for=2s seed=9",
        "exits ports=3 mmio=4",
        "wait for=20ms",
        "wait",
        "fault",
    ] {
        let c = parse_command(spec).unwrap();
        assert_eq!(parse_command(&c.to_string()).unwrap(), c, "{spec}");
    }
}

mod properties {
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn arbitrary_specs_never_panic_and_round_trip(text in "[a-z0-9=;:,/ .x-]{0,80}") {
            crate::fuzz::workload_spec(text.as_bytes());
        }

        #[test]
        fn generated_touch_commands_round_trip(off in 0u64..1024, size in 1u64..1 << 20, stride in 1u64..64, pattern in 1u64..u64::MAX) {
            let spec = format!("touch offset={} size={size} stride={stride} pattern={pattern:#x}", off * 4096);
            crate::fuzz::workload_spec(spec.as_bytes());
        }

        #[test]
        fn generated_dirty_commands_round_trip(ws in 1u64..1 << 30, rate in 0u64..1_000_000, ns in 0u64..10_000_000_000, seed in any::<u64>()) {
            let rate = if rate == 0 { "max".to_string() } else { format!("{rate}/s") };
            let spec = format!("dirty ws={ws} rate={rate} for={ns}ns seed={seed}");
            crate::fuzz::workload_spec(spec.as_bytes());
        }
    }
}
